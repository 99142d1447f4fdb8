"""The JUnit readers that cannot be installed here, each as its reading rule, measured from its
source: GitLab, mikepenz/action-junit-report, dorny/test-reporter and the Jenkins junit plugin.

Each rule is a small function whose docstring names the source it was read from.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path


def suites(junit: Path) -> list[ET.Element]:
    root = ET.parse(junit).getroot()
    return [root] if root.tag == "testsuite" else list(root.iter("testsuite"))


def _text(element: ET.Element | None) -> str | None:
    return None if element is None else (element.text or "")


@dataclass(frozen=True)
class GitLabCase:
    suite_name: str
    classname: str
    name: str
    file: str | None
    status: str  # failed | error | skipped | success
    system_output: str | dict[str, str] | None


def from_xml(element: ET.Element) -> str | dict[str, str]:
    """ActiveSupport's Hash.from_xml for a leaf element (rails/rails,
    activesupport/lib/active_support/core_ext/hash/conversions.rb, XMLConverter: an element
    with text becomes that text alone, `become_content?` / `process_content`, so its attributes
    are dropped; one without text stays the hash of its attributes)."""
    content = (element.text or "").strip()
    if content:
        return element.text or ""
    return dict(element.attrib)


def gitlab_reads(junit: Path) -> list[GitLabCase]:
    """GitLab's JUnit parser (gitlabhq/gitlabhq, lib/gitlab/ci/parsers/test/junit.rb,
    `create_test_case`): the status is `failure`, else `error`, else `skipped`, else success,
    and the element found is the test's `system_output`, what the test report shows under the
    test (with the classname, the file and the time); any other element (`flakyFailure`) is not
    read: the test is a success. `file` is `data['file']` of the test case only: a testsuite's
    `file` is never read. The suite name is the enclosing `<testsuite>`'s `name`."""
    cases = []
    for suite in suites(junit):
        for case in suite.findall("testcase"):
            status, output = "success", None
            for tag, read_as in (("failure", "failed"), ("error", "error"), ("skipped", "skipped")):
                element = case.find(tag)
                if element is not None:
                    status, output = read_as, from_xml(element)
                    break
            cases.append(
                GitLabCase(
                    suite.get("name", ""),
                    case.get("classname", ""),
                    case.get("name", ""),
                    case.get("file"),
                    status,
                    output,
                )
            )
    return cases


@dataclass(frozen=True)
class Annotation:
    path: str
    start_line: int
    level: str  # failure | notice
    title: str
    message: str
    raw_details: str


def mikepenz_position(
    file: str | None, line: str | None, classname: str, output: str
) -> tuple[str, int]:
    """`resolveFileAndLine` (mikepenz/action-junit-report, src/testParser.ts): the file is the
    one given, else the classname's last dot-part; with no line given, the last
    ` [^ ]*<file>.*?:<digits>` in the failure's text gives it, else line 1."""
    file_name = file if file else classname.rsplit(".", maxsplit=1)[-1]
    given = int(line) if line and line.isdigit() else None
    if file_name and given:
        return file_name, given
    matches = re.findall(f" [^ ]*{re.escape(file_name)}.*?:\\d+", output)
    if not matches:
        return file_name, given or 1
    return file_name, int(matches[-1].split(":")[-1])


def mikepenz_resolve_path(file_name: str, workspace: Path) -> str:
    """`resolvePath` (same file): the first `**/<file>.*` in the workspace outside `/build/`
    and `/__pycache__/`, else the name itself without a leading `./`."""
    normalized = file_name.removeprefix("./")
    for found in sorted(workspace.glob(f"**/{normalized}.*")):
        relative = found.relative_to(workspace).as_posix()
        if "/build/" not in f"/{relative}" and "/__pycache__/" not in f"/{relative}":
            return relative
    return normalized


