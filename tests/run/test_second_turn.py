"""The turn after a tool result: what the model is told, and a repeated call right after it ran.

A call asked for again right after it ran to the end with exit code 0 is not run a second time
(a second release is a hazard); it is answered with the result the model already had, recorded
as `invalid` and not started, so `expect.times` and `no_calls` judge only what really ran. The
third identical call in a row is still the loop detector's.
"""

from __future__ import annotations

from pathlib import Path

from mm_batch.plan import Overrides
from mm_batch.run.loop import ANSWER_NOW, REPEAT_REASON, SETTLES
from mm_batch.run.ports import ModelReply
from tests.helpers import write, yolo_agent
from tests.run.scripted import answer, calls, run_tasks

AGENT = yolo_agent("note", "Write a note.", '["./note.sh", "{{text}}"]', "{text: {type: string}}")
# Exits 3 for the text "fail", after writing it down: a call that ran and failed.
NOTE = """#!/bin/sh
echo "$1" >> notes.txt
echo "noted: $1"
[ "$1" = fail ] && exit 3
exit 0
"""
TASKS = """
agent: agent.yaml
tasks:
  - id: t
    prompt: Take a note.
    expect:
      calls: [{tool: note, args: {text: hello}, times: 1}]
"""
RESCUE = Overrides(models=("scripted/model",), model_options={"recover_text_tool_calls": True})


def tasks_file(tmp_path: Path, tasks: str = TASKS) -> Path:
    write(tmp_path, "agent.yaml", AGENT)
    write(tmp_path, "note.sh", NOTE).chmod(0o755)
    return write(tmp_path, "tasks.yaml", tasks)


def notes(tmp_path: Path) -> list[str]:
    path = tmp_path / "notes.txt"
    return path.read_text().splitlines() if path.exists() else []


def written(text: str) -> ModelReply:
    """A turn that writes its call as text, as the 0.5B does."""
    return ModelReply(f'{{"name": "note", "arguments": {{"text": "{text}"}}}}', (), "stop", 1, 1, 0)


def test_the_same_call_right_after_it_succeeded_is_answered_not_run(tmp_path: Path) -> None:
    same = calls(("note", '{"text": "hello"}'))
    out = run_tasks(tasks_file(tmp_path), [same, same, answer("Noted.")])
    assert notes(tmp_path) == ["hello"]
    first, repeat = out.records.of("tool")
    assert (first["outcome"], first["started"]) == ("ran", True)
    assert (repeat["outcome"], repeat["started"]) == ("invalid", False)
    assert repeat["reason"] == REPEAT_REASON
    assert repeat["arguments"] == {"text": "hello"} and repeat["exit_code"] is None
    # times: 1 counts what ran: the answered repeat is not a second call.
    assert out.result.status == "passed", out.result.reason
    reply = out.client.requests[2][-1]
    assert reply["role"] == "tool" and reply["tool_call_id"] == "c0"
    assert reply["content"].startswith("This exact note call already ran just now")
    assert "$ ./note.sh hello\nexit code: 0\nstdout:\nnoted: hello" in reply["content"]
    assert reply["content"].endswith(SETTLES)


def test_the_same_call_twice_in_one_turn_runs_once(tmp_path: Path) -> None:
    twice = calls(("note", '{"text": "hello"}'), ("note", '{"text":"hello"}'))
    out = run_tasks(tasks_file(tmp_path), [twice, answer("Noted.")])
    assert notes(tmp_path) == ["hello"]
    assert [r["outcome"] for r in out.records.of("tool")] == ["ran", "invalid"]
    history = out.client.requests[1]
    assert [m["role"] for m in history] == ["user", "assistant", "tool", "tool"]
    assert [m["tool_call_id"] for m in history[2:]] == ["c0", "c1"]
    assert out.result.status == "passed", out.result.reason


def test_a_call_that_failed_may_run_again(tmp_path: Path) -> None:
    tasks = tasks_file(tmp_path, TASKS.replace("text: hello}, times: 1", "text: fail}, times: 2"))
    same = calls(("note", '{"text": "fail"}'))
    out = run_tasks(tasks, [same, same, answer("It failed twice.")])
    assert notes(tmp_path) == ["fail", "fail"]
    assert [(r["outcome"], r["exit_code"]) for r in out.records.of("tool")] == [
        ("ran", 3),
        ("ran", 3),
    ]
    assert out.result.status == "passed", out.result.reason


def test_the_same_call_after_another_one_runs_again(tmp_path: Path) -> None:
    tasks = tasks_file(tmp_path, TASKS.replace("times: 1", "times: 2"))
    hello, other = calls(("note", '{"text": "hello"}')), calls(("note", '{"text": "other"}'))
    out = run_tasks(tasks, [hello, other, hello, answer("Noted.")])
    assert notes(tmp_path) == ["hello", "other", "hello"]
    assert out.result.status == "passed", out.result.reason


