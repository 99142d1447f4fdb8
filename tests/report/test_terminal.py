"""The terminal: a live line that ticks, plain lines elsewhere, a short summary at the end.

The live-line tests run `mm-batch run` as its own process on a real pseudo-terminal.
"""

from __future__ import annotations

import fcntl
import io
import os
import re
import select
import signal
import struct
import subprocess
import termios
import time
from collections.abc import Mapping
from pathlib import Path

import pytest

from mm_batch.errors import ExitCode
from mm_batch.report.terminal import Progress, short_summary
from mm_batch.run.records import RunResult, Status
from mm_batch.testing.fake_openai import (
    HttpFailure,
    by_prompt,
    text,
    tool_call,
)
from tests.helpers import Cli, Fake, model_args, write, yolo_agent
from tests.report.pty_session import pty_run, slow_suite

TABLE_HEADER = re.compile(r"^model +passed/runs +failed +errors +mean s +tokens in/out +cost usd$")
LIVE = re.compile(r"(\d+)/(\d+) done, \d+ passed, \d+ failed, \d+ errors, (\d+) s elapsed")


class _Terminal(io.StringIO):
    """A stream that says it is a terminal, and remembers when each write came."""

    def __init__(self) -> None:
        super().__init__()
        self.writes: list[float] = []

    def isatty(self) -> bool:
        return True

    def write(self, s: str) -> int:
        self.writes.append(time.monotonic())
        return super().write(s)


def _result(status: Status, reason: str = "", task: str = "t", repeat: int = 1) -> RunResult:
    return RunResult(f"{task}[m]#{repeat}", task, "m", repeat, status, reason, (), 1.0, None, ())


def test_the_live_line_ticks_while_nothing_finishes() -> None:
    stream = _Terminal()
    with Progress(3, stream, environ={"TERM": "xterm"}, tick_s=0.05):
        time.sleep(0.5)
        drawn = stream.getvalue().count("\r")
    assert drawn >= 5  # redrawn with no run finished
    assert "0/3 done, 0 passed, 0 failed, 0 errors, 0 s elapsed, ETA unknown" in stream.getvalue()
    # Leaving ended the open line and stopped the ticker: nothing is written afterwards.
    after = stream.getvalue()
    assert after.endswith("\n") and after.count("\n") == 1
    time.sleep(0.2)
    assert stream.getvalue() == after


def test_a_finished_live_line_is_ended_once() -> None:
    stream = _Terminal()
    with Progress(2, stream, environ={"TERM": "xterm"}, tick_s=0.02) as progress:
        progress(_result("passed"))
        progress(_result("failed", "why\nnot", repeat=2))
        time.sleep(0.1)  # the ticker does not redraw a finished line
    text = stream.getvalue()
    assert text.count("\n") == 1 and text.endswith("\n")
    assert text.split("\r")[-1].startswith("\x1b[2K2/2 done, 1 passed, 1 failed, 0 errors")


def test_an_interrupted_live_line_is_ended_before_anything_else() -> None:
    stream = _Terminal()
    with Progress(3, stream, environ={"TERM": "xterm"}, tick_s=10) as progress:
        progress(_result("passed"))
    text = stream.getvalue()
    assert text.endswith("1/3 done, 1 passed, 0 failed, 0 errors, 0 s elapsed, ETA 0 s\n")


def test_the_live_line_fits_a_narrow_terminal() -> None:
    """On a real pseudo-terminal 40 columns wide, the line is cut rather than wrapped."""
    master, slave = os.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 40, 0, 0))
    with open(slave, "w", encoding="utf-8", closefd=True) as stream:
        assert stream.isatty()
        with Progress(3, stream, environ={"TERM": "xterm"}, tick_s=10) as progress:
            progress(_result("passed"))
    output = b""
    while select.select([master], [], [], 0.2)[0]:
        try:
            output += os.read(master, 4096)
        except OSError:
            break
    os.close(master)
    drawn = output.decode().replace("\r\n", "\n").split("\r")
    lines = [d.removeprefix("\x1b[2K").rstrip("\n") for d in drawn if d]
    assert lines and all(len(line) == 39 for line in lines), lines
    assert lines[-1].startswith("1/3 done, 1 passed, 0 failed")


