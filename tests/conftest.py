"""Shared fixtures: a scripted fake model behind a real HTTP server, and a CLI driver."""

from __future__ import annotations

import functools
import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
import time
import xml.etree.ElementTree as ET
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from mm_batch import schemas
from mm_batch.cli import main
from mm_batch.schemas import SchemaName
from mm_batch.testing.fake_openai import FakeOpenAI, Script

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "release"
JUNIT_XSD = ROOT.parent / "shared" / "data" / "junit-10.xsd"


@dataclass
class CliResult:
    code: int
    out: str
    err: str


@pytest.fixture
def cli(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> Callable[..., CliResult]:
    """Run mm-batch in-process, as a user would from the shell."""

    def invoke(*args: str | Path, cwd: Path | None = None) -> CliResult:
        if cwd is not None:
            monkeypatch.chdir(cwd)
        capsys.readouterr()
        code = main([str(a) for a in args])
        captured = capsys.readouterr()
        return CliResult(code, captured.out, captured.err)

    return invoke


@pytest.fixture
def fake_model() -> Iterator[Callable[[Script], FakeOpenAI]]:
    servers: list[FakeOpenAI] = []

    def start(script: Script, latency_s: float = 0.0) -> FakeOpenAI:
        server = FakeOpenAI(script, latency_s).__enter__()
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.__exit__(None, None, None)


@pytest.fixture
def release_example(tmp_path: Path) -> Path:
    """A private copy of examples/release, so that runs can write beside it."""
    target = tmp_path / "release"
    shutil.copytree(EXAMPLE, target, ignore=shutil.ignore_patterns("calls-received.log"))
    return target


def run_until_marker(
    tasks: Path, server: FakeOpenAI, out: Path, marker: Path, *options: str
) -> subprocess.Popen[bytes]:
    """Start `mm-batch run` (with `options`) as its own process; return once a tool has created
    the marker."""
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "mm_batch",
            "run",
            str(tasks),
            *model_args(server),
            "--out",
            str(out),
            *options,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        cwd=tasks.parent,
    )
    deadline = time.monotonic() + 60
    while not marker.exists():
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "the tool never started"
        time.sleep(0.05)
    return proc


def _truthy(value: str | None) -> bool:
    return (value or "").strip().lower() in ("true", "1", "yes")


@functools.cache
def _xsd(path: Path) -> Any:
    import xmlschema

    return xmlschema.XMLSchema(str(path))


@functools.cache
def json_validator(name: SchemaName) -> Any:
    """A validator of one of the project's JSON Schemas (draft 2020-12), formats checked."""
    import jsonschema

    schema = json.loads(schemas.path(name).read_text(encoding="utf-8"))
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(
        schema, format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER
    )


def check_json(name: SchemaName, document: Any, where: str) -> None:
    """Fail with every schema error of `document`, each with its JSON path."""
    errors = sorted(json_validator(name).iter_errors(document), key=lambda e: list(e.path))
    if errors:
        shown = "\n".join(f"  {e.json_path}: {e.message[:300]}" for e in errors[:20])
        pytest.fail(f"{where} is not valid against {name}:\n{shown}", pytrace=False)


def check_junit(
    path: Path, shared_xsd: Path = JUNIT_XSD, environ: Mapping[str, str] = os.environ
) -> None:
    """junit.xml against the project's XSD always, and against the common JUnit XSD of the
    shared documents where they lie beside the checkout; under CI=true they must be there."""
    _xsd(schemas.path("junit.xsd")).validate(str(path))
    if shared_xsd.exists():
        _xsd(shared_xsd).validate(str(path))
    elif _truthy(environ.get("CI")):
        pytest.fail(
            f"CI=true but the common JUnit XSD is not at {shared_xsd}: CI must check the "
            "reports against it (check out the shared documents beside the project)",
            pytrace=False,
        )
    # What an XSD 1.0 cannot say: the counts agree, one verdict a test case, SPEC 7's attributes.
    root = ET.parse(path).getroot()
    totals = {"tests": 0, "failures": 0, "errors": 0}
    for suite in root:
        cases = suite.findall("testcase")
        verdicts = [[r.tag for r in c if r.tag in _VERDICTS] for c in cases]
        assert all(len(v) <= 1 for v in verdicts), f"{path}: a test case with {verdicts}"
        counts = {
            "tests": len(cases),
            "failures": sum(v == ["failure"] for v in verdicts),
            "errors": sum(v == ["error"] for v in verdicts),
        }
        assert {k: int(suite.attrib[k]) for k in counts} == counts, f"{path}: {suite.attrib}"
        skipped = sum(v == ["skipped"] for v in verdicts)
        assert int(suite.get("skipped", "0")) == skipped, f"{path}: {suite.attrib}"
        assert set(suite.attrib) >= _SUITE_ATTRIBUTES, f"{path}: {suite.attrib}"
        assert _RFC3339.fullmatch(suite.attrib["timestamp"]), f"{path}: {suite.attrib}"
        for key in totals:
            totals[key] += counts[key]
        for case in cases:
            assert set(case.attrib) == {"name", "classname", "time"}, case.attrib
    for key, value in totals.items():
        assert int(root.get(key, "-1")) == value, f"{path}: testsuites {key}={root.get(key)}"


