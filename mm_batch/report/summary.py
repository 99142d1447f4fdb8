"""Verdicts per task and per model, the exit code, and summary.md / summary.json."""

from __future__ import annotations

import json
import string
import unicodedata
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TypeAlias

from mm_batch.errors import ExitCode
from mm_batch.jsontypes import JsonObject
from mm_batch.plan import Plan
from mm_batch.run.batch import EXITFIRST_REASON
from mm_batch.run.records import COST_LIMIT_REASON, RunResult, total_usd, usd

# The reasons of runs the batch did not start (`--max-cost`, `--exitfirst`): never tolerated.
NOT_STARTED = (COST_LIMIT_REASON, EXITFIRST_REASON)

# A value of summary.json's provenance (and of junit.xml's properties): the schema allows no
# nesting. mm-batch writes strings, and `merged_from` a count.
ProvenanceValue: TypeAlias = str | int | float | bool | None
Provenance: TypeAlias = Mapping[str, ProvenanceValue]


@dataclass(frozen=True)
class Coverage:
    """Which part of the whole plan a results folder covers (summary.json's `plan`)."""

    shard: str | None  # K/N of --shard; None for an unsharded run or a merge
    whole_runs: int  # the runs of the whole, unsharded plan

    @staticmethod
    def of(plan: Plan) -> Coverage:
        shard = f"{plan.shard[0]}/{plan.shard[1]}" if plan.shard else None
        return Coverage(shard, plan.whole_runs)


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
    stopped: int = 0  # runs `--max-cost` or `--exitfirst` did not start: never tolerated

    @property
    def pass_rate(self) -> float:
        return self.passed / self.runs if self.runs else 0.0

    @property
    def status(self) -> str:
        if self.runs and self.pass_rate >= self.min_pass_rate and not self.stopped:
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
    # Summed over the model's runs; None when any run's is unknown (no price, older results).
    prompt_tokens: int | None
    completion_tokens: int | None
    cost_usd: float | None

    @property
    def tokens(self) -> str:
        """Prompt/completion tokens, as the tables show them ("-" where unknown)."""
        if self.prompt_tokens is None or self.completion_tokens is None:
            return "-"
        return f"{self.prompt_tokens}/{self.completion_tokens}"

    @property
    def cost(self) -> str:
        return "-" if self.cost_usd is None else usd(self.cost_usd)


def human_duration(seconds: float) -> str:
    """A duration as a person says it: `4 ms`, `2.5 s`, `5 min 52 s`, `1 h 02 min`."""
    if seconds < 0.9995:
        return f"{seconds * 1000:.0f} ms"
    if seconds < 59.95:
        return f"{seconds:.1f} s"
    if seconds < 3599.5:
        minutes, rest = divmod(round(seconds), 60)
        return f"{minutes} min {rest:02d} s"
    hours, minutes = divmod(round(seconds / 60), 60)
    return f"{hours} h {minutes:02d} min"


def _total(values: Sequence[int | None]) -> int | None:
    """The sum, or None when any value is unknown."""
    known = [v for v in values if v is not None]
    return sum(known) if len(known) == len(values) else None


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
            sum(r.status == "error" and r.reason.startswith(NOT_STARTED) for r in rs),
        )
        for (task, model), rs in groups.items()
    ]


def flaky_runs(results: Iterable[RunResult], min_pass_rate: float) -> set[str]:
    """Run ids that did not pass although their task passed on that model: tolerated repeats."""
    results = list(results)
    met = {(v.task, v.model) for v in task_verdicts(results, min_pass_rate) if v.status == "passed"}
    return {r.run_id for r in results if r.status != "passed" and (r.task, r.model) in met}


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
            _total([r.prompt_tokens for r in rs]),
            _total([r.completion_tokens for r in rs]),
            total_usd(r.cost_usd for r in rs),
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
    provenance: Provenance,
    code: int,
    coverage: Coverage,
) -> str:
    verdicts = task_verdicts(results, min_pass_rate)
    data = {
        "suite": suite,
        "provenance": dict(provenance),
        "plan": {"shard": coverage.shard, "whole_runs": coverage.whole_runs},
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
                "prompt_tokens": m.prompt_tokens,
                "completion_tokens": m.completion_tokens,
                "cost_usd": _rounded_usd(m.cost_usd),
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
        "runs": [run_entry(r) for r in results],
    }
    return json.dumps(data, indent=2, ensure_ascii=False, allow_nan=False) + "\n"


def run_entry(result: RunResult) -> JsonObject:
    """A run as summary.json lists it; report/readback.py reads it back."""
    return {
        "run": result.run_id,
        "task": result.task,
        "model": result.model,
        "repeat": result.repeat,
        "status": result.status,
        "reason": result.reason,
        "duration_s": round(result.duration_s, 3),
        "line": result.line,
        "index": result.index,
        "rerun": result.rerun,
        "prompt_tokens": result.prompt_tokens,
        "completion_tokens": result.completion_tokens,
        "cost_usd": _rounded_usd(result.cost_usd),
    }


def _rounded_usd(amount: float | None) -> float | None:
    """To a millionth of a cent: what a float sum adds beyond that is noise."""
    return None if amount is None else round(amount, 8)


# What a model or a command wrote is shown as text wherever it is rendered. In summary.md every
# character that markdown (GitHub's cmark-gfm and its extensions) could read as markup is
# backslash-escaped; the few ASCII punctuation marks left alone cannot start anything inside a
# table cell or a heading, which is where all such text goes. GFM links e-mail addresses even
# when their characters are escaped, so an `@` is followed by a word joiner (U+2060, invisible),
# which also keeps GitHub from reading `@name` as a mention.
_INERT = frozenset(",;?'\"%-=+/")
_MARKDOWN_ACTIVE = frozenset(string.punctuation) - _INERT
WORD_JOINER = "\u2060"
_BIDI_CONTROLS = frozenset("\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069")


