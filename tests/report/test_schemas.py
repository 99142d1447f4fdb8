"""The project's own schemas: shipped in the package, met by every report and input file the
loader accepts, and strict enough to refuse the mistakes they exist to catch."""

from __future__ import annotations

import copy
import fnmatch
import itertools
import json
import os
import subprocess
import sys
import textwrap
import tomllib
import xml.etree.ElementTree as ET
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
import xmlschema
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from mm_batch import schemas
from mm_batch.config.load import load_agent_file, load_any, load_tasks
from mm_batch.config.model import TasksFile
from mm_batch.config.problems import ConfigError
from mm_batch.schemas import SchemaName
from mm_batch.testing.fake_openai import (
    HttpFailure,
    Script,
    first_user_message,
    text,
    tool_call,
)
from tests.helpers import (
    JUNIT_XSD,
    ROOT,
    Cli,
    Fake,
    check_json,
    check_junit,
    check_report,
    json_validator,
    model_args,
    read_calls,
    write,
)

JSON_SCHEMAS: tuple[SchemaName, ...] = tuple(n for n in schemas.NAMES if n.endswith(".json"))
DRAFT = "https://json-schema.org/draft/2020-12/schema"


def _xsd(path: Path) -> xmlschema.XMLSchema:
    return xmlschema.XMLSchema(str(path))


OURS = _xsd(schemas.path("junit.xsd"))
SHARED = _xsd(JUNIT_XSD) if JUNIT_XSD.exists() else None


# -- shipped ----------------------------------------------------------------------------------


def test_every_schema_is_found_by_name_and_is_itself_valid() -> None:
    import jsonschema

    for name in JSON_SCHEMAS:
        document = json.loads(schemas.path(name).read_text(encoding="utf-8"))
        assert document["$schema"] == DRAFT, name
        assert document["$id"].startswith("urn:mm-batch:schema:"), name
        assert document["title"].startswith("mm-batch "), name
        assert len(document["description"]) > 40, name
        jsonschema.Draft202012Validator.check_schema(document)
    assert OURS.root_elements[0].local_name == "testsuites"
    assert [e.local_name for e in OURS.root_elements] == ["testsuites"]
    with pytest.raises(ValueError, match="no schema named"):
        schemas.path("junit-10.xsd")  # type: ignore[arg-type]


def test_the_package_data_ships_every_schema() -> None:
    """What pip installs holds each schema: a package of mm_batch, its files in package data."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]
    assert any(
        fnmatch.fnmatch("mm_batch.schemas", p)
        for p in config["setuptools"]["packages"]["find"]["include"]
    )
    patterns = config["setuptools"]["package-data"]["mm_batch"]
    folder = ROOT / "mm_batch" / "schemas"
    files = {p.name for p in folder.iterdir() if p.is_file()}
    assert files == {*schemas.NAMES, "__init__.py"}, "a file here that schemas.NAMES omits"
    for name in schemas.NAMES:
        assert schemas.path(name) == folder / name
        assert any(fnmatch.fnmatch(f"schemas/{name}", p) for p in patterns), name


# -- junit.xml --------------------------------------------------------------------------------

EVERY_ELEMENT = """\
<?xml version="1.0" encoding="utf-8"?>
<testsuites tests="5" failures="1" errors="1" time="1,234.500">
  <testsuite name="tasks[m]" tests="5" failures="1" errors="1" skipped="1" time="1234.500"
      timestamp="2026-12-02T15:04:05+00:00" hostname="ci-7" file="ci/tasks.yaml">
    <properties>
      <property name="mm_batch_version" value="0.9.0"/>
    </properties>
    <testcase name="a" classname="tasks.m" time="1.000">
      <failure type="failed" message="why">failed: why</failure>
      <system-out>$ ./release.sh</system-out>
      <system-err/>
    </testcase>
    <testcase name="b" classname="tasks.m" time="2.5">
      <error type="error" message="401">could not be judged: 401</error>
    </testcase>
    <testcase name="c#1" classname="tasks.m" time="0">
      <flakyFailure type="failed" message="why">failed: why<stackTrace>trace</stackTrace>
      </flakyFailure>
    </testcase>
    <testcase name="c#2" classname="tasks.m" time="0">
      <flakyError type="error">could not be judged</flakyError>
    </testcase>
    <testcase name="d" classname="tasks.m" time="0"><skipped message="filtered"/></testcase>
  </testsuite>
