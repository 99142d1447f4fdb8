"""Loading `expect.calls.args` (a list: any one of these values) and a tool's `repeatable`."""

from __future__ import annotations

from pathlib import Path

from mm_batch.config.load import load_tasks
from mm_batch.config.model import AnyOf
from tests.helpers import write

AGENT = """
mcp:
  - {name: proj, url: "http://127.0.0.1:9/mcp"}
tools:
  - name: status
    description: The status of a service.
    parameters:
      service: {type: string}
      ratio: {type: number, required: false}
      n: {type: integer, required: false}
    command: ["./status.sh", "{{service}}", "--ratio={{ratio}}", "--n={{n}}"]
    repeatable: true
  - name: release
    description: Release a version.
    parameters:
      version: {type: string}
    command: ["./release.sh", "{{version}}"]
    repeatable: false
"""
TASKS = """
agent: agent.yaml
tasks:
  - id: t
    prompt: Status of billing.
    expect:
      calls:
        - {tool: status, args: {service: [billing, Billing], ratio: 2, n: [1, 2]}}
        - {tool: proj_set, args: {config: {debug: true}, level: [1, 2.5, "x", false]}}
        - {tool: release, args: {version: "1.4.2"}}
"""


def test_a_list_is_any_one_of_its_values_typed_by_the_parameter(tmp_path: Path) -> None:
    write(tmp_path, "agent.yaml", AGENT)
    tasks = load_tasks(write(tmp_path, "tasks.yaml", TASKS))
    expect = tasks.tasks[0].expect
    assert expect is not None
    status, mcp, release = expect.calls
    assert status.args == {
        "service": AnyOf(("billing", "Billing")),
        "ratio": 2.0,
        "n": AnyOf((1, 2)),
    }
    assert status.numbers == frozenset({"ratio"})  # a number parameter's 2 is its 2.0
    assert mcp.args == {"config": {"debug": True}, "level": AnyOf((1, 2.5, "x", False))}
    assert mcp.numbers == frozenset()
    assert release.args == {"version": "1.4.2"}


def test_repeatable_is_read_and_defaults_to_false(tmp_path: Path) -> None:
    write(tmp_path, "agent.yaml", AGENT + "  - {name: ping, description: d, command: [ping]}\n")
    tasks = load_tasks(write(tmp_path, "tasks.yaml", TASKS))
    tools = {t.name: t.repeatable for t in tasks.tasks[0].agent.tools}
    assert tools == {"status": True, "release": False, "ping": False}
