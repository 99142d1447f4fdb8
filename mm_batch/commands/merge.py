"""`mm-batch merge DIR... --out DIR`: shards' results into one, as if one machine ran them all."""

from __future__ import annotations

import json
import re
import xml.etree.ElementTree as ET
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import click

from mm_batch.errors import ExitCode
from mm_batch.plan import PlanError, classname
from mm_batch.report.files import (
    CALLS,
    JUNIT,
    SUMMARY_JSON,
    SUMMARY_MD,
    ResultsFolder,
    unwritable,
)
from mm_batch.report.junit import case_name, flaky_runs, recount, serialize, set_flaky
from mm_batch.report.summary import (
    exit_code,
    summary_json,
    summary_markdown,
    task_verdicts,
    terminal_table,
)
from mm_batch.report.terminal import short_summary
from mm_batch.run.records import RunResult

_RUN_KEYS = {"run", "task", "model", "repeat", "status", "reason", "duration_s", "line", "index"}


def _is_run(run: object) -> bool:
    return (
        isinstance(run, dict)
        and run.keys() >= _RUN_KEYS
        and all(type(run[k]) is int for k in ("repeat", "line", "index"))
        and all(isinstance(run[k], str) for k in ("run", "task", "model", "reason"))
        and run["status"] in ("passed", "failed", "error")
        and isinstance(run["duration_s"], int | float)
    )


class MergeError(PlanError):
    """A folder that cannot be merged: missing, damaged or overlapping results."""

    consequence = "nothing merged"


def _read_summary(directory: Path) -> dict[str, Any]:
    for name in (CALLS, JUNIT, SUMMARY_JSON):
        if not (directory / name).is_file():
            raise MergeError(f"{directory}: no {name} here: not an mm-batch results folder")
    try:
        data = json.loads((directory / SUMMARY_JSON).read_text(encoding="utf-8"))
    except ValueError as exc:
        raise MergeError(f"{directory / SUMMARY_JSON}: not valid JSON ({exc})") from None
    if (
        not isinstance(data, dict)
        or not isinstance(data.get("runs"), list)
        or not all(_is_run(r) for r in data["runs"])
        or not isinstance(data.get("plan", {}), dict)
        or not isinstance(data.get("provenance", {}), dict)
    ):
        raise MergeError(f"{directory / SUMMARY_JSON}: not an mm-batch summary")
    return data


def _results(summaries: Sequence[tuple[Path, dict[str, Any]]]) -> list[RunResult]:
    seen: dict[str, Path] = {}
    results: list[RunResult] = []
    for directory, data in summaries:
        for run in data["runs"]:
            if run["run"] in seen:
                raise MergeError(
                    f"run {run['run']} is in both {seen[run['run']]} and {directory}: "
                    "shards must not overlap"
                )
            seen[run["run"]] = directory
            results.append(
                RunResult(
                    run["run"],
                    run["task"],
                    run["model"],
                    run["repeat"],
                    run["status"],
                    run["reason"],
                    (),
                    run["duration_s"],
                    None,
                    (),
                    line=run["line"],
                    index=run["index"],
                )
            )
    return results


def _check_provenance(summaries: Sequence[tuple[Path, dict[str, Any]]]) -> None:
    """Shards of one plan ran the same files with the same mm-batch; anything else is refused."""

    def identity(data: dict[str, Any]) -> dict[str, str]:
        provenance = data.get("provenance") or {}
        return {
            key: str(value)
            for key, value in provenance.items()
            if key == "mm_batch_version" or key.startswith("sha256:")
        }

    first_dir, first = summaries[0][0], identity(summaries[0][1])
    for directory, data in summaries[1:]:
        other = identity(data)
        differ = sorted(k for k in first.keys() | other.keys() if first.get(k) != other.get(k))
        if differ:
            what = "; ".join(
                f"{key}: {first.get(key, 'absent')} in {first_dir}, "
                f"{other.get(key, 'absent')} in {directory}"
                for key in differ
            )
            raise MergeError(
                f"{first_dir} and {directory} do not come from the same plan ({what}): "
                "merge the shards of one run of one mm-batch over the same files"
            )


