"""What a task run is doing now, and since when: what the reason of a run that timed out names.

A run that reaches its timeout while the model is still answering, or while a tool still runs,
has no record of that model turn or call yet: without this, its report could say only that
nothing finished. The loop says what it waits on; the batch, giving up on a run, reads it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

WAITING_FOR_THE_MODEL = "waiting for the model"


def tool_running(name: str) -> str:
    return f"tool {name} running"


def check_running(program: str) -> str:
    return f"check {program} running"


def seconds(value: float) -> str:
    """A duration as a person reads it: `352 s`, `2.5 s`."""
    return f"{value:.0f} s" if value >= 10 else f"{value:.1f} s"


def timeout_reason(timeout: float, in_flight: str | None) -> str:
    """`task timeout (600 s) reached: waiting for the model since 352 s`."""
    reason = f"task timeout ({timeout:g} s) reached"
    return reason if in_flight is None else f"{reason}: {in_flight}"


class InFlight:
    """The one thing a run waits on now (a model turn, a tool call, its check), shared between
    the run's thread, which sets it, and the batch's, which reads it."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._what: str | None = None
        self._since = 0.0

    @contextmanager
    def doing(self, what: str) -> Iterator[None]:
        with self._lock:
            self._what, self._since = what, self._clock()
        try:
            yield
        finally:
            with self._lock:
                self._what = None

    def now(self) -> str | None:
        """`waiting for the model since 352 s`, or None when nothing is in flight."""
        with self._lock:
            if self._what is None:
                return None
            return f"{self._what} since {seconds(self._clock() - self._since)}"
