"""report.html read by a person: what a timed-out run was doing, no `None`, human durations."""

from __future__ import annotations

import re
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mm_batch.report.html import report_html
from mm_batch.report.summary import human_duration
from mm_batch.run.records import RunResult
from tests.helpers import dom

TIMED_OUT = "task timeout (600 s) reached: waiting for the model since 352 s"


def result(run_id: str = "t[m]#1", status: Any = "failed", reason: str = TIMED_OUT) -> RunResult:
    return RunResult(run_id, "t", "m", 1, status, reason, (), 600.2, None, ())


def page_text(records: list[dict[str, Any]], run: RunResult | None = None) -> str:
    run = run or result()
    return dom(report_html("tasks", [run], {run.run_id: records})).text()


def task_record(status: str = "failed", reason: str = TIMED_OUT) -> dict[str, Any]:
    return {
        "ts": "2026-01-01T00:10:00.000000Z",
        "run": "t[m]#1",
        "seq": 1,
        "kind": "task",
        "status": status,
        "reason": reason,
        "checks": [],
    }


def test_a_run_that_timed_out_waiting_for_the_model_says_so_in_its_time_line() -> None:
    # No model turn finished: the verdict is the only record, and it says what was in flight.
    page = report_html("tasks", [result()], {"t[m]#1": [task_record()]})
    timeline = page.split("Time line", 1)[1]
    assert "waiting for the model since 352 s" in dom(timeline).text()


NONES: dict[str, Any] = {
    "latency_s": None,
    "prompt_tokens": None,
    "completion_tokens": None,
    "finish_reason": None,
    "exit_code": None,
    "rule": None,
    "duration_s": None,
}


def test_no_field_a_record_leaves_out_shows_as_none() -> None:
    """A call that never started has no exit code, rule or duration; a model turn read back
    from older results may lack its counts: the page leaves them out, never prints `None`."""
    tool = {
        "ts": "2026-01-01T00:00:01.000000Z",
        "run": "t[m]#1",
        "seq": 2,
        "kind": "tool",
        "tool": "deploy",
        "outcome": "refused",
        "where": "host",
        "argv": None,
        **NONES,
    }
    model = {"ts": "2026-01-01T00:00:00.000000Z", "run": "t[m]#1", "seq": 1, "kind": "model"}
    model.update(NONES)
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
    model = {
        "ts": "2026-01-01T00:00:00.000000Z",
        "run": "t[m]#1",
        "seq": 1,
        "kind": "model",
        "latency_s": 1.234567,
        "prompt_tokens": 10,
        "completion_tokens": 5,
        "finish_reason": "tool_calls",
    }
    tool = {
        "ts": "2026-01-01T00:00:01.500000Z",
        "run": "t[m]#1",
        "seq": 2,
        "kind": "tool",
        "tool": "deploy",
        "outcome": "ran",
        "where": "host",
        "argv": ["./deploy.sh"],
        "exit_code": 0,
        "rule": "allow[0]",
        "duration_s": 0.012345,
    }
    text = page_text([model, tool, task_record()])
    assert not re.search(r"\d\.\d{3,}", text), text
    assert "1.2 s" in text and "12 ms" in text
