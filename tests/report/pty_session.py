"""`mm-batch run` as its own process on a real pseudo-terminal, and a slow task to watch."""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from mm_batch.testing.fake_openai import FakeOpenAI
from tests.helpers import model_args, write


def pty_run(
    tasks: Path,
    server: FakeOpenAI,
    out: Path,
    term: str,
    on_output: Callable[[bytes, subprocess.Popen[bytes]], None] = lambda _o, _p: None,
    timeout_s: float = 90,
) -> tuple[int, list[tuple[float, bytes]]]:
    """Run `mm-batch run` with its stdout and stderr on a pseudo-terminal; what it printed, when."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GITHUB_")}
    env.update(TERM=term, PYTHONUNBUFFERED="1", COLUMNS="200")
    master, slave = os.openpty()
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
        stdin=subprocess.DEVNULL,
        stdout=slave,
        stderr=slave,
        env=env,
        cwd=tasks.parent,
    )
    os.close(slave)
    chunks: list[tuple[float, bytes]] = []
    seen = b""
    deadline = time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 0.1)
            if not ready:
                continue
            try:
                data = os.read(master, 4096)
            except OSError:  # EIO: every holder of the terminal's other end has closed it
                break
            if not data:
                break
            chunks.append((time.monotonic(), data))
            seen += data
            on_output(seen, proc)
        else:
            proc.kill()
            pytest.fail(
                f"mm-batch did not finish in {timeout_s} s: {seen.decode(errors='replace')}"
            )
    finally:
        os.close(master)
    return proc.wait(timeout=30), chunks


def slow_suite(directory: Path, command: str, check: str = "exit 1") -> Path:
    """One task whose one tool runs `command`; the task's check program runs `check`."""
    write(
        directory,
        "agent.yaml",
        f"""
        yolo: true
        tools:
          - name: slow
            description: Takes its time.
            command: ["/bin/sh", "-c", {json.dumps(command)}]
        """,
    )
    return write(
        directory,
        "tasks.yaml",
        f"""
        agent: agent.yaml
        tasks:
          - id: slow
            prompt: slow
            expect:
              check: ["/bin/sh", "-c", {json.dumps(check)}]
        """,
    )
