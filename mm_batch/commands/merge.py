"""`mm-batch merge DIR... --out DIR`: shards' results into one, as if one machine ran them all."""

from __future__ import annotations

import itertools
import re
import xml.etree.ElementTree as ET
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click

from mm_batch.commands.results import (
    ResultsError,
    read_junit,
    read_records,
    read_summary,
    refusing,
)
from mm_batch.config.secrets import Masker
from mm_batch.errors import ExitCode
from mm_batch.plan import classname
from mm_batch.report.calls_log import record_line
from mm_batch.report.files import (
    CALLS,
    JUNIT,
    REPORT_HTML,
    SUMMARY_JSON,
    SUMMARY_MD,
    ResultsFolder,
    unwritable,
)
from mm_batch.report.html import group_records, report_html
from mm_batch.report.junit import (
    DETAILS_LIMIT,
    MESSAGE_LIMIT,
    SYSTEM_OUT_LIMIT,
    recount,
    serialize,
    set_flaky,
)
from mm_batch.report.summary import (
    exit_code,
    flaky_runs,
    one_line,
    run_result,
    summary_json,
    summary_markdown,
    task_verdicts,
    terminal_table,
)
from mm_batch.report.terminal import short_summary
from mm_batch.run.records import RunResult


class MergeError(ResultsError):
    """Folders that cannot be merged: overlapping, incomplete or from different plans."""


def results_of(summaries: Sequence[tuple[Path, dict[str, Any]]]) -> list[list[RunResult]]:
    """Each folder's runs, in the order of `summaries`; a run in two folders is refused."""
    seen: dict[str, Path] = {}
    indexes: dict[int, str] = {}
    folders: list[list[RunResult]] = []
    for directory, data in summaries:
        results: list[RunResult] = []
        for run in data["runs"]:
            if run["run"] in seen:
                raise MergeError(
                    f"run {one_line(run['run'], 120)} is in both {seen[run['run']]} and "
                    f"{directory}: shards must not overlap"
                )
            if run["index"] in indexes:
                raise MergeError(
                    f"runs {one_line(indexes[run['index']], 120)} and {one_line(run['run'], 120)} "
                    f"share the index {run['index']}: each run has a place of its own in the plan"
                )
            seen[run["run"]] = directory
            indexes[run["index"]] = run["run"]
            results.append(run_result(run))
        folders.append(results)
    return folders


def _check_provenance(summaries: Sequence[tuple[Path, dict[str, Any]]]) -> None:
    """Shards of one plan ran the same files with the same mm-batch; anything else is refused.

    Files are compared by their digests, not their paths: shards started from other working
    directories name the same file differently.
    """

    def identity(data: dict[str, Any]) -> tuple[str, list[str], dict[str, str]]:
        provenance = data.get("provenance") or {}
        files = {k: str(v) for k, v in provenance.items() if k.startswith("sha256:")}
        return str(provenance.get("mm_batch_version")), sorted(files.values()), files

    first_dir, (version, digests, files) = summaries[0][0], identity(summaries[0][1])
    for directory, data in summaries[1:]:
        other_version, other_digests, other_files = identity(data)
        if other_version != version:
            what = f"mm_batch_version: {version} in {first_dir}, {other_version} in {directory}"
        elif other_digests != digests:
            what = (
                "; ".join(
                    f"{one_line(k, 120)}: {v} in {first_dir}, {other_files.get(k, 'absent')} in "
                    f"{directory}"
                    for k, v in files.items()
                    if v not in other_digests
                )
                or f"their files differ: {sorted(other_files)} in {directory}"
            )
        else:
            continue
        raise MergeError(
            f"{first_dir} and {directory} do not come from the same plan ({one_line(what, 600)}): "
            "merge the shards of one run of one mm-batch over the same files"
        )


def _check_complete(summaries: Sequence[tuple[Path, dict[str, Any]]]) -> None:
    """Every shard of a plan must be there: a missing one would drop its runs unseen."""
    shards: dict[int, dict[int, tuple[Path, dict[str, Any]]]] = {}
    for directory, data in summaries:
        shard = (data.get("plan") or {}).get("shard")
        if shard is None:  # an unsharded run, a merge, or results of an older mm-batch
            continue
        match = re.fullmatch(r"(\d{1,9})/(\d{1,9})", str(shard))
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
        shards[n][k] = (directory, data)
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
        planned = {data["plan"].get("whole_runs") for _, data in parts.values()}
        found = sum(len(data["runs"]) for _, data in parts.values())
        if planned != {found}:
            raise MergeError(
                f"the {n} shards hold {found} runs but were cut from plans of "
                f"{', '.join(map(str, sorted(planned, key=str)))}: they come from different runs"
            )


def _merge_calls(
    folders: Sequence[tuple[Path, Sequence[RunResult]]],
) -> tuple[str, list[dict[str, Any]]]:
    """The shards' records, one JSON object a line, and those records read (for report.html)."""
    records: list[dict[str, Any]] = []
    for directory, results in folders:
        records.extend(read_records(directory / CALLS, {r.run_id for r in results}))
    return "".join(map(record_line, records)), records


