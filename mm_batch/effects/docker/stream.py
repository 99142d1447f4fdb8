"""An exec's output, read from the engine's stream: split into stdout and stderr, each kept up to
its cap, within a deadline, and for a call, under its timeout, its cancel and the kill.

Measured facts this relies on:
- The SDK turns the socket timeout off on exec streams: each exec's stream is read here, from a
  socket of our own, with select and a deadline, and a quiet stream makes us ask the engine
  whether it still answers, so that a stalled engine fails the call instead of hanging it.
- The stream is read while a timed-out call is killed: an exec flooding its output otherwise
  stalls the engine's other execs (the kill among them) for 20 s.
"""

from __future__ import annotations

import select
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from mm_batch.effects.host import KILL_GRACE_S, Sink
from mm_batch.run.ports import Captured, SandboxError

PROBE_AFTER_S = 10.0  # a call whose stream is quiet this long asks the engine whether it answers
_READ_CHUNK = 65536


class EngineError(Exception):
    """The engine failed or stopped answering, or the container is gone."""


class Frames:
    """Splits the engine's multiplexed exec stream (8-byte headers) into stdout and stderr."""

    def __init__(self, out: Sink, err: Sink) -> None:
        self._buffer = bytearray()
        self._sinks = {1: out, 2: err}
        self._err = err

    def feed(self, data: bytes) -> None:
        self._buffer += data
        while len(self._buffer) >= 8:
            size = int.from_bytes(self._buffer[4:8], "big")
            if len(self._buffer) < 8 + size:
                return
            kind = self._buffer[0]
            self._sinks.get(kind, self._err).add(bytes(self._buffer[8 : 8 + size]))
            del self._buffer[: 8 + size]


class Background:
    """A request to the engine on a thread of its own; `failure` says why it failed."""

    def __init__(self, action: Callable[[], None]) -> None:
        self.began = time.monotonic()
        self.failure: str | None = None
        self._thread = threading.Thread(target=self._run, args=(action,), daemon=True)
        self._thread.name = "mm-batch-sweep"
        self._thread.start()

    def _run(self, action: Callable[[], None]) -> None:
        try:
            action()
        except (EngineError, SandboxError) as exc:
            self.failure = str(exc)
        except Exception as exc:  # a thread must not die silently: the call fails instead
            self.failure = f"internal error: {type(exc).__name__}: {exc}"

    def done(self) -> bool:
        return not self._thread.is_alive()

    def wait(self, timeout: float | None = None) -> bool:
        self._thread.join(timeout)
        return self.done()


def read_to_end(sock: socket.socket, frames: Frames, deadline: float) -> bool:
    """Feed a non-blocking exec stream to `frames` until it ends (True), or until the deadline
    (False): an exec of our own that takes that long is the engine's failure."""
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        readable, _, _ = select.select([sock], [], [], left)
        if not readable:
            continue
        try:
            chunk = sock.recv(_READ_CHUNK)
        except BlockingIOError:
            continue
        if not chunk:
            return True
        frames.feed(chunk)


@dataclass(frozen=True)
class Streamed:
    """What a call's stream carried and how reading it ended: `failure` says why the sandbox
    failed the call (the call's end is then not the engine's to tell)."""

    stdout: Captured
    stderr: Captured
    timed_out: bool = False
    interrupted: bool = False
    failure: str | None = None


@dataclass(frozen=True)
class Watch:
    """What a call's stream is read under: the kill (at the deadline or the cancel), how long
    the kill may take, and the probe asked whenever the stream is quiet (a reason, or None
    while the engine answers and the container runs)."""

    kill: Callable[[], None]
    kill_limit_s: float
    probe: Callable[[], str | None]


def supervise(
    sock: socket.socket,
    log_limit: int,
    begun: float,
    timeout: float,
    cancel: threading.Event | None,
    watch: Watch,
) -> Streamed:
    """Read a call's stream to its end, each output kept up to `log_limit`; at the deadline or
    the cancel the call's processes are killed while the stream is still read."""
    out, err = Sink(log_limit), Sink(log_limit)
    frames = Frames(out, err)

    def failed(reason: str) -> Streamed:
        return Streamed(out.captured(), err.captured(), failure=reason)

    deadline = begun + timeout
    killer: Background | None = None
    killed_at: float | None = None
    timed_out = interrupted = False
    heard = time.monotonic()
    while True:
        now = time.monotonic()
        if killer is None and (now >= deadline or (cancel is not None and cancel.is_set())):
            timed_out, interrupted = now >= deadline, now < deadline
            # The stream is read on while the kill runs: an exec still printing otherwise
            # holds up the engine's other execs, the kill's among them.
            killer = Background(watch.kill)
        if killer is not None and killed_at is None and killer.done():
            if killer.failure is not None:
                return failed(killer.failure)
            killed_at = now
        # Output held open by a process the kill could not reach must not hold us forever.
        if killed_at is not None and now >= killed_at + 2 * KILL_GRACE_S:
            break
        if killer is not None and killed_at is None and now >= killer.began + watch.kill_limit_s:
            return failed("the call's processes could not be stopped in time")
        if now - heard >= PROBE_AFTER_S:
            problem = watch.probe()
            if problem is not None:
                return failed(problem)
            heard = now
        wait = max(0.001, min(0.1, deadline - now if killer is None else 0.05))
        try:
            readable, _, _ = select.select([sock], [], [], wait)
            if not readable:
                continue
            chunk = sock.recv(_READ_CHUNK)
        except BlockingIOError:
            continue
        except OSError as exc:
            return failed(f"the engine's stream broke: {first_line(exc)}")
        if not chunk:
            if killer is not None and killed_at is None:
                killer.wait()  # the stream ended: the kill's word is still needed
                if killer.failure is not None:
                    return failed(killer.failure)
            break
        frames.feed(chunk)
        heard = time.monotonic()
    return Streamed(out.captured(), err.captured(), timed_out, interrupted)


def first_line(exc: BaseException) -> str:
    """The first line of an error's message, at most 300 characters (its type when empty)."""
    text = str(exc).strip().splitlines()
    return text[0][:300] if text else type(exc).__name__