@pytest.mark.parametrize("environ", [{"TERM": "dumb"}, {}], ids=["TERM=dumb", "no TERM"])
def test_dumb_terminals_and_pipes_get_plain_lines(environ: Mapping[str, str]) -> None:
    streams: list[io.StringIO] = [io.StringIO()]  # not a terminal
    if environ.get("TERM") == "dumb":
        streams.append(_Terminal())  # a terminal that cannot redraw
    for stream in streams:
        with Progress(2, stream, environ=environ, tick_s=0.01) as progress:
            time.sleep(0.05)
            progress(_result("passed"))
            progress(_result("error", "model\n\x1b[31mdown", repeat=2))
        assert stream.getvalue() == (
            "[1/2] passed t[m]#1 (1.0 s)\n[2/2] error  t[m]#2 (1.0 s): model \\x1b[31mdown\n"
        )


def test_short_summary_lists_each_run_that_did_not_pass() -> None:
    results = [
        _result("passed"),
        _result("failed", "calls[0]: expected x\nbut got y", repeat=2),
        _result("error", "the model could not be reached", task="u"),
        _result("passed", task="u", repeat=2),
    ]
    assert short_summary(results, min_pass_rate=1.0) == [
        "FAILED t[m]#2 - calls[0]: expected x but got y",
        "ERROR u[m]#1 - the model could not be reached",
    ]
    assert short_summary(results, min_pass_rate=0.5) == [
        "FAILED t[m]#2 - calls[0]: expected x but got y (tolerated: the task passed 1/2 runs)",
        "ERROR u[m]#1 - the model could not be reached (tolerated: the task passed 1/2 runs)",
    ]


def _mixed_suite(directory: Path) -> Path:
    write(directory, "agent.yaml", yolo_agent("noop", "Does nothing."))
    return write(
        directory,
        "tasks.yaml",
        """
        agent: agent.yaml
        jobs: 1
        tasks:
          - {id: good, prompt: good, expect: {answer_contains: [ok]}}
          - {id: bad, prompt: bad, expect: {answer_contains: [ok]}}
          - {id: down, prompt: down, expect: {answer_contains: [ok]}}
        """,
    )