_CASE_CHILDREN = ("failure", "error", "flakyFailure", "flakyError", "skipped")
_KNOWN_CASE_CHILDREN = frozenset((*_CASE_CHILDREN, "system-out", "system-err"))
_STATUS_OF = {
    "skipped": "skipped",  # mm-batch never skips: agrees with no run's status
    "failure": "failed",
    "flakyFailure": "failed",
    "error": "error",
    "flakyError": "error",
}
_SUITE_ATTRIBUTES = ("name", "timestamp", "hostname", "file")


def _case_copy(case: ET.Element) -> ET.Element:
    """A shard's test case rebuilt from what mm-batch writes, and nothing else a file may hold."""
    copy = ET.Element("testcase", {k: case.get(k, "") for k in ("name", "classname", "time")})
    for child in case:
        if child.tag in _CASE_CHILDREN:
            kept = {k: v for k in ("message", "type") if (v := child.get(k)) is not None}
            verdict = ET.SubElement(copy, child.tag, kept)
            verdict.text = child.text
            trace = child.find("stackTrace")
            if trace is not None:
                ET.SubElement(verdict, "stackTrace").text = trace.text
        elif child.tag in ("system-out", "system-err"):
            ET.SubElement(copy, child.tag).text = child.text
    return copy


def _strange_element(case: ET.Element) -> str | None:
    """The first element in a test case that mm-batch does not write there, if any."""
    for child in case:
        if child.tag not in _KNOWN_CASE_CHILDREN:
            return f"<{one_line(str(child.tag), 60)}>"
        allowed = ("stackTrace",) if child.tag.startswith("flaky") else ()
        for grandchild in child:
            if grandchild.tag not in allowed or len(grandchild):
                return f"<{one_line(str(grandchild.tag), 60)}>"
    return None


def _oversized(case: ET.Element) -> str | None:
    """A text of the test case over what SPEC 7 lets mm-batch write there, if any."""
    for element in case.iter():
        limit = SYSTEM_OUT_LIMIT if element.tag in ("system-out", "system-err") else DETAILS_LIMIT
        if len(element.text or "") > limit:
            return f"a <{element.tag}> text over {limit} characters"
        if len(element.get("message", "")) > MESSAGE_LIMIT:
            return f"a message over {MESSAGE_LIMIT} characters"
    return None


_RFC3339 = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}(\.[0-9]{1,9})?Z")


def _suite_problem(suite: ET.Element) -> str | None:
    """What a testsuite lacks of the attributes mm-batch always writes (SPEC 7), if anything."""
    for name in ("name", "hostname", "file"):
        if not suite.get(name):
            return f"has no {name}"
    if not _RFC3339.fullmatch(suite.get("timestamp", "")):
        return f"has a timestamp that is not RFC 3339 ({one_line(suite.get('timestamp', ''), 40)})"
    return None


def _case_status(case: ET.Element) -> str:
    tags = [c.tag for c in case if c.tag in _STATUS_OF]
    return _STATUS_OF[tags[0]] if len(tags) == 1 else "passed" if not tags else "several"


@dataclass(frozen=True)
class JunitPart:
    """One folder's junit.xml, checked against its summary.json: its testsuites (attributes
    and properties) and its test cases, each with the run it reports."""

    suites: tuple[ET.Element, ...]
    cases: tuple[tuple[str, RunResult, ET.Element], ...]  # (testsuite name, run, test case)

    def without(self, run_ids: Collection[str]) -> JunitPart:
        """The part less the test cases of these runs (run again by `--rerun-failed`)."""
        kept = tuple(c for c in self.cases if c[1].run_id not in run_ids)
        return JunitPart(self.suites, kept)

    def mask(self, masker: Masker) -> None:
        """Mask the texts of the test cases and the suites' property values, in place (the
        secrets of this run, which the folder's own run may not have known)."""
        for _, _, case in self.cases:
            for element in case.iter():
                if element.text:
                    element.text = masker.text(element.text)
                if "message" in element.attrib:
                    element.set("message", masker.text(element.get("message", "")))
        for suite in self.suites:
            for prop in suite.iterfind("properties/property"):
                prop.set("value", masker.text(prop.get("value", "")))


