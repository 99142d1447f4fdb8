"""The seed experiment's plumbing: every approach can pass, judged by what the script received."""

from __future__ import annotations

import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from mm_batch.testing.fake_openai import Reply, by_prompt, text, tool_call
from tests.helpers import ROOT, Cli, Fake, model_args, read_calls

RELEASE = "Release version 1.4.2 to the beta channel."
CALLS = {
    "skill-bash": [
        tool_call("read_skill", {"name": "release"}),
        tool_call("bash", {"command": "./release.sh 1.4.2 --channel=beta"}),
    ],
    "mcp-standin": [tool_call("proj_release", {"version": "1.4.2", "channel": "beta"})],
    "declared": [tool_call("release", {"version": "1.4.2", "channel": "beta"})],
}


@pytest.fixture
def seed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A copy of the example (and of the scripts it links to), with its MCP stand-in running."""
    for name in ("release", "seed-experiment"):
        shutil.copytree(
            ROOT / "examples" / name,
            tmp_path / name,
            symlinks=True,
            ignore=shutil.ignore_patterns("calls-received.log"),
        )
    folder = tmp_path / "seed-experiment"
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    standin = subprocess.Popen(
        [sys.executable, str(folder / "mcp_standin.py"), str(port)], stderr=subprocess.DEVNULL
    )
    try:
        deadline = time.monotonic() + 20
        while True:
            with socket.socket() as probe:
                if probe.connect_ex(("127.0.0.1", port)) == 0:
                    break
            assert time.monotonic() < deadline, "the stand-in did not start"
            time.sleep(0.05)
        monkeypatch.setenv("SEED_MCP_URL", f"http://127.0.0.1:{port}/mcp")
        yield folder
    finally:
        standin.terminate()
        standin.wait(timeout=10)


def _by_approach(request: dict[str, Any]) -> Reply:
    """Script each agent with the calls that its approach needs."""
    tools = {t["function"]["name"] for t in request.get("tools", [])}
    approach = (
        "skill-bash"
        if "bash" in tools
        else "mcp-standin"
        if "proj_release" in tools
        else ("declared")
    )
    return by_prompt({RELEASE: [*CALLS[approach], text("done")]})(request)


def test_each_approach_passes_only_when_the_script_really_ran(
    seed: Path,
    cli: Cli,
    fake_model: Fake,
    tmp_path: Path,
) -> None:
    fake = fake_model(_by_approach)
    out = tmp_path / "out"
    result = cli(
        "run",
        seed / "tasks.yaml",
        *model_args(fake),
        "--out",
        out,
        "--filter",
        "*.release-*",
        "--repeat",
        "2",
    )
    assert result.code == 1  # the French requests were scripted with nothing: no script ran
    verdicts = {
        (t["task"], t["repeat"]): t["status"] for t in read_calls(out) if t["kind"] == "task"
    }
    assert len(verdicts) == 12
    for (task, _), status in verdicts.items():
        assert status == ("passed" if task.endswith("release-en") else "failed"), task
