"""SIGTERM mid-run: valid junit.xml, parseable calls.jsonl, unfinished runs as errors, exit 130."""

from __future__ import annotations

import json
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import xmlschema
from junitparser import Error, JUnitXml

from mm_batch.testing.fake_openai import FakeOpenAI, Script, by_prompt, text, tool_call
from tests.conftest import JUNIT_XSD, run_until_marker, write


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signal_mid_call_keeps_everything(
    sig: signal.Signals, fake_model: Callable[[Script], FakeOpenAI], tmp_path: Path
) -> None:
    write(
        tmp_path,
        "agent.yaml",
        """
        yolo: true
        tools:
          - name: quick
            description: Quick.
            command: ["true"]
          - name: slow
            description: Slow.
            command: ["/bin/sh", "-c", "echo started > started; sleep 300"]
    """,
    )
    write(
        tmp_path,
        "tasks.yaml",
        """
        agent: agent.yaml
        jobs: 2
        tasks:
          - {id: fast, prompt: fast}
          - {id: hang, prompt: hang}
          - {id: queued-1, prompt: q}
          - {id: queued-2, prompt: q}
    """,
    )
    fake = fake_model(
        by_prompt(
            {
                "fast": [tool_call("quick", {}), text("done")],
                "hang": [tool_call("slow", {}), text("never")],
                "q": [tool_call("slow", {}), text("never")],
            }
        )
    )
    out = tmp_path / "out"
    proc = run_until_marker(tmp_path / "tasks.yaml", fake, out, tmp_path / "started")
    time.sleep(0.3)
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 130, err.decode()
    assert f"interrupted by {sig.name}" in err.decode()
    records = [json.loads(line) for line in (out / "calls.jsonl").read_text().splitlines()]
    finals = {r["task"]: r for r in records if r["kind"] == "task"}
    assert set(finals) == {"fast", "hang", "queued-1", "queued-2"}
    assert finals["fast"]["status"] == "passed"
    assert {finals[t]["status"] for t in ("hang", "queued-1", "queued-2")} == {"error"}
    if JUNIT_XSD.exists():
        xmlschema.XMLSchema(str(JUNIT_XSD)).validate(str(out / "junit.xml"))
    cases = {c.name: c for s in JUnitXml.fromfile(str(out / "junit.xml")) for c in s}
    assert cases["fast"].is_passed
    assert isinstance(cases["hang"].result[0], Error)
    assert json.loads((out / "summary.json").read_text())["exit_code"] == 130
    # The slow command's process group was stopped with the run.
    assert (
        subprocess.run(["pgrep", "-f", "sleep 300"], check=False, capture_output=True).stdout == b""
    )
