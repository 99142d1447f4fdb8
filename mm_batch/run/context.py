"""What one task run talks to, built once per run and passed down.

The run, its loop and its calls take this one value instead of threading the same model
client, executor, hook runner, MCP client, masker, cancel event, pristine copies, recorder and
output sink through three constructors. Everything in it reaches the world through the
protocols of `run/ports.py`.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass

from mm_batch.config.secrets import Masker
from mm_batch.plan import RunSpec
from mm_batch.run.in_flight import InFlight
from mm_batch.run.ports import Executor, HookRunner, McpClient, ModelClient
from mm_batch.run.pristine import Pristine
from mm_batch.run.records import RunRecorder


class Notices:
    """Warnings for the person running the batch, each said once in a batch however many of
    its runs meet it, to the sink the caller gave (the command's stderr)."""

    def __init__(self, sink: Callable[[str], None]) -> None:
        self._sink = sink
        self._said: set[str] = set()
        self._lock = threading.Lock()

    def warn(self, text: str) -> None:
        with self._lock:
            if text in self._said:
                return
            self._said.add(text)
        self._sink(text)


@dataclass(frozen=True)
class RunContext:
    """One task run's collaborators: what it runs (`spec`), what it talks to, where its records
    go, and what it shares with the other runs of its batch (masker, cancel, pristine copies,
    notices)."""

    spec: RunSpec
    client: ModelClient
    executor: Executor
    hooks: HookRunner
    mcp: McpClient
    masker: Masker
    cancel: threading.Event
    pristine: Pristine
    recorder: RunRecorder
    in_flight: InFlight
    notices: Notices
