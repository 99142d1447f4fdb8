"""junit.xml: one <testsuite> per tasks file and model, one <testcase> per task run.

junit-xml writes the report; what it lacks (`<flakyFailure>`, the counts once a run is flaky) is
done on its tree here. A results folder's junit.xml is read back here too, checked against its
summary.json (`junit_part`), and the parts of several folders merged (`merge_junit`, for `merge`
and `--rerun-failed`) by the same tree functions, so a merged report follows the same rules as
one machine's.
"""

from __future__ import annotations

import re
import socket
import xml.etree.ElementTree as ET
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from junit_xml import TestCase, TestSuite

from mm_batch.config.paths import report_path
from mm_batch.config.secrets import Masker
from mm_batch.plan import Plan, classname
from mm_batch.report.files import JUNIT, SUMMARY_JSON
from mm_batch.report.readback import LoggedRecord, MergeError
from mm_batch.report.summary import Provenance, flaky_runs, one_line
from mm_batch.run.records import RunResult, TaskRecord

# Characters XML 1.0 cannot carry at all; anything a process or a model prints may hold them.
_ILLEGAL_XML = re.compile("[^\u0009\u000a\u000d\u0020-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")


def xml_safe(text: str) -> str:
    """Show illegal characters as #xNN, as pytest's junitxml does, instead of breaking the file."""
    return _ILLEGAL_XML.sub(lambda m: f"#x{ord(m.group()):02X}", text)


SYSTEM_OUT_LIMIT = 64 * 1024  # characters of <system-out> per test case
DETAILS_LIMIT = 64 * 1024  # characters of the text of <failure> / <error>
MESSAGE_LIMIT = 1024  # characters of `message`

# The text of a verdict starts with what it means: some readers show only the text, some only
# `message` (GitLab drops `message` when there is text).
_PREFIX = {"failed": "failed", "error": "could not be judged"}
_VERDICT_TAGS = {"failure": "flakyFailure", "error": "flakyError"}
_FLAKY_TAGS = {flaky: plain for plain, flaky in _VERDICT_TAGS.items()}


def _bounded(text: str, limit: int) -> str:
    """At most `limit` characters, the cut said: a 10 MiB answer must not make a 10 MiB report."""
    if len(text) <= limit:
        return text
    marker = f"\n[... {len(text) - limit} more characters cut ...]"
    return text[: max(limit - len(marker), 0)] + marker


def case_name(task: str, repeat: int, repeats: int) -> str:
    """A test case's name: the task id, and `#r` when the plan repeats each task."""
    return task if repeats == 1 else f"{task}#{repeat}"


def _details(result: RunResult, tasks_file: str) -> str:
    """The text of a <failure>/<error>: the reason first, then the checks, then the task's line."""
    parts = [f"{_PREFIX[result.status]}: {result.reason}"]
    if result.checks:
        parts.append(
            "\n".join(f"[{'ok' if c.ok else 'FAILED'}] {c.name}: {c.detail}" for c in result.checks)
        )
    # Many readers show only this text (GitLab, dorny): the failing commands' stderr goes here too.
    if result.failed_calls:
        parts.append("calls that exited non-zero:\n" + "\n".join(result.failed_calls))
    # Last, whatever is cut: mikepenz takes the last <file>:<line> of the text as the place.
    place = f"\n\nrun: {result.run_id}\ntask defined at {tasks_file}:{result.line}"
    return _bounded("\n\n".join(parts), DETAILS_LIMIT - len(place)) + place


def _case(result: RunResult, suite: str, repeats: int, tasks_file: str) -> TestCase:
    out = "\n".join(result.calls) or "(no tool calls)"
    if result.answer is not None:
        out += f"\n\nfinal answer:\n{result.answer}"
    case = TestCase(
        name=xml_safe(case_name(result.task, result.repeat, repeats)),
        classname=xml_safe(classname(suite, result.model)),
        stdout=xml_safe(_bounded(out, SYSTEM_OUT_LIMIT)),
    )
    if result.status != "passed":
        message = xml_safe(_bounded(result.reason, MESSAGE_LIMIT))
        output = xml_safe(_details(result, tasks_file))
        if result.status == "failed":
            case.add_failure_info(message=message, output=output, failure_type="failed")
        else:
            case.add_error_info(message=message, output=output, error_type="error")
    return case


def set_flaky(case: ET.Element, flaky: bool) -> None:
    """A failing run of a task whose pass rate is met is a flaky pass, and back again (merge)."""
    tags = _VERDICT_TAGS if flaky else _FLAKY_TAGS
    for child in list(case):
        if child.tag not in tags:
            continue
        child.tag = tags[child.tag]
        # Last in its test case: xunit-viewer takes a case's status from its first child.
        case.remove(child)
        case.append(child)
        stack_trace = child.find("stackTrace")
        if flaky and stack_trace is None:
            # Surefire 2.22.1 and later write the text here, older ones as the element's text.
            ET.SubElement(child, "stackTrace").text = child.text
        elif not flaky and stack_trace is not None:
            child.remove(stack_trace)


