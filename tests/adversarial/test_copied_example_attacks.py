"""Attacks on the copied-example hold: a hostile model, a hostile tool output, a hostile config.

A string value that stands as a whole word in its own parameter's description and nowhere in
what the model was told is answered as an invalid call (outcome `invalid`, started false); the
same call sent again after that answer runs. None of that may weaken what stands around it:
consent still decides (a marker file the tool writes proves what really ran), a call invalid
for another reason never runs however often it is sent, the loop detector still ends a run, no
value or description raises or ends a run as an error, secrets stay masked, and `expect` judges
only started calls. The breaks these attacks found are fixed: their tests say what went wrong.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mm_batch.config.model import AgentConfig, ParamSpec, ToolSpec
from mm_batch.config.secrets import Masker
from mm_batch.run.ports import McpTool, ModelReply, ToolCallRequest
from mm_batch.run.toolbox import PreparedCall, Toolbox
from mm_batch.tools import declared
from mm_batch.tools.declared import InvalidCall, ValidCall, validate_call
from tests.helpers import Cli, write
from tests.run.scripted import Outcome, ScriptedClient, answer, calls, run_tasks

EXAMPLE = "inventory"
SERVICE_DESCRIPTION = f"The service name, e.g. {EXAMPLE}."
HELD = "is the example in its description"
SECRET = "s3cret-VALUE-0123456789"
# Every argv a tool really received, one JSON list a line: the marker of what ran.
MARKER_TOOL = f"""#!{sys.executable}
import json, sys
with open(sys.argv[1], "a", encoding="utf-8", errors="surrogateescape") as f:
    f.write(json.dumps(sys.argv[2:]) + "\\n")
print("done")
"""
NOTE = """#!/bin/sh
cat note.txt
"""
# A refusing pre-call hook that keeps every call it was shown.
HOOK = """#!/bin/sh
cat >> hook.log
echo >> hook.log
echo "not today"
exit 1
"""


def agent_yaml(
    *,
    service: str = SERVICE_DESCRIPTION,
    yolo: bool = True,
    allow: str = "",
    extra: str = "",
) -> str:
    """The agent file: descriptions are written as JSON strings, which YAML reads as they are."""
    return f"""
system: You ship services for ACME.
yolo: {"true" if yolo else "false"}
{allow}
{extra}
tools:
  - name: ship
    description: Ship a service.
    parameters:
      service: {{type: string, description: {json.dumps(service, ensure_ascii=False)}}}
      version:
        type: string
        required: false
        description: "The version, e.g. 1.0.0; leave out for the newest."
      env: {{type: string, enum: [staging, production], description: "Where, e.g. staging."}}
    command: ["./mark.py", "shipped.txt", "{{{{service}}}}", "--version={{{{version}}}}",
              "--env={{{{env}}}}"]
  - name: clean
    description: Clean a path.
    parameters:
      path: {{type: string, description: "The path to clean, e.g. build or -rf."}}
    command: ["./mark.py", "cleaned.txt", "{{{{path}}}}"]
  - name: note
    description: Read the team's note.
    parameters: {{}}
    command: ["./note.sh"]
