"""Run every task run of a plan on worker threads, each under a supervisor.

Whatever a task run raises, in whatever thread, becomes that run's `error` result; a run that
outlives its timeout by more than the grace is given up on as failed; a cancelled batch reports
its unfinished runs as errors. The batch always returns one result per run: none vanishes.
With a cost limit, a run about to start once the batch has spent that much is closed as an
error instead: the runs already started finish.
"""

from __future__ import annotations

import contextlib
import queue
import threading
import time
import traceback
from collections.abc import Callable, Collection
from dataclasses import dataclass

from mm_batch.config.local_catalog import LOCAL_PREFIX
from mm_batch.config.secrets import Masker
from mm_batch.jsontypes import JsonObject
from mm_batch.plan import Plan, RunSpec
from mm_batch.run.context import Notices, RunContext
from mm_batch.run.in_flight import InFlight, timeout_reason
from mm_batch.run.loop import INTERRUPTED
from mm_batch.run.ports import (
    Executor,
    HookRunner,
    McpClient,
    ModelClient,
    ModelError,
    SandboxError,
)
from mm_batch.run.pristine import Pristine
from mm_batch.run.records import (
    COST_LIMIT_REASON,
    Recorder,
    RunRecorder,
    RunResult,
    Status,
    total_usd,
    usage,
    usd,
)
from mm_batch.run.task_run import TaskRun, finish, internal_error

# The reason of a run `--exitfirst` did not start, once an earlier run failed or erred.
EXITFIRST_REASON = "not started: --exitfirst"
# After a cancel, how long running task runs get to stop before they are reported as errors.
CANCEL_GRACE_S = 3.0
# How long past its timeout a task run may take to wind down before it is given up on.
OVERRUN_GRACE_S = 4.0
# How often the batch looks for runs past their timeout and grace.
WATCH_S = 0.1


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
        self.in_flight = InFlight()  # what the run waits on now: named if it is given up on

    def elapsed(self) -> float:
        return time.monotonic() - self.started if self.started is not None else 0.0

    def close(self, status: Status, reason: str, trace: str | None = None) -> RunResult:
        """Record a run that ends without a verdict of its own (unless it ended already)."""
        return finish(
            self.spec,
            self.recorder,
            status,
            reason,
            self.elapsed(),
            trace=trace,
        )

    def counted(self, result: RunResult) -> RunResult:
        """The result with the tokens and cost of the run's model turns."""
        return usage(result, self.recorder.turns())


class _Spending:
    """What the batch has spent (USD), summed from the model records as every run's thread
    writes them: a run about to start sees what the runs in flight have spent so far. A turn
    of a model with a price whose cost is unknown (counts a provider did not report, or
    reported as nonsense) cannot be counted: with a limit, that stops the batch too, rather
    than let it spend unseen."""

    def __init__(self, recorder: Recorder, unpriced: Collection[str]) -> None:
        self._recorder = recorder
        self._unpriced = unpriced
        self._lock = threading.Lock()
        self._costs: list[float] = []
        self._uncounted = 0

    def write(self, record: JsonObject) -> None:
        self._recorder.write(record)
        if record.get("kind") != "model":
            return
        cost = record.get("cost_usd")  # 0 for a reply from the cache
        with self._lock:
            if isinstance(cost, float | int):
                self._costs.append(float(cost))
            elif record.get("model") not in self._unpriced:
                self._uncounted += 1

    def limit_reached(self, max_cost: float | None) -> str | None:
        """The reason a run is not started, once what was spent reaches `max_cost`."""
        if max_cost is None:
            return None
        with self._lock:
            costs, uncounted = list(self._costs), self._uncounted
        if uncounted:
            return f"{COST_LIMIT_REASON}: the cost of {uncounted} model turn(s) cannot be counted"
        spent = total_usd(costs)
        if spent is not None and spent < max_cost:
            return None
        shown = "more than a float holds" if spent is None else usd(spent)
        return f"{COST_LIMIT_REASON}: {shown} USD spent of {usd(max_cost)}"


