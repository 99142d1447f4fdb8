"""The verdict fault matrix: every way a task run can go wrong is failed or error, never passed.

Each case runs a real batch in-process (scripted model client, real host processes), and
asserts the verdict, the reason, that the run's task record is its last, and what ran.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from mm_batch.effects.host import HostExecutor
from mm_batch.run import batch as batch_module
from mm_batch.run.ports import (
    ExecResult,
    Executor,
    ModelError,
    ModelReply,
    SandboxError,
)
from tests.helpers import write
from tests.run.scripted import Outcome, ScriptedClient, Step, answer, calls, run_tasks

AGENT = """
yolo: false
allow:
  - tool: mark
tools:
  - name: mark
    description: Leave a marker.
    parameters:
      name: {type: string}
    command: ["./mark.sh", "{{name}}"]
    timeout: 1
  - name: deploy
    description: Deploy.
    command: ["./mark.sh", "deployed"]
"""
MARK = """#!/bin/sh
case "$1" in
  slow) sleep 30 ;;
  fail) echo "quota exceeded" >&2; exit 3 ;;
esac
touch "mark-$1"
"""


def setup(tmp_path: Path, expect: str = "", extra: str = "") -> Path:
    write(tmp_path, "agent.yaml", AGENT)
    write(tmp_path, "mark.sh", MARK).chmod(0o755)
    write(tmp_path, "check.sh", "#!/bin/sh\nexit 1\n").chmod(0o755)
    body = f"""
agent: agent.yaml
tasks:
  - id: t
    prompt: Leave the marker.{extra}
    expect:
      calls: [{{tool: mark, args: {{name: ok}}}}]
{expect}"""
    return write(tmp_path, "tasks.yaml", body)


def marks(tmp_path: Path) -> set[str]:
    return {p.name for p in tmp_path.glob("mark-*")}


def assert_last_is_task(out: Outcome, status: str) -> dict[str, Any]:
    lines = out.records.lines
    assert lines[-1]["kind"] == "task" and lines[-1]["status"] == status, lines[-1]
    assert sum(r["kind"] == "task" for r in lines) == 1
    return lines[-1]


DONE = answer("done")
GOOD = [calls(("mark", '{"name": "ok"}')), DONE]


class RaisingExecutor(HostExecutor):
    """An executor with a bug: every call raises."""

    def execute(self, *args: Any, **kwargs: Any) -> ExecResult:
        raise RuntimeError("executor bug")


class DyingSandbox(HostExecutor):
    """Runs the command, then reports that its container died under it."""

    where = "docker:test"

    def execute(self, *args: Any, **kwargs: Any) -> ExecResult:
        result = super().execute(*args, **kwargs)
        return replace(result, error="the container died", sandbox_failed=True, exit_code=None)


class UnsettledSandbox(HostExecutor):
    """Runs each call; the sweep after the last one could not confirm that its processes are
    gone (a leftover it could not end)."""

    where = "docker:test"

    def settled(self) -> str | None:
        return "what the previous call left could not be cleared away: left 4242"


class ClosingRaises(HostExecutor):
    def close(self) -> None:
        raise RuntimeError("cannot remove the container")


def hang_forever(_messages: list[dict[str, Any]], _timeout: float) -> ModelReply:
    threading.Event().wait(3600)
    raise AssertionError("unreachable")


def test_the_good_run_passes(tmp_path: Path) -> None:
    """The matrix's reference cell: without a fault the same run passes."""
    out = run_tasks(setup(tmp_path), GOOD)
    assert out.result.status == "passed"
    assert_last_is_task(out, "passed")
    assert marks(tmp_path) == {"mark-ok"}


