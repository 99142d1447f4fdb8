"""Run every task run of a plan on worker threads, and stop cleanly when cancelled."""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from mm_batch.config.secrets import Masker
from mm_batch.plan import Plan, RunSpec
from mm_batch.run.ports import Executor, HookRunner, McpClient, SandboxError
from mm_batch.run.ports import ModelClient, ModelError
from mm_batch.run.records import Recorder, RunRecorder
from mm_batch.run.task_run import INTERRUPTED, RunResult, TaskRun, error_result

# After a cancel, how long running task runs get to stop before they are reported as errors.
CANCEL_GRACE_S = 3.0


@dataclass(frozen=True)
class Effects:
    """How a batch reaches the outside world: one client per model, one executor per run."""

    client_for: Callable[[RunSpec], ModelClient]  # may raise ModelError
    executor_for: Callable[[RunSpec], Executor]  # may raise SandboxError
    hooks: HookRunner  # runs hooks on the host, wherever the tools run
    mcp: McpClient
    shutdown: Callable[[], None] = lambda: None  # on the way out, whatever happened


class _Slot:
    def __init__(self, spec: RunSpec, recorder: RunRecorder) -> None:
        self.spec = spec
        self.recorder = recorder
        self.started: float | None = None
        self.result: RunResult | None = None


def _semaphores(plan: Plan) -> dict[str, threading.Semaphore]:
    return {model: threading.Semaphore(n) for model, n in plan.parallel_limits.items()}


def run_batch(
    plan: Plan,
    effects: Effects,
    recorder: Recorder,
    masker: Masker,
    cancel: threading.Event,
    on_result: Callable[[RunResult], None] = lambda _: None,
) -> list[RunResult]:
    """Run the plan; return one result per run, in plan order, whatever happened."""
    slots = [
        _Slot(spec, RunRecorder(recorder, spec.run_id, spec.task.id, spec.model, spec.repeat))
        for spec in plan.runs
    ]
    pending: queue.Queue[_Slot] = queue.Queue()
    for slot in slots:
        pending.put(slot)
    limits = _semaphores(plan)
    lock = threading.Lock()
    finished = threading.Condition(lock)
    done = 0

    def work() -> None:
        nonlocal done
        while not cancel.is_set():
            try:
                slot = pending.get_nowait()
            except queue.Empty:
                return
            limit = limits.get(slot.spec.model)
            if limit is not None:
                limit.acquire()
            try:
                result = _run_one(slot, effects, masker, cancel)
            finally:
                if limit is not None:
                    limit.release()
            with finished:
                if slot.result is None:
                    slot.result = result
                    done += 1
                    on_result(result)
                if done == len(slots) or cancel.is_set():  # what the waiting thread waits for
                    finished.notify_all()

    # Daemon threads: an interrupted batch must not wait for a model call still in flight.
    workers = [
        threading.Thread(target=work, daemon=True, name=f"mm-batch-{i}")
        for i in range(max(1, min(plan.jobs, len(slots))))
    ]
    for w in workers:
        w.start()
    with finished:
        while done < len(slots) and not cancel.is_set():
            finished.wait(timeout=0.2)
        if cancel.is_set():
            grace_end = time.monotonic() + CANCEL_GRACE_S
            while done < len(slots) and any(
                s.started is not None and s.result is None for s in slots
            ):
                left = grace_end - time.monotonic()
                if left <= 0:
                    break
                finished.wait(timeout=min(left, 0.1))
            for slot in slots:
                if slot.result is None:
                    slot.result = _close_with_error(slot, INTERRUPTED)
    return [s.result for s in slots if s.result is not None]


def _run_one(slot: _Slot, effects: Effects, masker: Masker, cancel: threading.Event) -> RunResult:
    slot.started = time.monotonic()
    try:
        client = effects.client_for(slot.spec)
    except ModelError as exc:
        return _close_with_error(slot, str(exc))
    try:
        executor = effects.executor_for(slot.spec)
    except SandboxError as exc:
        return _close_with_error(slot, f"the sandbox is not available: {exc}")
    try:
        return TaskRun(
            slot.spec, client, executor, slot.recorder, masker, cancel, effects.hooks, effects.mcp
        ).run()
    finally:
        executor.close()


def _close_with_error(slot: _Slot, reason: str) -> RunResult:
    """Record a run that cannot be judged, and drop whatever its worker still writes."""
    duration = time.monotonic() - slot.started if slot.started is not None else 0.0
    result = error_result(slot.spec, reason, duration)
    slot.recorder.emit(
        "task",
        {
            "status": "error",
            "checks": [],
            "duration_s": round(duration, 6),
            "reason": reason,
            "answer": None,
        },
    )
    slot.recorder.close()
    return result