def _dispatch_order(plan: Plan) -> Callable[[_Slot], tuple[int, int]]:
    """The order runs start in: the plan's, but the runs of local models model by model, after
    the others. Local servers take turns on the CPU, and a server batching two of its slots
    gets through them faster than two servers taking turns with one slot each (the plan lists
    runs task by task, so in plan order the runs in flight are mostly one of each model)."""
    rank = {m: n for n, m in enumerate(dict.fromkeys(r.model for r in plan.runs))}

    def key(slot: _Slot) -> tuple[int, int]:
        model = slot.spec.model
        group = 1 + rank[model] if model.startswith(LOCAL_PREFIX) else 0
        return group, slot.spec.index

    return key


def _semaphores(plan: Plan) -> dict[str, threading.Semaphore]:
    return {model: threading.Semaphore(n) for model, n in plan.parallel_limits.items()}


@dataclass(frozen=True)
class BatchContext:
    """What every run of a batch shares, built once per batch: each run's `RunContext` is made
    of it and of what is the run's own."""

    plan: Plan
    effects: Effects
    masker: Masker
    cancel: threading.Event
    pristine: Pristine
    notices: Notices
    spending: _Spending
    on_start: Callable[[str], None]
    on_result: Callable[[RunResult], None]

    def for_run(self, slot: _Slot, client: ModelClient, executor: Executor) -> RunContext:
        return RunContext(
            spec=slot.spec,
            client=client,
            executor=executor,
            hooks=self.effects.hooks,
            mcp=self.effects.mcp,
            masker=self.masker,
            cancel=self.cancel,
            pristine=self.pristine,
            recorder=slot.recorder,
            in_flight=slot.in_flight,
            notices=self.notices,
        )


def run_batch(
    plan: Plan,
    effects: Effects,
    recorder: Recorder,
    masker: Masker,
    cancel: threading.Event,
    on_result: Callable[[RunResult], None] = lambda _: None,
    pristine: Pristine | None = None,
    unpriced: Collection[str] = (),
    on_start: Callable[[str], None] = lambda _run_id: None,
    warn: Callable[[str], None] = lambda _line: None,
) -> list[RunResult]:
    """Run the plan; return one result per run, in plan order, whatever happened. `unpriced`:
    the models (masked) litellm knows no price for, whose calls `--max-cost` counts as 0.
    `on_start` gets the (masked) id of each run as it starts, `on_result` its result; `warn`
    each warning for the person running the batch (once per batch). `pristine`: the files the
    tasks' programs named when the run started; read now when not given (and let go after)."""
    if pristine is None:
        taken = Pristine.take({r.task.id: r.task for r in plan.runs}.values())
        try:
            return run_batch(
                plan, effects, recorder, masker, cancel, on_result, taken, unpriced, on_start, warn
            )
        finally:
            taken.close()
    spending = _Spending(recorder, unpriced)
    slots = [
        _Slot(
            spec,
            RunRecorder(spending, masker, spec.run_id, spec.task.id, spec.model, spec.repeat),
        )
        for spec in plan.runs
    ]
    context = BatchContext(
        plan,
        effects,
        masker,
        cancel,
        pristine,
        Notices(warn),
        spending,
        on_start,
        on_result,
    )
    _Batch(context, slots).run()
    for slot in slots:
        if slot.result is None:
            reason = INTERRUPTED if cancel.is_set() else "internal error: the run never started"
            slot.result = slot.counted(slot.close("error", reason))
    return [s.result for s in slots if s.result is not None]


