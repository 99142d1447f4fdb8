"""What a run's headline reason says: its first cause, and what was in flight when it ended."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

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


def _seconds_in(reason: str, prefix: str) -> float:
    assert reason.startswith(prefix), reason
    rest = reason[len(prefix) :]
    assert rest.endswith(" s"), reason
    return float(rest[:-2])


def test_a_model_turn_past_the_deadline_is_named_with_how_long_it_was_awaited(
    tmp_path: Path,
) -> None:
    def slow_then_deadline(_messages: list[dict[str, Any]], _timeout: float) -> ModelReply:
        time.sleep(0.4)
        raise ModelDeadlineError("the task's deadline came before the model answered")

    out = run_tasks(_project(tmp_path, 600), [slow_then_deadline])
    assert out.result.status == "failed"
    prefix = "task timeout (600 s) reached: waiting for the model since "
    assert 0.4 <= _seconds_in(out.result.reason, prefix) < 5
    (task,) = out.records.of("task")
    assert task["reason"] == out.result.reason  # the record says it, as the reports do


def test_a_run_given_up_while_the_model_hangs_names_the_wait(tmp_path: Path) -> None:
    def hang(_messages: list[dict[str, Any]], _timeout: float) -> ModelReply:
        threading.Event().wait(3600)
        raise AssertionError("unreachable")

    out = run_tasks(_project(tmp_path, 0.5), [hang])
    assert out.result.status == "failed"
    prefix = "task timeout (0.5 s) reached: waiting for the model since "
    # Given up 4 s past the timeout: the wait had lasted that long.
    assert 4 <= _seconds_in(out.result.reason, prefix) < 6


def test_a_tool_running_into_the_deadline_is_named(tmp_path: Path) -> None:
    out = run_tasks(_project(tmp_path, 0.5), [calls(("deploy", "{}"))])
    assert out.result.status == "failed"
    prefix = "task timeout (0.5 s) reached: tool deploy running since "
    assert 0.3 <= _seconds_in(out.result.reason, prefix) < 5


def test_in_flight_says_nothing_once_the_wait_is_over() -> None:
    clock = iter([10.0, 362.0]).__next__
    in_flight = InFlight(clock)
    with in_flight.doing(WAITING_FOR_THE_MODEL):
        assert in_flight.now() == "waiting for the model since 352 s"
    assert in_flight.now() is None