CELLS: list[tuple[str, Sequence[Step], str, str, set[str]]] = [
    ("model unreachable", [ModelError("could not be reached")], "error", "reached", set()),
    ("model client bug", [RuntimeError("bug")], "error", "internal error: RuntimeError", set()),
    ("request refused", [ModelError("the model refused the request")], "error", "refused", set()),
    ("answer without the call", [answer("I released it.")], "failed", "calls[0]", set()),
    ("answer cut", [*GOOD[:1], answer("don", "length")], "failed", "length", {"mark-ok"}),
    ("loop", [calls(("mark", '{"name": "x"}'))] * 3, "failed", "loop detector", {"mark-x"}),
    ("unexpected refusal", [calls(("deploy", "{}")), *GOOD], "failed", "refusal", {"mark-ok"}),
    (
        "tool times out",
        [calls(("mark", '{"name": "slow"}')), answer("ok")],
        "failed",
        "calls",
        set(),
    ),
    ("tool fails", [calls(("mark", '{"name": "fail"}')), answer("ok")], "failed", "calls", set()),
    (
        "invalid calls only",
        [calls(("mark", '{"nam": "ok"}')), answer("ok")],
        "failed",
        "calls",
        set(),
    ),
]


@pytest.mark.parametrize(
    ("fault", "steps", "status", "why", "ran"), CELLS, ids=[c[0] for c in CELLS]
)
def test_a_fault_is_never_a_pass(
    tmp_path: Path, fault: str, steps: Sequence[Step], status: str, why: str, ran: set[str]
) -> None:
    out = run_tasks(setup(tmp_path), steps)
    assert out.result.status == status, (fault, out.result.reason)
    assert why in out.result.reason
    assert_last_is_task(out, status)
    assert marks(tmp_path) == ran  # what really ran; deploy never among it


def test_a_check_that_fails_fails_the_run(tmp_path: Path) -> None:
    out = run_tasks(setup(tmp_path, '      check: ["./check.sh"]\n'), GOOD)
    assert out.result.status == "failed" and "check: exited 1" in out.result.reason
    assert marks(tmp_path) == {"mark-ok"}


def test_a_check_program_that_is_missing_fails_the_run(tmp_path: Path) -> None:
    out = run_tasks(setup(tmp_path, '      check: ["./missing.sh"]\n'), GOOD)
    assert out.result.status == "failed" and "check: could not complete" in out.result.reason


def test_an_executor_bug_is_an_error_with_its_traceback(tmp_path: Path) -> None:
    out = run_tasks(setup(tmp_path), GOOD, executor=RaisingExecutor)
    assert out.result.status == "error"
    assert out.result.reason == "internal error: RuntimeError: executor bug"
    task = assert_last_is_task(out, "error")
    assert "Traceback" in task["traceback"] and "executor bug" in task["traceback"]


def test_a_sandbox_that_dies_mid_call_is_an_error_and_the_call_counts_as_started(
    tmp_path: Path,
) -> None:
    out = run_tasks(setup(tmp_path), GOOD, executor=DyingSandbox)
    assert out.result.status == "error" and "the container died" in out.result.reason
    tool = out.records.of("tool")[0]
    assert (tool["outcome"], tool["started"]) == ("error", True)


def test_a_last_call_whose_sweep_could_not_confirm_makes_the_run_an_error(
    tmp_path: Path,
) -> None:
    """The sweep runs off the call's path, so only a later call or check would read its
    failure: after the last call the run waits for it, and no pass stands on it."""
    out = run_tasks(setup(tmp_path), GOOD, executor=UnsettledSandbox)
    assert out.result.status == "error" and "left 4242" in out.result.reason
    assert out.records.of("tool")[0]["outcome"] == "ran"  # the call itself went well


def test_a_sandbox_that_cannot_start_is_an_error(tmp_path: Path) -> None:
    def no_sandbox() -> Executor:
        raise SandboxError("the Docker engine is unreachable")

    out = run_tasks(setup(tmp_path), GOOD, executor=no_sandbox)
    assert out.result.status == "error"
    assert out.result.reason == "the sandbox is not available: the Docker engine is unreachable"
    assert marks(tmp_path) == set()


