"""Shared fixtures: a scripted fake model behind a real HTTP server, and a CLI driver."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
import time
import xml.etree.ElementTree as ET
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from mm_batch.cli import main
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
    tasks: Path, server: FakeOpenAI, out: Path, marker: Path
) -> subprocess.Popen[bytes]:
    """Start `mm-batch run` as its own process; return once a tool has created the marker."""
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


def check_report(path: Path) -> None:
    """Validate a junit.xml against the common JUnit XSD where the shared documents lie beside
    the checkout (kept out of it); elsewhere, check the shape CI readers rely on."""
    if JUNIT_XSD.exists():
        import xmlschema

        xmlschema.XMLSchema(str(JUNIT_XSD)).validate(str(path))
        return
    root = ET.parse(path).getroot()  # well-formed, whatever the commands printed
    assert root.tag == "testsuites"
    for suite in root:
        assert suite.tag == "testsuite"
        assert {"name", "tests", "failures", "errors", "time"} <= set(suite.attrib)
        cases = suite.findall("testcase")
        assert int(suite.attrib["tests"]) == len(cases)
        failures = sum(c.find("failure") is not None for c in cases)
        errors = sum(c.find("error") is not None for c in cases)
        assert (int(suite.attrib["failures"]), int(suite.attrib["errors"])) == (failures, errors)
        for case in cases:
            assert set(case.attrib) == {"name", "classname", "time"}


def write(directory: Path, name: str, text: str) -> Path:
    path = directory / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text).lstrip("\n"), encoding="utf-8")
    return path


def read_calls(out: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (out / "calls.jsonl").read_text().splitlines()]


def model_args(server: FakeOpenAI) -> list[str]:
    return ["--model", "hosted_vllm/fake", "--model-option", f"api_base={server.url}"]


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