</testsuites>
"""


def test_the_junit_xsd_accepts_every_element_mm_batch_writes() -> None:
    OURS.validate(EVERY_ELEMENT)
    if SHARED is not None:
        SHARED.validate(EVERY_ELEMENT)


def _mutated(mutate: Callable[[ET.Element], object]) -> str:
    root = ET.fromstring(EVERY_ELEMENT.split("\n", 1)[1])
    mutate(root)
    return ET.tostring(root, encoding="unicode")


def _find(root: ET.Element, path: str) -> ET.Element:
    found = root.find(path)
    assert found is not None, path
    return found


def _case(root: ET.Element) -> ET.Element:
    return _find(root, "testsuite/testcase")


MISTAKES: dict[str, Callable[[ET.Element], object]] = {
    # GitLab reads `file` on a testcase; SPEC 7 puts it on the testsuite only.
    "a testcase attribute besides name, classname, time": lambda r: _case(r).set("file", "t.yaml"),
    "a testcase without name": lambda r: _case(r).attrib.pop("name"),
    "a testsuite without tests": lambda r: r[0].attrib.pop("tests"),
    "junit-xml's disabled": lambda r: r[0].set("disabled", "0"),
    "a time with a unit": lambda r: r[0].set("time", "1.5s"),
    "a flakyFailure without type": lambda r: _find(r, "testsuite/testcase/flakyFailure").attrib.pop(
        "type"
    ),
    "an element of no JUnit reader": lambda r: _case(r).append(ET.Element("reason")),
    "a rerunFailure mm-batch never writes": lambda r: _case(r).append(
        ET.Element("rerunFailure", type="failed")
    ),
    "a nested testsuite": lambda r: r[0].append(
        ET.Element("testsuite", name="n", tests="0", failures="0", errors="0")
    ),
    "a property without value": lambda r: _find(r, "testsuite/properties/property").attrib.pop(
        "value"
    ),
    "text loose in a testcase": lambda r: setattr(_case(r), "text", "oops"),
}


@pytest.mark.parametrize("mistake", sorted(MISTAKES))
def test_the_junit_xsd_refuses_mistakes(mistake: str) -> None:
    document = _mutated(MISTAKES[mistake])
    assert document != _mutated(lambda r: None), "the mutation changed nothing"
    assert not OURS.is_valid(document)


def test_the_junit_xsd_refuses_any_root_but_testsuites() -> None:
    suite = ET.fromstring(EVERY_ELEMENT.split("\n", 1)[1])[0]
    document = ET.tostring(suite, encoding="unicode")
    assert not OURS.is_valid(document)
    if SHARED is not None:
        assert SHARED.is_valid(document)  # the common XSD takes any of its elements as root


# A model of the common JUnit XSD, restricted to the subset mm-batch writes: each drawn
# document knows whether that XSD accepts it and whether it stays inside the subset.
_TEXT = st.text(st.characters(codec="utf-8", categories=("L", "N", "P", "Zs")), max_size=6)
_TIMES_OK = ("0", "1.5", "12.345", "1,234.5", ".5", "", "3.")
_TIMES_BAD = ("1.5s", "-1", "1e3", "abc")


class _Drawn:
    def __init__(self, draw: st.DrawFn) -> None:
        self.draw = draw
        self.valid = True  # the common XSD accepts it
        self.subset = True  # only what this project's XSD allows

    def attributes(
        self,
        element: ET.Element,
        required: tuple[str, ...] = (),
        optional: tuple[str, ...] = (),
        timed: tuple[str, ...] = (),
        foreign: tuple[str, ...] = (),
    ) -> None:
        for name in required:
            if self.draw(st.integers(0, 9)) == 0:
                self.valid = False  # a required attribute left out
            else:
                element.set(name, self.draw(_TEXT))
        for name in optional:
            if self.draw(st.booleans()):
                element.set(name, self.draw(_TEXT))
        for name in timed:
            if self.draw(st.booleans()):
                good = self.draw(st.integers(0, 5)) > 0
                element.set(name, self.draw(st.sampled_from(_TIMES_OK if good else _TIMES_BAD)))
                self.valid &= good
        for name in foreign:  # valid in the common XSD, never written by mm-batch
            if self.draw(st.integers(0, 7)) == 0:
                element.set(name, "x")
                self.subset = False
        if self.draw(st.integers(0, 15)) == 0:
            element.set("bogus", "x")  # in no JUnit XSD
            self.valid = False

    def result(self, tag: str) -> ET.Element:
        element = ET.Element(tag)
        element.text = self.draw(_TEXT)
        if tag.startswith(("flaky", "rerun")):
            self.attributes(element, required=("type",), optional=("message",))
            if self.draw(st.booleans()):
                ET.SubElement(element, "stackTrace").text = self.draw(_TEXT)
            if self.draw(st.integers(0, 7)) == 0:
                ET.SubElement(element, "system-out").text = "x"
                self.subset = False
        else:
            self.attributes(element, optional=("type", "message"))
        return element

    def testcase(self) -> ET.Element:
        case = ET.Element("testcase")
        self.attributes(case, ("name",), ("classname", "time"), foreign=("group",))
        results = ("skipped", "error", "failure", "flakyFailure", "flakyError")
        outputs = ("system-out", "system-err")
        for tag in self.draw(st.lists(st.sampled_from(results + outputs + ("rerunFailure",)))):
            if tag == "rerunFailure":
                self.subset = False
            if tag in outputs:
                ET.SubElement(case, tag).text = self.draw(_TEXT)
            else:
                case.append(self.result(tag))
        if self.draw(st.integers(0, 15)) == 0:
            case.text = "loose text"
            self.valid = False
        return case

    def testsuite(self) -> ET.Element:
        suite = ET.Element("testsuite")
        self.attributes(
            suite,
            ("name", "tests", "failures", "errors"),
            ("skipped", "timestamp", "hostname", "file"),
            ("time",),
            ("id", "package", "group", "log", "url"),
        )
        for tag in self.draw(st.lists(st.sampled_from(("properties", "testcase", "other")))):
            if tag == "testcase":
                suite.append(self.testcase())
            elif tag == "properties":
                properties = ET.SubElement(suite, "properties")
                for _ in range(self.draw(st.integers(0, 2))):
                    prop = ET.SubElement(properties, "property")
                    self.attributes(prop, ("name", "value"))
            else:
                self.subset = False
                other = self.draw(st.sampled_from(("system-out", "testsuite")))
                nested = ET.SubElement(suite, other)
                if other == "testsuite":
                    nested.attrib.update(name="n", tests="0", failures="0", errors="0")
        return suite


@st.composite
def junit_documents(draw: st.DrawFn) -> tuple[str, bool, bool]:
    drawn = _Drawn(draw)
    root = ET.Element("testsuites")
    drawn.attributes(root, optional=("tests", "failures", "errors"), timed=("time",))
    drawn.attributes(root, foreign=("name",))
    for _ in range(draw(st.integers(0, 2))):
        root.append(drawn.testsuite())
    return ET.tostring(root, encoding="unicode"), drawn.valid, drawn.subset


@settings(max_examples=300, deadline=None)
@given(junit_documents())
def test_the_junit_xsd_is_the_common_xsd_on_its_subset(drawn: tuple[str, bool, bool]) -> None:
    """Valid here only when the common XSD takes it too; and within the subset, whatever the
    common XSD takes is valid here: a consumer that checks against it never refuses a report."""
    document, valid, subset = drawn
    assert OURS.is_valid(document) == (valid and subset), document
    if SHARED is not None:
        assert SHARED.is_valid(document) == valid, document


def test_without_the_shared_xsd_ci_fails_and_a_clone_checks_the_project_xsd(
    tmp_path: Path,
) -> None:
    report = tmp_path / "junit.xml"
    report.write_text(EVERY_ELEMENT, encoding="utf-8")
    absent = tmp_path / "shared" / "data" / "junit-10.xsd"
    check_junit(report, absent, {})  # a user's clone: the project's XSD alone
    with pytest.raises(pytest.fail.Exception, match="CI=true but the common JUnit XSD"):
        check_junit(report, absent, {"CI": "true"})
    report.write_text(_mutated(lambda r: _case(r).set("file", "x")), encoding="utf-8")
    with pytest.raises(xmlschema.XMLSchemaValidationError):
        check_junit(report, absent, {})


def test_check_junit_catches_counts_the_xsd_cannot(tmp_path: Path) -> None:
    report = tmp_path / "junit.xml"
    wrong = 'tests="5" failures="0" errors="1" skipped="1"'
    report.write_text(
        EVERY_ELEMENT.replace('tests="5" failures="1" errors="1" skipped="1"', wrong),
        encoding="utf-8",
    )
    assert wrong in report.read_text(encoding="utf-8")
    assert OURS.is_valid(str(report))
    with pytest.raises(AssertionError):
        check_junit(report, tmp_path / "absent.xsd", {})


# -- reports of real runs ---------------------------------------------------------------------

HOOK = ["python3", "-c", "import sys; sys.stdin.read()"]


def _replies() -> Script:
    releases = itertools.count()

    def reply(request: dict[str, Any]) -> Any:
        prompt = first_user_message(request)
        if "Publie" in prompt:  # every try refused: the model cannot be used
            return HttpFailure(401, "invalid api key")
        if any(m.get("role") == "tool" for m in request["messages"]):
            return text("Done.")
        if "billing" in prompt:
            return tool_call("status", {"service": "billing"})
        # release-en: beta (allowed) and stable (refused) in turn, one repeat each
        channel = ("beta", "stable")[next(releases) % 2]
        return tool_call("release", {"version": "1.4.2", "channel": channel})

    return reply


def test_reports_of_passes_failures_errors_and_a_merge_meet_the_schemas(
    cli: Cli,
    fake_model: Fake,
    release_example: Path,
    tmp_path: Path,
) -> None:
    agent = (release_example / "agent.yaml").read_text(encoding="utf-8")
    hooks = f"hooks:\n  preToolCall: {json.dumps(HOOK)}\n  postToolCall: {json.dumps(HOOK)}\n"
    (release_example / "agent.yaml").write_text(agent + hooks, encoding="utf-8")
    tasks = write(
        release_example,
        "matrix.yaml",
        """
        agent: agent.yaml
        repeat: 2
        min_pass_rate: 0.5
        tasks:
          - id: status-en
            prompt: "What is the status of the billing service?"
            expect: {calls: [{tool: status, args: {service: billing}}]}
          - id: release-fr
            prompt: "Publie la version 1.4.2 sur le canal beta."
          - id: release-en
            prompt: "Release version 1.4.2 to the beta channel."
            expect: {calls: [{tool: release, args: {channel: beta}}]}
        """,
    )
    fake = fake_model(_replies())
    whole = tmp_path / "whole"
    result = cli("run", tasks, *model_args(fake), "--out", whole)
    assert result.code in (1, 3), result.err
    check_report(whole / "junit.xml")
    records = read_calls(whole)
    assert {r["kind"] for r in records} == {"model", "tool", "task"}
    assert {r["status"] for r in records if r["kind"] == "task"} >= {"passed", "error"}
    assert any(r.get("hooks") for r in records), "no tool record held its hooks"
    runs = json.loads((whole / "summary.json").read_text(encoding="utf-8"))["runs"]
    assert sorted(r["index"] for r in runs) == list(range(6))
    assert {r["task"]: r["line"] for r in runs} == {
        "status-en": 5,
        "release-fr": 8,
        "release-en": 10,
    }

    shards = [tmp_path / f"shard{k}" for k in (1, 2)]
    for k, out in enumerate(shards, 1):
        ran = cli("run", tasks, *model_args(fake), "--shard", f"{k}/2", "--out", out)
        assert ran.code in (0, 1, 3), ran.err
        check_report(out / "junit.xml")
    merged = tmp_path / "merged"
    assert cli("merge", *shards, "--out", merged).code == 0
    check_report(merged / "junit.xml")
    merged_runs = json.loads((merged / "summary.json").read_text(encoding="utf-8"))["runs"]
    assert sorted((r["index"], r["line"]) for r in merged_runs) == sorted(
        (r["index"], r["line"]) for r in runs
    )


# -- summary.json and calls.jsonl: what they refuse -------------------------------------------

SUMMARY: dict[str, Any] = {
    "suite": "tasks",
    "provenance": {
        "mm_batch_version": "0.9.0",
        "litellm_version": "1.110.2",
        "python_version": "3.11.7",
        "models": "hosted_vllm/fake",
        "seeds": "none",
        "started_at": "2026-12-02T15:04:05Z",
        "sha256:tasks.yaml": "0" * 64,
        "local_model_sha256": "f" * 64,
        "merged_from": 2,
    },
    "plan": {"shard": "1/2", "whole_runs": 2},
    "min_pass_rate": 1.0,
    "exit_code": 1,
    "models": [
        {"model": "m", "runs": 1, "passed": 0, "failed": 1, "errors": 0, "mean_s": 1.5},
    ],
    "tasks": [
        {
            "task": "t",
            "model": "m",
            "runs": 1,
            "passed": 0,
            "failed": 1,
            "errors": 0,
            "pass_rate": 0.0,
            "status": "failed",
        }
    ],
    "runs": [
        {
            "run": "t[m]#1",
            "task": "t",
            "model": "m",
            "repeat": 1,
            "status": "failed",
            "reason": "why",
            "duration_s": 1.5,
            "line": 3,
            "index": 0,
        }
    ],
}
IDENTITY = {"ts": "2026-12-02T15:04:05.123456Z", "run": "t[m]#1", "task": "t", "model": "m"}
MODEL_RECORD: dict[str, Any] = {
    **IDENTITY,
    "repeat": 1,
    "seq": 1,
    "kind": "model",
    "latency_s": 0.25,
    "prompt_tokens": 10,
    "completion_tokens": None,
    "finish_reason": "tool_calls",
    "tool_calls": [{"name": "release", "arguments": '{"version": "1.4.2"}'}],
    "content": None,
    "attempts": 1,
}
TOOL_RECORD: dict[str, Any] = {
    **IDENTITY,
    "repeat": 1,
    "seq": 2,
    "kind": "tool",
    "tool": "release",
    "raw_arguments": '{"version": "1.4.2"}',
    "arguments": {"version": "1.4.2"},
    "outcome": "ran",
    "reason": None,
    "rule": "allow[0]",
    "argv": ["./release.sh", "1.4.2"],
    "where": "docker:mm-batch/sandbox:base",
    "started": True,
    "exit_code": 0,
    "duration_s": 0.01,
    "stdout": "released\n",
    "stderr": "",
    "stdout_bytes": 9,
    "stderr_bytes": 0,
    "truncated": False,
    "recovered_from_text": False,
    "hooks": {
        "preToolCall": {
            "argv": ["./audit.sh"],
            "exit_code": 0,
            "stdout": "",
            "stderr": "",
            "timed_out": False,
            "error": None,
        }
    },
}
TASK_RECORD: dict[str, Any] = {
    **IDENTITY,
    "repeat": 1,
    "seq": 3,
    "kind": "task",
    "status": "failed",
    "checks": [{"check": "calls[0]", "ok": False, "detail": "ran 0 matching call(s)"}],
    "duration_s": 1.5,
    "reason": "calls[0]: ran 0 matching call(s)",
    "answer": "Done.",
    "traceback": "Traceback ...",
}


def _set(path: str, value: Any) -> Callable[[dict[str, Any]], None]:
    """A mutation setting (or, with DELETE, removing) the value at a path such as runs/0/line."""

    def mutate(document: dict[str, Any]) -> None:
        *parents, last = path.split("/")
        target: Any = document
        for part in parents:
            target = target[int(part)] if isinstance(target, list) else target[part]
        if value is DELETE:
            del target[last]
        else:
            target[last] = value

    return mutate


DELETE = object()
BAD_DOCUMENTS: list[tuple[SchemaName, dict[str, Any], str, Any]] = [
    ("summary.schema.json", SUMMARY, "runs", DELETE),
    ("summary.schema.json", SUMMARY, "surprise", 1),
    ("summary.schema.json", SUMMARY, "exit_code", 5),
    ("summary.schema.json", SUMMARY, "runs/0/status", "ok"),
    ("summary.schema.json", SUMMARY, "runs/0/line", 0),
    ("summary.schema.json", SUMMARY, "runs/0/index", DELETE),
    ("summary.schema.json", SUMMARY, "runs/0/duration_s", "1.5"),
    ("summary.schema.json", SUMMARY, "tasks/0/pass_rate", 1.5),
    ("summary.schema.json", SUMMARY, "plan/shard", "2"),
    ("summary.schema.json", SUMMARY, "provenance/mm_batch_version", DELETE),
    ("summary.schema.json", SUMMARY, "provenance/sha256:tasks.yaml", "abc"),
    ("summary.schema.json", SUMMARY, "provenance/nested", {"a": 1}),
    ("calls.schema.json", MODEL_RECORD, "kind", "other"),
    ("calls.schema.json", MODEL_RECORD, "ts", "2026-12-02T15:04:05Z"),
    ("calls.schema.json", MODEL_RECORD, "seq", 0),
    ("calls.schema.json", MODEL_RECORD, "latency_s", DELETE),
    ("calls.schema.json", MODEL_RECORD, "attempts", 0),
    ("calls.schema.json", MODEL_RECORD, "outcome", "ran"),  # a tool field in a model record
    ("calls.schema.json", TOOL_RECORD, "outcome", "maybe"),
    ("calls.schema.json", TOOL_RECORD, "started", DELETE),
    ("calls.schema.json", TOOL_RECORD, "where", "podman"),
    ("calls.schema.json", TOOL_RECORD, "argv", "./release.sh 1.4.2"),
    ("calls.schema.json", TOOL_RECORD, "hooks/preToolCall/timed_out", "no"),
    ("calls.schema.json", TOOL_RECORD, "hooks/onCall", {}),
    ("calls.schema.json", TASK_RECORD, "status", "ok"),
    ("calls.schema.json", TASK_RECORD, "checks/0/ok", "false"),
    ("calls.schema.json", TASK_RECORD, "run", "t[m]"),
    ("calls.schema.json", TASK_RECORD, "repeat", 0),
]


@pytest.mark.parametrize(
    ("name", "document"),
    [
        ("summary.schema.json", SUMMARY),
        ("calls.schema.json", MODEL_RECORD),
        ("calls.schema.json", TOOL_RECORD),
        ("calls.schema.json", TASK_RECORD),
    ],
)
def test_the_report_schemas_accept_each_kind_of_document(
    name: SchemaName, document: dict[str, Any]
) -> None:
    check_json(name, document, "the sample")


@pytest.mark.parametrize(
    ("name", "document", "path", "value"),
    BAD_DOCUMENTS,
    ids=[
        f"{d.get('kind', 'summary')}.{p}={'DELETE' if v is DELETE else v!r}"
        for _, d, p, v in BAD_DOCUMENTS
    ],
)
def test_the_report_schemas_refuse_a_bad_document(
    name: SchemaName, document: dict[str, Any], path: str, value: Any
) -> None:
    bad = copy.deepcopy(document)
    _set(path, value)(bad)
    assert bad != document
    assert not json_validator(name).is_valid(bad)
    with pytest.raises(pytest.fail.Exception, match=f"not valid against {name}"):
        check_json(name, bad, "the sample")


# -- the input files --------------------------------------------------------------------------


def _yaml_files() -> list[Path]:
    return sorted(
        p
        for folder in ("examples", "tests")
        for p in (ROOT / folder).rglob("*")
        if p.suffix in (".yaml", ".yml") and p.is_file()
    )


class _EveryVariable(Mapping[str, str]):
    """An environment in which every ${VAR} is set: a fixture may name any."""

    def __getitem__(self, name: str) -> str:
        return f"value-of-{name}"

    def __iter__(self) -> Iterator[str]:
        return iter(())

    def __len__(self) -> int:
        return 0


def _accepted(path: Path) -> SchemaName | None:
    """Which schema a file the loader accepts must meet; None when the loader refuses it."""
    try:
        loaded = load_any(path, environ=_EveryVariable())
    except ConfigError:
        return None
    return "tasks.schema.json" if isinstance(loaded, TasksFile) else "agent.schema.json"


def test_every_file_the_loader_accepts_meets_its_schema() -> None:
    checked: dict[SchemaName, list[str]] = {"tasks.schema.json": [], "agent.schema.json": []}
    for path in _yaml_files():
        name = _accepted(path)
        if name is None:
            continue
        relative = path.relative_to(ROOT).as_posix()
        check_json(name, yaml.safe_load(path.read_text(encoding="utf-8")), relative)
        checked[name].append(relative)
    assert {"examples/release/tasks.yaml", "examples/seed-experiment/tasks.yaml"} <= set(
        checked["tasks.schema.json"]
    )
    assert "examples/release/agent.yaml" in checked["agent.schema.json"]
    assert len(checked["agent.schema.json"]) >= 4, checked


FULL_AGENT = """
$schema: ../mm_batch/schemas/agent.schema.json
model: hosted_vllm/qwen2.5-coder-1.5b
model_options: {api_base: "http://127.0.0.1:8080/v1", temperature: 0.2, max_tokens: 512,
                timeout: 60, max_parallel: 2, recover_text_tool_calls: true,
                extra_body: {top_k: [1, 2]}}
