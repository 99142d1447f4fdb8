"""The host executor: argv exactly, exit codes, output, workdir, clean env, timeouts, floods."""

from __future__ import annotations

import json
import sys
import threading
import time
from pathlib import Path

import pytest

from mm_batch.effects.host import LOG_LIMIT, HostExecutor, host_environment

from mm_batch.run.ports import ExecResult

PY = sys.executable


def run(
    argv: list[str],
    workdir: Path,
    timeout: float = 30,
    env: dict[str, str] | None = None,
    cancel: threading.Event | None = None,
) -> ExecResult:
    return HostExecutor().execute(argv, workdir, env or {}, timeout, cancel)


def _alive(pid: int) -> bool:
    """Running or sleeping; a zombie waiting for a reaper is dead."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


def test_argv_exit_code_and_streams(tmp_path: Path) -> None:
    code = "import sys; print(sys.argv[1:]); print('err', file=sys.stderr); sys.exit(7)"
    result = run([PY, "-c", code, "a b", "*", "$HOME"], tmp_path)
    assert result.exit_code == 7
    assert result.stdout.data == b"['a b', '*', '$HOME']\n"
    assert result.stderr.data == b"err\n"
    assert not result.timed_out and result.error is None


def test_workdir_and_relative_program(tmp_path: Path) -> None:
    script = tmp_path / "where.sh"
    script.write_text("#!/bin/sh\npwd\n")
    script.chmod(0o755)
    result = run(["./where.sh"], tmp_path)
    assert result.stdout.data.decode().strip() == str(tmp_path)


def test_environment_is_clean(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MM_BATCH_LEAK_CHECK", "leaked")
    code = "import os, json; print(json.dumps(dict(os.environ)))"
    result = run([PY, "-c", code], tmp_path, env={"TOOL_VAR": "1"})
    env = json.loads(result.stdout.data)
    assert "MM_BATCH_LEAK_CHECK" not in env
    assert env["TOOL_VAR"] == "1"
    assert set(env) - {"PATH", "HOME", "LANG", "TZ", "TOOL_VAR", "LC_CTYPE"} == set()
    assert host_environment({}, {"PATH": "/p", "SECRET": "x"}) == {"PATH": "/p"}


def test_timeout_kills_the_whole_process_tree(tmp_path: Path) -> None:
    pidfile = tmp_path / "child.pid"
    script = f"sleep 300 & echo $! > {pidfile}; wait"
    started = time.monotonic()
    result = run(["/bin/sh", "-c", script], tmp_path, timeout=1)
    assert result.timed_out and result.exit_code is None
    assert time.monotonic() - started < 6
    child = int(pidfile.read_text())
    time.sleep(0.2)
    assert not _alive(child)


def test_term_ignored_is_killed(tmp_path: Path) -> None:
    result = run(["/bin/sh", "-c", "trap '' TERM; sleep 300"], tmp_path, timeout=0.5)
    assert result.timed_out
    assert result.duration_s < 6


def test_output_flood_is_bounded(tmp_path: Path) -> None:
    code = "import sys\nfor _ in range(64): sys.stdout.write('x' * 1048576)"
    result = run([PY, "-c", code], tmp_path)
    assert result.exit_code == 0
    assert len(result.stdout.data) == LOG_LIMIT
    assert result.stdout.total == 64 * 1048576
    assert result.stdout.cut == 63 * 1048576


def test_missing_program(tmp_path: Path) -> None:
    result = run(["./nope.sh"], tmp_path)
    assert result.exit_code is None
    assert result.error == f"program not found: ./nope.sh (looked in {tmp_path})"
    result = run(["no-such-program-mm-batch"], tmp_path)
    assert result.error == "program not found: no-such-program-mm-batch (looked in the PATH)"


def test_not_executable(tmp_path: Path) -> None:
    (tmp_path / "plain.sh").write_text("echo hi\n")
    assert run(["./plain.sh"], tmp_path).error == "program is not executable: ./plain.sh"


def test_cancel_stops_the_command(tmp_path: Path) -> None:
    cancel = threading.Event()
    threading.Timer(0.3, cancel.set).start()
    result = run(["sleep", "300"], tmp_path, cancel=cancel)
    assert result.interrupted and not result.timed_out
    assert result.duration_s < 5


def test_signal_death_is_reported_like_a_shell(tmp_path: Path) -> None:
    assert run(["/bin/sh", "-c", "kill -9 $$"], tmp_path).exit_code == 137
