"""Verdicts per task and per model, the exit code, and summary.md / summary.json."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from mm_batch.errors import ExitCode
from mm_batch.run.records import RunResult


@dataclass(frozen=True)
class TaskVerdict:
    """A task on a model over its repeats: passing when passes/runs >= min_pass_rate."""

    task: str
    model: str
    runs: int
    passed: int
    failed: int
    errors: int
    min_pass_rate: float

    @property
    def pass_rate(self) -> float:
        return self.passed / self.runs if self.runs else 0.0

    @property
    def status(self) -> str:
        if self.runs and self.pass_rate >= self.min_pass_rate:
            return "passed"
        return "failed" if self.failed else "error"


@dataclass(frozen=True)
class ModelLine:
    model: str
    runs: int
    passed: int
    failed: int
    errors: int
    mean_s: float


def task_verdicts(results: Sequence[RunResult], min_pass_rate: float) -> list[TaskVerdict]:
    groups: dict[tuple[str, str], list[RunResult]] = {}
    for r in results:
        groups.setdefault((r.task, r.model), []).append(r)
    return [
        TaskVerdict(
            task,
            model,
            len(rs),
            sum(r.status == "passed" for r in rs),
            sum(r.status == "failed" for r in rs),
            sum(r.status == "error" for r in rs),
            min_pass_rate,
        )
        for (task, model), rs in groups.items()
    ]


def model_lines(results: Sequence[RunResult]) -> list[ModelLine]:
    groups: dict[str, list[RunResult]] = {}
    for r in results:
        groups.setdefault(r.model, []).append(r)
    return [
        ModelLine(
            model,
            len(rs),
            sum(r.status == "passed" for r in rs),
            sum(r.status == "failed" for r in rs),
            sum(r.status == "error" for r in rs),
            sum(r.duration_s for r in rs) / len(rs),
        )
        for model, rs in groups.items()
    ]


def exit_code(verdicts: Sequence[TaskVerdict]) -> ExitCode:
    if any(v.status == "failed" for v in verdicts):
        return ExitCode.FAILED
    if any(v.status == "error" for v in verdicts):
        return ExitCode.ERROR
    return ExitCode.PASSED


def summary_json(
    suite: str,
    min_pass_rate: float,
    results: Sequence[RunResult],
    provenance: Mapping[str, Any],
    code: int,
    coverage: Mapping[str, Any],
) -> str:
    verdicts = task_verdicts(results, min_pass_rate)
    data = {
        "suite": suite,
        "provenance": dict(provenance),
        "plan": dict(coverage),
        "min_pass_rate": min_pass_rate,
        "exit_code": code,
        "models": [
            {
                "model": m.model,
                "runs": m.runs,
                "passed": m.passed,
                "failed": m.failed,
                "errors": m.errors,
                "mean_s": round(m.mean_s, 3),
            }
            for m in model_lines(results)
        ],
        "tasks": [
            {
                "task": v.task,
                "model": v.model,
                "runs": v.runs,
                "passed": v.passed,
                "failed": v.failed,
                "errors": v.errors,
                "pass_rate": round(v.pass_rate, 4),
                "status": v.status,
            }
            for v in verdicts
        ],
        "runs": [
            {
                "run": r.run_id,
                "task": r.task,
                "model": r.model,
                "repeat": r.repeat,
                "status": r.status,
                "reason": r.reason,
                "duration_s": round(r.duration_s, 3),
            }
            for r in results
        ],
    }
    return json.dumps(data, indent=2, ensure_ascii=False) + "\n"


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def summary_markdown(suite: str, results: Sequence[RunResult]) -> str:
    lines = [
        f"## mm-batch: {suite}",
        "",
        "| Model | Passes/runs | Failed | Errors | Mean s per task |",
        "|-------|-------------|--------|--------|-----------------|",
    ]
    for m in model_lines(results):
        lines.append(
            f"| {_cell(m.model)} | {m.passed}/{m.runs} | {m.failed} | {m.errors} | {m.mean_s:.1f} |"
        )
    not_passed = [r for r in results if r.status != "passed"]
    if not_passed:
        lines += ["", "| Run | Status | Why |", "|-----|--------|-----|"]
        for r in not_passed:
            lines.append(f"| {_cell(r.run_id)} | {r.status} | {_cell(r.reason[:300])} |")
    return "\n".join(lines) + "\n"


def terminal_table(results: Sequence[RunResult]) -> str:
    rows = [("model", "passed/runs", "failed", "errors", "mean s")]
    rows += [
        (m.model, f"{m.passed}/{m.runs}", str(m.failed), str(m.errors), f"{m.mean_s:.1f}")
        for m in model_lines(results)
    ]
    widths = [max(len(r[i]) for r in rows) for i in range(5)]
    return "\n".join(
        "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows
    )
