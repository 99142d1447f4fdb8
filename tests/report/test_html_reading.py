"""report.html read by a person: what a timed-out run was doing, no `None`, human durations."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mm_batch.jsontypes import JsonObject, JsonValue
from mm_batch.report.html import report_html
from mm_batch.report.readback import LoggedRecord, logged_record
from mm_batch.report.summary import human_duration
from mm_batch.run.records import RunResult, Status
from tests.helpers import dom

TIMED_OUT = "task timeout (600 s) reached: waiting for the model since 352 s"


def result(run_id: str = "t[m]#1", status: Status = "failed", reason: str = TIMED_OUT) -> RunResult:
    return RunResult(run_id, "t", "m", 1, status, reason, (), 600.2, None, ())


def page_text(records: list[LoggedRecord], run: RunResult | None = None) -> str:
    run = run or result()
    return dom(report_html("tasks", [run], {run.run_id: records})).text()


# Each kind of record with every field the schema requires, as calls.jsonl holds it.
FIELDS: dict[str, JsonObject] = {
    "model": {
        "latency_s": 0.5,
        "prompt_tokens": None,
        "completion_tokens": None,
        "finish_reason": None,
        "tool_calls": [],
        "content": None,
        "attempts": 1,
    },
    "tool": {
        "tool": "deploy",
        "raw_arguments": "{}",
        "arguments": {},
        "outcome": "refused",
        "reason": None,
        "rule": None,
        "argv": None,
        "where": "host",
        "started": False,
        "exit_code": None,
        "duration_s": None,
        "stdout": None,
        "stderr": None,
        "stdout_bytes": None,
        "stderr_bytes": None,
        "truncated": False,
        "recovered_from_text": False,
        "hooks": None,
    },
    "task": {"status": "failed", "reason": "", "checks": [], "duration_s": 600.2, "answer": None},
}


def logged(kind: str, ts: str, seq: int, **fields: JsonValue) -> LoggedRecord:
    """A record of run t[m]#1 read back as report.html gets it."""
    identity: JsonObject = {"ts": ts, "run": "t[m]#1", "task": "t", "model": "m", "repeat": 1}
    return logged_record({**identity, "seq": seq, "kind": kind, **FIELDS[kind], **fields})


def task_record(status: str = "failed", reason: str = TIMED_OUT) -> LoggedRecord:
    return logged("task", "2026-01-01T00:10:00.000000Z", 3, status=status, reason=reason)


def test_a_run_that_timed_out_waiting_for_the_model_says_so_in_its_time_line() -> None:
    # No model turn finished: the verdict is the only record, and it says what was in flight.
    page = report_html("tasks", [result()], {"t[m]#1": [task_record()]})
    timeline = page.split("Time line", 1)[1]
    assert "waiting for the model since 352 s" in dom(timeline).text()


def test_no_field_a_record_leaves_out_shows_as_none() -> None:
    """A call that never started has no exit code, rule or duration; a model turn may not know
    its counts or why it finished: the page leaves them out, never prints `None`."""
    tool = logged("tool", "2026-01-01T00:00:01.000000Z", 2)
    model = logged("model", "2026-01-01T00:00:00.000000Z", 1)
    text = page_text([model, tool, task_record()])
    assert "None" not in text
    assert "null" not in text


@pytest.mark.parametrize(
    ("seconds", "shown"),
    [
        (0.004213, "4 ms"),
        (0.35219876, "352 ms"),
        (2.5123456, "2.5 s"),
        (59.94, "59.9 s"),
        (352.123456, "5 min 52 s"),
        (3725.5, "1 h 02 min"),
    ],
)
def test_durations_read_as_a_person_says_them(seconds: float, shown: str) -> None:
    assert human_duration(seconds) == shown


@settings(max_examples=200, deadline=None)
@given(st.floats(min_value=0, max_value=8 * 24 * 3600, allow_nan=False))
def test_no_duration_shows_more_than_one_decimal(seconds: float) -> None:
    shown = human_duration(seconds)
    assert not re.search(r"\.\d\d", shown), shown
    assert re.fullmatch(r"\d+(\.\d)? (ms|s)|\d+ min \d\d s|\d+ h \d\d min", shown), shown


def test_the_page_shows_latencies_and_durations_as_a_person_reads_them() -> None:
    model = logged(
        "model",
        "2026-01-01T00:00:00.000000Z",
        1,
        latency_s=1.234567,
        prompt_tokens=10,
        completion_tokens=5,
        finish_reason="tool_calls",
    )
    tool = logged(
        "tool",
        "2026-01-01T00:00:01.500000Z",
        2,
        outcome="ran",
        started=True,
        argv=["./deploy.sh"],
        exit_code=0,
        rule="allow[0]",
        duration_s=0.012345,
    )
    text = page_text([model, tool, task_record()])
    assert not re.search(r"\d\.\d{3,}", text), text
    assert "1.2 s" in text and "12 ms" in text
