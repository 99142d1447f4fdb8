"""The records a task run emits, and the small interface they are written through."""

from __future__ import annotations

import threading
from datetime import UTC, datetime
from typing import Any, Literal, Protocol

Outcome = Literal["ran", "refused", "invalid", "timeout", "error", "loop"]
Status = Literal["passed", "failed", "error"]
Kind = Literal["model", "tool", "task"]


def timestamp() -> str:
    """RFC 3339, UTC, microseconds: 2026-12-02T15:04:05.123456Z."""
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class Recorder(Protocol):
    """Where records go (calls.jsonl in production, a list in tests)."""

    def write(self, record: dict[str, Any]) -> None: ...


class RunRecorder:
    """Stamps each record of one task run with its identity and its sequence number."""

    def __init__(self, recorder: Recorder, run: str, task: str, model: str, repeat: int) -> None:
        self._recorder = recorder
        self._identity = {"run": run, "task": task, "model": model, "repeat": repeat}
        self._seq = 0
        self._closed = False
        self._lock = threading.Lock()

    def emit(self, kind: Kind, fields: dict[str, Any]) -> None:
        with self._lock:
            if self._closed:
                return
            self._seq += 1
            record = {"ts": timestamp(), **self._identity, "seq": self._seq, "kind": kind, **fields}
            self._recorder.write(record)

    def close(self) -> None:
        """After the run's last record: later writes (a worker still winding down) are dropped."""
        with self._lock:
            self._closed = True
