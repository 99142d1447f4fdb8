"""The order runs start in: local models' runs model by model (their servers share the CPU, and
one server batching two slots beats two taking turns), every other run in plan order; the
reports keep plan order whatever the order of starts."""

from __future__ import annotations

from pathlib import Path

from mm_batch.plan import Overrides
from tests.helpers import write
from tests.run.scripted import run_tasks

SMALL, LARGE = "local/qwen2.5-coder-0.5b", "local/qwen2.5-coder-1.5b"


def _tasks(tmp_path: Path) -> Path:
    write(tmp_path, "agent.yaml", "yolo: true\n")
    body = "".join(f"  - {{id: t{i}, prompt: p{i}}}\n" for i in range(1, 4))
    return write(tmp_path, "tasks.yaml", f"agent: agent.yaml\njobs: 1\ntasks:\n{body}")


def _started(models: tuple[str, ...], tmp_path: Path) -> tuple[list[str], list[str]]:
    """The models in the order their runs started (jobs: 1), and the results' run ids."""
    outcome = run_tasks(_tasks(tmp_path), [], overrides=Overrides(models=models))
    started = [r["model"] for r in outcome.records.lines if r["kind"] == "task"]
    return started, [r.run_id for r in outcome.results]


def test_the_runs_of_local_models_start_model_by_model_and_report_in_plan_order(
    tmp_path: Path,
) -> None:
    started, reported = _started((SMALL, LARGE), tmp_path)
    assert started == [SMALL, SMALL, SMALL, LARGE, LARGE, LARGE]
    assert reported == [f"t{i}[{m}]#1" for i in range(1, 4) for m in (SMALL, LARGE)]


def test_hosted_models_keep_plan_order_and_start_before_local_ones(tmp_path: Path) -> None:
    started, _ = _started(("hosted_vllm/a", SMALL, "hosted_vllm/b"), tmp_path)
    assert started == [*["hosted_vllm/a", "hosted_vllm/b"] * 3, SMALL, SMALL, SMALL]
