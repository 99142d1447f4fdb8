"""One conformance suite for every executor, as inspect_ai's sandbox self-check does.

Each test runs against the host executor and against the Docker sandbox (busybox image): a task
file that moves its commands into a container must see the same behaviour.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from mm_batch.config.model import SandboxSpec
from mm_batch.effects.docker import DockerClient
from mm_batch.effects.host import DRAIN_S, KILL_GRACE_S, LOG_LIMIT, HostExecutor
from mm_batch.run.ports import ExecResult, Executor
from tests.docker_support import TEST_IMAGE
from tests.helpers import SLACK_S, wait_for

# A leftover below leaves `late` this long after it starts: past the deadline of each call here
# (a timeout of at most 2 s, KILL_GRACE_S before SIGKILL, DRAIN_S of reading), with SLACK_S for
# a loaded machine. A call that returns before `late` exists did not wait for its leftover.
LATE_S = math.ceil(2 + KILL_GRACE_S + DRAIN_S + SLACK_S)  # whole seconds: busybox's sleep
LEFTOVER = f"(sleep {LATE_S}; touch late) >/dev/null 2>&1 &"


@pytest.fixture(params=["host", pytest.param("docker", marks=pytest.mark.docker)])
def sandbox(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[Executor, Path]]:
    """(executor, agent directory): the directory is what a container sees as /workspace."""
    agent_dir = tmp_path / "agent"
    agent_dir.mkdir()
    agent_dir.chmod(0o777)  # the sandbox's uid 1000 writes there, like a user's own checkout
    if request.param == "host":
        yield HostExecutor(), agent_dir
        return
    from mm_batch.effects.docker import DockerSandbox

    client = request.getfixturevalue("docker_client")
    spec = SandboxSpec(kind="docker", image=TEST_IMAGE, pids=64, memory="128m")
    executor = DockerSandbox(client, spec, agent_dir, f"conformance-{request.node.name}")
    yield executor, agent_dir
    executor.close()


Run = Callable[..., ExecResult]


@pytest.fixture
def run(sandbox: tuple[Executor, Path]) -> Run:
    executor, agent_dir = sandbox

    def call(
        argv: list[str], timeout: float = 30, env: dict[str, str] | None = None, sub: str = ""
    ) -> ExecResult:
        return executor.execute(argv, agent_dir / sub, env or {}, timeout)

    return call


def test_argv_is_passed_exactly(run: Run) -> None:
    values = ["a b", "*", "$HOME", "", "'\"", "--flag", "é漢", "x\ny"]
    result = run(["sh", "-c", 'printf "%s\\0" "$@"', "sh", *values])
    assert result.exit_code == 0, result.error
    assert result.stdout.data.split(b"\0")[:-1] == [v.encode() for v in values]


def test_exit_codes(run: Run) -> None:
    assert run(["sh", "-c", "exit 0"]).exit_code == 0
    assert run(["sh", "-c", "exit 3"]).exit_code == 3
    assert run(["sh", "-c", "exit 255"]).exit_code == 255


def test_stdout_and_stderr_are_apart(run: Run) -> None:
    result = run(["sh", "-c", "echo out; echo err >&2; echo more"])
    assert result.stdout.data == b"out\nmore\n"
    assert result.stderr.data == b"err\n"


def test_workdir(run: Run, sandbox: tuple[Executor, Path]) -> None:
    executor, agent_dir = sandbox
    (agent_dir / "sub").mkdir()
    (agent_dir / "sub" / "marker").write_text("here")
    result = run(["sh", "-c", "pwd; cat marker"], sub="sub")
    where, marker = result.stdout.data.decode().splitlines()
    assert marker == "here"
    expected = str(agent_dir / "sub") if executor.where == "host" else "/workspace/sub"
    assert where == expected


def test_environment(run: Run, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MM_BATCH_LEAK_CHECK", "leaked")
    result = run(["env"], env={"TOOL_VAR": "tool value"})
    env = dict(
        line.split("=", 1) for line in result.stdout.data.decode().splitlines() if "=" in line
    )
    assert env["TOOL_VAR"] == "tool value"
    assert "MM_BATCH_LEAK_CHECK" not in env
    assert "PATH" in env and "HOME" in env


def _late(run: Run) -> bool:
    """Whether a LEFTOVER has left its marker (looked at from the sandbox: docker copies)."""
    return run(["sh", "-c", "test -e late"]).exit_code == 0


def test_timeout_kills_the_tree_and_the_sandbox_stays_usable(run: Run) -> None:
    result = run(["sh", "-c", f"{LEFTOVER} {LEFTOVER} wait"], timeout=1)
    assert result.timed_out and result.exit_code is None
    assert not _late(run), "the call waited for its leftovers"

    # Killed is not yet gone: a loaded machine may take a moment to end a signalled process.
    def gone() -> bool:
        after = run(["sh", "-c", "ps -o pid,args 2>/dev/null || ps; echo usable"])
        assert after.exit_code == 0 and after.stdout.data.endswith(b"usable\n")
        return f"sleep {LATE_S}".encode() not in after.stdout.data

    wait_for(gone, "the leftovers are gone")
    assert not _late(run)


def test_output_flood_is_bounded(run: Run) -> None:
    result = run(["sh", "-c", "yes | head -c 5000000; echo done >&2"])
    assert result.exit_code == 0
    assert result.stdout.total == 5_000_000
    assert len(result.stdout.data) == LOG_LIMIT
    assert result.stderr.data == b"done\n"


def test_missing_program(run: Run, sandbox: tuple[Executor, Path]) -> None:
    result = run(["./no-such-program"])
    assert result.exit_code is None
    assert result.error is not None and result.error.startswith(
        "program not found: ./no-such-program"
    )
    assert not result.started and not result.sandbox_failed
    assert run(["no-such-program-on-the-path"]).error.startswith(  # type: ignore[union-attr]
        "program not found: no-such-program-on-the-path"
    )
    assert run(["sh", "-c", "echo still fine"]).exit_code == 0


def test_program_not_executable(run: Run, sandbox: tuple[Executor, Path]) -> None:
    _, agent_dir = sandbox
    (agent_dir / "plain.txt").write_text("echo I ran > ran-marker\n")
    result = run(["./plain.txt"])
    assert result.exit_code is None and not result.started and not result.sandbox_failed
    assert result.error == "program is not executable: ./plain.txt"
    assert run(["sh", "-c", "test -e ran-marker"]).exit_code == 1  # nothing of it ran


# What a runtime prints when it cannot start a program: a command may print it too, and exit the
# same way; it still ran, and must be counted as started (or `no_calls` could be fooled).
SPOOFS = {
    127: 'OCI runtime exec failed: exec failed: unable to start container process: exec: "x": '
    "executable file not found in $PATH: unknown",
    126: 'OCI runtime exec failed: exec failed: unable to start container process: exec: "x": '
    "permission denied: unknown",
}


@pytest.mark.parametrize("code", [126, 127])
def test_126_and_127_from_a_command_that_ran_are_ordinary_exits(run: Run, code: int) -> None:
    result = run(["sh", "-c", f"touch ran-{code}; echo '{SPOOFS[code]}'; exit {code}"])
    assert result.exit_code == code
    assert result.error is None and result.started and not result.sandbox_failed
    assert run(["sh", "-c", f"test -e ran-{code}"]).exit_code == 0


@pytest.mark.parametrize(("signal_name", "code"), [("KILL", 137), ("TERM", 143), ("SEGV", 139)])
def test_a_process_killed_by_a_signal(run: Run, signal_name: str, code: int) -> None:
    result = run(["sh", "-c", f"echo before; kill -{signal_name} $$; echo after"])
    assert result.exit_code == code
    assert result.error is None and result.started and not result.sandbox_failed
    assert result.stdout.data == b"before\n"
    assert run(["sh", "-c", "echo usable"]).stdout.data == b"usable\n"


def test_a_background_leftover_is_killed_when_the_call_returns(run: Run) -> None:
    loop = "(while :; do date +%s%N > tick; sleep 0.05; done) >/dev/null 2>&1 &"
    result = run(["sh", "-c", f"{loop} {LEFTOVER} echo go"])
    assert result.exit_code == 0 and result.stdout.data == b"go\n"
    assert not _late(run), "the call waited for its leftover"  # (or the loop would hold it)
    after = run(["sh", "-c", 'a=$(cat tick); sleep 0.5; b=$(cat tick); [ "$a" = "$b" ]'])
    assert after.exit_code == 0, "the background loop still ran during the next call"


def test_a_timeout_keeps_the_workspace(
    run: Run, sandbox: tuple[Executor, Path], tmp_path: Path
) -> None:
    made = run(["sh", "-c", "echo kept > work-file"])
    assert made.exit_code == 0, made
    result = run(["sh", "-c", "sleep 300"], timeout=1)
    assert result.timed_out and result.started
    kept = run(["sh", "-c", "cat work-file"])
    assert kept.exit_code == 0 and kept.stdout.data == b"kept\n"


@pytest.mark.parametrize(
    "flood",
    ["cat /dev/zero", "yes flooding-stdout", "yes flooding-stderr >&2", "yes | tee /dev/stderr"],
)
def test_a_call_still_printing_at_its_timeout_is_a_timeout(run: Run, flood: str) -> None:
    result = run(["sh", "-c", f"{LEFTOVER} {flood}"], timeout=2)
    # Read on while it is killed: the kill is never held up by the output (it was 20 s).
    assert result.timed_out and result.error is None and result.started, result
    assert not _late(run), "the kill waited on the output"
    assert result.stdout.total + result.stderr.total > 0


@pytest.mark.docker
@pytest.mark.parametrize("sandbox", ["docker"], indirect=True)
def test_each_docker_call_gets_a_fresh_home_and_tmpdir(sandbox: tuple[Executor, Path]) -> None:
    executor, agent_dir = sandbox
    script = 'echo "$HOME $TMPDIR"; ls -A "$HOME" "$TMPDIR"; touch "$HOME/.mark" "$TMPDIR/mark"'
    seen = [executor.execute(["sh", "-c", script], agent_dir, {}, 30) for _ in range(3)]
    homes = [r.stdout.data.decode().splitlines()[0].split() for r in seen]
    assert len({home for home, _ in homes}) == 3
    for (home, tmpdir), result in zip(homes, seen, strict=True):
        assert tmpdir == f"{home}/tmp" and home.startswith("/tmp/.mm-batch-home-")
        assert b"mark" not in result.stdout.data  # each starts empty


def test_where(sandbox: tuple[Executor, Path]) -> None:
    executor, _ = sandbox
    assert executor.where in ("host", f"docker:{TEST_IMAGE}")


@pytest.mark.docker
def test_workdir_outside_the_agent_directory_is_an_error_of_the_call(
    docker_client: DockerClient, tmp_path: Path
) -> None:
    from mm_batch.effects.docker import DockerSandbox

    agent_dir = tmp_path / "agent"
    agent_dir.mkdir()
    box = DockerSandbox(
        docker_client, SandboxSpec(kind="docker", image=TEST_IMAGE), agent_dir, "outside"
    )
    try:
        result = box.execute(["true"], tmp_path, {}, 10)
        assert not result.sandbox_failed
        assert (result.error or "").startswith(f"working directory {tmp_path} is outside")
    finally:
        box.close()
