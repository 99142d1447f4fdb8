"""The JUnit consumers that install from PyPI, fed the project's reports: junitparser and
junit2html. Each must read the counts mm-batch meant and show, for every run that did not pass,
the task, the model, the reason, the checks, the command's stderr and the task's line."""

from __future__ import annotations

import json
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path

import pytest
from junit2htmlreport import parser as junit2html
from junitparser import Error, Failure
from junitparser.xunit2 import JUnitXml, TestCase

from tests.consumers.shapes import MODEL, Reports, Shape, assert_shows
from tests.helpers import check_report

SHAPES = ("passing", "failing", "error", "flaky", "merged")


def shape_of(reports: Reports, name: str) -> Shape:
    shape: Shape = getattr(reports, name)
    return shape


@pytest.mark.parametrize("name", SHAPES)
def test_the_reports_are_valid_and_exit_as_they_say(reports: Reports, name: str) -> None:
    shape = shape_of(reports, name)
    check_report(shape.junit)
    # The exit code agrees with the report: 0 when it holds no failure and no error.
    expected = 1 if shape.counts["failures"] else 3 if shape.counts["errors"] else 0
    assert shape.code == expected, (name, shape.code, shape.counts)
    # A merge says the batch's exit code for the job that reads it.
    summary = json.loads((shape.folder / "summary.json").read_text(encoding="utf-8"))
    assert summary["exit_code"] == expected


def test_the_shapes_are_what_they_claim(reports: Reports) -> None:
    """The fixtures themselves: a pass, a failure with a stderr tail, a 401, a tolerated flaky
    repeat, a 3-shard merge with failures in it."""
    assert reports.passing.failing == ()
    (deploy,) = reports.failing.failing
    assert (
        deploy.kind == "failure" and deploy.stderr is not None and "quota exceeded" in deploy.stderr
    )
    (refused,) = reports.error.failing
    assert refused.kind == "error" and "401" in refused.reason and refused.stderr is None
    (flaky,) = reports.flaky.failing
    assert flaky.kind == "flakyFailure" and reports.flaky.code == 0
    assert flaky.stderr is not None and "unknown service payroll" in flaky.stderr
    assert [f.case for f in reports.merged.failing] == ["deploy-2", "deploy-3"]
    assert len(reports.merged.order) == 6


@pytest.mark.parametrize("name", SHAPES)
def test_junitparser_reads_the_counts_and_the_reasons(reports: Reports, name: str) -> None:
    shape = shape_of(reports, name)
    xml = JUnitXml.fromfile(str(shape.junit))
    suites = list(xml)
    assert [s.name for s in suites] == [f"{Path(shape.tasks_file).stem}[{MODEL}]"]
    counts = {
        key: sum(getattr(s, key) or 0 for s in suites)
        for key in ("tests", "failures", "errors", "skipped")
    }
    assert counts == shape.counts
    assert (xml.tests, xml.failures, xml.errors) == (
        shape.counts["tests"],
        shape.counts["failures"],
        shape.counts["errors"],
    )
    cases = [case for suite in suites for case in suite]
    # Plan order, also after the merge of three shards.
    assert tuple(c.name for c in cases) == shape.order
    failing = {f.case: f for f in shape.failing}
    for case in cases:
        assert isinstance(case, TestCase)  # read as xunit2: flakyFailure included
        if case.name not in failing:
            assert case.is_passed and not case.flaky_failures(), case.name
            continue
        want = failing[case.name]
        suite_name = next(s.name for s in suites if case in list(s))
        if want.kind == "flakyFailure":
            # A tolerated repeat passes, and its failure is kept as Surefire's flakyFailure.
            assert case.is_passed and not case.result
            (flaky,) = case.flaky_failures()
            message, text = flaky.message, f"{flaky.text}\n{flaky.stack_trace}"
        else:
            (final,) = case.result
            assert isinstance(final, Failure if want.kind == "failure" else Error)
            message, text = final.message, final.text or ""
        assert message == want.reason
        shown = f"{suite_name}\n{case.classname}\n{case.name}\n{message}\n{text}"
        assert_shows("junitparser", shown, want, shape.tasks_file)


class _Text(HTMLParser):
    """The text a browser shows of a page (scripts and styles left out)."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.parts: list[str] = []
        self._hidden = 0

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self._hidden += tag in ("script", "style")

    def handle_endtag(self, tag: str) -> None:
        self._hidden -= tag in ("script", "style")

    def handle_data(self, data: str) -> None:
        if not self._hidden:
            self.parts.append(data)


def page_text(html: str) -> str:
    reader = _Text()
    reader.feed(html)
    return "".join(reader.parts)


@pytest.mark.parametrize("name", SHAPES)
def test_junit2html_counts_and_shows_the_reasons(
    reports: Reports, name: str, tmp_path: Path
) -> None:
    shape = shape_of(reports, name)
    report = junit2html.Junit(str(shape.junit))
    suites = list(report)
    cases = [case for suite in suites for case in suite.all()]
    assert tuple(c.name for c in cases) == shape.order
    # junit2html folds errors into failures; a flakyFailure it does not read: a pass.
    failed = [c.name for suite in suites for c in suite.failed()]
    assert sorted(failed) == sorted(f.case for f in shape.failing if f.kind != "flakyFailure")
    assert sum(len(s.skipped()) for s in suites) == 0
    assert sum(len(s.passed()) for s in suites) == shape.counts["tests"] - len(failed)
    # What a user opens: the page its command line writes.
    page = tmp_path / "report.html"
    subprocess.run(
        [sys.executable, "-m", "junit2htmlreport", str(shape.junit), str(page)],
        check=True,
        capture_output=True,
        timeout=120,
    )
    shown = page_text(page.read_text(encoding="utf-8"))
    failing = {f.case: f for f in shape.failing}
    for suite in suites:
        for case in suite.all():
            assert case.name in shown
            want = failing.get(case.name)
            if want is None:
                continue
            # What the page shows of this case, each part of it drawn on the page.
            parts = [suite.name, case.testclass.name, case.name]
            parts += [case.failure_msg or "", case.failure or "", case.stdout or ""]
            assert all(part.strip() in shown for part in parts), case.name
            if want.kind == "flakyFailure":
                # Shown as a pass with its system-out, where the failing call's stderr is.
                assert want.stderr is not None and want.stderr in (case.stdout or "")
                continue
            assert_shows("junit2html", "\n".join(parts[:-1]), want, shape.tasks_file)