_VERDICTS = ("failure", "error", "skipped", "flakyFailure", "flakyError")
# SPEC 7: each <testsuite> carries the tasks file, when it ran and where.
_SUITE_ATTRIBUTES = {"name", "tests", "failures", "errors", "time", "file", "timestamp", "hostname"}
_RFC3339 = re.compile(
    r"[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}(\.[0-9]+)?(Z|[+-][0-9]{2}:[0-9]{2})"
)


def check_report(path: Path) -> None:
    """Validate a results folder by its junit.xml: the JUnit report (see `check_junit`), and
    summary.json and every calls.jsonl record beside it against the project's JSON Schemas."""
    check_junit(path)
    folder = path.parent
    summary = json.loads((folder / "summary.json").read_text(encoding="utf-8"))
    check_json("summary.schema.json", summary, str(folder / "summary.json"))
    cases = ET.parse(path).getroot().iter("testcase")
    assert len(summary["runs"]) == sum(1 for _ in cases), "summary.json and junit.xml disagree"
    last: dict[str, dict[str, Any]] = {}
    lines = (folder / "calls.jsonl").read_text(encoding="utf-8").splitlines()
    for number, line in enumerate(lines, 1):
        record = json.loads(line)
        where = f"{folder / 'calls.jsonl'}:{number}"
        check_json("calls.schema.json", record, where)
        before = last.get(record["run"])
        # Each run's records count from 1 without a gap, and its task record comes last.
        assert record["seq"] == (before["seq"] + 1 if before else 1), f"{where}: seq"
        assert before is None or before["kind"] != "task", f"{where}: a record after the verdict"
        last[record["run"]] = record


def write(directory: Path, name: str, text: str) -> Path:
    path = directory / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text).lstrip("\n"), encoding="utf-8")
    return path


def read_calls(out: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (out / "calls.jsonl").read_text().splitlines()]


def model_args(server: FakeOpenAI) -> list[str]:
    return ["--model", "hosted_vllm/fake", "--model-option", f"api_base={server.url}"]


PRICED_MODEL = "openai/gpt-4o-mini"  # in litellm's bundled price map


def priced_model_args(server: FakeOpenAI, model: str = PRICED_MODEL) -> list[str]:
    """The options that send `model` (one litellm prices, by default) to the fake server;
    litellm's OpenAI client wants a key, which the fake server never reads."""
    return [
        "--model",
        model,
        "--model-option",
        f"api_base={server.url}",
        "--model-option",
        "api_key=not-a-real-key",
    ]


# A program that prints its argv (after argv[0]) as JSON: what really reached the process.
ARGV_PRINTER = textwrap.dedent(
    """\
    #!/usr/bin/env python3
    import json, sys
    print(json.dumps(sys.argv[1:]))
    """
)


@pytest.fixture
def argv_printer(tmp_path: Path) -> Path:
    path = tmp_path / "show-argv"
    path.write_text(ARGV_PRINTER)
    path.chmod(0o755)
    return path


from tests.docker_support import docker_client  # noqa: E402, F401  (a shared fixture)


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """Say how many Docker and live-model tests really ran: in CI they must run, never skip."""
    for marker in ("docker", "live"):
        counts = {"passed": 0, "failed": 0, "skipped": 0}
        for outcome in counts:
            for report in terminalreporter.stats.get(outcome, []):
                # A pass counts at its call; a failure or a skip may happen in the setup already.
                phases = ("call",) if outcome == "passed" else ("setup", "call")
                if marker in getattr(report, "keywords", {}) and report.when in phases:
                    counts[outcome] += 1
        terminalreporter.write_line(
            f"{marker} tests: {counts['passed']} passed, {counts['failed']} failed, "
            f"{counts['skipped']} skipped"
        )
