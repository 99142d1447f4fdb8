"""Daemon threads kept for the next job once theirs ended.

A task run and each of its model calls run on a thread of their own, so that the batch can give
up on one that hangs (a thread cannot be stopped; it can be left behind). A new thread for each
cost more than the thread: `Thread.start` waits for the new thread to run, a handoff of the
interpreter lock, and with 16 jobs busy in litellm each such wait took up to a switch interval
(5 ms); at 50 ms a turn that put a run's start and answer behind the others' work.

The threads are daemons, so one still stuck in a hung call never holds up the process's exit,
and each job runs in a fresh `contextvars.Context`, so nothing one job sets there (litellm keeps
per-call state in context variables) reaches the next job on the same thread.
"""

from __future__ import annotations

import contextvars
import queue
import threading
from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")

# Idle threads kept beyond this many end: a burst of jobs leaves no crowd of threads behind.
MAX_IDLE = 64


class Pending(Generic[T]):
    """A job handed to a thread: its result or exception, once it ended."""

    def __init__(self, job: Callable[[], T]) -> None:
        self._job = job
        self._done = threading.Event()
        self._value: T | None = None
        self._error: BaseException | None = None

    def run(self) -> None:
        try:
            self._value = contextvars.Context().run(self._job)
        except BaseException as exc:  # handed to the waiting thread, which decides
            self._error = exc
        finally:
            self._done.set()

    def wait(self, timeout: float | None = None) -> bool:
        """Whether the job ended within `timeout` seconds (`None`: waits as long as it takes)."""
        return self._done.wait(timeout)

    def result(self) -> T:
        """The job's return value, or its exception raised here; only once it ended."""
        assert self._done.is_set(), "wait() until the job ended"
        if self._error is not None:
            raise self._error
        return self._value  # type: ignore[return-value]  # set: the job returned


class _Worker:
    def __init__(self, pool: _Threads, name: str) -> None:
        self._pool = pool
        self.jobs: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()
        threading.Thread(target=self._loop, daemon=True, name=name).start()

    def _loop(self) -> None:
        while True:
            job = self.jobs.get()
            job()
            del job  # its result belongs to whoever waits on it, not to an idle thread
            if not self._pool.rest(self):
                return


class _Threads:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._idle: list[_Worker] = []

    def start(self, job: Callable[[], T], name: str) -> Pending[T]:
        pending = Pending(job)
        with self._lock:
            worker = self._idle.pop() if self._idle else None
        if worker is None:
            worker = _Worker(self, name)
        worker.jobs.put(pending.run)
        return pending

    def rest(self, worker: _Worker) -> bool:
        """Keep `worker` for a next job; False when enough others wait already: it ends."""
        with self._lock:
            if len(self._idle) >= MAX_IDLE:
                return False
            self._idle.append(worker)
            return True


_THREADS = _Threads()


def start(job: Callable[[], T], name: str) -> Pending[T]:
    """Run `job` on a daemon thread (an idle one, or a new one named `name`)."""
    return _THREADS.start(job, name)
