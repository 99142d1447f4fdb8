"""The agent loop over a scripted model client and a list recorder: no HTTP, real processes."""

from __future__ import annotations

import json
from pathlib import Path

from mm_batch.run.ports import ModelDeadlineError, ModelError, ModelReply
from tests.helpers import write
from tests.run.scripted import answer, calls, run_tasks

AGENT = """
yolo: true
builtins: [read_skill]
skills: [skills/]
tools:
  - name: note
    description: Write a note.
    parameters:
      text: {type: string}
    command: ["./note.sh", "{{text}}"]
"""
NOTE = """#!/bin/sh
echo "$1" >> notes.txt
echo "noted: $1"
"""
SKILL = """---
name: releasing
description: How to release.
---
Call note with text released.
"""


def agent_dir(tmp_path: Path, tasks: str) -> Path:
    write(tmp_path, "agent.yaml", AGENT)
    write(tmp_path, "note.sh", NOTE).chmod(0o755)
    write(tmp_path, "skills/releasing/SKILL.md", SKILL)
    return write(tmp_path, "tasks.yaml", tasks)


ONE_TASK = """
agent: agent.yaml
tasks:
  - id: t
    prompt: Take a note.
    expect:
      calls: [{tool: note, args: {text: hello}}]
"""


def notes(tmp_path: Path) -> list[str]:
    path = tmp_path / "notes.txt"
    return path.read_text().splitlines() if path.exists() else []


def test_a_call_runs_and_its_result_comes_back_as_a_tool_message(tmp_path: Path) -> None:
    tasks = agent_dir(tmp_path, ONE_TASK)
    out = run_tasks(tasks, [calls(("note", '{"text": "hello"}')), answer("Noted.")])
    assert out.result.status == "passed", out.result.reason
    assert notes(tmp_path) == ["hello"]
    second = out.client.requests[1]
    assert [m["role"] for m in second] == ["system", "user", "assistant", "tool"]
    assert second[3]["content"].startswith("$ ./note.sh hello\nexit code: 0\nstdout:\nnoted: hello")
    kinds = [r["kind"] for r in out.records.lines]
    assert kinds == ["model", "tool", "model", "task"]
    assert [r["seq"] for r in out.records.lines] == [1, 2, 3, 4]


def test_an_invalid_call_is_answered_and_the_model_may_retry(tmp_path: Path) -> None:
    tasks = agent_dir(tmp_path, ONE_TASK)
    steps = [calls(("note", '{"txt": "hello"}')), calls(("note", '{"text": "hello"}'))]
    out = run_tasks(tasks, [*steps, answer("ok")])
    assert out.result.status == "passed"
    first = out.records.of("tool")[0]
    assert first["outcome"] == "invalid" and first["started"] is False
    assert "unknown parameter 'txt'" in out.client.requests[1][3]["content"]
    assert notes(tmp_path) == ["hello"]


def test_an_unknown_tool_named_like_a_skill_is_answered_with_how_to_read_it(
    tmp_path: Path,
) -> None:
    tasks = agent_dir(tmp_path, ONE_TASK)
    out = run_tasks(tasks, [calls(("releasing", "{}")), answer("gave up")])
    reply = out.client.requests[1][3]["content"]
    assert "There is no tool named 'releasing'" in reply
    assert "read it with read_skill" in reply
    assert out.records.of("tool")[0]["outcome"] == "invalid"
    assert out.result.status == "failed"


def test_the_third_identical_call_in_a_row_is_not_run(tmp_path: Path) -> None:
    tasks = agent_dir(tmp_path, ONE_TASK)
    same = calls(("note", '{"text": "hello"}'))
    out = run_tasks(tasks, [same, same, same, answer("never")])
    # The 2nd came right after the 1st ran with exit 0: answered, not run (test_second_turn.py).
    assert notes(tmp_path) == ["hello"]
    assert [r["outcome"] for r in out.records.of("tool")] == ["ran", "invalid", "loop"]
    last = out.records.of("tool")[-1]
    assert last["outcome"] == "loop" and last["started"] is False
    assert out.result.status == "failed"
    assert out.result.reason.startswith("loop detector: note asked for 3 times in a row")


def test_max_turns_without_an_answer_fails(tmp_path: Path) -> None:
    tasks = agent_dir(
        tmp_path, ONE_TASK.replace("prompt: Take a note.", "prompt: x\n    max_turns: 2")
    )
    steps = [calls(("note", '{"text": "hello"}')), calls(("note", '{"text": "again"}'))]
    out = run_tasks(tasks, steps)
    assert out.result.status == "failed"
    assert out.result.reason == "max_turns (2) reached without a final answer"


def test_an_answer_cut_by_the_token_limit_fails(tmp_path: Path) -> None:
    tasks = agent_dir(tmp_path, ONE_TASK)
    steps = [calls(("note", '{"text": "hello"}')), answer("Noted, and the", "length")]
    out = run_tasks(tasks, steps)
    assert out.result.status == "failed"
    assert "finish_reason: length" in out.result.reason
    assert out.records.of("model")[-1]["finish_reason"] == "length"


def test_the_model_client_hitting_the_deadline_fails_as_a_timeout(tmp_path: Path) -> None:
    tasks = agent_dir(tmp_path, ONE_TASK)
    out = run_tasks(tasks, [ModelDeadlineError("the deadline came first")])
    assert out.result.status == "failed"
    assert out.result.reason.startswith(
        "task timeout (600 s) reached: waiting for the model since "
    )


def test_an_unreachable_model_is_an_error(tmp_path: Path) -> None:
    tasks = agent_dir(tmp_path, ONE_TASK)
    out = run_tasks(tasks, [ModelError("the model could not be reached after 3 tries")])
    assert out.result.status == "error"
    assert out.result.reason == "the model could not be reached after 3 tries"


def test_text_calls_are_rescued_only_when_the_setting_is_on(tmp_path: Path) -> None:
    tasks = agent_dir(tmp_path, ONE_TASK)
    written = ModelReply('{"name": "note", "arguments": {"text": "hello"}}', (), "stop", 1, 1, 0)
    off = run_tasks(tasks, [written])
    assert notes(tmp_path) == [] and off.result.status == "failed"
    from mm_batch.plan import Overrides

    on = run_tasks(
        tasks,
        [written, answer("Noted.")],
        overrides=Overrides(
            models=("scripted/model",), model_options={"recover_text_tool_calls": True}
        ),
    )
    assert notes(tmp_path) == ["hello"] and on.result.status == "passed"
    record = on.records.of("tool")[0]
    assert record["recovered_from_text"] is True
    # The model's turn stays as it was; the result comes back as the next user message.
    assert on.client.requests[1][-1]["role"] == "user"
    assert on.client.requests[1][-2] == {"role": "assistant", "content": written.text}


def test_records_hold_what_the_model_sent_and_what_ran(tmp_path: Path) -> None:
    tasks = agent_dir(tmp_path, ONE_TASK)
    out = run_tasks(tasks, [calls(("note", '{"text": "hello"}')), answer("Noted.")])
    record = out.records.of("tool")[0]
    assert record["raw_arguments"] == '{"text": "hello"}'
    assert record["arguments"] == {"text": "hello"}
    assert record["argv"] == ["./note.sh", "hello"]
    assert (record["outcome"], record["started"], record["exit_code"]) == ("ran", True, 0)
    assert record["rule"] == "yolo" and record["where"] == "host"
    task = out.records.of("task")[0]
    assert task["status"] == "passed" and json.loads(json.dumps(task["checks"]))[0]["ok"]