class _Batch:
    """Worker threads that each run one task run at a time, on their own thread, and the
    calling thread watching them: a run past its timeout and grace is given up on (its thread
    left behind, its model slot freed, another worker started in its place). One watcher for
    all runs, rather than a thread of its own for each: handing a run to another thread and
    back cost two switches of the interpreter lock a run, which at 16 jobs kept each waiting
    behind the others' litellm work."""

    def __init__(self, context: BatchContext, slots: list[_Slot]) -> None:
        plan = context.plan
        self.context = context
        self.plan = plan
        self.cancel = context.cancel
        self.slots = slots
        self.pending: queue.Queue[_Slot] = queue.Queue()
        for slot in sorted(slots, key=_dispatch_order(plan)):
            self.pending.put(slot)
        self.limits = _semaphores(plan)
        self.finished = threading.Condition(threading.Lock())
        self.done = 0
        self.flying: set[_Slot] = set()  # started, and their worker has not returned from them
        self.first_failure: str | None = None  # with --exitfirst: why no run starts any more
        self.workers: list[threading.Thread] = []

    def run(self) -> None:
        for _ in range(max(1, min(self.plan.jobs, len(self.slots)))):
            self._start_worker()
        while True:
            with self.finished:
                if self.done >= len(self.slots) or self.cancel.is_set():
                    break
                self.finished.wait(timeout=WATCH_S)
                overdue = self._overdue()
                if not overdue and not any(w.is_alive() for w in self.workers):
                    break  # every worker is gone: what is left can never start
            for slot in overdue:
                self._give_up(slot)
        if self.cancel.is_set():
            self._cancel_grace()

    def _start_worker(self) -> None:
        # Daemon threads: an interrupted batch must not wait for a model call still in flight.
        worker = threading.Thread(
            target=self._work, daemon=True, name=f"mm-batch-{len(self.workers)}"
        )
        self.workers.append(worker)
        worker.start()

    def _work(self) -> None:
        while not self.cancel.is_set():
            try:
                slot = self.pending.get_nowait()
            except queue.Empty:
                return
            limit = self.limits.get(slot.spec.model)
            if limit is not None:
                limit.acquire()
            with self.finished:
                slot.started = time.monotonic()
                self.flying.add(slot)
            try:
                spending = self.context.spending
                over = self.first_failure or spending.limit_reached(self.plan.max_cost)
                if over is not None:
                    result = slot.close("error", over)
                else:
                    with contextlib.suppress(Exception):  # a progress display never stops a batch
                        self.context.on_start(self.context.masker.text(slot.spec.run_id))
                    result = _run_one(slot, self.context)
            except BaseException as exc:  # never lose a run, even to a bug of the batch
                result = slot.close("error", internal_error(exc), traceback.format_exc())
            with self.finished:
                given_up = slot not in self.flying
                self.flying.discard(slot)
                self._settle(slot, result)
            if given_up:
                return  # the watcher freed this run's model slot and started another worker
            if limit is not None:
                limit.release()

    def _overdue(self) -> list[_Slot]:
        """The runs past their timeout and grace, now given up on (the lock held)."""
        now = time.monotonic()
        overdue = [
            s
            for s in self.flying
            if s.started is not None and now >= s.started + s.spec.task.timeout + OVERRUN_GRACE_S
        ]
        self.flying.difference_update(overdue)
        return overdue

    def _give_up(self, slot: _Slot) -> None:
        limit = self.limits.get(slot.spec.model)
        if limit is not None:
            limit.release()
        if not self.cancel.is_set():
            self._start_worker()
        result = slot.close("failed", timeout_reason(slot.spec.task.timeout, slot.in_flight.now()))
        with self.finished:
            self._settle(slot, result)

    def _settle(self, slot: _Slot, result: RunResult) -> None:
        """Keep a run's first result (the lock held); wake the watcher when it matters."""
        if slot.result is None:
            slot.result = result = slot.counted(result)
            self.done += 1
            if self.plan.exitfirst and result.status != "passed" and self.first_failure is None:
                how = "failed" if result.status == "failed" else "had an error"
                self.first_failure = f"{EXITFIRST_REASON} after {result.run_id} {how}"
            with contextlib.suppress(Exception):  # a progress display never stops a batch
                self.context.on_result(result)
        if self.done == len(self.slots) or self.cancel.is_set():
            self.finished.notify_all()

    def _cancel_grace(self) -> None:
        """After a cancel, the runs in flight get `CANCEL_GRACE_S` to stop on their own."""
        grace_end = time.monotonic() + CANCEL_GRACE_S
        with self.finished:
            while self.done < len(self.slots) and any(
                s.started is not None and s.result is None for s in self.slots
            ):
                left = grace_end - time.monotonic()
                if left <= 0:
                    break
                self.finished.wait(timeout=min(left, 0.1))


def _run_one(slot: _Slot, context: BatchContext) -> RunResult:
    try:
        client = context.effects.client_for(slot.spec)
    except ModelError as exc:
        return slot.close("error", str(exc))
    try:
        executor = context.effects.executor_for(slot.spec)
    except SandboxError as exc:
        return slot.close("error", f"the sandbox is not available: {exc}")
    try:
        return TaskRun(context.for_run(slot, client, executor)).run()
    finally:
        # A sandbox that cannot be removed now is an orphan a later run removes: the verdict
        # of this run stands either way.
        with contextlib.suppress(Exception):
            executor.close()