def mikepenz_reads(junit: Path, workspace: Path) -> tuple[dict[str, int], list[Annotation]]:
    """`parseSuite` with the action's defaults (no `suite_regex`, no `check_title_template`,
    stack traces cut to 2 lines only for the message fallback): a test fails on `failure` or
    `error` (any other element is a pass); the message is the `message` attribute, else the
    first two lines of the text; `raw_details` is the text; the title is `<file>.<test name>`;
    the file comes from the test case, else the `<testsuite file>`, else the classname."""
    annotations = []
    total = skipped = 0
    for suite in suites(junit):
        for case in suite.findall("testcase"):
            total += 1
            result = case.find("failure")
            if result is None:
                result = case.find("error")
            skip = case.find("skipped") is not None
            skipped += skip
            stack_trace = (_text(result) or "").strip()
            attribute = result.get("message") if result is not None else None
            message = (
                attribute or "\n".join(stack_trace.split("\n")[:2]) or case.get("name") or ""
            ).strip()
            file_name, line = mikepenz_position(
                case.get("file") or suite.get("file"),
                case.get("line") or suite.get("line"),
                case.get("classname") or case.get("name") or "",
                stack_trace,
            )
            failed = result is not None and not skip
            path = mikepenz_resolve_path(file_name, workspace) if failed else file_name
            name = case.get("name", "")
            title = f"{file_name}.{name}" if file_name != name else name
            level = "failure" if failed else "notice"
            annotations.append(Annotation(path, line, level, title, message, stack_trace))
    failed_count = sum(a.level == "failure" for a in annotations)
    counts = {"tests": total, "failed": failed_count, "skipped": skipped}
    return counts, annotations


@dataclass(frozen=True)
class DornyTest:
    suite: str
    group: str
    name: str
    result: str  # success | failed | skipped
    message: str | None
    details: str | None


def dorny_reads(junit: Path) -> list[DornyTest]:
    """The java-junit parser (dorny/test-reporter, src/parsers/java-junit/java-junit-parser.ts):
    `failure` or `error` make a test `failed` ("We process <error> and <failure> the same
    way"), `skipped` skipped, anything else success; the error's `details` is the element's
    text and its `message` is `<type>: <message>`; `<system-out>` is never read. A test's group
    is its classname unless that equals the suite's name. The report lists the message under
    the failed test (src/report/get-report.ts), the annotation's title is `<suite> ► <group> ►
    <test>` and its raw details the text (src/report/get-annotations.ts)."""
    tests = []
    for suite in suites(junit):
        suite_name = suite.get("name", "").strip()
        for case in suite.findall("testcase"):
            element = case.find("failure")
            if element is None:
                element = case.find("error")
            if element is not None:
                result = "failed"
            elif case.find("skipped") is not None:
                result = "skipped"
            else:
                result = "success"
            message = details = None
            if element is not None:
                details = element.text
                message = element.get("message")
                if element.get("type"):
                    message = f"{element.get('type')}: {message}"
            classname = case.get("classname", "")
            group = "" if classname == suite_name else classname
            tests.append(
                DornyTest(suite_name, group, case.get("name", "").strip(), result, message, details)
            )
    return tests


@dataclass(frozen=True)
class JenkinsCase:
    suite: str
    class_name: str
    name: str
    passed: bool
    skipped: bool
    error_details: str | None  # shown as "Error Message" ("Error Details" in recent versions)
    error_stack_trace: str | None  # shown as "Stacktrace" ("Stack Trace")
    stdout: str | None  # shown as "Standard Output"


def jenkins_reads(junit: Path) -> list[JenkinsCase]:
    """The junit plugin's CaseResult (jenkinsci/junit-plugin,
    src/main/java/hudson/tasks/junit/CaseResult.java): `errorStackTrace` is the text of
    `<error>`, else of `<failure>`; `errorDetails` the `message` of `<error>`, else of
    `<failure>`; a test passes when it is not skipped and has neither (`isPassed`), so a test
    holding only `<flakyFailure>` is a passed test (the flaky-test-handler plugin reads it, as
    Maven Surefire writes it, as a flaky pass). The test's page
    (src/main/resources/hudson/tasks/junit/CaseResult/test-output.jelly) shows the details,
    the stack trace and `<system-out>`; its heading shows the class name, and "(from <suite>)"
    when that differs from the suite's name."""
    cases = []
    for suite in suites(junit):
        for case in suite.findall("testcase"):
            error, failure = case.find("error"), case.find("failure")
            stack_trace = _text(error) if error is not None else _text(failure)
            shown = error if error is not None else failure
            details = shown.get("message") if shown is not None else None
            skipped = case.find("skipped") is not None
            cases.append(
                JenkinsCase(
                    suite.get("name", ""),
                    case.get("classname", ""),
                    case.get("name", ""),
                    not skipped and details is None and stack_trace is None,
                    skipped,
                    details,
                    stack_trace,
                    _text(case.find("system-out")),
                )
            )
    return cases
