"""SIGINT, SIGTERM and SIGHUP during a run: set the cancel event, let the reports be written.

A closed terminal or SSH session (SIGHUP) interrupts a run as Ctrl-C does (SPEC 7): reports
written, unfinished runs errors, exit 130; never a death without reports. The first signal
cancels the run; every later one, until the process exits, changes nothing.
A handler may run between any two bytecodes of the main thread, so it only records the signal
and writes a byte to a pipe: a helper thread sets the cancel event (`Event.set` takes a lock the
interrupted main thread may hold). Once a signal came, the caller's end does not restore the
default handlers: it ignores these signals until exit, since Python itself puts the defaults
back while it shuts down, which would turn a late signal into a death by signal (143).
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType

CANCELLING = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


@contextmanager
def cancel_on_signals(cancel: threading.Event, received: list[int]) -> Iterator[None]:
    """SIGINT, SIGTERM and SIGHUP set the cancel event (the first is kept in `received`); any
    signal received keeps them all ignored after the block, until the process exits."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    read_end, write_end = os.pipe()
    os.set_blocking(write_end, False)  # a storm of signals fills the pipe, never blocks

    def handler(signum: int, _frame: FrameType | None) -> None:
        if not received:
            received.append(signum)
        with contextlib.suppress(OSError):
            os.write(write_end, b"!")

    def set_cancel() -> None:
        try:
            if os.read(read_end, 1):
                cancel.set()
        finally:
            os.close(read_end)

    threading.Thread(target=set_cancel, daemon=True, name="mm-batch-signals").start()
    previous = {s: signal.signal(s, handler) for s in CANCELLING}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, signal.SIG_IGN if received else old)
        # No handler writes any more (a pending one now finds SIG_IGN or the old handler).
        os.close(write_end)