def junit_part(
    root: ET.Element, results: Sequence[RunResult], suite_of_runs: str, directory: Path
) -> JunitPart:
    """The junit.xml of a folder, which must hold exactly its runs, each once, with the verdict
    its summary.json gives: a report that disagrees with the summary (and the exit code) is
    refused."""
    path = directory / JUNIT
    runs: dict[tuple[str, str], RunResult] = {}
    for r in results:
        runs[classname(suite_of_runs, r.model), f"{r.task}#{r.repeat}"] = r
        if r.repeat == 1:  # a plan without repeats names its cases by the task alone
            runs[classname(suite_of_runs, r.model), r.task] = r
    found: set[str] = set()
    suites: list[ET.Element] = []
    cases: list[tuple[str, RunResult, ET.Element]] = []
    for suite in root.iter("testsuite"):
        problem = _suite_problem(suite)
        if problem is not None:
            raise MergeError(f"{path}: a testsuite {problem}: the folder is damaged")
        suites.append(suite)
        for case in suite.iterfind("testcase"):
            label = one_line(f"{case.get('classname')}.{case.get('name')}", 120)
            run = runs.get((case.get("classname", ""), case.get("name", "")))
            if run is None or run.run_id in found:
                what = "is no run of" if run is None else "is twice in the report of"
                raise MergeError(f"{path}: test case {label} {what} {directory}")
            if _case_status(case) != run.status:
                raise MergeError(
                    f"{path}: test case {label} is {_case_status(case)} but "
                    f"{directory / SUMMARY_JSON} says {run.status}: the folder is damaged"
                )
            strange = _strange_element(case) or _oversized(case)
            if strange is not None:
                raise MergeError(
                    f"{path}: test case {label} holds {strange} where mm-batch never writes "
                    "one: the folder is damaged"
                )
            found.add(run.run_id)
            copy = _case_copy(case)
            copy.set("time", f"{run.duration_s:.3f}")  # summary.json's, checked: one source
            cases.append((suite.get("name", ""), run, copy))
    missing = [r.run_id for r in results if r.run_id not in found]
    if missing:
        raise MergeError(f"{path}: no test case for run {one_line(missing[0], 120)}")
    return JunitPart(tuple(suites), tuple(cases))


def merge_junit(parts: Sequence[JunitPart], rate: float) -> str:
    """The parts' test cases (moved, not copied) in plan order within each testsuite, flaky as
    the whole says; a testsuite takes its attributes and properties from the first part that
    has it."""
    root = ET.Element("testsuites")
    suites: dict[str, ET.Element] = {}
    cases: dict[str, list[tuple[RunResult, ET.Element]]] = {}
    for part in parts:
        for suite in part.suites:
            name = suite.get("name", "")
            if name not in suites:
                attributes = {k: v for k in _SUITE_ATTRIBUTES if (v := suite.get(k)) is not None}
                suites[name] = ET.SubElement(root, "testsuite", attributes)
                properties = ET.SubElement(suites[name], "properties")
                for p in suite.iterfind("properties/property"):
                    pair = {"name": p.get("name", ""), "value": p.get("value", "")}
                    ET.SubElement(properties, "property", pair)
            else:
                _widen(suites[name], suite)
        for name, run, case in part.cases:
            cases.setdefault(name, []).append((run, case))
    flaky = flaky_runs((run for pairs in cases.values() for run, _ in pairs), rate)
    for name, pairs in cases.items():
        for run, case in sorted(pairs, key=lambda pair: pair[0].index):
            set_flaky(case, run.run_id in flaky)
            suites[name].append(case)
    recount(root)
    return serialize(root)


def _widen(merged: ET.Element, suite: ET.Element) -> None:
    """A merged testsuite started when its first shard did, on every host that ran a part."""
    timestamps = [t for t in (merged.get("timestamp"), suite.get("timestamp")) if t]
    if timestamps:
        merged.set("timestamp", min(timestamps))
    hosts = [*(merged.get("hostname") or "").split(","), suite.get("hostname") or ""]
    merged.set("hostname", ",".join(h for h in dict.fromkeys(hosts) if h))


def merge(directories: Sequence[Path], out_dir: Path) -> int:
    with refusing("nothing merged"):
        return _merge(directories, out_dir)


def _merge(directories: Sequence[Path], out_dir: Path) -> int:
    summaries = [(d, read_summary(d)) for d in directories]
    rates = {float(data.get("min_pass_rate", 1.0)) for _, data in summaries}
    suites = {str(data.get("suite", "")) for _, data in summaries}
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
    junit = merge_junit(
        [
            junit_part(read_junit(d / JUNIT), runs, suite, d)
            for d, runs in zip(directories, folders, strict=True)
        ],
        rate,
    )
    calls, records = _merge_calls(list(zip(directories, folders, strict=True)))
    provenance = dict(summaries[0][1].get("provenance") or {})
    provenance["merged_from"] = len(directories)
    code = exit_code(task_verdicts(results, rate))
    coverage = {"shard": None, "whole_runs": len(results)}
    problem = unwritable(out_dir)
    if problem is not None:
        raise MergeError(problem)
    folder = ResultsFolder(out_dir)
    try:
        folder.clear()
        folder.write(CALLS, calls)
        folder.write(JUNIT, junit)
        folder.write(SUMMARY_JSON, summary_json(suite, rate, results, provenance, code, coverage))
        folder.write(SUMMARY_MD, summary_markdown(suite, results, rate))
        folder.write(REPORT_HTML, report_html(suite, results, group_records(records)))
    finally:
        folder.close()
    click.echo(terminal_table(results), err=True)
    for line in short_summary(results, rate):
        click.echo(line, err=True)
    click.echo(
        f"mm-batch: {len(results)} run(s) of {len(directories)} folder(s) merged into "
        f"{out_dir}; as one run it would exit {code}",
        err=True,
    )
    return ExitCode.PASSED
