"""SIGINT and SIGTERM during a run: set the cancel event, and let the reports be written."""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType


@contextmanager
def cancel_on_signals(cancel: threading.Event, received: list[int]) -> Iterator[None]:
    """SIGINT and SIGTERM set the cancel event; the reports are still written."""

    def handler(signum: int, _frame: FrameType | None) -> None:
        received.append(signum)
        cancel.set()

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)