def run_ends(records: Mapping[str, Sequence[LoggedRecord]]) -> dict[str, float]:
    """When each run ended (seconds since the epoch): its task record's `ts`, written as it
    ended. `records` are calls.jsonl's, grouped by run id."""
    ends: dict[str, float] = {}
    for run_id, found in records.items():
        for record in found:
            if not isinstance(record.record, TaskRecord):
                continue
            try:
                moment = datetime.fromisoformat(record.ts.replace("Z", "+00:00"))
            except ValueError:
                continue
            ends[run_id] = moment.timestamp()
    return ends


def wall_seconds(results: Iterable[RunResult], ends: Mapping[str, float]) -> float | None:
    """From the first start to the last end of these runs (a run started `duration_s` before
    it ended); None when no run's end is known."""
    spans = [(ends[r.run_id] - r.duration_s, ends[r.run_id]) for r in results if r.run_id in ends]
    if not spans:
        return None
    return max(end for _, end in spans) - min(start for start, _ in spans)


def recount(root: ET.Element, walls: Mapping[str, float] | None = None) -> None:
    """The counts and times of every <testsuite> and of <testsuites>, from their test cases.
    `walls`: the wall time of each suite (by name) and of the whole (""), where known; else a
    time is the sum of its test cases' (shards merged from their junit.xml alone)."""
    walls = walls or {}
    totals = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
    elapsed = 0.0
    for suite in root.iter("testsuite"):
        cases = suite.findall("testcase")
        counts = {
            "tests": len(cases),
            "failures": sum(c.find("failure") is not None for c in cases),
            "errors": sum(c.find("error") is not None for c in cases),
            "skipped": sum(c.find("skipped") is not None for c in cases),
        }
        seconds = walls.get(suite.get("name") or "")
        if seconds is None:
            seconds = sum(float(c.get("time") or 0) for c in cases)
        for key, value in counts.items():
            suite.set(key, str(value))
            totals[key] += value
        suite.set("time", f"{seconds:.3f}")
        elapsed += seconds
    for key in ("tests", "failures", "errors"):
        root.set(key, str(totals[key]))
    root.set("time", f"{walls.get('', elapsed):.3f}")


def serialize(root: ET.Element) -> str:
    ET.indent(root)
    return '<?xml version="1.0" encoding="utf-8"?>\n' + ET.tostring(root, encoding="unicode") + "\n"


def junit_xml(
    plan: Plan,
    results: Sequence[RunResult],
    provenance: Provenance,
    masker: Masker,
    *,
    ends: Mapping[str, float] | None = None,
) -> str:
    """`results` and `provenance` come masked; the names taken from the plan are masked here.
    `ends`: when each run ended (see `run_ends`), which makes each suite's time its wall time
    (SPEC 7): runs in parallel overlap, and the sum of their times is no time anyone waited."""
    suite = masker.text(plan.suite)
    tasks_file = masker.text(report_path(plan.tasks_file.path))  # what CI links to: SPEC §7
    results = sorted(results, key=lambda r: r.index)
    properties = {xml_safe(k): xml_safe(str(v)) for k, v in provenance.items()}
    flaky = flaky_runs(results, plan.min_pass_rate)
    hostname = xml_safe(socket.gethostname())
    timestamp = str(provenance.get("started_at", ""))
    root = ET.Element("testsuites")
    walls: dict[str, float] = {}
    whole = wall_seconds(results, ends or {})
    if whole is not None:
        walls[""] = whole
    for model in dict.fromkeys(r.model for r in results):
        runs = [r for r in results if r.model == model]
        name = xml_safe(f"{suite}[{model}]")
        wall = wall_seconds(runs, ends or {})
        if wall is not None:
            walls[name] = wall
        element = TestSuite(
            name,
            [_case(r, suite, plan.repeat, tasks_file) for r in runs],
            hostname=hostname,
            timestamp=timestamp,
            properties=properties,
            file=xml_safe(tasks_file),
        ).build_xml_doc()
        # junit-xml always writes `disabled`, which the common JUnit XSD rejects.
        element.attrib.pop("disabled", None)
        for run, case in zip(runs, element.findall("testcase"), strict=True):
            case.set("time", f"{run.duration_s:.3f}")  # here: junit-xml leaves out a time of 0
            set_flaky(case, run.run_id in flaky)
        root.append(element)
    recount(root, walls)
    return serialize(root)


# -- read back and merged: the junit.xml of results folders (merge, --rerun-failed) ----------

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
