"""SIGINT, SIGTERM and SIGHUP: valid reports, unfinished runs as errors, exit 130, whatever follows.

End to end, `mm-batch run` is a process of its own; the first signal cancels the run, and any
number of further ones (during the run, during report writing, up to the process's exit)
change nothing. In-process, the handlers' own contract.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from junitparser import Error, JUnitXml

from mm_batch.effects.signals import cancel_on_signals
from mm_batch.testing.fake_openai import by_prompt, text, tool_call
from tests.helpers import Fake, check_report, live_members, run_until_marker, write


def _start(fake_model: Fake, tmp_path: Path) -> subprocess.Popen[bytes]:
    """A run of four tasks: one finishes, one hangs in a tool, two wait; return mid-call."""
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
            command: ["/bin/sh", "-c", "echo $$ >> groups; echo started > started; sleep 300"]
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
    proc = run_until_marker(tmp_path / "tasks.yaml", fake, tmp_path / "out", tmp_path / "started")
    time.sleep(0.3)  # the fast task has finished by now
    return proc


def _assert_interrupted(proc: subprocess.Popen[bytes], err: bytes, out: Path, first: str) -> None:
    """Exit 130, said once, and every report written whole."""
    assert proc.returncode == 130, err.decode()
    assert err.decode().count(f"interrupted by {first}") == 1
    records = [json.loads(line) for line in (out / "calls.jsonl").read_text().splitlines()]
    finals = {r["task"]: r for r in records if r["kind"] == "task"}
    assert set(finals) == {"fast", "hang", "queued-1", "queued-2"}
    assert finals["fast"]["status"] == "passed"
    assert {finals[t]["status"] for t in ("hang", "queued-1", "queued-2")} == {"error"}
    check_report(out / "junit.xml")
    cases = {c.name: c for s in JUnitXml.fromfile(str(out / "junit.xml")) for c in s}
    assert set(cases) == set(finals)
    assert cases["fast"].is_passed
    assert isinstance(cases["hang"].result[0], Error)
    assert json.loads((out / "summary.json").read_text())["exit_code"] == 130
    summary = (out / "summary.md").read_text()
    assert all(f"{t}\\[hosted_vllm/fake\\]\\#1 | error" in summary for t in ("hang", "queued-1"))
    # Every slow command's process group was stopped with the run.
    groups = [int(g) for g in (out.parent / "groups").read_text().split()]
    assert groups and not [g for g in groups if live_members(g)]


@pytest.mark.parametrize(
    "sig", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP], ids=["SIGTERM", "SIGINT", "SIGHUP"]
)
def test_signal_mid_call_keeps_everything(
    sig: signal.Signals, fake_model: Fake, tmp_path: Path
) -> None:
    proc = _start(fake_model, tmp_path)
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=30)
    _assert_interrupted(proc, err, tmp_path / "out", sig.name)


def test_a_second_and_third_sigterm_mid_run_change_nothing(
    fake_model: Fake, tmp_path: Path
) -> None:
    proc = _start(fake_model, tmp_path)
    for _ in range(3):
        proc.send_signal(signal.SIGTERM)
        time.sleep(0.2)  # while the runs wind down
    _, err = proc.communicate(timeout=30)
    _assert_interrupted(proc, err, tmp_path / "out", "SIGTERM")


@pytest.mark.parametrize(
    "first", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP], ids=["SIGINT", "SIGTERM", "SIGHUP"]
)
def test_signals_until_the_process_exits_change_nothing(
    first: signal.Signals, fake_model: Fake, tmp_path: Path
) -> None:
    """After the first, SIGTERM, SIGINT and SIGHUP every few ms: through the wind-down, the report
    writing and the interpreter's own shutdown, to the very exit."""
    proc = _start(fake_model, tmp_path)
    proc.send_signal(first)
    sent = 0
    while proc.poll() is None:
        try:
            proc.send_signal((signal.SIGTERM, signal.SIGINT, signal.SIGHUP)[sent % 3])
        except ProcessLookupError:
            break
        sent += 1
        time.sleep(0.005)
    _, err = proc.communicate(timeout=30)
    # The storm went on for the whole wind-down (which, with the teardown skipped, is short).
    assert sent > 10
    _assert_interrupted(proc, err, tmp_path / "out", first.name)


# -- in-process: the handlers' contract ------------------------------------------------------


@pytest.fixture
def dispositions() -> Iterator[None]:
    """Whatever a test leaves installed for SIGINT, SIGTERM and SIGHUP, pytest gets its own
    back."""
    saved = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    yield
    for sig, handler in saved.items():
        signal.signal(sig, handler)


def test_the_first_signal_cancels_and_later_ones_add_nothing(dispositions: None) -> None:
    cancel = threading.Event()
    received: list[int] = []
    with cancel_on_signals(cancel, received):
        os.kill(os.getpid(), signal.SIGTERM)
        assert cancel.wait(timeout=2)
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGINT):
            os.kill(os.getpid(), sig)
        time.sleep(0.05)
        assert received == [signal.SIGTERM]
    # The caller is done, the process not yet: both signals stay ignored until it exits.
    assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_IGN
    os.kill(os.getpid(), signal.SIGTERM)  # would end the test process if it were not ignored
    assert received == [signal.SIGTERM]


def test_sighup_cancels_like_sigterm(dispositions: None) -> None:
    """A closed terminal or SSH session interrupts the run; it never kills it unreported."""
    cancel = threading.Event()
    received: list[int] = []
    with cancel_on_signals(cancel, received):
        os.kill(os.getpid(), signal.SIGHUP)
        assert cancel.wait(timeout=2)
        os.kill(os.getpid(), signal.SIGHUP)
    assert received == [signal.SIGHUP]
    assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
    os.kill(os.getpid(), signal.SIGHUP)  # would end the test process if it were not ignored


def test_without_a_signal_the_previous_handlers_come_back(dispositions: None) -> None:
    def mine(_signum: int, _frame: object) -> None:
        pass

    signal.signal(signal.SIGTERM, mine)
    before = signal.getsignal(signal.SIGINT)
    cancel = threading.Event()
    received: list[int] = []
    with cancel_on_signals(cancel, received):
        assert signal.getsignal(signal.SIGTERM) is not mine
    assert signal.getsignal(signal.SIGTERM) is mine
    assert signal.getsignal(signal.SIGINT) is before
    assert not cancel.is_set() and received == []


def test_off_the_main_thread_nothing_is_installed(dispositions: None) -> None:
    before = signal.getsignal(signal.SIGTERM)
    seen: list[object] = []

    def inside() -> None:
        with cancel_on_signals(threading.Event(), []):
            seen.append(signal.getsignal(signal.SIGTERM))

    worker = threading.Thread(target=inside)
    worker.start()
    worker.join()
    assert seen == [before]