"""


def project(
    tmp_path: Path,
    prompt: str = "Ship the usual service to staging.",
    *,
    agent: str | None = None,
    task_extra: str = "",
    note: str = "nothing new",
) -> Path:
    write(tmp_path, "agent.yaml", agent if agent is not None else agent_yaml())
    write(tmp_path, "mark.py", MARKER_TOOL).chmod(0o755)
    write(tmp_path, "note.sh", NOTE).chmod(0o755)
    write(tmp_path, "hook.sh", HOOK).chmod(0o755)
    (tmp_path / "note.txt").write_text(note, encoding="utf-8")
    tasks = f"agent: agent.yaml\ntasks:\n  - id: t\n    prompt: {json.dumps(prompt)}\n{task_extra}"
    return write(tmp_path, "tasks.yaml", tasks)


def marks(tmp_path: Path, name: str = "shipped.txt") -> list[list[str]]:
    path = tmp_path / name
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def ship(arguments: dict[str, Any] | str) -> ModelReply:
    raw = arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False)
    return calls(("ship", raw))


def outcomes(out: Outcome) -> list[tuple[str, bool]]:
    return [(r["outcome"], r["started"]) for r in out.records.of("tool")]


def inventory(env: str = "staging") -> dict[str, Any]:
    return {"service": EXAMPLE, "env": env}


# 1. Consent is never bypassed by the insist rule.


def test_an_insisted_example_off_the_allowlist_is_refused_and_never_runs(tmp_path: Path) -> None:
    allow = "allow:\n  - tool: ship\n    args: {service: checkout}"
    tasks = project(tmp_path, agent=agent_yaml(yolo=False, allow=allow))
    same = ship(inventory())
    out = run_tasks(tasks, [same, same, answer("Could not ship.")])
    assert marks(tmp_path) == []  # never ran
    assert outcomes(out) == [("invalid", False), ("refused", False)]
    held, refused = out.records.of("tool")
    assert HELD in held["reason"] and held["rule"] is None
    assert refused["reason"].startswith("refused: ship with")
    assert out.result.status == "failed"  # an unexpected refusal, as ever


def test_an_insisted_example_runs_only_under_the_rule_that_allows_it(tmp_path: Path) -> None:
    allow = "allow:\n  - tool: ship\n    args: {service: inventory, env: staging}"
    tasks = project(tmp_path, agent=agent_yaml(yolo=False, allow=allow))
    same = ship(inventory())
    production = ship(inventory("production"))
    out = run_tasks(tasks, [same, same, production, production, answer("Shipped.")])
    assert marks(tmp_path) == [["inventory", "--env=staging"]]
    tools = out.records.of("tool")
    assert outcomes(out)[:2] == [("invalid", False), ("ran", True)]
    assert tools[1]["rule"] == "allow[0]"
    # Held or not, the production call is off the allowlist: sent twice, it ends refused.
    assert [r["started"] for r in tools[2:]] == [False, False]
    assert tools[-1]["outcome"] == "refused"


def test_a_yolo_false_run_with_no_rule_never_runs_a_held_or_insisted_example(
    tmp_path: Path,
) -> None:
    tasks = project(tmp_path, agent=agent_yaml(yolo=False))
    same = ship(inventory())
    out = run_tasks(tasks, [same, same, same, answer("No.")])
    assert marks(tmp_path) == []
    assert [r["outcome"] for r in out.records.of("tool")] == ["invalid", "refused", "loop"]


def test_an_insisted_example_still_goes_through_the_pre_call_hook(tmp_path: Path) -> None:
    hooks = 'hooks:\n  preToolCall: ["./hook.sh"]'
    tasks = project(tmp_path, agent=agent_yaml(extra=hooks))
    same = ship(inventory())
    out = run_tasks(tasks, [same, same, answer("No.")])
    assert marks(tmp_path) == []
    assert outcomes(out) == [("invalid", False), ("refused", False)]
    # The hook saw the insisted call only: a held call reaches neither consent nor hooks.
    shown = [json.loads(x) for x in (tmp_path / "hook.log").read_text().split("\n") if x]
    assert [s["arguments"] for s in shown] == [{"service": "inventory", "env": "staging"}]
    assert out.records.of("tool")[1]["reason"].strip() == "not today"


# 2. A call invalid for another reason never runs, however often it is sent.

OTHER_INVALID = {
    "missing": ("ship", json.dumps({"service": EXAMPLE}), "env: missing (required)"),
    "ill-typed": ("ship", json.dumps({"service": 7, "env": "staging"}), "service:"),
    "out of enum": ("ship", json.dumps({"service": EXAMPLE, "env": "moon"}), "is not one of"),
    "unknown": (
        "ship",
        json.dumps({"service": EXAMPLE, "env": "staging", "force": True}),
        "unknown parameter",
    ),
    "option injection": ("clean", json.dumps({"path": "-rf"}), "begins with '-'"),
    "NUL": ("ship", json.dumps({"service": "inventory\x00", "env": "staging"}), "NUL"),
    "lone surrogate": ("ship", '{"service": "inv\\ud800", "env": "staging"}', "surrogate"),
    "over 64 KiB": (
        "ship",
        json.dumps({"service": "x" * (64 * 1024 + 1), "env": "staging"}),
        "over 64 KiB",
    ),
    "not JSON": ("ship", "service=inventory env=staging", ""),
    "not an object": ("ship", json.dumps([EXAMPLE, "staging"]), ""),
}


@pytest.mark.parametrize("case", sorted(OTHER_INVALID))
def test_sending_an_otherwise_invalid_call_again_never_runs_it(tmp_path: Path, case: str) -> None:
    tool, raw, why = OTHER_INVALID[case]
    agent = agent_yaml(extra="loop_limit: 1000")
    tasks = project(tmp_path, agent=agent, task_extra="    max_turns: 8\n")
    out = run_tasks(tasks, [calls((tool, raw))] * 6 + [answer("Gave up.")])
    assert marks(tmp_path) == [] and marks(tmp_path, "cleaned.txt") == []
    assert outcomes(out) == [("invalid", False)] * 6
    assert all(why in r["reason"] for r in out.records.of("tool"))
    assert out.result.status == "passed"  # invalid calls alone fail nothing


@pytest.mark.parametrize("case", sorted(OTHER_INVALID))
def test_the_loop_detector_still_ends_an_otherwise_invalid_call(tmp_path: Path, case: str) -> None:
    tool, raw, _ = OTHER_INVALID[case]
    tasks = project(tmp_path)
    out = run_tasks(tasks, [calls((tool, raw))] * 3 + [answer("unreached")])
    assert marks(tmp_path) == [] and marks(tmp_path, "cleaned.txt") == []
    assert [r["outcome"] for r in out.records.of("tool")] == ["invalid", "invalid", "loop"]
    assert out.result.status == "failed" and out.result.reason.startswith("loop detector")


def test_the_insisted_run_counts_towards_the_loop_detector(tmp_path: Path) -> None:
    same = ship(inventory())
    out = run_tasks(project(tmp_path), [same, same, same, answer("unreached")])
    assert marks(tmp_path) == [["inventory", "--env=staging"]]  # once, never twice
    assert [r["outcome"] for r in out.records.of("tool")] == ["invalid", "ran", "loop"]
    assert out.result.status == "failed"


def test_with_loop_limit_2_an_insisted_example_is_a_loop_and_never_runs(tmp_path: Path) -> None:
    # The loop detector counts the same call whatever its earlier outcome: the hold cannot
    # buy the insisted call past it.
    tasks = project(tmp_path, agent=agent_yaml(extra="loop_limit: 2"))
    same = ship(inventory())
    out = run_tasks(tasks, [same, same, answer("unreached")])
    assert marks(tmp_path) == []
    assert [r["outcome"] for r in out.records.of("tool")] == ["invalid", "loop"]
    assert out.result.status == "failed"


# 3. Hostile values and descriptions raise nothing and never end a run as an error.

ODD_EXAMPLES = [
    "a.*b",
    "(x|y)",
    "[a-z]+",
    "\\d{3}\\",
    "^v1$",
    "x?+*",
    "100%",
    "{{service}}",
    "${HOME}",
    "$(touch pwned)",
    "café",
    "СЕРВИС",
    "服务",
    "🚀rocket",
    "tab\there",
    "line1\nline2",
    "e.g.",
    "))((",
    "İstanbul",
]


@pytest.mark.parametrize("value", ODD_EXAMPLES)
def test_an_odd_example_is_held_once_then_runs_exactly_as_sent(tmp_path: Path, value: str) -> None:
    agent = agent_yaml(service=f"The service name, e.g. {value}.")
    tasks = project(tmp_path, agent=agent)
    same = ship({"service": value, "env": "staging"})
    out = run_tasks(tasks, [same, same, answer("Shipped.")])
    assert outcomes(out) == [("invalid", False), ("ran", True)]
    assert marks(tmp_path) == [[value, "--env=staging"]]  # one argv entry, nothing expanded
    assert not (tmp_path / "pwned").exists()
    assert out.result.status == "passed"


@pytest.mark.parametrize("value", ["", " ", "\t\n ", "\u00a0", "\u3000", "\u2028"])
def test_an_empty_or_blank_value_is_never_held(tmp_path: Path, value: str) -> None:
    # A blank value stands "in" every description: it must never be taken for an example.
    agent = agent_yaml(service=f"The service name, e.g. {value}, or inventory.")
    tasks = project(tmp_path, agent=agent)
    out = run_tasks(tasks, [ship({"service": value, "env": "staging"}), answer("Shipped.")])
    assert outcomes(out) == [("ran", True)]
    assert marks(tmp_path) == [[value, "--env=staging"]]


def test_a_padded_example_is_held_and_then_runs_with_its_padding(tmp_path: Path) -> None:
    same = ship({"service": f"  {EXAMPLE}\t", "env": "staging"})
    out = run_tasks(project(tmp_path), [same, same, answer("Shipped.")])
    assert outcomes(out) == [("invalid", False), ("ran", True)]
    assert marks(tmp_path) == [[f"  {EXAMPLE}\t", "--env=staging"]]


def test_a_64_kib_example_is_held_then_runs_whole(tmp_path: Path) -> None:
    value = "v" * (64 * 1024)  # exactly the limit: allowed
    agent = agent_yaml(service=f"The service name, e.g. {value}.")
    tasks = project(tmp_path, agent=agent)
    same = ship({"service": value, "env": "staging"})
    out = run_tasks(tasks, [same, same, answer("Shipped.")])
    assert outcomes(out) == [("invalid", False), ("ran", True)]
    assert marks(tmp_path) == [[value, "--env=staging"]]
    held = out.records.of("tool")[0]["reason"]
    assert HELD in held and len(held) < 400  # the reason stays short, whatever the value


def test_a_huge_description_raises_nothing(tmp_path: Path) -> None:
    prose = "Services are named after what they do, like search or billing. " * 3500
    agent = agent_yaml(service=f"{prose} For example {EXAMPLE}. {prose}")
    tasks = project(tmp_path, "Ship search, then the usual one, to staging.", agent=agent)
    held = ship(inventory())
    steps = [ship({"service": "search", "env": "staging"}), held, held, answer("Shipped.")]
    out = run_tasks(tasks, steps)
    assert [r["outcome"] for r in out.records.of("tool")] == ["ran", "invalid", "ran"]
    assert out.result.status == "passed"


def test_every_parameter_holding_its_example_is_named_once(tmp_path: Path) -> None:
    both = ship({"service": EXAMPLE, "version": "1.0.0", "env": "staging"})
    out = run_tasks(project(tmp_path), [both, both, answer("Shipped.")])
    held, ran = out.records.of("tool")
    assert held["reason"].count(HELD) == 2
    assert "service:" in held["reason"] and "version:" in held["reason"]
    assert ran["outcome"] == "ran"


def _tool(description: str) -> ToolSpec:
    return ToolSpec(
        name="ship",
        description="Ship a service.",
        params=(ParamSpec("service", "string", description, required=True),),
        command=("./ship.sh", "x{{service}}"),
        workdir=Path("."),
    )


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    value=st.text(max_size=40),
    before=st.text(max_size=20),
    after=st.text(max_size=20),
    said=st.text(max_size=60),
)
def test_validation_with_what_was_said_never_raises_and_only_ever_holds(
    value: str, before: str, after: str, said: str
) -> None:
    tool = _tool(f"{before} {value} {after}")
    raw = json.dumps({"service": value})  # lone surrogates travel as \\ud800 escapes
    plain = validate_call(tool, raw)
    checked = validate_call(tool, raw, said)
    # What was said can only add the copied-example problem to a call that was valid.
    if isinstance(plain, InvalidCall):
        assert isinstance(checked, InvalidCall) and checked.problems == plain.problems
    elif isinstance(checked, InvalidCall):
        assert len(checked.problems) == 1 and HELD in checked.problems[0]
    else:
        assert checked == plain
    # A model told the whole description was told its example: never held then.
    assert type(validate_call(tool, raw, tool.params[0].description)) is type(plain)


# 4. A tool result that says the example lets it run; nothing else is lifted by it.


def test_a_result_that_prints_the_example_lets_it_run_at_once(tmp_path: Path) -> None:
    tasks = project(tmp_path, note=f"Ship {EXAMPLE} next, it is ready.")
    steps = [calls(("note", "{}")), ship(inventory()), answer("Shipped.")]
    out = run_tasks(tasks, steps)
    assert outcomes(out) == [("ran", True), ("ran", True)]
    assert marks(tmp_path) == [["inventory", "--env=staging"]]


def test_a_result_that_prints_an_option_never_lets_it_through(tmp_path: Path) -> None:
    tasks = project(tmp_path, note="Clean -rf now.", agent=agent_yaml(extra="loop_limit: 1000"))
    clean = calls(("clean", '{"path": "-rf"}'))
    out = run_tasks(tasks, [calls(("note", "{}")), clean, clean, clean, answer("No.")])
    assert [r["outcome"] for r in out.records.of("tool")] == ["ran"] + ["invalid"] * 3
    assert marks(tmp_path, "cleaned.txt") == []


def test_the_models_own_words_do_not_vouch_for_its_example(tmp_path: Path) -> None:
    # Its text and its calls are its own turns, never what it was told: an example it wrote
    # in an earlier turn's text is still held.
    note = ToolCallRequest("c0", "note", "{}")
    chatty = ModelReply(f"I will ship {EXAMPLE}.", (note,), "tool_calls", 10, 5, 0.0)
    request = ToolCallRequest("c1", "ship", json.dumps(inventory()))
    again = ModelReply(f"Shipping {EXAMPLE} now.", (request,), "tool_calls", 10, 5, 0.0)
    out = run_tasks(project(tmp_path), [chatty, again, answer("Stopped.")])
    assert outcomes(out) == [("ran", True), ("invalid", False)]
    assert marks(tmp_path) == []


# 5. Secrets stay masked in the hold's reason and answer.


def _no_leak(out: Outcome, secret: str = SECRET) -> None:
    written = json.dumps(out.records.lines, ensure_ascii=False)
    sent = json.dumps(out.client.requests, ensure_ascii=False)
    for n in range(6, len(secret) + 1):
        assert secret[:n] not in written, ("records", secret[:n])
        assert secret[:n] not in sent, ("model", secret[:n])
    assert secret not in out.result.reason and secret not in "".join(out.result.calls)


def test_a_secret_example_is_masked_in_the_reason_and_the_answer(tmp_path: Path) -> None:
    agent = agent_yaml(service=f"The service name, e.g. {SECRET}.")
    tasks = project(tmp_path, agent=agent)
    same = ship({"service": SECRET, "env": "staging"})
    out = run_tasks(tasks, [same, same, answer("Shipped.")], secrets=[SECRET])
    assert outcomes(out) == [("invalid", False), ("ran", True)]
    held = out.records.of("tool")[0]
    assert held["reason"].startswith("service: the value sent is the example in its description")
    assert 'You sent: {"service": "***"' in out.client.requests[1][-1]["content"]
    _no_leak(out)


def test_a_secret_the_request_says_is_never_leaked_by_the_hold(tmp_path: Path) -> None:
    agent = agent_yaml(service=f"The service name, e.g. {SECRET}.")
    tasks = project(tmp_path, f"Ship {SECRET} to staging.", agent=agent)
    same = ship({"service": SECRET, "env": "staging"})
    out = run_tasks(tasks, [same, same, answer("Shipped.")], secrets=[SECRET])
    assert marks(tmp_path) == [[SECRET, "--env=staging"]]  # it ran, once
    assert [r["outcome"] for r in out.records.of("tool")][-1] == "ran"
    _no_leak(out)


def test_a_secret_straddling_the_cut_of_the_reason_leaks_no_prefix(tmp_path: Path) -> None:
    value = "https://hooks.example.com/" + "a" * 44 + SECRET  # the secret begins at 70
    agent = agent_yaml(service=f"The hook, e.g. {value}.")
    tasks = project(tmp_path, agent=agent)
    same = ship({"service": value, "env": "staging"})
    out = run_tasks(tasks, [same, same, answer("Shipped.")], secrets=[SECRET])
    assert outcomes(out) == [("invalid", False), ("ran", True)]
    _no_leak(out)


def test_a_secret_in_a_description_is_never_sent_to_the_model(tmp_path: Path) -> None:
    seen: list[str] = []

    class Recording(ScriptedClient):
        def complete(
            self, messages: list[dict[str, Any]], tools: list[dict[str, Any]], timeout: float
        ) -> ModelReply:
            seen.append(json.dumps(tools, ensure_ascii=False))
            return super().complete(messages, tools, timeout)

    tasks = project(tmp_path, agent=agent_yaml(service=f"The service name, e.g. {SECRET}."))
    run_tasks(tasks, lambda: Recording([answer("Nothing to do.")]), secrets=[SECRET])
    assert seen and all(SECRET not in tools for tools in seen)


def test_mm_batch_tools_prints_the_descriptions_masked_as_they_are_sent(
    tmp_path: Path, cli: Cli, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SHIP_TOKEN", SECRET)  # a secret by its name, as `run` reads it
    agent = write(tmp_path, "agent.yaml", agent_yaml(service=f"The service name, e.g. {SECRET}."))
    result = cli("tools", agent)
    assert result.code == 0, result.err
    assert SECRET[:6] not in result.out and "e.g. ***." in result.out
    assert json.loads(result.out)[0]["function"]["name"] == "ship"  # names stay as they are


def test_a_secret_straddling_the_cut_of_an_option_reason_leaks_no_prefix() -> None:
    """_shown() cut a value to 80 characters before the record was masked: the run's masker
    now goes into validation, and the value is masked before the cut."""
    value = "-https://hooks.example.com/" + "a" * 43 + SECRET
    tool = ToolSpec(
        name="ship",
        description="Ship.",
        params=(ParamSpec("service", "string", "The hook.", required=True),),
        command=("./ship.sh", "{{service}}"),
        workdir=Path("."),
    )
    problem = validate_call(tool, json.dumps({"service": value}), masker=Masker([SECRET]))
    assert isinstance(problem, InvalidCall) and "begins with '-'" in problem.problems[0]
    masked = Masker([SECRET]).text(problem.problems[0])
    assert SECRET[:6] not in masked, masked
    assert SECRET[:6] not in problem.answer


# 6. `expect` judges started calls only: a held call is neither started nor refused.

JUDGED = {
    "no_calls holds": ("      no_calls: [ship]\n      exit_code: 0\n", 1, "passed"),
    "times 0 holds": ("      calls: [{tool: ship, times: 0}]\n", 1, "passed"),
    "refused is unmet": ("      refused: [ship]\n", 1, "failed"),
    "insisted counts once": (
        "      calls: [{tool: ship, args: {service: inventory}, times: 1}]\n      exit_code: 0\n",
        2,
        "passed",
    ),
    "insisted breaks no_calls": ("      no_calls: [ship]\n", 2, "failed"),
}


@pytest.mark.parametrize("case", sorted(JUDGED))
def test_expect_judges_only_started_calls(tmp_path: Path, case: str) -> None:
    expect, sends, status = JUDGED[case]
    tasks = project(tmp_path, task_extra=f"    expect:\n{expect}")
    out = run_tasks(tasks, [ship(inventory())] * sends + [answer("Done.")])
    started = [r["started"] for r in out.records.of("tool")]
    assert started == [False, True][:sends]
    assert out.result.status == status, out.result.checks


def test_a_held_call_is_no_unexpected_refusal(tmp_path: Path) -> None:
    tasks = project(tmp_path, agent=agent_yaml(yolo=False))
    out = run_tasks(tasks, [ship(inventory()), answer("I will not guess the service.")])
    assert outcomes(out) == [("invalid", False)]
    assert out.result.status == "passed"


# mm-batch's own answers (which quote what the model sent) never count as "what the model was
# told", and a call counts as sent again only once the model has read the answer.


def test_an_earlier_invalid_answer_does_not_vouch_for_the_example(tmp_path: Path) -> None:
    steps = [ship({"service": EXAMPLE}), ship(inventory()), answer("Shipped.")]
    out = run_tasks(project(tmp_path), steps)
    assert [r["outcome"] for r in out.records.of("tool")] == ["invalid", "invalid"]
    assert HELD in out.records.of("tool")[1]["reason"]
    assert marks(tmp_path) == []


def test_a_changed_call_with_the_same_example_is_held_again(tmp_path: Path) -> None:
    steps = [ship(inventory()), ship(inventory("production")), answer("Shipped.")]
    out = run_tasks(project(tmp_path), steps)
    assert [r["outcome"] for r in out.records.of("tool")] == ["invalid", "invalid"]
    assert marks(tmp_path) == []


def test_a_duplicate_in_the_same_turn_is_no_insisting(tmp_path: Path) -> None:
    raw = json.dumps(inventory())
    out = run_tasks(project(tmp_path), [calls(("ship", raw), ("ship", raw)), answer("Done.")])
    assert marks(tmp_path) == []
    assert [r["outcome"] for r in out.records.of("tool")] == ["invalid", "invalid"]


# Bounded time: the hold's search must not let one call outlive the task's timeout.

RUN = 16 * 1024  # a result's stdout and stderr are each cut to 16 KiB: the longest run of '_'


def test_the_hold_search_is_linear_in_what_was_said(monkeypatch: pytest.MonkeyPatch) -> None:
    """Linear by construction, counted rather than timed: what was said is cut into words in one
    pass, and the search is then one substring search (linear in CPython, whatever the text);
    no regex is built for the value (the lookbehind regex it replaced took 4.7 s on half of
    this, growing with the square of it). `python benchmarks/hostile_inputs.py` times it."""
    value = "_" * RUN + "z"
    description = f"The key, e.g. {value}."
    tool = McpTool(
        "srv",
        "put",
        "Put a key.",
        {
            "type": "object",
            "properties": {"key": {"type": "string", "description": description}},
            "required": ["key"],
        },
    )
    toolbox = Toolbox(_bare_agent(), [tool])
    said = "\n".join("$ ./flood\nstdout:\n" + "_" * RUN for _ in range(128))  # ~2 MiB said
    tokenized: list[int] = []  # the length of each text cut into words
    words = declared._words

    def counted(text: str) -> str:
        tokenized.append(len(text))
        return words(text)

    class NoRegex:
        def __getattr__(self, name: str) -> object:
            raise AssertionError(f"re.{name} called while a call was validated")

    monkeypatch.setattr(declared, "_words", counted)
    monkeypatch.setattr(declared, "re", NoRegex())
    prepared = toolbox.prepare("srv_put", json.dumps({"key": value}), said, masker=Masker([]))
    assert isinstance(prepared, InvalidCall) and HELD in prepared.problems[0]
    assert tokenized.count(len(said)) == 1, tokenized  # one pass over what was said...
    # ...and otherwise only the value and its description, each at most twice.
    assert sum(tokenized) <= len(said) + 2 * (len(value) + len(description)), tokenized


def _bare_agent() -> AgentConfig:
    return AgentConfig(path=Path("agent.yaml"), sha256="0" * 64, tools=())


def test_an_mcp_example_is_held_and_an_mcp_enum_is_not() -> None:
    tool = McpTool(
        "srv",
        "put",
        "Put a key.",
        {
            "type": "object",
            "properties": {
                "key": {"type": "string", "description": "The key, e.g. alpha."},
                "mode": {"type": "string", "description": "e.g. fast", "enum": ["fast", "slow"]},
            },
            "required": ["key"],
        },
    )
    toolbox = Toolbox(_bare_agent(), [tool])
    held = toolbox.prepare(
        "srv_put", '{"key": "alpha", "mode": "fast"}', "Put beta.", masker=Masker([])
    )
    assert isinstance(held, InvalidCall) and len(held.problems) == 1
    assert held.problems[0].startswith("key: the value sent is the example")
    ok = toolbox.prepare(
        "srv_put", '{"key": "beta", "mode": "fast"}', "Put beta.", masker=Masker([])
    )
    assert isinstance(ok, PreparedCall)
    assert isinstance(validate_call(_tool("e.g. alpha."), '{"service": "alpha"}'), ValidCall)
