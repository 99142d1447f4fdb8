"""Scripted fakes of the run stage's protocols: a batch in-process, without HTTP.

The model client replays a script of replies (or exceptions, or functions of the request); the
recorder is a list; commands run for real through the host executor unless a test swaps it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mm_batch.config.load import load_tasks
from mm_batch.config.model import McpServerSpec
from mm_batch.config.secrets import Masker
from mm_batch.effects.host import HostExecutor
from mm_batch.jsontypes import JsonObject
from mm_batch.plan import Overrides, make_plan
from mm_batch.run.batch import Effects, run_batch
from mm_batch.run.ports import (
    Executor,
    McpClient,
    McpResult,
    McpTool,
    ModelError,
    ModelReply,
    ToolCallRequest,
)
from mm_batch.run.pristine import Pristine
from mm_batch.run.records import RunResult

Step = ModelReply | BaseException | Callable[[list[dict[str, Any]], float], ModelReply]


def answer(text: str, finish_reason: str = "stop") -> ModelReply:
    return ModelReply(text, (), finish_reason, 10, 5, 0.0)


def calls(*pairs: tuple[str, str]) -> ModelReply:
    """A turn asking for tool calls: (name, raw JSON arguments) each."""
    requests = tuple(ToolCallRequest(f"c{i}", n, a) for i, (n, a) in enumerate(pairs))
    return ModelReply(None, requests, "tool_calls", 10, 5, 0.0)


@dataclass
class ScriptedClient:
    """Replays its steps, one per model turn; past the end it answers 'done'."""

    steps: Sequence[Step]
    requests: list[list[dict[str, Any]]] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def complete(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]], timeout: float
    ) -> ModelReply:
        with self._lock:
            n = len(self.requests)
            self.requests.append([dict(m) for m in messages])
        step = self.steps[n] if n < len(self.steps) else answer("done")
        if isinstance(step, BaseException):
            raise step
        if callable(step):
            return step(messages, timeout)
        return step


class NoMcp:
    def list_tools(self, server: McpServerSpec, timeout: float = 30.0) -> list[McpTool]:
        raise AssertionError("no MCP server in this test")

    def call_tool(
        self, server: McpServerSpec, name: str, arguments: JsonObject, timeout: float
    ) -> McpResult:
        raise AssertionError("no MCP server in this test")


@dataclass
class ListRecorder:
    lines: list[dict[str, Any]] = field(default_factory=list)

    def write(self, record: JsonObject) -> None:
        self.lines.append(record)

    def of(self, kind: str) -> list[dict[str, Any]]:
        return [r for r in self.lines if r["kind"] == kind]


@dataclass
class Outcome:
    results: list[RunResult]
    records: ListRecorder
    client: ScriptedClient

    @property
    def result(self) -> RunResult:
        (only,) = self.results
        return only


def run_tasks(
    tasks_file: Path,
    steps: Sequence[Step] | Callable[[], ScriptedClient],
    *,
    executor: Callable[[], Executor] = HostExecutor,
    client_error: ModelError | None = None,
    secrets: Sequence[str] = (),
    cancel: threading.Event | None = None,
    overrides: Overrides | None = None,
    on_start: Callable[[str], None] = lambda _run_id: None,
    mcp: McpClient | None = None,
    warn: Callable[[str], None] = lambda _line: None,
) -> Outcome:
    """Load, plan and run a tasks file in-process on scripted fakes (an MCP client only when
    the test gives one)."""
    plan = make_plan(load_tasks(tasks_file), overrides or Overrides(models=("scripted/model",)))
    client = steps() if callable(steps) else ScriptedClient(steps)

    def client_for(_spec: Any) -> ScriptedClient:
        if client_error is not None:
            raise client_error
        return client

    recorder = ListRecorder()
    pristine = Pristine.take({r.task.id: r.task for r in plan.runs}.values())
    masker = Masker([*secrets, *(s for a in plan.tasks_file.agents for s in a.secrets)])
    effects = Effects(client_for, lambda _spec: executor(), HostExecutor(), mcp or NoMcp())
    try:
        results = run_batch(
            plan,
            effects,
            recorder,
            masker,
            cancel or threading.Event(),
            pristine=pristine,
            on_start=on_start,
            warn=warn,
        )
    finally:
        pristine.close()
    return Outcome(results, recorder, client)