def _visible(char: str) -> str:
    """A control character (or a lone surrogate, or a bidi override) as its escape sequence."""
    if char in _BIDI_CONTROLS or unicodedata.category(char) in ("Cc", "Cs"):
        code = ord(char)
        return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"
    return char


def printable(text: str) -> str:
    """The text with each control character spelled out: no escape sequence reaches a screen."""
    return "".join(_visible(c) for c in text)


def one_line(text: str, limit: int = 200) -> str:
    """Text flattened to one printable line: whitespace runs as one space, controls spelled out.

    GitHub's runner still reads the old `##[command]` form anywhere in a line of the log, so
    that form is broken with an invisible word joiner: a reason printed can command nothing.
    """
    flat = printable(" ".join(text.split())).replace("##[", "#" + WORD_JOINER + "#[")
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."


def markdown_text(text: str, limit: int = 300) -> str:
    """A text, whatever it holds, as one line of markdown that renders as exactly that text."""
    flat = one_line(text, limit)
    out: list[str] = []
    for i, char in enumerate(flat):
        if char == "_" and _between_alphanumerics(flat, i):
            out.append(char)  # intraword: can neither open nor close emphasis
        elif char == "@":
            out.append("\\@" + WORD_JOINER)
        elif char in _MARKDOWN_ACTIVE:
            out.append("\\" + char)
        else:
            out.append(char)
    return "".join(out)


def _between_alphanumerics(text: str, i: int) -> bool:
    before, after = text[i - 1 : i], text[i + 1 : i + 2]
    return before.isascii() and before.isalnum() and after.isascii() and after.isalnum()


# GitHub refuses a step summary over 1 MiB whole: 500 rows of at most ~700 bytes stay well under.
SUMMARY_RUNS_LIMIT = 500


def _count(n: int, what: str) -> str:
    return f"{n} {what}" if n == 1 else f"{n} {what}s"


def verdict_line(
    results: Sequence[RunResult], min_pass_rate: float, *, interrupted: bool = False
) -> str:
    """One line saying how the batch went, as the exit code does: per task and model."""
    verdicts = task_verdicts(results, min_pass_rate)
    runs = _count(len(results), "run")
    failed = sum(v.status == "failed" for v in verdicts)
    errors = sum(v.status == "error" for v in verdicts)
    words = {ExitCode.PASSED: "Passed", ExitCode.FAILED: "Failed", ExitCode.ERROR: "Error"}
    word = "Interrupted" if interrupted else words[exit_code(verdicts)]
    # A task on several models is judged on each: then the pairs are what passes or not.
    what = "task" if len({v.model for v in verdicts}) <= 1 else "task and model pair"
    if not failed and not errors:
        n = len(verdicts)
        some = _count(n, what) if n == 1 else f"all {_count(n, what)}"
        return f"**{word}**: {some} passed, {runs}."
    parts = [f"{failed} failed"] * bool(failed) + [f"{errors} could not be judged"] * bool(errors)
    return (
        f"**{word}**: {failed + errors} of {_count(len(verdicts), what)} did not pass "
        f"({', '.join(parts)}), {runs}."
    )


def summary_markdown(
    title: str,
    results: Sequence[RunResult],
    min_pass_rate: float | None = None,
    *,
    report: str | None = None,
    interrupted: bool = False,
) -> str:
    """The title (the tasks file), one verdict line pointing at `report` (report.html's path),
    the per-model table, then every run that did not pass and why, all of it shown as text.

    With `min_pass_rate`, a run that did not pass in a task whose pass rate is met says so.
    """
    rate = 1.0 if min_pass_rate is None else min_pass_rate
    verdict = verdict_line(results, rate, interrupted=interrupted)
    if report is not None:
        verdict += f" Details: {markdown_text(report)}"
    lines = [
        f"## mm-batch: {markdown_text(title)}",
        "",
        verdict,
        "",
        "| Model | Passes/runs | Failed | Errors | Mean s per task | Tokens in/out | Cost USD |",
        "|-------|-------------|--------|--------|-----------------|---------------|----------|",
    ]
    for m in model_lines(results):
        lines.append(
            f"| {markdown_text(m.model)} | {m.passed}/{m.runs} | {m.failed} | {m.errors} "
            f"| {m.mean_s:.1f} | {m.tokens} | {m.cost} |"
        )
    tolerated = set() if min_pass_rate is None else flaky_runs(results, min_pass_rate)
    not_passed = [r for r in results if r.status != "passed"]
    if not_passed:
        lines += ["", "| Run | Status | Why |", "|-----|--------|-----|"]
        for r in not_passed[:SUMMARY_RUNS_LIMIT]:
            status = f"{r.status} (tolerated)" if r.run_id in tolerated else r.status
            lines.append(f"| {markdown_text(r.run_id)} | {status} | {markdown_text(r.reason)} |")
        if len(not_passed) > SUMMARY_RUNS_LIMIT:
            more = len(not_passed) - SUMMARY_RUNS_LIMIT
            lines += ["", f"{more} more runs did not pass: junit.xml and summary.json list them."]
    return "\n".join(lines) + "\n"


def terminal_table(results: Sequence[RunResult]) -> str:
    rows = [("model", "passed/runs", "failed", "errors", "mean s", "tokens in/out", "cost usd")]
    rows += [
        (
            one_line(m.model),
            f"{m.passed}/{m.runs}",
            str(m.failed),
            str(m.errors),
            f"{m.mean_s:.1f}",
            m.tokens,
            m.cost,
        )
        for m in model_lines(results)
    ]
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join(
        "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows
    )
