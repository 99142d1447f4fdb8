"""SIGKILL of mm-batch: nothing of its run outlives it by more than 5 s, and nothing else dies.

End to end, `mm-batch run` is a process of its own, driven by the scripted fake model; each
attack leaves a command that would write a marker later, and checks that its group is gone
before the marker appeared (so that it never can). The watchdog's own rules (a recycled group
id, an owner still alive, a goodbye) are tried directly on a watchdog process, with real process
groups.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from mm_batch.effects.watchdog import (
    CLEANUP_S,
    LABEL_HOST,
    LABEL_PID,
    LABEL_PID_START,
    Watchdog,
    process_start,
)
from mm_batch.testing.fake_openai import FakeOpenAI, by_prompt, text, tool_call
from tests.docker_support import TEST_IMAGE
from tests.helpers import (
    SLACK_S,
    Fake,
    live_members,
    model_args,
    read_calls,
    run_until_marker,
    wait_for,
    write,
)

# SPEC 3: when mm-batch is SIGKILLed, its tools' groups and its containers are gone within 5 s.
# The watchdog's own budget for that is CLEANUP_S ("so that all is gone within 5 s"); with
# SLACK_S for a loaded machine, the one deadline these tests hold it to.
DEADLINE_S = CLEANUP_S + SLACK_S
# A command that says it started (its group id in `started`), leaves a sleeper in its group that
# would write `late` DEADLINE_S later, and waits: no call of it must ever finish.
LINGERING = (
    "echo $$ > started.tmp && mv started.tmp started; "
    f"(sleep {DEADLINE_S:g}; touch late) & sleep 300"
)


def _wait_gone(pgid: int) -> None:
    """Until no process of the group runs (a hang fails): the order, not the speed, is tested."""
    wait_for(lambda: not live_members(pgid), f"group {pgid} is gone")


def _watchdogs_of(owner: int) -> list[int]:
    """Live watchdog processes guarding the process `owner`."""
    found = []
    for entry in Path("/proc").iterdir():
        with contextlib.suppress(OSError):
            argv = (entry / "cmdline").read_bytes().split(b"\0")
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
            ours = any(a.endswith(b"watchdog.py") for a in argv) and str(owner).encode() in argv
            if ours and state != "Z":
                found.append(int(entry.name))
    return found


@pytest.fixture
def lingering_tool(tmp_path: Path) -> Path:
    write(
        tmp_path,
        "agent.yaml",
        f"""
        yolo: true
        tools:
          - name: slow
            description: Slow.
            command: ["/bin/sh", "-c", "{LINGERING}"]
        """,
    )
    return write(
        tmp_path, "tasks.yaml", "agent: agent.yaml\ntasks:\n  - {id: hang, prompt: hang}\n"
    )


def _hang_model(fake_model: Fake) -> FakeOpenAI:
    return fake_model(by_prompt({"hang": [tool_call("slow", {}), text("never")]}))


def _kill_and_check(proc: subprocess.Popen[bytes], folder: Path, kill: Callable[[], None]) -> None:
    """Kill mm-batch as `kill` does; the command's group must go before its sleeper writes
    `late` (DEADLINE_S after the command started), so that the marker never appears."""
    pgid = int((folder / "started").read_text())
    assert live_members(pgid), "the command should be running before the kill"
    kill()
    proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL
    late = folder / "late"
    wait_for(lambda: late.exists() or not live_members(pgid), f"group {pgid} is gone")
    assert not late.exists(), f"group {pgid} outlived mm-batch by {DEADLINE_S:g} s"
    _wait_gone(pgid)
    # The run never finished: no record claims it did.
    assert not (folder / "out" / "calls.jsonl").exists() or not [
        r for r in read_calls(folder / "out") if r["kind"] in ("tool", "task")
    ]


def _start_run(
    tasks: Path, fake: FakeOpenAI, start_new_session: bool = False
) -> subprocess.Popen[bytes]:
    """`mm-batch run` as a process of its own, results beside the tasks file."""
    out = tasks.parent / "out"
    return subprocess.Popen(
        [sys.executable, "-m", "mm_batch", "run", str(tasks), *model_args(fake), "--out", str(out)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        cwd=tasks.parent,
        start_new_session=start_new_session,
    )


def test_sigkill_mid_call_kills_the_tool_group(
    lingering_tool: Path, fake_model: Fake, tmp_path: Path
) -> None:
    proc = run_until_marker(
        lingering_tool, _hang_model(fake_model), tmp_path / "out", tmp_path / "started"
    )
    _kill_and_check(proc, tmp_path, proc.kill)


def test_sigkill_of_the_whole_process_group(
    lingering_tool: Path, fake_model: Fake, tmp_path: Path
) -> None:
    """A CI runner that kills mm-batch's process group does not take the watchdog with it."""
    proc = _start_run(lingering_tool, _hang_model(fake_model), start_new_session=True)
    started = tmp_path / "started"
    wait_for(lambda: started.exists() or proc.poll() is not None, "the tool started")
    assert proc.poll() is None, "mm-batch ended before its tool started"
    _kill_and_check(proc, tmp_path, lambda: os.killpg(proc.pid, signal.SIGKILL))


