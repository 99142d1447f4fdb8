"""The host executor: argv commands as processes. This module is the only one that spawns them."""

from __future__ import annotations

import contextlib
import os
import selectors
import signal
import stat
import subprocess
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from mm_batch.config.paths import drop_sealed, sealed_copy, sealed_fds
from mm_batch.effects.environment import host_environment, service_environment
from mm_batch.effects.watchdog import Watchdog, current_watchdog
from mm_batch.run.ports import EMPTY, Captured, ExecResult, PinnedProgram, UnreadProgram
from mm_batch.run.pristine import changed_here

LOG_LIMIT = 1024 * 1024  # bytes of each stream kept for the call log
KILL_GRACE_S = 2.0  # SIGTERM, then SIGKILL after this
DRAIN_S = 0.5  # after the group is killed, how long output still held open by an escapee is read
_READ_CHUNK = 65536


class Sink:
    """Keeps the first `limit` bytes of a stream and counts all of them."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.chunks: list[bytes] = []
        self.kept = 0
        self.total = 0

    def add(self, chunk: bytes) -> None:
        self.total += len(chunk)
        room = self.limit - self.kept
        if room > 0:
            piece = chunk[:room]
            self.chunks.append(piece)
            self.kept += len(piece)

    def captured(self) -> Captured:
        return Captured(b"".join(self.chunks), self.total)


def hide_own_process() -> None:
    """Make mm-batch's own process unreadable to the tools it starts on the host: not dumpable,
    /proc/<pid>/environ (its secrets) and its memory are closed to processes of the same user
    (root's still reach them: the host is no sandbox). Linux only; elsewhere nothing changes."""
    with contextlib.suppress(OSError, AttributeError):
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0)


_PR_SET_DUMPABLE = 4


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


class HostExecutor:
    """Runs argv lists on the host: no shell, own process group, clean environment."""

    where = "host"

    def __init__(self, log_limit: int = LOG_LIMIT) -> None:
        hide_own_process()
        self.log_limit = log_limit
        self._copies: dict[tuple[Path, bytes], str] = {}  # sealed: `paths.sealed_copy`

    def close(self) -> None:
        for copy in self._copies.values():
            drop_sealed(copy)
        self._copies.clear()

    def _copy(self, path: Path, content: bytes) -> str:
        """A sealed copy of a file as read at start (the host is no sandbox: a private folder
        would still be open to every command, all running as the same user)."""
        key = (path, content)
        if key not in self._copies:
            self._copies[key] = sealed_copy(content, path.name)
        return self._copies[key]

    def protect(self, files: Mapping[Path, bytes]) -> dict[Path, str]:
        """Sealed copies. An original that still holds the bytes read at start runs in place,
        its own folder's modules and files at hand, as a tool's program does (see `_pinned`)."""
        return {
            original: (
                str(original)
                if _holds(original, content, original)
                else self._copy(original, content)
            )
            for original, content in files.items()
        }

    def _pinned(
        self, argv: Sequence[str], workdir: Path, programs: Sequence[PinnedProgram]
    ) -> list[str]:
        """argv where each pinned program whose file no longer holds what it held at start
        runs from its copy; one that does runs in place, so that `$0`'s folder is unchanged."""
        pinned = list(argv)
        for program in programs:
            if not _holds(workdir / program.entry, program.content, program.path):
                pinned[program.index] = self._copy(program.path, program.content)
        return pinned

    def changed(
        self, workdir: Path, unread: Sequence[UnreadProgram], *, check: bool = False
    ) -> UnreadProgram | None:
        """The host's files are the agent's folder itself: looked at in place."""
        return changed_here(workdir, unread)

    def execute_check(
        self, argv: Sequence[str], workdir: Path, timeout: float, cancel: threading.Event | None
    ) -> ExecResult:
        """A `check` runs as the tools do: the host has no other user to give it."""
        return self.execute(argv, workdir, {}, timeout, cancel)

    def settled(self) -> str | None:
        """Nothing to wait for: a call's process group is killed before it returns."""
        return None

    def execute(
        self,
        argv: Sequence[str],
        workdir: Path,
        env: Mapping[str, str],
        timeout: float,
        cancel: threading.Event | None = None,
        *,
        programs: Sequence[PinnedProgram] = (),
        stdin: bytes | None = None,
    ) -> ExecResult:
        """Run argv; `stdin`, when given, is what the command reads (hooks get the call there)."""
        started = time.monotonic()
        if programs:
            argv = self._pinned(argv, workdir, programs)
        source: Any = subprocess.DEVNULL
        if stdin is not None:
            source = tempfile.TemporaryFile()  # noqa: SIM115 (closed below, once the child has it)
            source.write(stdin)
            source.seek(0)
        try:
            proc = subprocess.Popen(
                list(argv),
                cwd=workdir,
                env=host_environment(env),
                stdin=source,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                start_new_session=True,
                close_fds=True,
                pass_fds=sealed_fds(argv),
            )
        except OSError as exc:
            # Nothing ran: the only case that is an error with `started=False`.
            return ExecResult(
                None,
                EMPTY,
                EMPTY,
                time.monotonic() - started,
                error=_start_failure(argv[0], workdir, exc),
                started=False,
            )
        finally:
            if stdin is not None:
                source.close()
        watchdog = current_watchdog()
        if watchdog is not None:
            watchdog.register(proc.pid)
        return self._supervise(proc, started, timeout, cancel, watchdog)

    def _supervise(
        self,
        proc: subprocess.Popen[bytes],
        started: float,
        timeout: float,
        cancel: threading.Event | None,
        watchdog: Watchdog | None,
    ) -> ExecResult:
        assert proc.stdout is not None and proc.stderr is not None
        out, err = Sink(self.log_limit), Sink(self.log_limit)
        sinks = {proc.stdout.fileno(): out, proc.stderr.fileno(): err}
        selector = selectors.DefaultSelector()
        for fd in sinks:
            os.set_blocking(fd, False)
            selector.register(fd, selectors.EVENT_READ)
        # A pidfd turns "the process exited" into one more readable descriptor: no polling.
        pidfd = _pidfd(proc.pid)
        if pidfd is not None:
            selector.register(pidfd, selectors.EVENT_READ)
        deadline = started + timeout
        term_sent: float | None = None
        killed_at: float | None = None
        timed_out = interrupted = False
        try:
            while True:
                now = time.monotonic()
                stop = now >= deadline or (cancel is not None and cancel.is_set())
                if term_sent is None and stop:
                    timed_out, interrupted = now >= deadline, now < deadline
                    _signal_group(proc.pid, signal.SIGTERM)
                    term_sent = now
                # The leader is not reaped here: its zombie keeps the group's id ours to signal.
                exited = _exited(proc.pid)
                pipes_open = any(fd in sinks for fd in selector.get_map())
                if exited and not pipes_open:
                    break
                # The call returned (or its grace after SIGTERM ran out): what it left in its
                # group goes now, so that no call can watch the next one.
                grace_over = term_sent is not None and now >= term_sent + KILL_GRACE_S
                if killed_at is None and ((exited and term_sent is None) or grace_over):
                    _signal_group(proc.pid, signal.SIGKILL)
                    killed_at = now
                # Pipes held open by a process that escaped the group must not hold us forever.
                if exited and killed_at is not None and now >= killed_at + DRAIN_S:
                    break
                wait = min(0.1 if pidfd is not None else 0.02, max(deadline - now, 0.001))
                for key, _ in selector.select(timeout=wait):
                    fd = int(key.fd)
                    if fd == pidfd:
                        selector.unregister(fd)
                        continue
                    try:
                        chunk = os.read(fd, _READ_CHUNK)
                    except BlockingIOError:
                        continue
                    if chunk:
                        sinks[fd].add(chunk)
                    else:
                        selector.unregister(fd)
        finally:
            selector.close()
            if pidfd is not None:
                os.close(pidfd)
            proc.stdout.close()
            proc.stderr.close()
            # Whatever is left of the group goes while the leader's zombie still pins its id;
            # only then may the watchdog forget it and the leader be reaped.
            _signal_group(proc.pid, signal.SIGKILL)
            if watchdog is not None:
                watchdog.unregister(proc.pid)
            returncode = proc.wait()
        exit_code: int | None = returncode if returncode >= 0 else 128 - returncode
        if timed_out or interrupted:
            exit_code = None
        return ExecResult(
            exit_code,
            out.captured(),
            err.captured(),
            time.monotonic() - started,
            timed_out=timed_out,
            interrupted=interrupted,
        )


