"""What mm-batch prints while and after it runs: progress, and GitHub Actions annotations.

Everything that came from a model or a command is flattened to one line, and escaped in
workflow commands, so that it can never act as one.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TextIO

from mm_batch.run.records import RunResult


def one_line(text: str, limit: int = 200) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."


class Progress:
    """On a terminal, one live line (done, passed, failed, elapsed, ETA); else a line a run."""

    def __init__(self, total: int, stream: TextIO | None = None) -> None:
        self.total = total
        self.stream = stream or sys.stderr
        self.live = self.stream.isatty()
        self.started = time.monotonic()
        self.done = self.passed = self.failed = self.errors = 0
        self._lock = threading.Lock()

    def __call__(self, result: RunResult) -> None:
        with self._lock:
            self.done += 1
            self.passed += result.status == "passed"
            self.failed += result.status == "failed"
            self.errors += result.status == "error"
            if self.live:
                self._live_line()
            else:
                line = (
                    f"[{self.done}/{self.total}] {result.status:<6} {result.run_id} "
                    f"({result.duration_s:.1f} s)"
                )
                if result.reason:
                    line += f": {one_line(result.reason)}"
                print(line, file=self.stream, flush=True)

    def _live_line(self) -> None:
        elapsed = time.monotonic() - self.started
        eta = elapsed / self.done * (self.total - self.done)
        line = (
            f"{self.done}/{self.total} done, {self.passed} passed, {self.failed} failed, "
            f"{self.errors} errors, {elapsed:.0f} s elapsed, ETA {eta:.0f} s"
        )
        end = "\n" if self.done == self.total else ""
        print(f"\r\x1b[2K{line}", end=end, file=self.stream, flush=True)


def escape_data(text: str) -> str:
    """A workflow command's message: %, CR and LF escaped, as GitHub's toolkit does."""
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def escape_property(text: str) -> str:
    return escape_data(text).replace(":", "%3A").replace(",", "%2C")


def github_annotations(results: Sequence[RunResult]) -> list[str]:
    """One ::error line per run that did not pass."""
    return [
        f"::error title={escape_property(f'mm-batch {r.status}: {r.run_id}')}::"
        f"{escape_data(r.reason or r.status)}"
        for r in results
        if r.status != "passed"
    ]


def publish_to_github(
    results: Sequence[RunResult], summary_md: str, environ: Mapping[str, str] | None = None
) -> None:
    """On GitHub Actions: annotations for failed runs, summary.md on the job's summary page."""
    env = os.environ if environ is None else environ
    if env.get("GITHUB_ACTIONS") == "true":
        for line in github_annotations(results):
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