def test_sigkill_mid_hook_kills_the_hook_group(fake_model: Fake, tmp_path: Path) -> None:
    write(
        tmp_path,
        "agent.yaml",
        """
        yolo: true
        hooks:
          preToolCall: ["./hooks/pre.sh"]
        tools:
          - name: quick
            description: Quick.
            command: ["true"]
        """,
    )
    write(tmp_path, "hooks/pre.sh", f"#!/bin/sh\ncat > /dev/null\n{LINGERING}\n").chmod(0o755)
    tasks = write(tmp_path, "tasks.yaml", "agent: agent.yaml\ntasks:\n  - {id: h, prompt: h}\n")
    fake = fake_model(by_prompt({"h": [tool_call("quick", {}), text("done")]}))
    proc = run_until_marker(tasks, fake, tmp_path / "out", tmp_path / "started")
    _kill_and_check(proc, tmp_path, proc.kill)


def test_a_normal_run_leaves_no_watchdog_behind(fake_model: Fake, tmp_path: Path) -> None:
    write(
        tmp_path,
        "agent.yaml",
        """
        yolo: true
        tools:
          - name: pause
            description: Pause.
            command: ["/bin/sh", "-c", "touch started; sleep 1"]
        """,
    )
    tasks = write(tmp_path, "tasks.yaml", "agent: agent.yaml\ntasks:\n  - {id: p, prompt: p}\n")
    fake = fake_model(by_prompt({"p": [tool_call("pause", {}), text("done")]}))
    proc = run_until_marker(tasks, fake, tmp_path / "out", tmp_path / "started")
    assert _watchdogs_of(proc.pid), "the run should have a watchdog while it runs"
    owner = proc.pid
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err.decode()
    finals = [r for r in read_calls(tmp_path / "out") if r["kind"] == "task"]
    assert [r["status"] for r in finals] == ["passed"]
    assert _watchdogs_of(owner) == []


@pytest.mark.docker
def test_sigkill_mid_docker_call_removes_the_container(
    docker_client: Any, fake_model: Fake, tmp_path: Path
) -> None:
    write(
        tmp_path,
        "agent.yaml",
        f"""
        yolo: true
        sandbox: {{kind: docker, image: "{TEST_IMAGE}"}}
        tools:
          - name: slow
            description: Slow.
            command: ["sleep", "300"]
        """,
    )
    tasks = write(tmp_path, "tasks.yaml", "agent: agent.yaml\ntasks:\n  - {id: d, prompt: d}\n")
    fake = fake_model(by_prompt({"d": [tool_call("slow", {}), text("never")]}))
    proc = _start_run(tasks, fake)
    mine = {"label": f"{LABEL_PID}={proc.pid}"}

    def running() -> bool:
        """Whether the call runs in the run's container."""
        assert proc.poll() is None, "mm-batch ended before its call started"
        found = docker_client.containers.list(filters=mine)
        with contextlib.suppress(Exception):
            return bool(found) and any(
                "sleep 300" in " ".join(p) for p in found[0].top()["Processes"]
            )
        return False

    wait_for(running, "the call runs in the run's container")
    proc.kill()
    proc.wait(timeout=30)
    wait_for(
        lambda: not docker_client.containers.list(all=True, filters=mine),
        "the container is gone (SPEC 3: within 5 s of mm-batch's death)",
        give_up_after=DEADLINE_S,
    )


# -- the watchdog's own rules, on a watchdog process ----------------------------------------


@pytest.fixture
def owner() -> Iterator[subprocess.Popen[bytes]]:
    """A stand-in for mm-batch: the process the watchdog guards."""
    proc = subprocess.Popen(["sleep", "300"])
    yield proc
    proc.kill()
    proc.wait()


@pytest.fixture
def groups() -> Iterator[Callable[[str], subprocess.Popen[bytes]]]:
    """Start shell commands each in a session (and group) of its own; kill them all at the end."""
    started: list[subprocess.Popen[bytes]] = []

    def start(script: str) -> subprocess.Popen[bytes]:
        proc = subprocess.Popen(["/bin/sh", "-c", script], start_new_session=True)
        started.append(proc)
        return proc

    yield start
    for proc in started:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def _die(owner: subprocess.Popen[bytes], watchdog: Watchdog) -> None:
    """mm-batch dies: its process ends, and the pipe's write end with it."""
    owner.kill()
    owner.wait()
    watchdog.drop()
    watchdog.process.wait(timeout=DEADLINE_S)  # it leaves once its cleanup is done


