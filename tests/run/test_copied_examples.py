"""A value copied from a parameter's example is answered, not run.

Small models fill a parameter with its description's example ("The service name, e.g.
inventory.") instead of the value the request gives, or instead of leaving an optional
parameter out. A string value that stands in its parameter's description and nowhere in what
the model was told (the system prompt, the request, the results so far) is answered as an
invalid call. Sent again as it was, it runs: the model insists, and a request that really
means the example costs one turn, never the call.
"""

from __future__ import annotations

from pathlib import Path

from mm_batch.config.model import ParamSpec, ToolSpec
from mm_batch.run.ports import ModelReply
from mm_batch.tools.declared import InvalidCall, ValidCall, validate_call
from tests.helpers import write
from tests.run.scripted import answer, calls, run_tasks

AGENT = """
system: You ship services for ACME.
yolo: true
tools:
  - name: ship
    description: Ship a service.
    parameters:
      service: {type: string, description: "The service name, e.g. inventory."}
      version:
        type: string
        required: false
        description: "The version, e.g. 1.0.0; leave out for the newest."
      env: {type: string, enum: [staging, production], description: "Where, e.g. staging."}
    command: ["./ship.sh", "{{service}}", "--version={{version}}", "--env={{env}}"]
  - name: services
    description: List the services.
    parameters: {}
    command: ["./services.sh"]
"""
# Every call that really ran leaves its argv in shipped.txt: the marker of what ran.
SHIP = """#!/bin/sh
echo "$*" >> shipped.txt
echo "shipped $1"
"""
SERVICES = """#!/bin/sh
echo "billing inventory search"
"""


def tasks_file(tmp_path: Path, prompt: str) -> Path:
    write(tmp_path, "agent.yaml", AGENT)
    write(tmp_path, "ship.sh", SHIP).chmod(0o755)
    write(tmp_path, "services.sh", SERVICES).chmod(0o755)
    tasks = f"agent: agent.yaml\ntasks:\n  - id: t\n    prompt: {prompt!r}\n"
    return write(tmp_path, "tasks.yaml", tasks)


def shipped(tmp_path: Path) -> list[str]:
    path = tmp_path / "shipped.txt"
    return path.read_text().splitlines() if path.exists() else []


def ship(arguments: str) -> ModelReply:
    return calls(("ship", arguments))


def test_a_copied_example_is_answered_and_never_run(tmp_path: Path) -> None:
    tasks = tasks_file(tmp_path, "Ship checkout to staging.")
    steps = [
        ship('{"service": "inventory", "env": "staging"}'),
        ship('{"service": "checkout", "env": "staging"}'),
        answer("Shipped."),
    ]
    out = run_tasks(tasks, steps)
    assert shipped(tmp_path) == ["checkout --env=staging"]  # the example never ran
    copied, ran = out.records.of("tool")
    assert (copied["outcome"], copied["started"]) == ("invalid", False)
    assert copied["reason"] == (
        "service: the value sent is the example in its description, and the request does not "
        "say it: give the value the request gives"
    )
    told = out.client.requests[1][-1]
    assert told["role"] == "tool" and told["content"].startswith("Invalid call of ship")
    assert "service: the value sent is the example in its description" in told["content"]
    assert ran["outcome"] == "ran" and out.result.status == "passed"


def test_an_optional_parameter_holding_its_example_is_told_to_be_left_out(
    tmp_path: Path,
) -> None:
    tasks = tasks_file(tmp_path, "Ship search to production, the newest version.")
    steps = [
        ship('{"service": "search", "version": "1.0.0", "env": "production"}'),
        ship('{"service": "search", "env": "production"}'),
        answer("Shipped."),
    ]
    out = run_tasks(tasks, steps)
    assert shipped(tmp_path) == ["search --env=production"]
    assert out.records.of("tool")[0]["reason"] == (
        "version: the value sent is the example in its description, and the request does not "
        "say it: leave version out, or give the value the request gives"
    )


def test_the_example_runs_at_once_when_the_request_says_it(tmp_path: Path) -> None:
    tasks = tasks_file(tmp_path, "Ship INVENTORY 1.0.0 to staging.")
    steps = [ship('{"service": "inventory", "version": "1.0.0", "env": "staging"}'), answer("Ok.")]
    out = run_tasks(tasks, steps)
    assert shipped(tmp_path) == ["inventory --version=1.0.0 --env=staging"]
    assert [r["outcome"] for r in out.records.of("tool")] == ["ran"]


def test_the_example_runs_at_once_when_a_result_said_it(tmp_path: Path) -> None:
    tasks = tasks_file(tmp_path, "List the services, then ship the second one to staging.")
    steps = [
        calls(("services", "{}")),
        ship('{"service": "inventory", "env": "staging"}'),
        answer("Shipped."),
    ]
    out = run_tasks(tasks, steps)
    assert shipped(tmp_path) == ["inventory --env=staging"]
    assert [r["outcome"] for r in out.records.of("tool")] == ["ran", "ran"]


def test_the_same_call_sent_again_after_the_answer_runs(tmp_path: Path) -> None:
    tasks = tasks_file(tmp_path, "Ship the usual service to staging.")
    same = ship('{"service": "inventory", "env": "staging"}')
    out = run_tasks(tasks, [same, same, answer("Shipped.")])
    assert shipped(tmp_path) == ["inventory --env=staging"]  # once: told, then insisted
    assert [r["outcome"] for r in out.records.of("tool")] == ["invalid", "ran"]
    assert out.result.status == "passed"


SHIP_TOOL = ToolSpec(
    name="ship",
    description="Ship a service.",
    params=(
        ParamSpec("service", "string", "The service name, e.g. inventory.", required=True),
        ParamSpec("env", "string", "Where, e.g. staging.", required=True, enum=("staging", "x")),
    ),
    command=("./ship.sh", "{{service}}", "--env={{env}}"),
    workdir=Path("."),
)


def test_enum_values_and_words_that_only_contain_the_example_are_not_held() -> None:
    said = "Ship inv to production."
    # staging is an allowed value named in its description; inv is not the word inventory.
    for arguments in ('{"service": "inv", "env": "staging"}', '{"service": "inv-2", "env": "x"}'):
        assert isinstance(validate_call(SHIP_TOOL, arguments, said), ValidCall), arguments
    copied = validate_call(SHIP_TOOL, '{"service": "Inventory", "env": "x"}', said)
    assert isinstance(copied, InvalidCall) and "is the example" in copied.problems[0]
    # Without what was said (a caller that does not check), the example passes as before.
    example = '{"service": "inventory", "env": "staging"}'
    assert isinstance(validate_call(SHIP_TOOL, example), ValidCall)