def _check_complete(summaries: Sequence[tuple[Path, dict[str, Any]]]) -> None:
    """Every shard of a plan must be there: a missing one would drop its runs unseen."""
    shards: dict[int, dict[int, tuple[Path, dict[str, Any]]]] = {}
    for directory, data in summaries:
        shard = (data.get("plan") or {}).get("shard")
        if shard is None:  # an unsharded run, a merge, or results of an older mm-batch
            continue
        match = re.fullmatch(r"(\d+)/(\d+)", str(shard))
        if match is None:
            raise MergeError(f"{directory / SUMMARY_JSON}: plan.shard is not K/N: {shard!r}")
        k, n = int(match[1]), int(match[2])
        if k in shards.setdefault(n, {}):
            raise MergeError(
                f"shard {k}/{n} is in both {shards[n][k][0]} and {directory}: "
                "shards must not overlap"
            )
        shards[n][k] = (directory, data)
    for n, parts in sorted(shards.items()):
        missing = [f"{k}/{n}" for k in range(1, n + 1) if k not in parts]
        if missing:
            raise MergeError(
                f"shard {', '.join(missing)} missing: its runs would be absent from the merged "
                "report; merge the results folder of every shard"
            )
        planned = {data["plan"].get("whole_runs") for _, data in parts.values()}
        found = sum(len(data["runs"]) for _, data in parts.values())
        if planned != {found}:
            raise MergeError(
                f"the {n} shards hold {found} runs but were cut from plans of "
                f"{', '.join(map(str, sorted(planned, key=str)))}: they come from different runs"
            )


def _merge_calls(directories: Sequence[Path]) -> str:
    """The shards' records, one JSON object a line; a line that is not one is named, not copied."""
    lines: list[str] = []
    for directory in directories:
        path = directory / CALLS
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except ValueError as exc:
                raise MergeError(f"{path}:{number}: not a JSON record ({exc})") from None
            if not isinstance(record, dict):
                raise MergeError(f"{path}:{number}: not a JSON object")
            lines.append(line + "\n")
    return "".join(lines)


def _merge_junit(
    directories: Sequence[Path], suite_of_runs: str, results: Sequence[RunResult], rate: float
) -> str:
    """The shards' test cases in plan order within each testsuite, flaky as the whole says."""
    repeats = max((r.repeat for r in results), default=1)
    runs = {
        (classname(suite_of_runs, r.model), case_name(r.task, r.repeat, repeats)): r
        for r in results
    }
    root = ET.Element("testsuites")
    suites: dict[str, ET.Element] = {}
    cases: dict[str, list[tuple[RunResult, ET.Element]]] = {}
    for directory in directories:
        try:
            tree = ET.parse(directory / JUNIT)
        except ET.ParseError as exc:
            raise MergeError(f"{directory / JUNIT}: not valid XML ({exc})") from None
        for suite in tree.getroot().iter("testsuite"):
            name = suite.get("name", "")
            if name not in suites:
                merged = ET.SubElement(root, "testsuite", dict(suite.attrib))
                properties = suite.find("properties")
                if properties is not None:
                    merged.append(properties)
                suites[name] = merged
            else:
                _widen(suites[name], suite)
            for case in suite.findall("testcase"):
                run = runs.get((case.get("classname", ""), case.get("name", "")))
                if run is None:
                    raise MergeError(
                        f"{directory / JUNIT}: test case {case.get('classname')}."
                        f"{case.get('name')} is no run of {directory / SUMMARY_JSON}"
                    )
                cases.setdefault(name, []).append((run, case))
    flaky = flaky_runs(results, rate)
    for name, found in cases.items():
        for run, case in sorted(found, key=lambda pair: pair[0].index):
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
    summaries = [(d, _read_summary(d)) for d in directories]
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
    results = sorted(_results(summaries), key=lambda r: r.index)
    junit = _merge_junit(directories, suite, results, rate)
    calls = _merge_calls(directories)
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