def test_the_registered_groups_die_with_their_owner_and_only_they(
    owner: subprocess.Popen[bytes], groups: Callable[[str], subprocess.Popen[bytes]]
) -> None:
    registered = groups("sleep 300 & sleep 300")
    finished = groups("sleep 300")  # a call that ended: unregistered, must be left alone
    stranger = groups("sleep 300")  # never registered
    time.sleep(0.1)
    watchdog = Watchdog.spawn(owner.pid, containers=False)
    watchdog.register(registered.pid)
    watchdog.register(finished.pid)
    watchdog.unregister(finished.pid)
    _die(owner, watchdog)
    assert watchdog.process.returncode == 0  # it acted, then left: it never outlives its job
    _wait_gone(registered.pid)
    assert live_members(finished.pid) and live_members(stranger.pid)


def test_a_group_whose_leader_is_gone_still_dies(
    owner: subprocess.Popen[bytes], groups: Callable[[str], subprocess.Popen[bytes]], tmp_path: Path
) -> None:
    """The leader exited and was reaped; its background child still holds the group."""
    leader = groups(f"sleep 300 & echo $! > {tmp_path}/child; exit 0")
    watchdog = Watchdog.spawn(owner.pid, containers=False)
    watchdog.register(leader.pid)
    leader.wait()
    assert live_members(leader.pid) == [int((tmp_path / "child").read_text())]
    _die(owner, watchdog)
    _wait_gone(leader.pid)


def test_nothing_is_killed_while_the_owner_lives(
    owner: subprocess.Popen[bytes], groups: Callable[[str], subprocess.Popen[bytes]]
) -> None:
    """A pipe closed without a goodbye is acted on only once the owner is really gone."""
    group = groups("sleep 300")
    watchdog = Watchdog.spawn(owner.pid, containers=False)
    watchdog.register(group.pid)
    watchdog.drop()
    time.sleep(0.5)
    assert live_members(group.pid) and watchdog.process.poll() is None
    _die(owner, watchdog)
    _wait_gone(group.pid)


def test_a_goodbye_ends_the_watchdog_and_the_calls_left_behind(
    owner: subprocess.Popen[bytes], groups: Callable[[str], subprocess.Popen[bytes]]
) -> None:
    """On a normal exit the watchdog leaves at once, taking abandoned calls' groups with it."""
    abandoned = groups("sleep 300")
    watchdog = Watchdog.spawn(owner.pid, containers=False)
    watchdog.register(abandoned.pid)
    watchdog.close()
    # close() waits a bounded while (CLOSE_WAIT_S) and kills nothing: the watchdog left by itself.
    assert watchdog.process.returncode == 0
    _wait_gone(abandoned.pid)
    assert owner.poll() is None  # the owner itself is never the watchdog's to touch


def _recycle(pid: int, attempts: int = 20) -> subprocess.Popen[bytes] | None:
    """Start a process in a session of its own that gets exactly `pid` (root only)."""
    for _ in range(attempts):
        try:
            Path("/proc/sys/kernel/ns_last_pid").write_text(str(pid - 1))
        except OSError:
            return None
        proc = subprocess.Popen(["sleep", "300"], start_new_session=True)
        if proc.pid == pid:
            return proc
        proc.kill()  # another process took the number first: try again
        proc.wait()
    return None


def test_a_recycled_group_id_is_never_killed(owner: subprocess.Popen[bytes]) -> None:
    """The registered group ended; its id now leads another, unrelated group: that one lives."""
    ended = subprocess.Popen(["sleep", "300"], start_new_session=True)
    watchdog = Watchdog.spawn(owner.pid, containers=False)
    watchdog.register(ended.pid)
    ended.kill()
    ended.wait()  # the number is free again
    victim = _recycle(ended.pid)
    if victim is None:
        watchdog.close()
        pytest.skip("cannot choose the next pid here (needs root and /proc/sys/kernel/ns_last_pid)")
    try:
        assert os.getpgid(victim.pid) == ended.pid  # the same group id, another group
        _die(owner, watchdog)
        time.sleep(0.2)
        assert victim.poll() is None, "the watchdog killed a group that was not mm-batch's"
    finally:
        victim.kill()
        victim.wait()


def _labelled(client: Any, owner: int) -> Any:
    return client.containers.run(
        TEST_IMAGE,
        ["sleep", "300"],
        detach=True,
        network_mode="none",
        labels={
            "mm-batch": "1",
            "mm-batch.run": "watchdog-test",
            LABEL_PID: str(owner),
            LABEL_PID_START: process_start(owner),
            LABEL_HOST: socket.gethostname(),
        },
    )


@pytest.mark.docker
def test_the_dead_owners_containers_go_and_no_other(
    docker_client: Any, owner: subprocess.Popen[bytes]
) -> None:
    mine = _labelled(docker_client, owner.pid)
    other = _labelled(docker_client, os.getpid())  # a live run's container: never touched
    try:
        watchdog = Watchdog.spawn(owner.pid, containers=True)
        _die(owner, watchdog)  # the watchdog left within its deadline, its cleanup done
        ids = {c.id for c in docker_client.containers.list(all=True)}
        assert mine.id not in ids
        assert other.id in ids
    finally:
        for container in (mine, other):
            with contextlib.suppress(Exception):
                container.remove(force=True)
