"""The rules that answer a call without running it compare coerced arguments (SPEC §2).

`{"n": 1}` right after `{"n": "1"}` ran is the same release, answered with the earlier result,
not run twice; `repeatable: true` runs it again; a value copied from a description's example,
sent again in a later turn spelled another way, is the same call and runs. The key that decides
"same call" is a property: equal coerced values give equal keys, and only they do.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from mm_batch.config.model import ParamSpec, ParamType, ToolSpec
from mm_batch.run.calls import call_key
from mm_batch.run.loop import REPEAT_REASON
from mm_batch.tools.coercion import same_value
from mm_batch.tools.declared import ValidCall, validate_call
from tests.helpers import write
from tests.run.scripted import answer, calls, run_tasks

AGENT = """
yolo: true
tools:
  - name: release
    description: Release build number n.
    parameters:
      n: {type: integer}
      dry_run: {type: boolean, required: false, default: false}
    command: ["./release.sh", "{{n}}", "--dry-run={{dry_run}}"]
  - name: poll
    description: Poll the status of build number n.
    parameters:
      n: {type: integer}
    command: ["./release.sh", "{{n}}", "--poll"]
    repeatable: true
  - name: notify
    description: Notify a channel.
    parameters:
      channel: {type: string, description: "The channel, e.g. ops-alerts."}
      n: {type: integer}
    command: ["./release.sh", "{{n}}", "--channel={{channel}}"]
"""
# Each run leaves a line: what ran, and how many times, is read back from the file.
RELEASE = """#!/bin/sh
echo "$*" >> ran.txt
echo "released $1"
"""
TASKS = """
agent: agent.yaml
tasks:
  - id: t
    prompt: Release build 1.
"""


def project(tmp_path: Path) -> Path:
    write(tmp_path, "agent.yaml", AGENT)
    write(tmp_path, "release.sh", RELEASE).chmod(0o755)
    return write(tmp_path, "tasks.yaml", TASKS)


def ran(tmp_path: Path) -> list[str]:
    path = tmp_path / "ran.txt"
    return path.read_text().splitlines() if path.exists() else []


def test_the_same_release_spelled_another_way_is_not_run_twice(tmp_path: Path) -> None:
    spellings = ['{"n": 1}', '{"n": "1"}', '{"n": 1.0, "dry_run": "FALSE"}']
    steps = [calls(("release", raw)) for raw in spellings]
    out = run_tasks(project(tmp_path), [*steps, answer("Released.")])
    assert ran(tmp_path) == ["1 --dry-run=false"]
    records = out.records.of("tool")
    assert [(r["outcome"], r["started"]) for r in records] == [
        ("ran", True),
        ("invalid", False),
        ("invalid", False),
    ]
    assert all(r["reason"] == REPEAT_REASON for r in records[1:])


def test_a_repeatable_tool_runs_again(tmp_path: Path) -> None:
    steps = [calls(("poll", '{"n": 1}')), calls(("poll", '{"n": "1"}'))]
    out = run_tasks(project(tmp_path), [*steps, answer("Done.")])
    assert ran(tmp_path) == ["1 --poll", "1 --poll"]
    assert [r["outcome"] for r in out.records.of("tool")] == ["ran", "ran"]


def test_a_copied_example_sent_again_another_way_runs(tmp_path: Path) -> None:
    """Held once as a copied example, the value runs when the model insists, whatever JSON
    spelling of the other arguments it insists with."""
    steps = [
        calls(("notify", '{"channel": "ops-alerts", "n": 1}')),
        calls(("notify", '{"channel": "ops-alerts", "n": "1"}')),
    ]
    out = run_tasks(project(tmp_path), [*steps, answer("Notified.")])
    assert [r["outcome"] for r in out.records.of("tool")] == ["invalid", "ran"]
    assert ran(tmp_path) == ["1 --channel=ops-alerts"]


# -- the key, as a property ------------------------------------------------------------------

RAW = {
    "integer": st.one_of(
        st.integers(-3, 3),
        st.integers(-3, 3).map(str),
        st.sampled_from([1.0, -0.0, 2.0, 2.5, "01", "-0", True]),
    ),
    "number": st.one_of(
        st.integers(-3, 3),
        st.sampled_from([1.0, -0.0, 0.0, 2.5, "2.5", "2.50", "1", "1.0", False]),
    ),
    "boolean": st.sampled_from([True, False, "true", "TRUE", "False", 1, "yes"]),
    "string": st.sampled_from(["1", "true", "a", "", 1]),
    "json": st.sampled_from([1, 1.0, True, "1", [1], [True], {"a": 1}, {"a": True}]),
}


@settings(max_examples=300, deadline=None)
@given(data=st.data(), type_=st.sampled_from(list(RAW)))
def test_two_calls_are_the_same_call_exactly_when_they_coerce_equal(
    data: st.DataObject, type_: ParamType
) -> None:
    tool = ToolSpec(
        "t", "", (ParamSpec("v", type_, "", True, allow_dash=True),), ("p", "{{v}}"), Path()
    )
    first: Any = data.draw(RAW[type_])
    second: Any = data.draw(RAW[type_])
    a = validate_call(tool, json.dumps({"v": first}))
    b = validate_call(tool, json.dumps({"v": second}))
    if not (isinstance(a, ValidCall) and isinstance(b, ValidCall)):
        return
    # A number is the number it is (2 and 2.0, 0 and -0.0); inside an object, type-exact.
    equal = same_value(a.arguments["v"], b.arguments["v"], numeric=True)
    assert (call_key("t", a.arguments) == call_key("t", b.arguments)) == equal, (first, second)
    assert call_key("t", a.arguments) != call_key("u", a.arguments)
