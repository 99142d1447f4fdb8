"""What mm-batch prints while and after it runs: progress, the short summary, GitHub annotations.

Everything that came from a model or a command is flattened to one printable line (or, in
workflow commands, escaped as GitHub's toolkit does), so that it can never act as a command or
an escape sequence.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import TextIO

import click

from mm_batch.config.problems import Problem
from mm_batch.report.summary import (
    WORD_JOINER,
    TaskVerdict,
    one_line,
    printable,
    task_verdicts,
)
from mm_batch.run.records import RunResult

__all__ = [
    "ANNOTATION_LIMIT",
    "Progress",
    "escape_data",
    "escape_property",
    "github_annotations",
    "live_terminal",
    "one_line",
    "publish_to_github",
    "short_summary",
    "show_warnings",
]

TICK_S = 0.5  # how often the live line is redrawn while no run finishes
ANNOTATION_LIMIT = 10  # GitHub shows at most 10 error annotations a step
REASON_LIMIT = 300  # characters of a reason in the short summary
RUNNING_SHOWN = 3  # runs in flight the live line names, the longest running first


def show_warnings(warnings: Iterable[Problem]) -> None:
    """Say, on stderr, what is allowed but risky; a warning never changes the exit code."""
    for warning in warnings:
        click.echo(str(warning), err=True)


def live_terminal(stream: TextIO, environ: Mapping[str, str] | None = None) -> bool:
    """Whether the stream is a terminal that understands a redrawn line (not TERM=dumb)."""
    env = os.environ if environ is None else environ
    try:
        tty = stream.isatty()
    except (AttributeError, ValueError):  # closed, or not a real stream
        return False
    return tty and env.get("TERM") != "dumb"


class Progress:
    """On a terminal, one live line (done, passed, failed, elapsed, ETA); else a line a run.

    Used as a context manager, the live line is redrawn every TICK_S while no run finishes, and
    leaving the context ends a line left open (an interrupted batch), so nothing glues onto it.
    """

    def __init__(
        self,
        total: int,
        stream: TextIO | None = None,
        environ: Mapping[str, str] | None = None,
        tick_s: float = TICK_S,
    ) -> None:
        self.total = total
        self.stream = stream or sys.stderr
        self.live = live_terminal(self.stream, environ)
        self.tick_s = tick_s
        self.started = time.monotonic()
        self.done = self.passed = self.failed = self.errors = 0
        self._running: dict[str, float] = {}  # run id -> when it started, in start order
        self._lock = threading.Lock()
        self._open = False  # a live line is on the screen, not yet ended
        self._stop = threading.Event()
        self._ticker: threading.Thread | None = None

    def __enter__(self) -> Progress:
        if self.live:
            with self._lock:
                self._live_line()
            self._ticker = threading.Thread(target=self._tick, daemon=True, name="mm-batch-tick")
            self._ticker.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        """Stop the ticker and end the live line if it is still open."""
        self._stop.set()
        if self._ticker is not None:
            self._ticker.join()
            self._ticker = None
        with self._lock:
            if self._open:
                print(file=self.stream, flush=True)
                self._open = False

    def run_started(self, run_id: str) -> None:
        """A run started: the live line names it until its result comes."""
        with self._lock:
            self._running[run_id] = time.monotonic()
            if self.live:
                self._live_line()

    def __call__(self, result: RunResult) -> None:
        with self._lock:
            self._running.pop(result.run_id, None)
            self.done += 1
            self.passed += result.status == "passed"
            self.failed += result.status == "failed"
            self.errors += result.status == "error"
            if self.live:
                self._live_line()
            else:
                line = (
                    f"[{self.done}/{self.total}] {result.status:<6} {one_line(result.run_id)} "
                    f"({result.duration_s:.1f} s)"
                )
                if result.reason:
                    line += f": {one_line(result.reason)}"
                print(line, file=self.stream, flush=True)

    def _tick(self) -> None:
        while not self._stop.wait(self.tick_s):
            with self._lock:
                if self.done < self.total and not self._stop.is_set():
                    try:
                        self._live_line()
                    except (OSError, ValueError):  # the terminal went away: stop drawing
                        return

    def _live_line(self) -> None:
        """Redraw the line; called with the lock held."""
        elapsed = time.monotonic() - self.started
        if self.done:
            eta = f"ETA {elapsed / self.done * (self.total - self.done):.0f} s"
        else:
            eta = "ETA unknown"
        line = (
            f"{self.done}/{self.total} done, {self.passed} passed, {self.failed} failed, "
            f"{self.errors} errors, {elapsed:.0f} s elapsed, {eta}"
        )
        if self._running:
            now = time.monotonic()
            named = [
                f"{one_line(run_id)} {now - since:.0f} s"
                for run_id, since in list(self._running.items())[:RUNNING_SHOWN]
            ]
            more = len(self._running) - len(named)
            line += "; running: " + ", ".join(named) + (f", +{more} more" if more > 0 else "")
        width = _columns(self.stream)
        if width is not None and len(line) >= width:  # a wrapped line could not be redrawn
            line = line[: max(width - 1, 1)]
        finished = self.done == self.total
        print(f"\r\x1b[2K{line}", end="\n" if finished else "", file=self.stream, flush=True)
        self._open = not finished


def _columns(stream: TextIO) -> int | None:
    try:
        return os.get_terminal_size(stream.fileno()).columns or None
    except (AttributeError, OSError, ValueError):  # not a terminal, or closed
        return None


def short_summary(results: Sequence[RunResult], min_pass_rate: float) -> list[str]:
    """One line per run that did not pass, like pytest's short test summary.

    `FAILED <run> - <reason>` or `ERROR <run> - <reason>`; a run whose task passed anyway (its
    pass rate met `min_pass_rate`) says it was tolerated.
    """
    verdicts = {(v.task, v.model): v for v in task_verdicts(results, min_pass_rate)}
    lines = []
    for r in results:
        if r.status == "passed":
            continue
        line = f"{r.status.upper()} {one_line(r.run_id)} - {one_line(r.reason, REASON_LIMIT)}"
        verdict = verdicts[(r.task, r.model)]
        if verdict.status == "passed":
            line += f" (tolerated: the task passed {verdict.passed}/{verdict.runs} runs)"
        lines.append(line)
    return lines


def escape_data(text: str) -> str:
    """A workflow command's message: %, CR and LF escaped, as GitHub's toolkit does, and the
    old `##[command]` form, which the runner reads anywhere in a line, broken (see one_line)."""
    escaped = text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")
    return escaped.replace("##[", "#" + WORD_JOINER + "#[")


def escape_property(text: str) -> str:
    return escape_data(text).replace(":", "%3A").replace(",", "%2C")


def _printable(text: str) -> str:
    """The text with its controls spelled out, but for CR and LF, which escape_data escapes."""
    return "".join(c if c in "\r\n" else printable(c) for c in text)


def _reason(verdict: TaskVerdict, results: Sequence[RunResult]) -> str:
    """The reason of the first run that made the task fail (or error)."""
    runs = [r for r in results if (r.task, r.model) == (verdict.task, verdict.model)]
    first = next((r for r in runs if r.status == verdict.status), None)
    first = first or next(r for r in runs if r.status != "passed")
    return first.reason or first.status


def github_annotations(
    results: Sequence[RunResult], tasks_file: str, min_pass_rate: float, out_dir: str
) -> list[str]:
    """One ::error per task and model that did not pass, at most ANNOTATION_LIMIT, then a notice.

    Each points at the task's line in the tasks file; its message is the first failing run's
    reason. Repeats of one task on one model make one annotation.
    """
    failing = [v for v in task_verdicts(results, min_pass_rate) if v.status != "passed"]
    lines = []
    for verdict in failing[:ANNOTATION_LIMIT]:
        line_no = next(
            (r.line for r in results if (r.task, r.model) == (verdict.task, verdict.model)), 0
        )
        where = f"file={escape_property(tasks_file)}"
        if line_no > 0:
            where += f",line={line_no}"
        title = escape_property(f"{one_line(verdict.task)} [{one_line(verdict.model)}]")
        message = escape_data(_printable(_reason(verdict, results))[:4096])
        lines.append(f"::error {where},title={title}::{message}")
    more = len(failing) - ANNOTATION_LIMIT
    if more > 0:
        folder = out_dir.rstrip("/") or "."
        lines.append(
            f"::notice title={escape_property('mm-batch')}::"
            + escape_data(
                f"{more} more task and model pair(s) did not pass; all {len(failing)} are in "
                f"{folder}/junit.xml and {folder}/summary.md"
            )
        )
    return lines


def publish_to_github(
    results: Sequence[RunResult],
    summary_md: str,
    *,
    tasks_file: str,
    min_pass_rate: float,
    out_dir: str,
    environ: Mapping[str, str] | None = None,
) -> None:
    """On GitHub Actions: annotations for failed tasks, summary.md on the job's summary page."""
    env = os.environ if environ is None else environ
    if env.get("GITHUB_ACTIONS") == "true":
        for line in github_annotations(results, tasks_file, min_pass_rate, out_dir):
            print(line, flush=True)
    summary = env.get("GITHUB_STEP_SUMMARY")
    if summary:
        try:
            with Path(summary).open("a", encoding="utf-8") as handle:
                handle.write(summary_md + "\n")
        except OSError as exc:  # the reports are written already: say so, change no verdict
            print(
                f"mm-batch: summary.md not appended to GITHUB_STEP_SUMMARY ({summary}): "
                f"{exc.strerror or exc}",
                file=sys.stderr,
            )
