"""What a run's headline reason says: its first cause, and what was in flight when it ended."""

from __future__ import annotations

import itertools
import threading
from pathlib import Path
from typing import Any

import pytest

from mm_batch.run import batch
from mm_batch.run.in_flight import WAITING_FOR_THE_MODEL, InFlight
from mm_batch.run.ports import ModelDeadlineError, ModelReply
from tests.helpers import write, yolo_agent
from tests.run.scripted import calls, run_tasks

ALLOWLIST_AGENT = """
yolo: false
allow:
  - tool: deploy
    args: {env: staging}
tools:
  - name: deploy
    description: Deploy.
    parameters:
      env: {type: string}
    command: ["./deploy.sh", "{{env}}"]
"""


def test_a_refusal_then_the_loop_it_led_to_reports_the_refusal_first(tmp_path: Path) -> None:
    write(tmp_path, "agent.yaml", ALLOWLIST_AGENT)
    write(tmp_path, "deploy.sh", "#!/bin/sh\ntouch deployed\n").chmod(0o755)
    tasks = write(tmp_path, "tasks.yaml", "agent: agent.yaml\ntasks:\n  - {id: t, prompt: go}\n")
    prod = calls(("deploy", '{"env": "prod"}'))
    out = run_tasks(tasks, [prod, prod, prod])
    assert out.result.status == "failed"
    assert out.result.reason.startswith(
        "no_unexpected_refusal: refused: deploy with env=prod is not on this run's allowlist"
    ), out.result.reason
    assert out.result.reason.endswith(
        "; then loop detector: deploy asked for 3 times in a row with the same arguments"
    )
    assert not (tmp_path / "deployed").exists()


# -- a run that timed out names what was in flight, and for how long ---------------------------

NOTE_AGENT = yolo_agent("deploy", "Deploy.", '["./deploy.sh"]')


def _project(tmp_path: Path, timeout: float) -> Path:
    write(tmp_path, "agent.yaml", NOTE_AGENT)
    write(tmp_path, "deploy.sh", "#!/bin/sh\nsleep 30\n").chmod(0o755)
    task = f"  - {{id: t, prompt: go, timeout: {timeout}}}\n"
    return write(tmp_path, "tasks.yaml", f"agent: agent.yaml\ntasks:\n{task}")


@pytest.fixture(autouse=True)
def _in_flight_clock(monkeypatch: pytest.MonkeyPatch) -> None:
    """The clock of what each run of the batch waits on moves 352 s from one reading to the
    next, whenever it is read: a reason names the time between the two readings it took."""
    ticks = itertools.count(1000.0, 352.0).__next__
    monkeypatch.setattr(batch, "InFlight", lambda: InFlight(ticks))


def test_a_model_turn_past_the_deadline_is_named_with_how_long_it_was_awaited(
    tmp_path: Path,
) -> None:
    def deadline(_messages: list[dict[str, Any]], _timeout: float) -> ModelReply:
        raise ModelDeadlineError("the task's deadline came before the model answered")

    out = run_tasks(_project(tmp_path, 600), [deadline])
    assert out.result.status == "failed"
    assert out.result.reason == "task timeout (600 s) reached: waiting for the model since 352 s"
    (task,) = out.records.of("task")
    assert task["reason"] == out.result.reason  # the record says it, as the reports do


def test_a_run_given_up_while_the_model_hangs_names_the_wait(tmp_path: Path) -> None:
    def hang(_messages: list[dict[str, Any]], _timeout: float) -> ModelReply:
        threading.Event().wait(3600)
        raise AssertionError("unreachable")

    out = run_tasks(_project(tmp_path, 0.5), [hang])
    assert out.result.status == "failed"
    # The batch gave up on the run (its thread still waits): the batch read what it waited on.
    assert out.result.reason == "task timeout (0.5 s) reached: waiting for the model since 352 s"


def test_a_tool_running_into_the_deadline_is_named(tmp_path: Path) -> None:
    out = run_tasks(_project(tmp_path, 0.5), [calls(("deploy", "{}"))])
    assert out.result.status == "failed"
    # Since the tool began, not the turn that asked for it (704 s ago).
    assert out.result.reason == "task timeout (0.5 s) reached: tool deploy running since 352 s"


def test_in_flight_says_nothing_once_the_wait_is_over() -> None:
    clock = iter([10.0, 362.0]).__next__
    in_flight = InFlight(clock)
    with in_flight.doing(WAITING_FOR_THE_MODEL):
        assert in_flight.now() == "waiting for the model since 352 s"
    assert in_flight.now() is None