def _holds(path: Path, content: bytes, start: Path) -> bool:
    """Whether a path names, as at start, the file read then (`start`: no link on its way
    leads elsewhere now: a link a tool made to `/proc/self/cwd/...` would lead this process
    and the command to different files), a regular file holding exactly `content` (never
    blocks on a FIFO)."""
    try:
        if os.path.realpath(path) != os.fspath(start):
            return False
    except (OSError, ValueError):
        return False
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_size != len(content):
            return False
        with os.fdopen(os.dup(fd), "rb") as file:
            return file.read(len(content) + 1) == content
    except OSError:
        return False
    finally:
        os.close(fd)


def _start_failure(program: str, workdir: Path, exc: OSError) -> str:
    """Why a command could not start, in the words of the call's record."""
    if exc.filename is not None and os.fsdecode(exc.filename) == os.fsdecode(workdir):
        if isinstance(exc, FileNotFoundError):
            return f"working directory not found: {workdir}"
        return f"cannot enter the working directory {workdir}: {exc.strerror or exc}"
    if isinstance(exc, FileNotFoundError):
        where = "the PATH" if "/" not in program else str(workdir)
        return f"program not found: {program} (looked in {where})"
    if isinstance(exc, PermissionError):
        return f"program is not executable: {program}"
    return f"cannot start {program}: {exc.strerror or exc}"


def _exited(pid: int) -> bool:
    """Whether the child has exited, leaving it unreaped."""
    try:
        return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
    except ChildProcessError:
        return True


def _pidfd(pid: int) -> int | None:
    try:
        return os.pidfd_open(pid)
    except (AttributeError, OSError):
        return None


def _die_with_parent() -> None:
    """In the child: ask Linux for SIGKILL if mm-batch dies, so a model server is never left."""
    with contextlib.suppress(Exception):
        import ctypes

        pr_set_pdeathsig = 1
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(pr_set_pdeathsig, signal.SIGKILL)


def start_service(argv: Sequence[str], log_path: Path) -> subprocess.Popen[bytes]:
    """Start a long-running helper (a model server): own session, output to a log file."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("wb") as log:
        return subprocess.Popen(
            list(argv),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            close_fds=True,
            env=service_environment("LLAMA_", "GGML_", "OMP_", "LD_LIBRARY_PATH", "CUDA_", "HIP_"),
            preexec_fn=_die_with_parent,  # noqa: PLW1509 (called from the main thread, before runs)
        )


def stop_service(proc: subprocess.Popen[bytes], grace_s: float = 5.0) -> None:
    """SIGTERM the service's group, then SIGKILL when it does not stop within the grace."""
    if proc.poll() is None:
        _signal_group(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            _signal_group(proc.pid, signal.SIGKILL)
            proc.wait()
