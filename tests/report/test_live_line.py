"""On a terminal, the live line names the runs in flight and how long each has run, so that a
batch whose first runs take minutes does not read '0/4 done ... ETA unknown' and nothing else."""

from __future__ import annotations

import io
import threading
from pathlib import Path

from mm_batch.report.terminal import Progress
from mm_batch.run.records import RunResult
from tests.helpers import write
from tests.run.scripted import answer, run_tasks


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def _last_line(stream: io.StringIO) -> str:
    return stream.getvalue().split("\r")[-1].removeprefix("\x1b[2K")


def _result(run_id: str) -> RunResult:
    return RunResult(run_id, "t", "m", 1, "passed", "", (), 1.0, None, ())


def test_the_live_line_names_the_runs_in_flight_until_they_end() -> None:
    stream = _Terminal()
    with Progress(4, stream, environ={"TERM": "xterm"}, tick_s=10) as progress:
        progress.run_started("status-en[m]#1")
        progress.run_started("release-fr[m]#1")
        line = _last_line(stream)
        assert line.startswith("0/4 done, 0 passed, 0 failed, 0 errors, 0 s elapsed, ETA unknown")
        assert line.endswith("; running: status-en[m]#1 0 s, release-fr[m]#1 0 s")
        progress(_result("status-en[m]#1"))
        assert _last_line(stream).endswith("; running: release-fr[m]#1 0 s")


def test_many_runs_in_flight_are_named_by_the_oldest_few() -> None:
    stream = _Terminal()
    with Progress(20, stream, environ={"TERM": "xterm"}, tick_s=10) as progress:
        for i in range(8):
            progress.run_started(f"t{i}[m]#1")
        assert _last_line(stream).endswith(
            "; running: t0[m]#1 0 s, t1[m]#1 0 s, t2[m]#1 0 s, +5 more"
        )


def test_without_a_terminal_no_line_is_printed_when_a_run_starts() -> None:
    stream = io.StringIO()
    with Progress(2, stream, environ={"TERM": "xterm"}) as progress:
        progress.run_started("t[m]#1")
    assert stream.getvalue() == ""


def test_the_batch_says_when_each_run_starts(tmp_path: Path) -> None:
    write(tmp_path, "agent.yaml", "yolo: true\n")
    tasks = write(tmp_path, "tasks.yaml", "agent: agent.yaml\ntasks:\n  - {id: a, prompt: p}\n")
    started: list[str] = []
    lock = threading.Lock()

    def on_start(run_id: str) -> None:
        with lock:
            started.append(run_id)

    out = run_tasks(tasks, [answer("ok")], on_start=on_start)
    assert started == [out.result.run_id] == ["a[scripted/model]#1"]
