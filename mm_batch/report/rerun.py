"""`mm-batch run --rerun-failed DIR`: run again what did not pass in DIR, keep the rest of it.

DIR is read whole, and checked as hostile input like a folder given to `merge`, before anything
runs or any result is replaced (DIR may be the `--out` folder itself). The new folder holds DIR's
other runs as they were (their records, test cases and verdicts) and the runs made again, which
carry `rerun: true`.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from collections.abc import Collection, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import click

from mm_batch.config.secrets import Masker
from mm_batch.plan import Plan, PlanError, parse_shard
from mm_batch.report.files import CALLS, JUNIT
from mm_batch.report.junit import JunitPart, junit_part, merge_junit
from mm_batch.report.merge import digests, results_of
from mm_batch.report.readback import (
    LoggedRecord,
    ResultsError,
    read_junit,
    read_records,
    read_summary,
    refusing,
)
from mm_batch.report.summary import Coverage, Provenance, one_line
from mm_batch.run.records import RunResult


@dataclass(frozen=True)
class Previous:
    """A results folder read back: its runs, their test cases and their records."""

    directory: Path
    suite: str
    provenance: Provenance
    coverage: Coverage  # the part of the whole plan DIR covered: a rerun covers the same
    results: tuple[RunResult, ...]
    junit: JunitPart
    records: tuple[LoggedRecord, ...]
    run_ids: frozenset[str]
    started_at: str | None  # when DIR's run began (its provenance), None where not said

    def masked(self, masker: Masker) -> Previous:
        """What DIR kept, with this run's secrets masked too: they may not have been secrets
        when DIR was written."""
        self.junit.mask(masker)
        provenance: Provenance = masker.data(dict(self.provenance))
        return replace(
            self,
            provenance=provenance,
            started_at=None if self.started_at is None else masker.text(self.started_at),
            results=tuple(replace(r, reason=masker.text(r.reason)) for r in self.results),
            records=tuple(r.masked(masker) for r in self.records),
        )

    @property
    def not_passed(self) -> frozenset[str]:
        return frozenset(r.run_id for r in self.results if r.status != "passed")


def read_previous(directory: Path) -> Previous:
    """DIR's summary.json, junit.xml and calls.jsonl, each checked against the others. What an
    older mm-batch did not write (the plan, the provenance) reads as an unsharded plan of DIR's
    runs and no facts."""
    with refusing("nothing ran"):
        summary = read_summary(directory)
        (results,) = results_of([(directory, summary)])
        ids = frozenset(r.run_id for r in results)
        junit = junit_part(read_junit(directory / JUNIT), results, summary.suite, directory)
        records = read_records(directory / CALLS, ids, {r.run_id: r.status for r in results})
    whole_runs = len(results) if summary.whole_runs is None else summary.whole_runs
    coverage = Coverage(summary.shard, whole_runs)
    return Previous(
        directory,
        summary.suite,
        summary.provenance,
        coverage,
        tuple(results),
        junit,
        records,
        ids,
        summary.started_at,
    )


def rerun_plan(plan: Plan, previous: Previous, masker: Masker) -> Plan:
    """The plan narrowed to the runs that failed or erred in DIR, each marked as a rerun.

    DIR must come from this tasks file with the same repeats: a run is found again by its id,
    `<task>[<model>]#<repeat>`, as the reports name it (masked).
    """
    where = previous.directory
    with refusing("nothing ran"):
        if previous.suite != masker.text(plan.suite):
            raise ResultsError(
                f"{where} holds results of {one_line(previous.suite, 80)}, "
                f"not of {one_line(masker.text(plan.suite), 80)}: rerun with the tasks file "
                "that made them"
            )
        repeats = max((r.repeat for r in previous.results), default=plan.repeat)
        if repeats != plan.repeat:
            raise ResultsError(
                f"{where} was run with {repeats} repeat(s), this plan has {plan.repeat}: "
                "rerun with the same --repeat"
            )
        text = previous.coverage.shard
        try:  # the part of the whole plan that DIR covered, and so the rerun
            shard = None if text is None else parse_shard(text)
        except PlanError:
            raise ResultsError(
                f"{where}: its summary.json's plan.shard is not K/N: {one_line(text or '', 40)}"
            ) from None
    again = previous.not_passed
    # A run made again takes the place of the one it replaces, also when tasks were added
    # since: the order of the reports stays DIR's.
    index = {r.run_id: r.index for r in previous.results}
    ids = {masker.text(r.run_id): r for r in plan.runs}  # as the reports name them
    runs = tuple(replace(r, rerun=True, index=index[i]) for i, r in ids.items() if i in again)
    absent = [i for i in ids if i not in previous.run_ids]
    kept_failing = sorted(again - ids.keys())
    if absent:
        click.echo(
            f"mm-batch: {len(absent)} run(s) of the plan are not in {where} and do not run "
            f"(first: {absent[0]}); run without --rerun-failed to run them",
            err=True,
        )
    if kept_failing:
        click.echo(
            f"mm-batch: {len(kept_failing)} run(s) that did not pass in {where} are outside "
            f"this plan and are kept as they were (first: {one_line(kept_failing[0], 120)})",
            err=True,
        )
    if not runs:
        click.echo(f"mm-batch: nothing to rerun: no run of this plan failed in {where}", err=True)
    return replace(plan, runs=runs, shard=shard, whole_runs=previous.coverage.whole_runs)


def warn_if_changed(previous: Previous, provenance: Provenance) -> None:
    """Say so when the files differ from those that made DIR: its kept runs ran those."""
    before, now = digests(previous.provenance), digests(provenance)
    changed = [k.removeprefix("sha256:") for k, v in now.items() if before.get(k) != v]
    if changed:
        click.echo(
            f"mm-batch: {one_line(', '.join(changed), 200)} changed since {previous.directory} "
            "was made: its kept runs ran the earlier version",
            err=True,
        )


def kept_records(previous: Previous, again: Collection[str]) -> list[LoggedRecord]:
    """DIR's records less those of the runs made again (`again`: their ids, masked)."""
    return [r for r in previous.records if r.run not in again]


def with_previous(previous: Previous, new: Sequence[RunResult]) -> list[RunResult]:
    """DIR's runs that were not made again, and the new ones, in plan order."""
    again = {r.run_id for r in new}
    kept = [r for r in previous.results if r.run_id not in again]
    return sorted([*kept, *new], key=lambda r: r.index)


def rerun_junit(
    previous: Previous, new: Sequence[RunResult], new_junit: str, rate: float, out_dir: Path
) -> str:
    """junit.xml of the new runs and of DIR's others, flaky as the whole says. The new
    testsuites come first: their properties are those of this run."""
    again = {r.run_id for r in new}
    part = junit_part(ET.fromstring(new_junit), new, previous.suite, out_dir)
    return merge_junit([part, previous.junit.without(again)], rate)