def test_a_model_that_cannot_be_had_is_an_error(tmp_path: Path) -> None:
    out = run_tasks(setup(tmp_path), GOOD, client_error=ModelError("llama-server died"))
    assert out.result.status == "error" and out.result.reason == "llama-server died"


def test_a_sandbox_that_cannot_be_removed_keeps_the_verdict(tmp_path: Path) -> None:
    out = run_tasks(setup(tmp_path), GOOD, executor=ClosingRaises)
    assert out.result.status == "passed"


def test_the_task_timeout_while_a_tool_runs_fails_the_run(tmp_path: Path) -> None:
    tasks = setup(tmp_path, extra="\n    timeout: 0.5")
    out = run_tasks(tasks, [calls(("mark", '{"name": "slow"}')), answer("done")])  # sleeps 30 s
    assert out.result.status == "failed"
    assert out.result.reason.startswith("task timeout (0.5 s) reached: tool mark running since ")
    tool = out.records.of("tool")[0]
    assert tool["started"] is True and tool["exit_code"] is None


def test_a_model_that_hangs_past_the_timeout_is_given_up_as_failed(tmp_path: Path) -> None:
    tasks = setup(tmp_path, extra="\n    timeout: 0.5")
    out = run_tasks(tasks, [hang_forever])  # returns at all: the run stopped waiting
    assert out.result.status == "failed"
    assert out.result.reason.startswith(
        "task timeout (0.5 s) reached: waiting for the model since "
    )
    assert_last_is_task(out, "failed")


def test_a_hung_run_does_not_hold_up_the_others(tmp_path: Path) -> None:
    write(tmp_path, "agent.yaml", AGENT)
    write(tmp_path, "mark.sh", MARK).chmod(0o755)
    tasks = write(
        tmp_path,
        "tasks.yaml",
        """
agent: agent.yaml
jobs: 1
tasks:
  - {id: hangs, prompt: hang, timeout: 0.3}
  - {id: fine, prompt: fine}
""",
    )

    def scripted() -> ScriptedClient:
        class ByPrompt(ScriptedClient):
            def complete(
                self, messages: list[dict[str, Any]], tools: list[dict[str, Any]], timeout: float
            ) -> ModelReply:
                if messages[-1]["content"] == "hang":
                    return hang_forever(messages, timeout)
                return answer("fine")

        return ByPrompt([])

    out = run_tasks(tasks, scripted)
    assert [(r.task, r.status) for r in out.results] == [("hangs", "failed"), ("fine", "passed")]