def test_a_third_identical_call_is_still_the_loop_detector(tmp_path: Path) -> None:
    same = calls(("note", '{"text": "hello"}'))
    out = run_tasks(tasks_file(tmp_path), [same, same, same, answer("never")])
    assert notes(tmp_path) == ["hello"]
    assert [r["outcome"] for r in out.records.of("tool")] == ["ran", "invalid", "loop"]
    assert out.result.status == "failed"
    assert out.result.reason.startswith("loop detector: note asked for 3 times in a row")


def test_no_calls_judges_only_what_started(tmp_path: Path) -> None:
    tasks = tasks_file(
        tmp_path,
        TASKS.replace("calls: [{tool: note, args: {text: hello}, times: 1}]", "no_calls: [note]"),
    )
    same = calls(("note", '{"text": "hello"}'))
    out = run_tasks(tasks, [same, same, answer("Noted.")])
    (check,) = [c for c in out.records.of("task")[0]["checks"] if c["check"] == "no_calls:note"]
    assert check["ok"] is False and "started 1 time(s)" in check["detail"]


def test_a_rescued_call_that_ran_asks_for_the_answer(tmp_path: Path) -> None:
    out = run_tasks(tasks_file(tmp_path), [written("hello"), answer("Noted.")], overrides=RESCUE)
    assert out.result.status == "passed", out.result.reason
    result = out.client.requests[1][-1]
    assert result["role"] == "user"
    assert result["content"] == (
        "The note call was answered:\n$ ./note.sh hello\nexit code: 0\nstdout:\nnoted: hello"
        f"\n\n{ANSWER_NOW}"
    )


def test_a_rescued_call_that_did_not_run_leaves_room_to_call_again(tmp_path: Path) -> None:
    wrong = ModelReply('{"name": "note", "arguments": {"txt": "hello"}}', (), "stop", 1, 1, 0)
    steps = [wrong, written("hello"), answer("Noted.")]
    out = run_tasks(tasks_file(tmp_path), steps, overrides=RESCUE)
    assert out.result.status == "passed", out.result.reason
    answered = out.client.requests[1][-1]["content"]
    # Nothing ran: no line to stop on, only what was wrong and how to call again.
    assert "unknown parameter 'txt'" in answered
    assert answered.endswith("Give each parameter as its own field.")
    assert out.client.requests[2][-1]["content"].endswith(ANSWER_NOW)


def test_a_rescued_repeat_is_answered_as_a_user_message(tmp_path: Path) -> None:
    steps = [written("hello"), written("hello"), answer("Noted.")]
    out = run_tasks(tasks_file(tmp_path), steps, overrides=RESCUE)
    assert notes(tmp_path) == ["hello"]
    repeat = out.records.of("tool")[1]
    assert repeat["outcome"] == "invalid" and repeat["recovered_from_text"] is True
    history = out.client.requests[2]
    assert history[-2] == {"role": "assistant", "content": steps[1].text}  # kept as it was
    assert history[-1]["role"] == "user"
    assert history[-1]["content"].startswith("This exact note call already ran just now")
    assert history[-1]["content"].endswith(ANSWER_NOW)
    assert out.result.status == "passed", out.result.reason


def test_a_call_with_an_unknown_parameter_is_answered_with_the_call_without_it(
    tmp_path: Path,
) -> None:
    extra = ModelReply(
        '{"name": "note", "arguments": {"text": "hello", "description": "x"}}', (), "stop", 1, 1, 0
    )
    steps = [extra, written("hello"), answer("Noted.")]
    out = run_tasks(tasks_file(tmp_path), steps, overrides=RESCUE)
    assert out.result.status == "passed", out.result.reason
    answered = out.client.requests[1][-1]["content"]
    assert (
        'Call note again without the unknown parameters: {"name": "note", "arguments": '
        '{"text": "hello"}}'
    ) in answered
    # The invalid call did not run: mm-batch offers the call, it never runs one in its place.
    first = out.records.of("tool")[0]
    assert first["outcome"] == "invalid" and first["started"] is False
    assert notes(tmp_path) == ["hello"]


def test_the_offered_call_runs_only_when_the_model_makes_it(tmp_path: Path) -> None:
    extra = ModelReply(
        '{"name": "note", "arguments": {"text": "hello", "force": true}}', (), "stop", 1, 1, 0
    )
    out = run_tasks(tasks_file(tmp_path), [extra, answer("Done.")], overrides=RESCUE)
    assert out.result.status == "failed"
    assert not (tmp_path / "notes.txt").exists()  # note.sh never ran: nothing was run for it
