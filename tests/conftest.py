"""Shared fixtures and hooks: a scripted fake model behind a real HTTP server, a CLI driver.

Only fixtures and hooks live here; what tests import is in tests/helpers.py.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from mm_batch.cli import main
from mm_batch.testing.fake_openai import FakeOpenAI, Script
from tests.docker_support import docker_client  # noqa: F401  (a shared fixture)
from tests.helpers import ARGV_PRINTER, EXAMPLE, Cli, CliResult, Fake


@pytest.fixture
def cli(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> Cli:
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
def fake_model() -> Iterator[Fake]:
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


@pytest.fixture
def argv_printer(tmp_path: Path) -> Path:
    path = tmp_path / "show-argv"
    path.write_text(ARGV_PRINTER)
    path.chmod(0o755)
    return path


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
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