system: "You are the release assistant of ACME."
yolo: false
loop_limit: 4
allow:
  - tool: status
  - tool: release
    args: {channel: beta, version: "1.*"}
  - tool: proj_search
  - bash: "git status"
builtins: [read_skill, bash]
skills: [skills/]
mcp:
  - {name: proj, url: "http://127.0.0.1:8765/mcp"}
hooks:
  preToolCall: ["./hooks/audit.sh"]
  postToolCall: ["./hooks/notify.sh", "--quiet"]
sandbox:
  kind: docker
  image: mm-batch/sandbox:base
  network: none
  limits: {pids: 256, memory: 1g, cpus: 1.5, workspace: 536870912}
  user: "1000:1000"
  workspace: copy
tools:
  - name: release
    description: Release a version of the product to a channel.
    parameters:
      version: {type: string, description: "The version to release, e.g. 1.4.2."}
      channel: {type: string, enum: [beta, stable]}
      dry_run: {type: boolean, required: false, default: false}
      retries: {type: integer, enum: [0, 1, 2], default: 0}
      ratio: {type: number, allow_dash: true, required: false}
    command: ["./release.sh", "{{version}}", "--channel={{channel}}", "--dry-run={{dry_run}}"]
    timeout: 120
    workdir: .
    env: {RELEASE_TOKEN: "${RELEASE_TOKEN}"}
  - name: status
    description: ""
    command: ["./status.sh"]
