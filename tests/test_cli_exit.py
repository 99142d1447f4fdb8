"""How a real `mm-batch run` process starts and ends, attacked end to end.

The process imports litellm on a thread of its own from its first moment, and ends with
`os._exit` once its reports are written, skipping the interpreter's teardown. Nothing may be
lost to that: every record, junit.xml, the summaries and GitHub's step summary are whole, the
exit code is the verdict's, the watchdog leaves with a goodbye, and a SIGTERM mid-run still
ends in complete reports and exit 130. A litellm that cannot be imported is a clear error,
never a hang. In-process, `main(argv)` returns its code and never ends the caller's process.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from mm_batch.cli import main
from mm_batch.effects.litellm import BackgroundImport, LiteLLMImportError
from mm_batch.testing.fake_openai import Delayed, FakeOpenAI, Reply, by_prompt, text
from tests.helpers import Fake, check_report, model_args, write

TASKS = ("alpha", "beta", "gamma", "delta", "epsilon", "zeta")
CONSOLE_SCRIPT = Path(sys.executable).parent / "mm-batch"


def _plan(directory: Path) -> Path:
    write(directory, "agent.yaml", "tools: []\n")
    items = "\n".join(f"  - {{id: {t}, prompt: {t}}}" for t in TASKS)
    return write(directory, "tasks.yaml", f"agent: agent.yaml\njobs: 3\ntasks:\n{items}\n")


def _spawn(
    command: list[str], tasks: Path, fake: FakeOpenAI, out: Path, **env: str
) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [*command, "run", str(tasks), *model_args(fake), "--out", str(out)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ, **env},
        cwd=tasks.parent,
    )


def _watchdogs_of(pid: int) -> list[int]:
    """Live watchdog processes whose owner is `pid` (its first argument after the script)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
            state = (entry / "stat").read_bytes().rsplit(b")", 1)[-1].split()[0]
        except OSError:
            continue
        script = [i for i, a in enumerate(argv) if a.endswith(b"watchdog.py")]
        if script and argv[script[0] + 1 : script[0] + 2] == [str(pid).encode()] and state != b"Z":
            found.append(int(entry.name))
    return found


def _records(out: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in (out / "calls.jsonl").read_text().splitlines()]


@pytest.mark.parametrize(
    "command",
    [[sys.executable, "-m", "mm_batch"], [str(CONSOLE_SCRIPT)]],
    ids=["python -m mm_batch", "mm-batch"],
)
def test_a_real_process_leaves_every_report_whole(
    command: list[str], fake_model: Fake, tmp_path: Path
) -> None:
    fake = fake_model(by_prompt({}, default=text("done")))
    step_summary = tmp_path / "step-summary.md"
    step_summary.write_text("before\n")
    out = tmp_path / "out"
    proc = _spawn(command, _plan(tmp_path), fake, out, GITHUB_STEP_SUMMARY=str(step_summary))
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err.decode()
    assert err.decode().rstrip().endswith(f"mm-batch: reports in {out}")
    finals = {r["task"]: r["status"] for r in _records(out) if r["kind"] == "task"}
    assert finals == dict.fromkeys(TASKS, "passed")
    check_report(out / "junit.xml")  # with summary.json and every record, against the schemas
    assert json.loads((out / "summary.json").read_text())["exit_code"] == 0
    summary_md = (out / "summary.md").read_text()
    assert step_summary.read_text() == "before\n" + summary_md + "\n"
    assert not _watchdogs_of(proc.pid)  # it left on a goodbye, as mm-batch exited


def test_sigterm_mid_run_keeps_every_report_and_exits_130(fake_model: Fake, tmp_path: Path) -> None:
    """Two runs answered, the others' model calls in flight when SIGTERM comes."""
    answered = threading.Event()

    def script(request: dict[str, Any]) -> Reply:
        prompt = by_prompt({})(request)  # "done" for any prompt
        if len(fake.requests) > 2:
            answered.set()
            return Delayed(prompt, 60)
        return prompt

    fake = fake_model(script)
    step_summary = tmp_path / "step-summary.md"
    out = tmp_path / "out"
    proc = _spawn(
        [str(CONSOLE_SCRIPT)], _plan(tmp_path), fake, out, GITHUB_STEP_SUMMARY=str(step_summary)
    )
    assert answered.wait(60), proc.communicate(timeout=5)
    time.sleep(0.3)  # the first two runs are settled, three calls hang
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 130, err.decode()
    assert f"interrupted by SIGTERM; reports written to {out}" in err.decode()
    finals = {r["task"]: r["status"] for r in _records(out) if r["kind"] == "task"}
    assert set(finals) == set(TASKS)  # every run, finished or not, has its last record
    assert list(finals.values()).count("passed") == 2
    check_report(out / "junit.xml")
    assert json.loads((out / "summary.json").read_text())["exit_code"] == 130
    assert step_summary.read_text() == (out / "summary.md").read_text() + "\n"
    assert not _watchdogs_of(proc.pid)


def test_a_litellm_that_cannot_be_imported_is_a_clear_error(
    fake_model: Fake, tmp_path: Path
) -> None:
    broken = write(tmp_path / "broken", "litellm/__init__.py", "raise ImportError('on purpose')\n")
    fake = fake_model(by_prompt({}, default=text("done")))
    path = os.pathsep.join([str(broken.parent.parent), os.environ.get("PYTHONPATH", "")])
    out = tmp_path / "out"
    proc = _spawn([sys.executable, "-m", "mm_batch"], _plan(tmp_path), fake, out, PYTHONPATH=path)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 2, err.decode()
    assert (
        "mm-batch: litellm cannot be imported (ImportError: on purpose); reinstall mm-batch "
        "with its dependencies; nothing ran"
    ) in err.decode()
    assert "Traceback" not in err.decode()
    assert not fake.requests and not out.exists()


def test_a_failed_import_fails_every_caller_alike() -> None:
    calls: list[int] = []

    def load() -> ModuleType:
        calls.append(1)
        raise ModuleNotFoundError("No module named 'litellm'")

    background = BackgroundImport(load)
    background.start()
    for _ in range(2):
        with pytest.raises(LiteLLMImportError, match="ModuleNotFoundError: No module named"):
            background.result()
    assert calls == [1]  # tried once: the failure is handed to every caller


def test_every_caller_waits_for_the_one_import_in_flight() -> None:
    release = threading.Event()
    calls: list[int] = []

    module = ModuleType("litellm")

    def load() -> ModuleType:
        calls.append(1)
        release.wait(5)
        return module

    background = BackgroundImport(load)
    background.start()
    results: list[object] = []
    waiters = [threading.Thread(target=lambda: results.append(background.result())) for _ in "ab"]
    for waiter in waiters:
        waiter.start()
    time.sleep(0.1)
    assert not results  # both wait for the import, neither starts its own
    release.set()
    for waiter in waiters:
        waiter.join(5)
    assert results == [module, module] and calls == [1]


def test_in_process_main_returns_its_code(fake_model: Fake, tmp_path: Path) -> None:
    """Given its arguments, main is a function: the caller's process goes on after it."""
    fake = fake_model(by_prompt({}, default=text("done")))
    args = ["run", str(_plan(tmp_path)), *model_args(fake), "--out", str(tmp_path / "out")]
    assert main(args) == 0