def test_run_ends_with_the_table_then_the_failed_and_erroring_runs(
    cli: Cli, fake_model: Fake, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("GITHUB_ACTIONS", raising=False)
    fake = fake_model(
        by_prompt(
            {"good": [text("ok")], "bad": [text("no")], "down": [HttpFailure(401, "bad key")]}
        )
    )
    tasks = _mixed_suite(tmp_path)
    result = cli("run", tasks, *model_args(fake), "--out", tmp_path / "out")
    assert result.code == 1, result.err
    lines = result.err.splitlines()
    table = next(i for i, line in enumerate(lines) if TABLE_HEADER.match(line))
    assert lines[table + 1].startswith("hosted_vllm/fake  1/3 ")
    failed, error = lines[table + 2 : table + 4]
    assert failed == "FAILED bad[hosted_vllm/fake]#1 - answer_contains:ok: not in the final answer"
    assert error.startswith("ERROR down[hosted_vllm/fake]#1 - ")
    assert "401" in error or "bad key" in error or "refused" in error, error
    assert lines[table + 4] == f"mm-batch: reports in {tmp_path / 'out'}"


def test_run_help_lists_the_exit_codes(cli: Cli) -> None:
    result = cli("run", "--help")
    assert result.code == 0
    help_lines = [line.strip() for line in result.out.splitlines()]
    start = help_lines.index("Exit codes:")
    codes = [int(line.split()[0]) for line in help_lines[start + 1 : start + 7]]
    assert codes == sorted(int(c) for c in ExitCode)  # one line each, kept as written
    assert "130  interrupted by SIGINT, SIGTERM or SIGHUP; the reports are written" in help_lines


# --- on a real pseudo-terminal -------------------------------------------------------------


def test_on_a_terminal_the_live_line_ticks_every_second(fake_model: Fake, tmp_path: Path) -> None:
    tasks = slow_suite(tmp_path, "sleep 3.5")
    fake = fake_model(by_prompt({"slow": [tool_call("slow", {}), text("done")]}))
    code, chunks = pty_run(tasks, fake, tmp_path / "out", "xterm-256color")
    assert code == 1
    output = b"".join(c for _, c in chunks).decode()
    # Every redraw while the one run was under way, with the seconds it showed.
    shown = [int(m.group(3)) for m in LIVE.finditer(output) if m.group(1) == "0"]
    assert len(shown) >= 5, output
    # No second was skipped: the line changed at least once a second.
    assert sorted(set(shown)) == list(range(shown[-1] + 1)), shown
    assert shown[-1] >= 3
    assert "\x1b[2K" in output
    # The finished line was ended, and the table starts a line of its own.
    lines = output.replace("\r\n", "\n").split("\n")
    assert any(TABLE_HEADER.match(line) for line in lines), output
    assert "FAILED slow[hosted_vllm/fake]#1 - check: exited 1" in output


def test_term_dumb_on_a_terminal_gets_plain_lines(fake_model: Fake, tmp_path: Path) -> None:
    # What the check prints (escape sequences included) ends up in the reason.
    paint = "printf 'not \\033[31mred\\033[0m\\033[2J'; exit 1"
    tasks = slow_suite(tmp_path, "sleep 1.2", check=paint)
    fake = fake_model(by_prompt({"slow": [tool_call("slow", {}), text("\x1b[2Jcleared")]}))
    code, chunks = pty_run(tasks, fake, tmp_path / "out", "dumb")
    assert code == 1
    output = b"".join(c for _, c in chunks).decode()
    assert "\x1b" not in output, output
    assert "\r" not in output.replace("\r\n", "\n"), output  # no line redrawn in place
    lines = output.replace("\r\n", "\n").splitlines()
    assert any(line.startswith("[1/1] failed slow[hosted_vllm/fake]#1 (") for line in lines)
    shown = "FAILED slow[hosted_vllm/fake]#1 - check: exited 1: not \\x1b[31mred\\x1b[0m\\x1b[2J"
    assert lines[-2] == shown


def test_sigint_ends_the_live_line_before_the_table(fake_model: Fake, tmp_path: Path) -> None:
    marker = tmp_path / "started"
    tasks = slow_suite(tmp_path, f"touch {marker}; sleep 300")
    fake = fake_model(by_prompt({"slow": [tool_call("slow", {}), text("never")]}))
    sent: list[float] = []

    def interrupt(seen: bytes, proc: subprocess.Popen[bytes]) -> None:
        # Once the command runs and the live line has been drawn since, interrupt.
        if not sent and marker.exists() and seen.count(b"0/1 done") >= 2:
            proc.send_signal(signal.SIGINT)
            sent.append(time.monotonic())

    code, chunks = pty_run(tasks, fake, tmp_path / "out", "xterm", interrupt)
    assert sent and code == 130
    output = b"".join(c for _, c in chunks).decode().replace("\r\n", "\n")
    lines = output.split("\n")
    header = next(i for i, line in enumerate(lines) if "passed/runs" in line)
    assert TABLE_HEADER.match(lines[header]), repr(lines[header])  # not glued on
    assert "0/1 done" in lines[header - 1]  # the live line, ended just before
    assert lines[header + 2].startswith("ERROR slow[hosted_vllm/fake]#1 - ")
    assert any(line.startswith("mm-batch: interrupted by SIGINT") for line in lines)