def test_a_hung_run_frees_its_model_s_parallel_slot(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # jobs 2, but the model takes one run at a time: once the hung run is given up, the
    # other starts and passes, although the hung run's thread is still stuck in its call.
    write(tmp_path, "agent.yaml", "model_options: {max_parallel: 1}\n" + AGENT)
    write(tmp_path, "mark.sh", MARK).chmod(0o755)
    tasks = write(
        tmp_path,
        "tasks.yaml",
        """
agent: agent.yaml
jobs: 2
tasks:
  - {id: hangs, prompt: hang, timeout: 0.3}
  - {id: fine, prompt: fine, timeout: 30}
""",
    )
    events: list[str] = []  # the model calls begun and the model's slot handed back, in order

    # The slots are watched where the batch makes them: a hand-back is what a call must wait
    # for, and no record shows it first (giving a run up frees its slot, then writes its verdict).
    class NotedSlots:
        """The model's parallel slots as the batch holds them, each hand-back noted."""

        def __init__(self, slots: threading.Semaphore) -> None:
            self._slots = slots

        def acquire(self) -> bool:
            return self._slots.acquire()

        def release(self) -> None:
            events.append("slot handed back")
            self._slots.release()

    semaphores = batch_module._semaphores
    monkeypatch.setattr(
        batch_module,
        "_semaphores",
        lambda plan: {m: NotedSlots(s) for m, s in semaphores(plan).items()},
    )

    class ByPrompt(ScriptedClient):
        def complete(
            self, messages: list[dict[str, Any]], tools: list[dict[str, Any]], timeout: float
        ) -> ModelReply:
            events.append(f"{messages[-1]['content']} called")
            if messages[-1]["content"] == "hang":
                return hang_forever(messages, timeout)
            return answer("fine")

    outs: list[Outcome] = []
    batch = threading.Thread(
        target=lambda: outs.append(run_tasks(tasks, lambda: ByPrompt([]))), daemon=True
    )
    batch.start()
    batch.join(30)  # a slot never freed would leave "fine" waiting for it forever
    assert outs, "the batch did not end: the hung run kept its model's slot"
    assert [(r.task, r.status) for r in outs[0].results] == [
        ("hangs", "failed"),
        ("fine", "passed"),
    ]
    # One at a time, as max_parallel says: each call begins once the slot of the run before is
    # handed back ("hangs" by being given up), never beside it. "hangs" is dispatched first; the
    # other order would hold the rule as well.
    calls = [e for e in events if e.endswith("called")]
    assert events == [calls[0], "slot handed back", calls[1], "slot handed back"], events


def test_cancel_mid_run_reports_the_run_as_an_interrupted_error(tmp_path: Path) -> None:
    cancel = threading.Event()

    def cancel_then_call(_messages: list[dict[str, Any]], _timeout: float) -> ModelReply:
        cancel.set()
        return calls(("mark", '{"name": "ok"}'))

    out = run_tasks(setup(tmp_path), [cancel_then_call, answer("done")], cancel=cancel)
    assert out.result.status == "error"
    assert out.result.reason == "interrupted before the run finished"
    assert_last_is_task(out, "error")


def test_a_progress_display_that_raises_does_not_stop_the_batch(tmp_path: Path) -> None:
    from mm_batch.config.load import load_tasks
    from mm_batch.config.secrets import Masker
    from mm_batch.plan import Overrides, make_plan
    from mm_batch.run.batch import Effects, run_batch
    from tests.run.scripted import ListRecorder, NoMcp

    plan = make_plan(load_tasks(setup(tmp_path)), Overrides(models=("scripted/model",)))
    client = ScriptedClient(GOOD)
    effects = Effects(lambda _s: client, lambda _s: HostExecutor(), HostExecutor(), NoMcp())

    def broken_progress(_result: Any) -> None:
        raise BrokenPipeError("stderr is gone")

    results = run_batch(
        plan, effects, ListRecorder(), Masker([]), threading.Event(), broken_progress
    )
    assert [r.status for r in results] == ["passed"]


@pytest.mark.parametrize(
    "expect",
    ["no_calls: [mark]", "calls: [{tool: mark, times: 0}]", "exit_code: 0"],
)
def test_a_forbidden_call_that_started_and_timed_out_still_fails_the_negative_checks(
    tmp_path: Path, expect: str
) -> None:
    # `slow` touches nothing before it sleeps, so mark the start from the wrapper itself.
    write(tmp_path, "agent.yaml", AGENT.replace('"./mark.sh"', '"./start-then-mark.sh"', 1))
    write(tmp_path, "mark.sh", MARK).chmod(0o755)
    write(tmp_path, "start-then-mark.sh", '#!/bin/sh\ntouch started\nexec ./mark.sh "$@"\n').chmod(
        0o755
    )
    tasks = write(
        tmp_path,
        "tasks.yaml",
        f"""
agent: agent.yaml
tasks:
  - id: t
    prompt: do not
    expect:
      {expect}
""",
    )
    out = run_tasks(tasks, [calls(("mark", '{"name": "slow"}')), DONE])
    assert (tmp_path / "started").exists()  # the damage was done before the timeout
    record = out.records.of("tool")[0]
    assert (record["outcome"], record["started"]) == ("timeout", True)
    assert out.result.status == "failed", out.result.reason
