"""Two results compared task by task: is a drop in passes a regression, or noise?

A run passes or it does not (a failed or erred run is not a pass, as in the summary's pass
rate). Per task and model, the question is whether HEAD's passes are so few, next to BASE's,
that equal pass rates would rarely give them: a one-sided Fisher exact test on the 2x2 table
(passes and non-passes on each side), its p-value the hypergeometric sum over every table with
the same margins and HEAD's passes this low or lower.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from fractions import Fraction

from mm_batch.report.readback import Summary
from mm_batch.report.summary import Provenance, markdown_text, one_line
from mm_batch.run.records import RunResult

DEFAULT_ALPHA = 0.05
# Provenance keys that differ between any two runs and say nothing of what was compared.
_CIRCUMSTANTIAL = frozenset({"started_at", "merged_from"})


def fisher_drop_p(base_passed: int, base_runs: int, head_passed: int, head_runs: int) -> float:
    """P(HEAD passes <= head_passed) when both sides share one pass rate, given the margins.

    Exact: the sum is taken in integers and divided once, so tiny p-values stay exact.
    """
    if not (0 <= base_passed <= base_runs and 0 <= head_passed <= head_runs):
        raise ValueError("passes must lie between 0 and the runs")
    runs = base_runs + head_runs
    passes = base_passed + head_passed
    fails = runs - passes
    lowest = max(0, head_runs - fails)
    tail = sum(
        math.comb(passes, x) * math.comb(fails, head_runs - x)
        for x in range(lowest, head_passed + 1)
    )
    return float(Fraction(tail, math.comb(runs, head_runs)))


@dataclass(frozen=True)
class Side:
    passed: int
    runs: int

    @property
    def rate(self) -> float:
        return self.passed / self.runs if self.runs else 0.0


@dataclass(frozen=True)
class Row:
    """One task and model: both sides where present, and the test when both are."""

    task: str
    model: str
    base: Side | None
    head: Side | None
    p_value: float | None
    regression: bool

    @property
    def new(self) -> bool:
        return self.base is None

    @property
    def vanished(self) -> bool:
        return self.head is None

    @property
    def change(self) -> float | None:
        if self.base is None or self.head is None:
            return None
        return self.head.rate - self.base.rate


@dataclass(frozen=True)
class Difference:
    """A provenance field that is not the same on both sides (None: absent on that side)."""

    key: str
    base: str | None
    head: str | None


@dataclass(frozen=True)
class Comparison:
    alpha: float
    rows: tuple[Row, ...]
    provenance: tuple[Difference, ...]

    @property
    def regressions(self) -> list[Row]:
        return [r for r in self.rows if r.regression]


def _sides(runs: Iterable[RunResult]) -> dict[tuple[str, str], Side]:
    counts: dict[tuple[str, str], list[int]] = {}
    for run in runs:
        tally = counts.setdefault((run.task, run.model), [0, 0])
        tally[0] += run.status == "passed"
        tally[1] += 1
    return {key: Side(passed, total) for key, (passed, total) in counts.items()}


def _differences(base: Provenance, head: Provenance) -> tuple[Difference, ...]:
    keys = sorted((base.keys() | head.keys()) - _CIRCUMSTANTIAL)
    found = []
    for key in keys:
        left, right = base.get(key), head.get(key)
        if left != right:
            found.append(
                Difference(
                    key, None if left is None else str(left), None if right is None else str(right)
                )
            )
    return tuple(found)


def compare(base: Summary, head: Summary, alpha: float = DEFAULT_ALPHA) -> Comparison:
    """Compare two summary.json read back (their runs and provenance)."""
    before, after = _sides(base.runs), _sides(head.runs)
    rows = []
    for key in [*before, *(k for k in after if k not in before)]:
        left, right = before.get(key), after.get(key)
        p_value, regression = None, False
        if left is not None and right is not None:
            p_value = fisher_drop_p(left.passed, left.runs, right.passed, right.runs)
            regression = right.rate < left.rate and p_value <= alpha
        rows.append(Row(key[0], key[1], left, right, p_value, regression))
    provenance = _differences(base.provenance, head.provenance)
    return Comparison(alpha, tuple(rows), provenance)


def _side_text(side: Side | None) -> str:
    return "-" if side is None else f"{side.passed}/{side.runs}"


def _change_text(row: Row) -> str:
    change = row.change
    return "-" if change is None else f"{change * 100:+.0f} pp"


def _p_text(row: Row) -> str:
    return "-" if row.p_value is None else f"{row.p_value:.3g}"


def verdict(row: Row) -> str:
    if row.new:
        return "new"
    if row.vanished:
        return "vanished"
    if row.regression:
        return "REGRESSION"
    change = row.change or 0.0
    return "better" if change > 0 else "worse (noise)" if change < 0 else "same"


def _headline(comparison: Comparison) -> str:
    regressions = len(comparison.regressions)
    if regressions:
        return (
            f"{regressions} regression(s) at alpha {comparison.alpha:g} "
            "(one-sided Fisher exact test on passes/runs)"
        )
    return (
        f"no regression at alpha {comparison.alpha:g} (one-sided Fisher exact test on passes/runs)"
    )


def compare_table(comparison: Comparison) -> str:
    """The terminal table: every row as one printable line, then the provenance differences."""
    rows: list[Sequence[str]] = [("task", "model", "base", "head", "change", "p", "verdict")]
    rows += [
        (
            one_line(r.task, 60),
            one_line(r.model, 60),
            _side_text(r.base),
            _side_text(r.head),
            _change_text(r),
            _p_text(r),
            verdict(r),
        )
        for r in comparison.rows
    ]
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    for d in comparison.provenance:
        lines.append(
            f"provenance {one_line(d.key, 80)}: {one_line(d.base or '(absent)', 120)} -> "
            f"{one_line(d.head or '(absent)', 120)}"
        )
    lines.append(_headline(comparison))
    return "\n".join(lines)


# A pull-request comment stays well under GitHub's 65,536-character limit.
COMPARE_ROWS_LIMIT = 300


def compare_markdown(comparison: Comparison) -> str:
    """compare.md, fit for a pull-request comment: every name from a run shown as text.

    Rows that changed come first (regressions, then other drops, rises, new, vanished); rows
    that stayed the same are counted, not listed.
    """
    order = {"REGRESSION": 0, "worse (noise)": 1, "better": 2, "new": 3, "vanished": 4}
    changed = sorted(
        (r for r in comparison.rows if verdict(r) != "same"), key=lambda r: order[verdict(r)]
    )
    lines = [f"## mm-batch compare: {_headline(comparison)}", ""]
    if changed:
        lines += [
            "| Task | Model | Base | Head | Change | p | Verdict |",
            "|------|-------|------|------|--------|---|---------|",
        ]
        for r in changed[:COMPARE_ROWS_LIMIT]:
            mark = "**REGRESSION**" if r.regression else verdict(r)
            lines.append(
                f"| {markdown_text(r.task)} | {markdown_text(r.model)} | {_side_text(r.base)} "
                f"| {_side_text(r.head)} | {_change_text(r)} | {_p_text(r)} | {mark} |"
            )
        if len(changed) > COMPARE_ROWS_LIMIT:
            more = len(changed) - COMPARE_ROWS_LIMIT
            lines += ["", f"{more} more changed rows: compare.json lists them all."]
        lines.append("")
    same = len(comparison.rows) - len(changed)
    lines.append(f"{same} task and model pair(s) unchanged.")
    if comparison.provenance:
        lines += ["", "| Provenance | Base | Head |", "|------------|------|------|"]
        for d in comparison.provenance:
            lines.append(
                f"| {markdown_text(d.key)} | {markdown_text(d.base or '(absent)')} "
                f"| {markdown_text(d.head or '(absent)')} |"
            )
    return "\n".join(lines) + "\n"


def _side_json(side: Side | None) -> dict[str, int] | None:
    return None if side is None else {"passed": side.passed, "runs": side.runs}


def compare_json(comparison: Comparison) -> str:
    data = {
        "alpha": comparison.alpha,
        "regressions": len(comparison.regressions),
        "rows": [
            {
                "task": r.task,
                "model": r.model,
                "base": _side_json(r.base),
                "head": _side_json(r.head),
                "p_value": r.p_value,
                "regression": r.regression,
                "new": r.new,
                "vanished": r.vanished,
            }
            for r in comparison.rows
        ],
        "provenance": [
            {"key": d.key, "base": d.base, "head": d.head} for d in comparison.provenance
        ],
    }
    return json.dumps(data, indent=2, ensure_ascii=False, allow_nan=False) + "\n"
