"""The JUnit readers that cannot be installed here, each as its reading rule, measured from its
source, applied to the project's reports: GitLab, mikepenz/action-junit-report,
dorny/test-reporter and the Jenkins junit plugin.

Each rule is a small function whose docstring names the source it was read from. For every run
that did not pass, what the reader shows must hold the task, the model, the reason, the checks,
the command's stderr and the task's line; its counts must be the ones mm-batch meant (a
tolerated flaky repeat is a pass everywhere).
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from tests.consumers.readers import (
    dorny_reads,
    from_xml,
    gitlab_reads,
    jenkins_reads,
    mikepenz_position,
    mikepenz_reads,
    suites,
)
from tests.consumers.shapes import Reports, Shape, assert_shows

SHAPES = ("passing", "failing", "error", "flaky", "merged")


def shape_of(reports: Reports, name: str) -> Shape:
    shape: Shape = getattr(reports, name)
    return shape


def checkout(shape: Shape) -> Path:
    """The working directory the report was made in: a CI job's checkout."""
    return shape.folder.parent.parent


# --- GitLab -------------------------------------------------------------------------------


@pytest.mark.parametrize("name", SHAPES)
def test_gitlab_shows_the_reason_in_the_text(reports: Reports, name: str) -> None:
    shape = shape_of(reports, name)
    cases = gitlab_reads(shape.junit)
    assert tuple(c.name for c in cases) == shape.order
    failing = {f.case: f for f in shape.failing}
    expected = {
        n: ({"failure": "failed", "error": "error"}.get(failing[n].kind, "success"))
        if n in failing
        else "success"
        for n in shape.order
    }
    assert {c.name: c.status for c in cases} == expected
    for case in cases:
        # The testsuite's `file` does not reach GitLab: the line must be in the text.
        assert case.file is None
        want = failing.get(case.name)
        if want is None or want.kind == "flakyFailure":
            assert case.system_output is None
            continue
        # `message` is dropped when there is text: the text alone must say everything.
        assert isinstance(case.system_output, str), case.system_output
        shown = f"{case.classname}\n{case.name}\n{case.system_output}"
        assert_shows("GitLab", shown, want, shape.tasks_file)


def test_gitlab_rule_drops_message_when_there_is_text() -> None:
    """The rule itself, on the two shapes of element it tells apart."""
    with_text = ET.fromstring('<failure message="the reason" type="failed">the text</failure>')
    without = ET.fromstring('<failure message="the reason" type="failed"/>')
    assert from_xml(with_text) == "the text"
    assert from_xml(without) == {"message": "the reason", "type": "failed"}


# --- mikepenz/action-junit-report -----------------------------------------------------------


@pytest.mark.parametrize("name", SHAPES)
def test_mikepenz_annotates_the_task_line(reports: Reports, name: str) -> None:
    shape = shape_of(reports, name)
    counts, annotations = mikepenz_reads(shape.junit, checkout(shape))
    unpassed = [f for f in shape.failing if f.kind != "flakyFailure"]
    assert counts == {"tests": len(shape.order), "failed": len(unpassed), "skipped": 0}
    failures = [a for a in annotations if a.level == "failure"]
    assert len(failures) == len(unpassed)
    for want in unpassed:
        (annotation,) = [a for a in failures if a.title.endswith(f".{want.case}")]
        # The annotation is on the tasks file, at the task's line, not on a file named after
        # the model.
        assert (annotation.path, annotation.start_line) == (shape.tasks_file, want.line)
        assert annotation.message == want.reason
        shown = f"{annotation.title}\n{annotation.message}\n{annotation.raw_details}"
        assert_shows("mikepenz/action-junit-report", shown, want, shape.tasks_file)


def test_mikepenz_rule_without_a_suite_file_takes_the_classname() -> None:
    """What the issue measured before `<testsuite file>`: a file named after the model."""
    position = mikepenz_position(None, None, "tasks.hosted_vllm_model-a", "calls[0] failed")
    assert position == ("hosted_vllm_model-a", 1)
    found = mikepenz_position(
        "ci/tasks.yaml", None, "x", "failed: r\ntask defined at ci/tasks.yaml:12"
    )
    assert found == ("ci/tasks.yaml", 12)


# --- dorny/test-reporter --------------------------------------------------------------------


@pytest.mark.parametrize("name", SHAPES)
def test_dorny_shows_the_reason_and_the_stderr_in_the_failure(reports: Reports, name: str) -> None:
    shape = shape_of(reports, name)
    tests = dorny_reads(shape.junit)
    assert tuple(t.name for t in tests) == shape.order
    failing = {f.case: f for f in shape.failing if f.kind != "flakyFailure"}
    assert {t.name for t in tests if t.result == "failed"} == set(failing)
    assert not [t for t in tests if t.result == "skipped"]
    for test in tests:
        want = failing.get(test.name)
        if want is None:
            continue
        # Errors are failures to dorny: what tells them apart must be in the text.
        prefix = "failed: " if want.kind == "failure" else "could not be judged: "
        assert (test.details or "").startswith(prefix + want.reason)
        shown = f"{test.suite} ► {test.group} ► {test.name}\n{test.message}\n{test.details}"
        assert_shows("dorny/test-reporter", shown, want, shape.tasks_file)


# --- Jenkins junit plugin --------------------------------------------------------------------


@pytest.mark.parametrize("name", SHAPES)
def test_jenkins_shows_message_stacktrace_and_output(reports: Reports, name: str) -> None:
    shape = shape_of(reports, name)
    cases = jenkins_reads(shape.junit)
    assert tuple(c.name for c in cases) == shape.order
    failing = {f.case: f for f in shape.failing}
    unpassed = {n for n, f in failing.items() if f.kind != "flakyFailure"}
    assert {c.name for c in cases if not c.passed} == unpassed
    # UNSTABLE exactly when mm-batch failed the run: a tolerated repeat leaves the build green.
    assert any(not c.passed for c in cases) == (shape.code != 0)
    for case in cases:
        want = failing.get(case.name)
        if want is None:
            continue
        if want.kind == "flakyFailure":
            assert case.passed and case.error_details is None
            continue
        assert case.error_details == want.reason
        shown = (
            f"{case.class_name} (from {case.suite})\n{case.name}\n"
            f"Error Message\n{case.error_details}\nStacktrace\n{case.error_stack_trace}\n"
            f"Standard Output\n{case.stdout}"
        )
        assert_shows("Jenkins", shown, want, shape.tasks_file)


def test_every_reader_sees_the_flaky_repeat_as_a_pass(reports: Reports) -> None:
    """With min_pass_rate met, mm-batch exits 0: no reader may show a failed test."""
    shape = reports.flaky
    assert shape.code == 0
    assert all(c.status == "success" for c in gitlab_reads(shape.junit))
    assert mikepenz_reads(shape.junit, checkout(shape))[0]["failed"] == 0
    assert all(t.result == "success" for t in dorny_reads(shape.junit))
    assert all(c.passed for c in jenkins_reads(shape.junit))
    # And the failure is kept, for the readers that show flaky runs.
    (flaky,) = shape.failing
    (case,) = [
        c for s in suites(shape.junit) for c in s.findall("testcase") if c.get("name") == flaky.case
    ]
    element = case.find("flakyFailure")
    assert element is not None and element.get("message") == flaky.reason
    stack_trace = element.find("stackTrace")
    assert stack_trace is not None and flaky.reason in (stack_trace.text or "")
