"""report.html read by a person: what a timed-out run was doing, no `None`, human durations."""

from __future__ import annotations

import re
from typing import Any

from mm_batch.report.html import report_html
from mm_batch.run.records import RunResult
from tests.consumers.test_xunit_viewer import dom

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
