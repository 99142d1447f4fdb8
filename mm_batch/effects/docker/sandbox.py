"""The Docker sandbox: one hardened container per task run, each call an exec of the argv list.

A call waits for the previous call's sweep (sweep.py), runs its programs as read at start
(workspace.py), is read under its timeout (stream.py), and ends as the engine tells it, unless
the runtime, the kernel or the container's death speaks instead (outcome.py).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Collection, Mapping, Sequence
from dataclasses import replace
from pathlib import Path, PurePosixPath

from mm_batch.config.model import SandboxSpec
from mm_batch.effects.docker import lifecycle
from mm_batch.effects.docker.engine import ENGINE_TIMEOUT_S, ROOT, Container, DockerClient, Engine
from mm_batch.effects.docker.outcome import (
    Call,
    dead_after_signal,
    kernel_refusal,
    kernel_refused,
    not_started_reason,
)
from mm_batch.effects.docker.stream import EngineError, Streamed, Watch, first_line, supervise
from mm_batch.effects.docker.sweep import KILL_TRIES_S, Sweeper, kill_gid, sweep
from mm_batch.effects.docker.workspace import (
    CHECK_DIR,
    WORKSPACE,
    Copies,
    Snapshot,
    Users,
    container_path,
    size_bytes,
)
from mm_batch.effects.host import LOG_LIMIT
from mm_batch.run.argv_programs import HiddenProgramError, program_entries
from mm_batch.run.ports import (
    EMPTY,
    Captured,
    ExecResult,
    PinnedProgram,
    SandboxError,
    UnreadProgram,
)

# For each (path, link) pair: whether the path is still the link it was (its target, when
# the image has `readlink`), or still nothing when `link` is empty; prints the index of the
# first that is not, else "same". Only /bin/sh and its built-ins are sure to be in an image.
_CHANGED = """
i=0
while [ $# -gt 1 ]; do
  if [ -z "$2" ]; then
    if [ -e "$1" ] || [ -L "$1" ]; then echo "$i"; exit 0; fi
  elif [ ! -L "$1" ]; then echo "$i"; exit 0
  elif command -v readlink >/dev/null 2>&1 && [ "$(readlink "$1")" != "$2" ]; then
    echo "$i"; exit 0
  fi
  i=$((i + 1)); shift 2
done
echo same
"""


def _by_container_path(argv: Sequence[str], placed: Collection[str] = ()) -> str | None:
    """Why a program named by its path in the container's workspace (`/workspace/deploy.sh`)
    may not run: read at start by its path in the agent's folder, it is held to that only when
    named so; None for none (or one mm-batch placed itself: `placed`)."""
    try:
        entries = program_entries(argv)
    except HiddenProgramError:
        return None  # refused where the programs were looked at
    for i in entries:
        entry = argv[i]
        if entry not in placed and (entry == str(WORKSPACE) or entry.startswith(f"{WORKSPACE}/")):
            return (
                f"{entry} names a program of the workspace by its path in the container: name it "
                "relative to the tool's workdir (./deploy.sh), so that it runs as read at start"
            )
    return None


class DockerSandbox:
    """An Executor whose commands run in one container, started at the first call."""

    def __init__(
        self,
        client: DockerClient,
        spec: SandboxSpec,
        agent_dir: Path,
        run_id: str,
        log_limit: int = LOG_LIMIT,
        out_dir: Path | None = None,
    ) -> None:
        self.client = client
        self.spec = spec
        self.agent_dir = agent_dir.resolve()
        self.run_id = run_id
        self.log_limit = log_limit
        self.out_dir = out_dir.resolve() if out_dir is not None else None
        self.engine = Engine(client, log_limit, str(WORKSPACE))
        self.users = Users.of(spec.user)
        self._lock = threading.Lock()
        self._oom_kills = 0
        self._closed = False
        self._copies = Copies(self.engine, self.agent_dir, self.users.check)
        # The sweep's kill exec runs with a gid that neither the tools nor the check have.
        self._kill_gid = kill_gid(self.users.gid, self.users.check_gid)
        self._sweeper = Sweeper(
            self.engine, spec.user, self.users.uid, self._kill_gid, spec.image, self._copies
        )
        # False only in benchmarks/exec.py, to measure what the fresh HOME costs a call.
        self.fresh_home_per_call = True

    @property
    def where(self) -> str:
        return f"docker:{self.spec.image}"

    @property
    def container(self) -> Container | None:
        """The container, once started; None again once closed."""
        return self.engine.container

    @property
    def container_id(self) -> str:
        container = self.engine.container
        if container is None:
            raise SandboxError("the sandbox has no container: not started, or closed")
        return container.id

    # -- lifecycle -----------------------------------------------------------------------

    def start(self) -> None:
        """Create and start the container, fill its workspace and check the image's programs."""
        with self._lock:
            if self.engine.container is not None:
                return
            if self._closed:
                raise SandboxError("the sandbox was closed")
            snapshot = None
            if self.spec.workspace == "copy":
                room = size_bytes(self.spec.workspace_size)
                snapshot = Snapshot.take(self.agent_dir, self.out_dir, room)
            self.engine.container = lifecycle.create(
                self.client, self.spec, self.agent_dir, self.run_id, self.users
            )
            try:
                self.client.api.start(self.container_id)
            except Exception as exc:
                raise SandboxError(f"cannot start the container: {first_line(exc)}") from exc
            lifecycle.prepare(
                self.engine, self.spec, self.agent_dir, snapshot, self.users, self._sweeper.home
            )

    def close(self) -> None:
        with self._lock:
            self._closed = True
            container, self.engine.container = self.engine.container, None
        if container is not None:
            with contextlib.suppress(Exception):
                self.client.api.remove_container(container.id, force=True)

    def settled(self) -> str | None:
        if self.engine.container is None:
            return None
        try:
            self._sweeper.settle()
        except SandboxError as exc:
            return f"the container failed: {exc}"
        return None

    def protect(self, files: Mapping[Path, bytes]) -> dict[Path, str]:
        """Copies for a `check`, out of every tool's reach (`Copies.protect`), placed once the
        sweep has confirmed that no tool process is left to change the originals."""
        self.start()
        self._sweeper.settle()
        return self._copies.protect(files)

    def changed(
        self, workdir: Path, unread: Sequence[UnreadProgram], *, check: bool = False
    ) -> UnreadProgram | None:
        """Looked at in the container, as the uid that would run them (what a tool's uid
        cannot see, it cannot run either), once the last call's sweep has confirmed that no
        tool process is left to change them. One the engine cannot answer for is changed."""
        if not unread:
            return None
        try:
            folder = container_path(self.agent_dir, workdir)
            self.start()
            self._sweeper.settle()
            pairs = [item for p in unread for item in (str(folder / p.entry), p.link or "")]
            user = self.users.check if check else self.spec.user
            done = self.engine.run(["/bin/sh", "-c", _CHANGED, "changed", *pairs], user)
            said = done.stdout.decode(errors="replace").split()
        except (ValueError, SandboxError, EngineError):
            return unread[0]
        if done.exit_code == 0 and said == ["same"]:
            return None
        first = int(said[0]) if said and said[0].isdigit() else 0
        return unread[first] if first < len(unread) else unread[0]

    # -- calls ---------------------------------------------------------------------------

    def execute(
        self,
        argv: Sequence[str],
        workdir: Path,
        env: Mapping[str, str],
        timeout: float,
        cancel: threading.Event | None = None,
        *,
        programs: Sequence[PinnedProgram] = (),
    ) -> ExecResult:
        begun = time.monotonic()
        container_workdir = self._workdir_in_container(workdir, begun)
        if isinstance(container_workdir, ExecResult):
            return container_workdir
        unpinned = _by_container_path(argv)
        if unpinned is not None:
            return ExecResult(None, EMPTY, EMPTY, 0.0, error=unpinned, started=False)
        try:
            self.start()
            self._sweeper.settle()
            command, first_pinned = self._copies.pinned(argv, container_workdir, programs)
            refusal = None
            if first_pinned:
                refusal = kernel_refusal(next(p for p in programs if p.index == 0).content)
            # A HOME and TMPDIR no earlier call could write (made after its sweep); the tool's
            # own `env` comes last, as on the host.
            home = self._sweeper.home
            call_env = {"HOME": home, "TMPDIR": f"{home}/tmp", **env}
            exec_id = self.engine.create_exec(
                command, self.spec.user, str(container_workdir), call_env, False
            )
        except (SandboxError, EngineError) as exc:
            return self._failed(begun, f"{exc}", EMPTY, EMPTY, started=False)
        call = Call(argv, command, str(container_workdir), self.users.uid, refusal)
        return self._run_call(exec_id, call, begun, timeout, cancel, sweep_after=True)

    def _workdir_in_container(self, workdir: Path, begun: float) -> PurePosixPath | ExecResult:
        """A host working directory's path in the container, or the call's error when it lies
        outside the agent's folder (all the container sees)."""
        try:
            return container_path(self.agent_dir, workdir)
        except ValueError as exc:
            return ExecResult(
                None, EMPTY, EMPTY, time.monotonic() - begun, error=str(exc), started=False
            )

    def execute_check(
        self, argv: Sequence[str], workdir: Path, timeout: float, cancel: threading.Event | None
    ) -> ExecResult:
        """A `check` as the check uid, HOME and TMPDIR in CHECK_DIR: no tool can signal or trace
        it (another uid), nor change its copies or fill its scratch space."""
        begun = time.monotonic()
        container_workdir = self._workdir_in_container(workdir, begun)
        if isinstance(container_workdir, ExecResult):
            return container_workdir
        unpinned = _by_container_path(argv, self._copies.checked_in_place)
        if unpinned is not None:
            return ExecResult(None, EMPTY, EMPTY, 0.0, error=unpinned, started=False)
        try:
            self.start()
            self._sweeper.settle()
            self._new_oom_kill()  # the count so far: no tool process is alive to add to it
            exec_id = self.engine.create_exec(
                argv,
                self.users.check,
                str(container_workdir),
                {"HOME": CHECK_DIR, "TMPDIR": CHECK_DIR},
                False,
            )
        except (SandboxError, EngineError) as exc:
            return self._failed(begun, f"{exc}", EMPTY, EMPTY, started=False)
        call = Call(argv, argv, str(container_workdir), self.users.check_uid, None)
        result = self._run_call(exec_id, call, begun, timeout, cancel, sweep_after=False)
        # Only the check's processes ran meanwhile: one the kernel killed for memory (a scan in
        # a pipe, say) leaves a verdict that cannot be trusted, whatever the check's exit.
        ended = result.error is None and not (result.timed_out or result.interrupted)
        if ended and self._new_oom_kill():
            return replace(
                result,
                error=(
                    "a process of the check was killed: out of memory (the sandbox limit is "
                    f"{self.spec.memory})"
                ),
            )
        return result

    def _run_call(
        self,
        exec_id: str,
        call: Call,
        begun: float,
        timeout: float,
        cancel: threading.Event | None,
        sweep_after: bool,
    ) -> ExecResult:
        try:
            # From here on the engine may have started the program: a failure counts as started.
            sock = self.engine.open_stream(exec_id)
        except EngineError as exc:
            return self._failed(begun, str(exc), EMPTY, EMPTY, started=True)
        watch = Watch(
            kill=lambda: sweep(self.engine, call.uid, self._kill_gid),
            kill_limit_s=2 * (ENGINE_TIMEOUT_S + KILL_TRIES_S),
            probe=self.engine.container_dead,
        )
        try:
            streamed = supervise(sock, self.log_limit, begun, timeout, cancel, watch)
            if streamed.failure is not None:
                return self._failed(
                    begun, streamed.failure, streamed.stdout, streamed.stderr, started=True
                )
            return self._conclude(exec_id, call, begun, streamed)
        finally:
            sock.close()
            if sweep_after:
                self._sweeper.later(reset=self.fresh_home_per_call)

    def _failed(
        self, begun: float, reason: str, out: Captured, err: Captured, started: bool
    ) -> ExecResult:
        """A call the sandbox failed: the task run cannot go on."""
        return ExecResult(
            None,
            out,
            err,
            time.monotonic() - begun,
            error=f"the container failed: {reason}",
            sandbox_failed=True,
            started=started,
        )

    def _conclude(self, exec_id: str, call: Call, begun: float, streamed: Streamed) -> ExecResult:
        """Read the exec's end from the engine: started or not, its exit, the container's fate."""
        stdout, stderr = streamed.stdout, streamed.stderr
        try:
            state = self.engine.inspect_exec(exec_id)
        except EngineError as exc:
            return self._failed(begun, self.engine.fate(str(exc)), stdout, stderr, started=True)
        duration = time.monotonic() - begun
        if streamed.timed_out or streamed.interrupted:
            return ExecResult(
                None,
                stdout,
                stderr,
                duration,
                timed_out=streamed.timed_out,
                interrupted=streamed.interrupted,
            )
        argv, workdir = call.argv, call.workdir
        if state.pid == 0 and not state.running:
            # The runtime never started the program: what it said is its own, not the program's.
            reason = not_started_reason(
                stdout.data.decode(errors="replace"), argv, workdir, self.where
            )
            return ExecResult(None, EMPTY, EMPTY, duration, error=reason, started=False)
        if state.running or state.exit_code is None:
            reason = self.engine.fate("the exec's stream ended while the command was still running")
            return self._failed(begun, reason, stdout, stderr, started=True)
        exit_code = state.exit_code
        refused = kernel_refused(self.engine, call, exit_code, stdout, stderr)
        if refused is not None:
            return refused.result(argv, workdir, self.where, stdout, stderr, duration)
        if exit_code >= 128:  # a signal: the container's own death kills every exec with 137
            dead = dead_after_signal(self.engine)
            if dead is not None:
                return self._failed(begun, dead, stdout, stderr, started=True)
        if exit_code == 137 and self._new_oom_kill():
            return ExecResult(
                exit_code,
                stdout,
                stderr,
                duration,
                error=f"killed: out of memory (the sandbox limit is {self.spec.memory})",
            )
        return ExecResult(exit_code, stdout, stderr, duration)

    def _new_oom_kill(self) -> bool:
        """Whether the memory cgroup killed a process since the last look (cgroup v1 and v2)."""
        script = (
            "cat /sys/fs/cgroup/memory.events /sys/fs/cgroup/memory/memory.oom_control "
            "2>/dev/null | grep oom_kill"
        )
        try:
            done = self.engine.run(["/bin/sh", "-c", script], ROOT)
            lines = done.stdout.decode().splitlines()
            count = max(int(line.split()[-1]) for line in lines)
        except Exception:
            return False
        new = count > self._oom_kills
        self._oom_kills = count
        return new
