"""Shards' results folders merged into one, as if one machine ran them all (`mm-batch merge`).

Every folder is read back whole and checked (report/readback.py), then checked against the
others: one plan, one mm-batch, every shard once, no run twice.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from mm_batch.errors import ExitCode
from mm_batch.report.files import CALLS, JUNIT, REPORT_HTML, SUMMARY_JSON, SUMMARY_MD
from mm_batch.report.html import group_records, report_html
from mm_batch.report.junit import JunitPart, junit_part, merge_junit
from mm_batch.report.readback import (
    LoggedRecord,
    MergeError,
    Summary,
    read_junit,
    read_records,
    read_summary,
)
from mm_batch.report.summary import (
    Coverage,
    Provenance,
    exit_code,
    flaky_runs,
    one_line,
    summary_json,
    summary_markdown,
    task_verdicts,
)
from mm_batch.run.records import RunResult


def results_of(summaries: Sequence[tuple[Path, Summary]]) -> list[list[RunResult]]:
    """Each folder's runs, in the order of `summaries`; a run in two folders is refused."""
    seen: dict[str, Path] = {}
    indexes: dict[int, str] = {}
    folders: list[list[RunResult]] = []
    for directory, summary in summaries:
        for run in summary.runs:
            if run.run_id in seen:
                raise MergeError(
                    f"run {one_line(run.run_id, 120)} is in both {seen[run.run_id]} and "
                    f"{directory}: shards must not overlap"
                )
            if run.index in indexes:
                raise MergeError(
                    f"runs {one_line(indexes[run.index], 120)} and {one_line(run.run_id, 120)} "
                    f"share the index {run.index}: each run has a place of its own in the plan"
                )
            seen[run.run_id] = directory
            indexes[run.index] = run.run_id
        folders.append(list(summary.runs))
    return folders


def digests(provenance: Provenance) -> dict[str, str]:
    """The `sha256:<file>` facts of a provenance: the files that made the results."""
    return {k: str(v) for k, v in provenance.items() if k.startswith("sha256:")}


def _check_provenance(summaries: Sequence[tuple[Path, Summary]]) -> None:
    """Shards of one plan ran the same files with the same mm-batch; anything else is refused.

    Files are compared by their digests, not their paths: shards started from other working
    directories name the same file differently.
    """

    def identity(summary: Summary) -> tuple[str, list[str], dict[str, str]]:
        files = digests(summary.provenance)
        return str(summary.mm_batch_version), sorted(files.values()), files

    first_dir, (version, sums, files) = summaries[0][0], identity(summaries[0][1])
    for directory, summary in summaries[1:]:
        other_version, other_sums, other_files = identity(summary)
        if other_version != version:
            what = f"mm_batch_version: {version} in {first_dir}, {other_version} in {directory}"
        elif other_sums != sums:
            what = (
                "; ".join(
                    f"{one_line(k, 120)}: {v} in {first_dir}, {other_files.get(k, 'absent')} in "
                    f"{directory}"
                    for k, v in files.items()
                    if v not in other_sums
                )
                or f"their files differ: {sorted(other_files)} in {directory}"
            )
        else:
            continue
        raise MergeError(
            f"{first_dir} and {directory} do not come from the same plan ({one_line(what, 600)}): "
            "merge the shards of one run of one mm-batch over the same files"
        )