"""
FULL_TASKS = """
$schema: ../mm_batch/schemas/tasks.schema.json
agent: agent.yaml
models: [hosted_vllm/qwen2.5-coder-1.5b, hosted_vllm/other]
repeat: 3
jobs: 4
min_pass_rate: 0.6
tasks:
  - id: release-fr.1_x
    prompt: "Publie la version 1.4.2 sur le canal beta."
    agent: agent.yaml
    timeout: 600
    max_turns: 20
    expect:
      calls:
        - {tool: release, args: {version: "1.4.2", channel: beta, dry_run: false}, times: 1}
        - {tool: proj_search}
      no_calls: [bash]
      refused: [status]
      exit_code: 0
      answer_contains: ["1.4.2"]
      check: ["./verify.sh", "release"]
  - id: minimal
    prompt: "Hi."
"""


@pytest.fixture
def full_files(tmp_path: Path) -> Path:
    """SPEC 1's agent and tasks files with every key, and the files they name."""
    write(tmp_path, "agent.yaml", FULL_AGENT)
    write(tmp_path, "skills/notes/SKILL.md", "---\nname: notes\ndescription: Notes.\n---\nBody.\n")
    for script in ("hooks/audit.sh", "hooks/notify.sh", "verify.sh", "release.sh", "status.sh"):
        write(tmp_path, script, "#!/bin/sh\nexit 0\n").chmod(0o755)
    return write(tmp_path, "tasks.yaml", FULL_TASKS)


def test_a_file_with_every_key_meets_the_loader_and_the_schema(full_files: Path) -> None:
    tasks = load_tasks(full_files, environ={"RELEASE_TOKEN": "s3cret-token"})
    assert [t.id for t in tasks.tasks] == ["release-fr.1_x", "minimal"]
    for name, path in (
        ("tasks.schema.json", full_files),
        ("agent.schema.json", full_files.parent / "agent.yaml"),
    ):
        document = yaml.safe_load(path.read_text(encoding="utf-8"))
        assert "$schema" in document
        check_json(name, document, path.name)  # type: ignore[arg-type]


AGENT_TOP = "tools:\n  - {name: mark, description: d, command: [./mark.sh]}\n"


def _tasks(*lines: str) -> str:
    return "agent: agent.yaml\n" + "".join(f"{line}\n" for line in lines)


def _expecting(expect: str) -> str:
    return _tasks(f"tasks: [{{id: a, prompt: p, expect: {expect}}}]")


def _tool(fields: str) -> str:
    return f"tools:\n  - {{name: t, description: d, {fields}}}\n"


ONE_TASK = "tasks: [{id: a, prompt: p}]"
# Each file is refused by the loader and by its schema.
BAD_INPUTS: list[tuple[SchemaName, str]] = [
    ("tasks.schema.json", _tasks("task: []")),
    ("tasks.schema.json", _tasks("repeat: '2'", ONE_TASK)),
    ("tasks.schema.json", _tasks("tasks: {id: a, prompt: p}")),
    ("tasks.schema.json", _tasks("tasks: []")),
    ("tasks.schema.json", _tasks("min_pass_rate: 1.5", ONE_TASK)),
    ("tasks.schema.json", _tasks("$schema: 7", ONE_TASK)),
    ("tasks.schema.json", _tasks("tasks: [{id: a b, prompt: p}]")),
    ("tasks.schema.json", _tasks("tasks: [{id: a}]")),
    ("tasks.schema.json", _expecting("{exit: 0}")),
    ("tasks.schema.json", _expecting("{exit_code: 256}")),
    ("tasks.schema.json", _expecting("{answer_contains: ['']}")),
    ("tasks.schema.json", _expecting("{calls: [{tool: mark, times: -1}]}")),
    ("tasks.schema.json", _expecting("{check: []}")),
    ("agent.schema.json", AGENT_TOP + "modle: m\n"),
    ("agent.schema.json", AGENT_TOP + "yolo: 'false'\n"),
    ("agent.schema.json", AGENT_TOP + "builtins: [web_fetch]\n"),
    ("agent.schema.json", AGENT_TOP + "model_options: {stream: true}\n"),
    ("agent.schema.json", AGENT_TOP + "model_options: {max_parallel: 0}\n"),
    ("agent.schema.json", AGENT_TOP + "allow: [{tool: bash}]\n"),
    ("agent.schema.json", AGENT_TOP + "allow: [{tool: mark, bash: ls}]\n"),
    ("agent.schema.json", AGENT_TOP + "allow: [{bash: ls, args: {a: b}}]\n"),
    ("agent.schema.json", AGENT_TOP + "allow: [{}]\n"),
    ("agent.schema.json", AGENT_TOP + "sandbox: {user: 1000}\n"),
    ("agent.schema.json", AGENT_TOP + "sandbox: {kind: podman}\n"),
    ("agent.schema.json", AGENT_TOP + "sandbox: {workspace: mount, limits: {workspace: 1g}}\n"),
    ("agent.schema.json", AGENT_TOP + "sandbox: {limits: {memory: 1 GB}}\n"),
    ("agent.schema.json", AGENT_TOP + "mcp: [{name: 1x, url: 'http://h/mcp'}]\n"),
    ("agent.schema.json", AGENT_TOP + "hooks: {preToolCall: ./audit.sh}\n"),
    ("agent.schema.json", "tools:\n  - {name: bash, description: d, command: [./x]}\n"),
    ("agent.schema.json", "tools:\n  - {name: t, command: [./x]}\n"),
    ("agent.schema.json", _tool("command: []")),
    ("agent.schema.json", _tool("command: ['{{p}}'], parameters: {p: {type: string}}")),
    ("agent.schema.json", _tool("command: [./x], parameters: {p: {type: str}}")),
    ("agent.schema.json", _tool("command: [./x], parameters: {p: {type: integer, enum: [a]}}")),
    (
        "agent.schema.json",
        _tool("command: [./x], parameters: {p: {type: string, default: a, required: true}}"),
    ),
    ("agent.schema.json", _tool("command: [./x], parameters: {1p: {type: string}}")),
    ("agent.schema.json", _tool("command: [./x], env: {A=B: c}")),
    ("agent.schema.json", _tool("command: [./x], timeout: 0")),
]