def _check_complete(summaries: Sequence[tuple[Path, Summary]]) -> None:
    """Every shard of a plan must be there: a missing one would drop its runs unseen."""
    shards: dict[int, dict[int, tuple[Path, Summary]]] = {}
    for directory, summary in summaries:
        shard = summary.shard
        if shard is None:  # an unsharded run, a merge, or results of an older mm-batch
            continue
        match = re.fullmatch(r"(\d{1,9})/(\d{1,9})", shard)
        if match is None:
            raise MergeError(f"{directory / SUMMARY_JSON}: plan.shard is not K/N: {shard!r}")
        k, n = int(match[1]), int(match[2])
        if not 1 <= k <= n:
            raise MergeError(
                f"{directory / SUMMARY_JSON}: plan.shard {shard} is not K/N with 1 <= K <= N"
            )
        if k in shards.setdefault(n, {}):
            raise MergeError(
                f"shard {k}/{n} is in both {shards[n][k][0]} and {directory}: "
                "shards must not overlap"
            )
        shards[n][k] = (directory, summary)
    for n, parts in sorted(shards.items()):
        if len(parts) < n:  # N can be huge: name the first few missing, count the rest
            missing = (f"{k}/{n}" for k in range(1, n + 1) if k not in parts)
            named = list(itertools.islice(missing, 5))
            more = n - len(parts) - len(named)
            raise MergeError(
                f"shard {', '.join(named)}{f' and {more} more' if more else ''} missing: its "
                "runs would be absent from the merged report; merge the results folder of "
                "every shard"
            )
        planned = {summary.whole_runs for _, summary in parts.values()}
        found = sum(len(summary.runs) for _, summary in parts.values())
        if planned != {found}:
            raise MergeError(
                f"the {n} shards hold {found} runs but were cut from plans of "
                f"{', '.join(map(str, sorted(planned, key=str)))}: they come from different runs"
            )


def _check_flaky(directory: Path, summary: Summary, part: JunitPart) -> None:
    """An unsharded folder's junit.xml shows as flaky the very runs its min_pass_rate makes
    flaky: one that does not was written under another rate (summary.json's edited, which
    would turn its failures into passes here). A shard's were judged on its runs alone, and
    an older mm-batch (no plan said) may not have written flaky runs."""
    if summary.shard is not None or summary.whole_runs is None:
        return
    flaky = flaky_runs(summary.runs, summary.min_pass_rate)
    for _, run, case in part.cases:
        shown = any(child.tag in ("flakyFailure", "flakyError") for child in case)
        if shown != (run.run_id in flaky):
            raise MergeError(
                f"{directory / JUNIT}: the test case of {one_line(run.run_id, 120)} is "
                f"{'' if shown else 'not '}flaky, but min_pass_rate {summary.min_pass_rate:g} in "
                f"{directory / SUMMARY_JSON} says otherwise: the folder is damaged"
            )


@dataclass(frozen=True)
class Merged:
    """The merged results: every report's text in the order written, and the verdicts."""

    reports: tuple[tuple[str, str], ...]  # (file name, text)
    results: tuple[RunResult, ...]
    min_pass_rate: float
    code: ExitCode  # the exit code the runs would have had as one run


def merge_folders(directories: Sequence[Path]) -> Merged:
    """The results folders of shards, read and checked, as one results folder."""
    summaries = [(d, read_summary(d)) for d in directories]
    rates = {summary.min_pass_rate for _, summary in summaries}
    suites = {summary.suite for _, summary in summaries}
    if len(rates) > 1 or len(suites) > 1:
        raise MergeError(
            "the folders come from different tasks files or min_pass_rate: "
            f"suites {sorted(suites)}, min_pass_rate {sorted(rates)}"
        )
    _check_provenance(summaries)
    _check_complete(summaries)
    (rate,), (suite,) = rates, suites
    folders = results_of(summaries)
    results = sorted((r for runs in folders for r in runs), key=lambda r: r.index)
    parts = [
        junit_part(read_junit(d / JUNIT), runs, suite, d)
        for d, runs in zip(directories, folders, strict=True)
    ]
    for (directory, summary), part in zip(summaries, parts, strict=True):
        _check_flaky(directory, summary, part)
    junit = merge_junit(parts, rate)
    records: list[LoggedRecord] = []
    for directory, runs in zip(directories, folders, strict=True):
        verdicts = {r.run_id: r.status for r in runs}
        records.extend(read_records(directory / CALLS, verdicts, verdicts))
    provenance = dict(summaries[0][1].provenance)
    provenance["merged_from"] = len(directories)
    code = exit_code(task_verdicts(results, rate))
    coverage = Coverage(None, len(results))
    reports = (
        (CALLS, "".join(r.line() for r in records)),
        (JUNIT, junit),
        (SUMMARY_JSON, summary_json(suite, rate, results, provenance, code, coverage)),
        (SUMMARY_MD, summary_markdown(suite, results, rate)),
        (REPORT_HTML, report_html(suite, results, group_records(records))),
    )
    return Merged(reports, tuple(results), rate, code)