@pytest.mark.parametrize(
    ("name", "text"), BAD_INPUTS, ids=[t.strip().splitlines()[-1] for _, t in BAD_INPUTS]
)
def test_the_input_schemas_refuse_what_the_loader_refuses(
    name: SchemaName, text: str, tmp_path: Path
) -> None:
    """Shape errors are refused by both; a schema never refuses a file the loader takes."""
    write(tmp_path, "mark.sh", "#!/bin/sh\n").chmod(0o755)
    write(tmp_path, "agent.yaml", AGENT_TOP)
    path = write(tmp_path, "agent.yaml" if name == "agent.schema.json" else "tasks.yaml", text)
    with pytest.raises(ConfigError):
        if name == "agent.schema.json":
            load_agent_file(path, environ={})
        else:
            load_tasks(path, environ={})
    assert not json_validator(name).is_valid(yaml.safe_load(text))


# -- check-jsonschema, as a user runs it ------------------------------------------------------

CHECK_JSONSCHEMA = Path(sys.executable).parent / "check-jsonschema"


def _check_jsonschema(name: SchemaName, *files: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(CHECK_JSONSCHEMA), "--schemafile", str(schemas.path(name)), *map(str, files)],
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "NO_COLOR": "1"},
    )


def test_check_jsonschema_validates_the_examples_and_names_a_mistake(tmp_path: Path) -> None:
    examples = [p for p in _yaml_files() if p.is_relative_to(ROOT / "examples")]
    kinds = {p: _accepted(p) for p in examples}
    assert None not in kinds.values(), "an example the loader refuses"
    for name in ("tasks.schema.json", "agent.schema.json"):
        files = [p for p, kind in kinds.items() if kind == name]
        assert files
        checked = _check_jsonschema(name, *files)
        assert checked.returncode == 0, checked.stdout + checked.stderr
        assert "ok -- validation done" in checked.stdout
    bad = write(tmp_path, "tasks.yaml", _tasks("repeat: two", ONE_TASK))
    refused = _check_jsonschema("tasks.schema.json", bad)
    assert refused.returncode == 1
    assert "$.repeat" in refused.stdout + refused.stderr


README_EXAMPLE = textwrap.dedent(
    """\
    # yaml-language-server: $schema=../mm_batch/schemas/tasks.schema.json
    agent: agent.yaml
    tasks: [{id: a, prompt: p}]
    """
)


def test_the_editor_modeline_is_a_comment_the_loader_ignores(tmp_path: Path) -> None:
    write(tmp_path, "mark.sh", "#!/bin/sh\n").chmod(0o755)
    write(tmp_path, "agent.yaml", AGENT_TOP)
    path = write(tmp_path, "tasks.yaml", README_EXAMPLE)
    assert [t.id for t in load_tasks(path, environ={}).tasks] == ["a"]
    assert _check_jsonschema("tasks.schema.json", path).returncode == 0
