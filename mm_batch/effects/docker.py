"""The Docker sandbox: one hardened container per task run, each call an exec of the argv list.

This module is the only one that imports the docker SDK. Measured facts it relies on:
- `exec_run` has no timeout and closing its stream leaves the process running, so what a call
  leaves running (and a timed-out call) is killed by the sweep: a root exec whose only
  capability is CAP_KILL (the container holds no other; tools run as a non-root uid, so they hold
  none) scans /proc, SIGKILLs every process of the tools' uid until a scan finds none, and says
  so. No tool process can signal, stop or trace it (another uid, no capability), so its word is
  the runtime's: a call whose processes it cannot end makes the task run an error.
- The SDK turns the socket timeout off on exec streams: each exec's stream is read here, from a
  socket of our own, with select and a deadline, and a quiet stream makes us ask the engine
  whether it still answers, so that a stalled engine fails the call instead of hanging it. The
  stream is read while a timed-out call is killed: an exec flooding its output otherwise stalls
  the engine's other execs (the kill among them) for 20 s.
- When the runtime cannot start the program (not found, not executable), the exec's `Pid` is 0
  and its message comes on stdout. When the kernel refuses a program the runtime found (a
  missing `#!` interpreter, `#!/bin/sh\r`, an empty or garbage file) the exec has a pid, exits 1
  and the runtime writes `exec PROGRAM: REASON` on stderr: words any program could print, so
  they count only for a program whose content mm-batch read at start and knows the kernel
  refuses; any other program that printed them ran, as far as anyone can tell.
- `put_archive` cannot write into a tmpfs, so a `copy` workspace is a tar stream into
  `tar -xf -` run as the tools' uid.
"""

from __future__ import annotations

import contextlib
import functools
import io
import os
import posixpath
import re
import secrets
import select
import socket
import stat
import tarfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path, PurePosixPath
from typing import Any

from mm_batch.config.model import SandboxSpec
from mm_batch.effects.host import KILL_GRACE_S, LOG_LIMIT, Sink
from mm_batch.effects.watchdog import LABEL_HOST, LABEL_PID, LABEL_PID_START, process_start
from mm_batch.run.ports import EMPTY, Captured, ExecResult, PinnedProgram, SandboxError

WORKSPACE = PurePosixPath("/workspace")
LABEL = "mm-batch"
LABEL_RUN = "mm-batch.run"
LABEL_PID_NS = "mm-batch.pid-ns"
ENGINE_TIMEOUT_S = 20.0  # every engine request; with the probe below, a stall fails in < 60 s
PROBE_AFTER_S = 10.0  # a call whose stream is quiet this long asks the engine whether it answers
PROBE_TIMEOUT_S = 10.0
# The sandbox's own tmpfs space, counted in the memory limit: /tmp (each call's HOME and TMPDIR),
# the checks' space and the program copies, 256 MiB in all.
TMP_BYTES = 192 * 1024 * 1024
CHECK_DIR = "/.mm-batch-check"  # the checks' copies, HOME and TMPDIR: owned by the check uid
CHECK_BYTES = 32 * 1024 * 1024
PROGRAMS_DIR = "/.mm-batch-programs"  # copies of the tools' programs: root's, read-only to tools
PROGRAMS_BYTES = 32 * 1024 * 1024
ROOT = "0:0"  # the sweep, the program copies and mm-batch's probes: root holding only CAP_KILL
_PAGE = 4096
_KEEPALIVE = ["sleep", "2147483647"]
_KILL_TRIES_S = 5.0
# Each pass lists the processes of the uid ($1) and SIGKILLs them; a pass that finds none prints
# `clean`. Zombies are dead already (docker-init reaps them). `kill` may be the shell's built-in
# and its status is not trusted: only the next pass's count is. The shell's own pid is skipped;
# it runs as root, never the uid swept.
_SWEEP = r"""
u=$1; n=0
while :; do
  left=
  for d in /proc/[0-9]*; do
    p=${d#/proc/}
    [ "$p" = "$$" ] && continue
    s=; r=; e=
    { while read -r k a b c; do
        case $k in State:) s=$a ;; Uid:) r=$a; e=$b; break ;; esac
      done <"$d/status"; } 2>/dev/null
    [ "$r" = "$u" ] || [ "$e" = "$u" ] || continue
    [ "$s" = Z ] || [ "$s" = X ] || left="$left $p"
  done
  [ -z "$left" ] && { echo clean; exit 0; }
  n=$((n + 1))
  [ $n -gt 300 ] && { echo "left$left"; exit 3; }
  kill -9 $left 2>/dev/null
done
"""
# Run as the tools' uid once the sweep found none of their processes: empty /tmp, /dev/shm and
# /dev/mqueue, the places outside the workspace a tool can write (what a call left there:
# dotfiles, .pth files, caches, POSIX shared memory, semaphores and queues); remove every SysV
# IPC object (message queues with their messages, shared memory, semaphores), then read the
# kernel's own list of them again; make the next call's HOME and TMPDIR ($1), then say which
# program copies ($2 $3, ... pairs of copy and original) the originals still equal. Prints
# `ready` at the end; `kept WHAT` for what could not be removed, and `no ipcrm` when the image
# lacks the program that removes SysV objects.
# The container has an IPC namespace of its own, where only tools and checks make objects, and
# checks run last: whatever is listed was made by the tools' uid, whose processes may remove
# it (the creator may, whoever it made the owner since), and no root exec of ours could (that
# needs CAP_SYS_ADMIN). The second reading uses the shell alone: a missing or lying `ipcrm`
# cannot make it say clean.
_RESET = r"""
h=$1; shift
cd / || exit 4
for d in /tmp /dev/shm /dev/mqueue; do
  for f in "$d"/* "$d"/.[!.]* "$d"/..?*; do
    [ -e "$f" ] || [ -L "$f" ] || continue
    [ -d "$f" ] && [ ! -L "$f" ] && chmod -R u+rwx "$f" 2>/dev/null
    rm -rf "$f" 2>/dev/null
    { [ -e "$f" ] || [ -L "$f" ]; } && echo "kept $f"
  done
done
for k in msg:q shm:m sem:s; do
  t=${k%:*}; f=/proc/sysvipc/$t; a=
  [ -e "$f" ] || continue
  { read -r _; while read -r _ i _; do a="$a -${k#*:} $i"; done; } <"$f"
  if [ -n "$a" ]; then
    command -v ipcrm >/dev/null 2>&1 || echo "no ipcrm"
    ipcrm $a >/dev/null 2>&1
  fi
  { read -r _; while read -r _ i _; do echo "kept SysV $t $i"; done; } <"$f" || echo "kept $f"
done
mkdir -m 700 "$h" && mkdir -m 700 "$h/tmp" || exit 5
while [ $# -ge 2 ]; do
  [ -f "$2" ] && cmp -s "$1" "$2" 2>/dev/null && echo "same $1"
  shift 2
done
echo ready
"""
# As root: place one program copy ($1 folder, $2 name, content on stdin), then say whether the
# original ($3) still holds the same bytes.
_PLACE = r"""
set -e; umask 022
mkdir "$1"; cat >"$1/$2"; chmod 0755 "$1/$2"
if [ -f "$3" ] && cmp -s "$1/$2" "$3" 2>/dev/null; then echo same; else echo changed; fi
"""
# As root: whether a `#!` interpreter the kernel did not find is really missing. It prints the
# real path of the deepest folder on its way that exists (root must be able to enter it); the
# caller believes the absence only when that folder lies outside every place a tool can write:
# there, nothing can have been made and removed since the exec.
_INTERPRETER_MISSING = r"""
i=$1
{ [ -e "$i" ] || [ -L "$i" ]; } && exit 0
d=$i
while :; do
  d=${d%/*}; [ -n "$d" ] || d=/
  [ -d "$d" ] && break
  { [ -e "$d" ] || [ -L "$d" ]; } && exit 0
done
cd "$d" 2>/dev/null && pwd -P
"""
_READ_CHUNK = 65536
_COPY_ERRORS = "/tmp/.mm-batch-copy-errors"
# Exit codes of the start-up script, each a clear reason (no program picks them: it runs first).
_NO_SLEEP, _COPY_FAILED, _NOT_WRITABLE, _NO_TAR, _NO_HOME = 90, 91, 92, 93, 94
_SIZE_UNITS = {"": 1, "b": 1, "k": 1024, "m": 1024**2, "g": 1024**3, "t": 1024**4}


def _pid_namespace() -> str:
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return ""


def connect() -> Any:
    """A client of the local engine. Raises SandboxError with one clear line when it is down."""
    import docker

    try:
        # use_context=False: CI must not follow a developer's docker CLI context.
        client = docker.from_env(use_context=False, timeout=ENGINE_TIMEOUT_S)
        client.ping()
    except Exception as exc:  # the SDK raises its own errors, requests' and OSError alike
        raise SandboxError(
            f"the Docker engine is unreachable ({_first_line(exc)}); is dockerd running?"
        ) from exc
    return client


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0][:300] if text else type(exc).__name__


def _is_not_found(exc: BaseException) -> bool:
    from docker.errors import NotFound

    return isinstance(exc, NotFound)


def remove_orphans(client: Any) -> int:
    """Remove containers of mm-batch runs whose mm-batch process is provably gone; never raises.

    Only containers of this host and pid namespace are judged; one whose labels are missing or
    odd is left alone, and one removed by someone else during the scan is skipped.
    """
    try:
        found = client.api.containers(all=True, filters={"label": LABEL})
    except Exception:
        return 0
    host, namespace = socket.gethostname(), _pid_namespace()
    removed = 0
    for item in found if isinstance(found, list) else []:
        try:
            labels = item.get("Labels")
            if not isinstance(labels, dict) or labels.get(LABEL_HOST) != host:
                continue
            if not namespace or labels.get(LABEL_PID_NS) != namespace:
                continue  # another pid namespace: its pids mean nothing here
            pid, start = int(str(labels.get(LABEL_PID))), labels.get(LABEL_PID_START)
            if pid <= 0 or not isinstance(start, str):
                continue
            if process_start(pid) == start:
                continue  # a live run: never touch it
            client.api.remove_container(str(item["Id"]), force=True)
            removed += 1
        except Exception:
            continue
    return removed


def check_user(user: str) -> str:
    """The uid a `check` runs as: never the tools' (so no tool can signal, trace or fill it)."""
    return "65531:65531" if user.split(":", maxsplit=1)[0] == "65532" else "65532:65532"


# Where tools can write in any container (its tmpfs mounts): an interpreter path there may
# have been made and removed by a call, so its absence proves nothing.
_WRITABLE = ("/tmp", "/dev", str(WORKSPACE), "/proc", "/sys", CHECK_DIR, PROGRAMS_DIR)


def kernel_refusal(content: bytes) -> str | None:
    """Why the kernel refuses to execute a file holding `content`, in the runtime's words (the
    errno's text), or None when it may run it. For `#!` lines the interpreter is returned as
    `interpreter:PATH`: whether it exists is for the image to say."""
    if content.startswith(b"\x7fELF"):
        return None  # whether this machine runs it is not for us to guess
    if content.startswith(b"#!"):
        line = content[2:].split(b"\n", 1)[0].strip(b" \t")
        interpreter = line.split(b" ", 1)[0].split(b"\t", 1)[0]
        if not interpreter or not interpreter.startswith(b"/") or b"\0" in interpreter:
            return None
        return "interpreter:" + interpreter.decode("utf-8", "surrogateescape")
    if _binfmt_handlers():
        return None  # the kernel may hand it to a registered handler (qemu, a JVM, ...)
    return "exec format error"  # no `#!` and no ELF header: ENOEXEC (an empty file too)


@functools.cache
def _binfmt_handlers() -> bool:
    """Whether this kernel has binfmt_misc handlers, which run files that are neither ELF nor
    `#!` (containers share the host's kernel)."""
    try:
        names = os.listdir("/proc/sys/fs/binfmt_misc")
    except OSError:
        return False
    return any(name not in ("register", "status") for name in names)


def size_bytes(text: str) -> int:
    """Bytes of a Docker size (`512m`, `1g`, `1.5g`, `1048576`)."""
    match = re.fullmatch(r"(\d+(?:\.\d+)?)([bkmgt]?)b?", text.strip().lower())
    if match is None:
        raise SandboxError(f"cannot read the size {text!r} (expected e.g. 512m or 1g)")
    return int(float(match[1]) * _SIZE_UNITS[match[2]])


# -- the copied workspace ---------------------------------------------------------------------


@dataclass(frozen=True)
class Snapshot:
    """What a `copy` workspace receives: the folder's entries, links as links, in tar order."""

    top: Path
    entries: tuple[tuple[Path, str], ...]  # (host path, name in the workspace)
    needed: int  # bytes of tmpfs pages the files take

    @classmethod
    def take(cls, top: Path, leave_out: Path | None, room: int) -> Snapshot:
        """List the folder without following any link; refuse it when it cannot fit `room`."""
        entries: list[tuple[Path, str]] = []
        needed = 0
        pending = [top]
        while pending:
            folder = pending.pop()
            try:
                children = sorted(os.scandir(folder), key=lambda e: e.name)
            except OSError as exc:
                raise SandboxError(
                    f"cannot read {folder} to copy it into the sandbox: {exc.strerror or exc}"
                ) from exc
            for child in children:
                path = Path(child.path)
                if leave_out is not None and path == leave_out:
                    continue  # the results folder: no command gets to see or swap it
                try:
                    mode = child.stat(follow_symlinks=False)
                except OSError:
                    continue  # gone since the listing
                if stat.S_ISDIR(mode.st_mode):
                    pending.append(path)
                elif stat.S_ISREG(mode.st_mode):
                    needed += -(-mode.st_size // _PAGE) * _PAGE
                elif not stat.S_ISLNK(mode.st_mode):
                    continue  # sockets, fifos, devices: nothing a tool reads as a file
                entries.append((path, path.relative_to(top).as_posix()))
        if needed > room:
            raise SandboxError(_does_not_fit(top, needed, room))
        return cls(top, tuple(entries), needed)

    def write(self, out: Any, uid: int, gid: int) -> None:
        """Write the tar stream to a binary file object; set-id bits are dropped."""
        with tarfile.open(fileobj=out, mode="w|", format=tarfile.GNU_FORMAT) as tar:
            for path, name in self.entries:
                try:
                    info = tar.gettarinfo(str(path), arcname=name)
                    info.uid, info.gid, info.uname, info.gname = uid, gid, "", ""
                    info.mode &= ~(stat.S_ISUID | stat.S_ISGID)
                    if info.isreg():
                        with path.open("rb") as content:
                            tar.addfile(info, content)
                    else:
                        tar.addfile(info)
                except OSError as exc:
                    raise SandboxError(
                        f"cannot copy {path} into the sandbox: {exc.strerror or exc}"
                    ) from exc


def _does_not_fit(top: Path, needed: int, room: int) -> str:
    return (
        f"the agent's folder {top} does not fit the sandbox workspace ({needed:,} bytes to copy, "
        f"limits.workspace is {room:,}): raise limits.workspace, or use workspace: readonly"
    )


class _SocketWriter(io.RawIOBase):
    """A write-only file object over a socket, for tarfile's stream mode."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        self._sock.sendall(data)
        return len(data)


# -- exec streams ------------------------------------------------------------------------------


class _Frames:
    """Splits the engine's multiplexed exec stream (8-byte headers) into stdout and stderr."""

    def __init__(self, out: Sink, err: Sink) -> None:
        self._buffer = bytearray()
        self._sinks = {1: out, 2: err}
        self._err = err

    def feed(self, data: bytes) -> None:
        self._buffer += data
        while len(self._buffer) >= 8:
            size = int.from_bytes(self._buffer[4:8], "big")
            if len(self._buffer) < 8 + size:
                return
            kind = self._buffer[0]
            self._sinks.get(kind, self._err).add(bytes(self._buffer[8 : 8 + size]))
            del self._buffer[: 8 + size]


@dataclass(frozen=True)
class _Done:
    """How an exec of our own (start-up, kill, protect) went."""

    pid: int
    exit_code: int | None
    stdout: bytes


class _EngineError(Exception):
    """The engine failed or stopped answering, or the container is gone."""


@dataclass(frozen=True)
class _Call:
    """One exec of a tool or a check: its argv as the model's call has it, what was executed
    (program copies swapped in), where, as which uid, and what the kernel would say of argv[0]
    when its content was read at start (`kernel_refusal`)."""

    argv: Sequence[str]
    command: Sequence[str]
    workdir: str
    uid: int
    refusal: str | None


@dataclass(frozen=True)
class _Refusal:
    """The runtime said the kernel refused the program: `verified` when mm-batch knows that of
    the program's content, else the words may be the program's own."""

    reason: str
    verified: bool

    def result(
        self,
        argv: Sequence[str],
        workdir: str,
        where: str,
        stdout: Captured,
        stderr: Captured,
        duration: float,
    ) -> ExecResult:
        if self.verified:
            reason = _not_started_reason(self.reason, argv, workdir, where)
            return ExecResult(None, EMPTY, EMPTY, duration, error=reason, started=False)
        # An error, never `ran`: `expect.calls` cannot pass on it; and started, so that no
        # negative check can pass on a program that printed the runtime's words.
        reason = (
            f"the runtime says it could not execute {argv[0]} ({self.reason}); that cannot be "
            "verified, so the call counts as started"
        )
        return ExecResult(None, stdout, stderr, duration, error=reason, started=True)


class _Background:
    """A request to the engine on a thread of its own; `failure` says why it failed."""

    def __init__(self, action: Callable[[], None]) -> None:
        self.began = time.monotonic()
        self.failure: str | None = None
        self._thread = threading.Thread(target=self._run, args=(action,), daemon=True)
        self._thread.name = "mm-batch-sweep"
        self._thread.start()

    def _run(self, action: Callable[[], None]) -> None:
        try:
            action()
        except (_EngineError, SandboxError) as exc:
            self.failure = str(exc)
        except Exception as exc:  # a thread must not die silently: the call fails instead
            self.failure = f"internal error: {type(exc).__name__}: {exc}"

    def done(self) -> bool:
        return not self._thread.is_alive()

    def wait(self, timeout: float | None = None) -> bool:
        self._thread.join(timeout)
        return self.done()


def _fresh_home() -> str:
    """A name for a call's HOME that no call can guess (and so cannot have made)."""
    return f"/tmp/.mm-batch-home-{secrets.token_hex(16)}"


def _not_started_reason(message: str, argv: Sequence[str], workdir: str, where: str) -> str:
    """The host executor's wording, from the runtime's own message (Pid 0: it never started)."""
    lowered = message.lower()
    if "chdir" in lowered or "cwd" in lowered:
        return f"working directory not found: {workdir} (in {where})"
    if "permission denied" in lowered or "exec format error" in lowered:
        return f"program is not executable: {argv[0]}"
    if "no such file" in lowered or "not found" in lowered:
        return f"program not found: {argv[0]} (in {where})"
    detail = message.strip().splitlines()[0][:300] if message.strip() else "no reason given"
    return f"cannot start {argv[0]} (in {where}): {detail}"


class DockerSandbox:
    """An Executor whose commands run in one container, started at the first call."""

    def __init__(
        self,
        client: Any,
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
        self.container: Any = None
        self._lock = threading.Lock()
        self._oom_kills = 0
        self._closed = False
        self._sweeper: _Background | None = None
        self._sweep_failure: str | None = None
        uid, _, gid = spec.user.partition(":")
        self._uid, self._gid = int(uid), int(gid or uid)
        self._check_user = check_user(spec.user)
        self._check_uid = int(self._check_user.split(":")[0])
        # Each call's HOME (and TMPDIR below it): made after the previous call's sweep.
        self._home = _fresh_home()
        # Program copies placed in the container: (file at start, content) -> (copy, original
        # in the container); and which copies the originals still equalled at the last look.
        self._programs: dict[tuple[Path, bytes], tuple[str, str]] = {}
        self._same: set[str] = set()
        # False only in benchmarks/exec.py, to measure what the fresh HOME costs a call.
        self.fresh_home_per_call = True

    @property
    def where(self) -> str:
        return f"docker:{self.spec.image}"

    @property
    def container_id(self) -> str:
        return str(self.container.id)

    # -- lifecycle -----------------------------------------------------------------------

    def start(self) -> None:
        """Create and start the container, fill its workspace and check the image's programs."""
        with self._lock:
            if self.container is not None:
                return
            if self._closed:
                raise SandboxError("the sandbox was closed")
            snapshot = None
            if self.spec.workspace == "copy":
                room = size_bytes(self.spec.workspace_size)
                snapshot = Snapshot.take(self.agent_dir, self.out_dir, room)
            self.container = self._create()
            try:
                self.client.api.start(self.container_id)
            except Exception as exc:
                raise SandboxError(f"cannot start the container: {_first_line(exc)}") from exc
            self._prepare(snapshot)

    def _create(self) -> Any:
        from docker.errors import ImageNotFound
        from docker.types import LogConfig

        memory = size_bytes(self.spec.memory) + TMP_BYTES + CHECK_BYTES + PROGRAMS_BYTES
        # `exec`: Docker's tmpfs default is noexec, and ./release.sh runs from the workspace,
        # a program's copy from PROGRAMS_DIR and a `check` from its copy in CHECK_DIR.
        check_uid = self._check_uid
        tmpfs = {
            "/tmp": f"rw,exec,nosuid,nodev,size={TMP_BYTES},mode=1777",
            CHECK_DIR: (
                f"rw,exec,nosuid,nodev,size={CHECK_BYTES},uid={check_uid},gid={check_uid},mode=0700"
            ),
            PROGRAMS_DIR: f"rw,exec,nosuid,nodev,size={PROGRAMS_BYTES},mode=0755",
        }
        volumes: dict[str, dict[str, str]] = {}
        if self.spec.workspace == "copy":
            room = size_bytes(self.spec.workspace_size)
            memory += room  # a full workspace is ENOSPC, not an OOM kill
            tmpfs[str(WORKSPACE)] = (
                f"rw,exec,nosuid,nodev,size={room},uid={self._uid},gid={self._gid},mode=0755"
            )
        else:
            mode = "rw" if self.spec.workspace == "mount" else "ro"
            volumes[str(self.agent_dir)] = {"bind": str(WORKSPACE), "mode": mode}
        pid = os.getpid()
        try:
            # create + start, never `run`: run would pull a missing image.
            return self.client.containers.create(
                self.spec.image,
                command=_KEEPALIVE,
                detach=True,
                init=True,
                # Root for the container's own processes, so that the sweep (a root exec) holds
                # CAP_KILL, the one capability kept: a non-root exec gets none (no-new-privileges
                # and no file capabilities), so no tool can signal, stop or trace a root process.
                # ptrace is denied to tools by uid, not by a seccomp profile: without
                # CAP_SYS_PTRACE the kernel refuses tracing another uid (the sweep, mm-batch's
                # probes: root; a check: its own uid), and the verified sweep leaves no process
                # of an earlier call to trace a later one, so what a tool can still trace is its
                # own call's processes, which it could change anyway. A profile would also break
                # strace and debuggers that tools may legitimately run.
                user=ROOT,
                network_mode=self.spec.network,
                # An IPC namespace of the container's own, which no other container may join:
                # what its calls make there is theirs alone, for the reset to remove. Shared
                # memory no process holds is destroyed at once (defence in depth: a segment
                # left by a call is gone with its last process, even in an image the reset
                # cannot remove SysV objects in).
                ipc_mode="private",
                sysctls={"kernel.shm_rmid_forced": "1"},
                cap_drop=["ALL"],
                cap_add=["KILL"],
                security_opt=["no-new-privileges"],
                privileged=False,
                read_only=True,
                tmpfs=tmpfs,
                pids_limit=self.spec.pids,
                mem_limit=memory,
                memswap_limit=memory,
                nano_cpus=int(self.spec.cpus * 1e9),
                volumes=volumes,
                working_dir=str(WORKSPACE),
                environment={"HOME": "/tmp"},
                labels={
                    LABEL: "1",
                    LABEL_RUN: self.run_id,
                    LABEL_PID: str(pid),
                    LABEL_PID_START: process_start(pid),
                    LABEL_PID_NS: _pid_namespace(),
                    LABEL_HOST: socket.gethostname(),
                },
                log_config=LogConfig(type="json-file", config={"max-size": "1m", "max-file": "1"}),
            )
        except ImageNotFound as exc:
            raise SandboxError(
                f"image {self.spec.image} not found (no image is pulled); build it first: "
                "containers/build.sh base, or see containers/README.md"
            ) from exc
        except Exception as exc:
            raise SandboxError(f"cannot create the container: {_first_line(exc)}") from exc

    def _prepare(self, snapshot: Snapshot | None) -> None:
        """One exec as the tools' uid: check `sleep`, then fill or check the workspace."""
        # A file on the PATH, as the keep-alive needs: busybox's shell would find its applet.
        script = (
            'found=; IFS=:; for d in $PATH; do [ -f "$d/sleep" ] && [ -x "$d/sleep" ] && found=1; '
            f'done; unset IFS; [ -n "$found" ] || exit {_NO_SLEEP}\n'
        )
        if snapshot is not None:
            script += (
                f"tar -xf - -C {WORKSPACE} 2>{_COPY_ERRORS}; copied=$?\n"
                f"[ $copied -ne 127 ] || exit {_NO_TAR}\n"
                f"[ $copied -eq 0 ] || {{ head -c 2000 {_COPY_ERRORS}; exit {_COPY_FAILED}; }}\n"
                f"rm -f {_COPY_ERRORS}\n"
            )
        elif self.spec.workspace == "mount":
            script += f"[ -w {WORKSPACE} ] || exit {_NOT_WRITABLE}\n"
        script += f"mkdir -m 700 {self._home} {self._home}/tmp || exit {_NO_HOME}\n"

        def send(sock: socket.socket) -> None:
            assert snapshot is not None
            snapshot.write(_SocketWriter(sock), self._uid, self._gid)

        try:
            done = self._run(
                ["/bin/sh", "-c", script], self.spec.user, send if snapshot is not None else None
            )
        except _EngineError as exc:
            raise SandboxError(self._start_failure(str(exc))) from exc
        except (OSError, tarfile.TarError) as exc:
            # The stream broke while tar was reading it: tar's own message says why.
            reason = f"the copy broke off: {_first_line(exc)}"
            raise SandboxError(self._start_failure(reason)) from exc
        image = self.spec.image
        output = done.stdout.decode(errors="replace").strip()
        if done.pid == 0:
            dead = self._start_failure("")
            if dead.startswith("image "):  # the keep-alive exited first: no sleep to run
                raise SandboxError(dead)
            raise SandboxError(
                f"image {image} has no /bin/sh, which the sandbox needs "
                f"(the runtime said: {output.splitlines()[0][:200] if output else 'nothing'})"
            )
        if done.exit_code == _NO_SLEEP:
            raise SandboxError(f"image {image} has no sleep program, which the sandbox needs")
        if done.exit_code == _NO_TAR:
            raise SandboxError(
                f"image {image} has no tar program, which the copied workspace needs "
                "(workspace: copy, the default); add tar to the image"
            )
        if done.exit_code == _COPY_FAILED:
            if "space" in output.lower():
                room = size_bytes(self.spec.workspace_size)
                needed = snapshot.needed if snapshot is not None else 0
                raise SandboxError(_does_not_fit(self.agent_dir, max(needed, room + 1), room))
            detail = output.splitlines()[0][:200] if output else "no reason given"
            raise SandboxError(f"cannot copy the agent's folder into the sandbox: {detail}")
        if done.exit_code == _NOT_WRITABLE:
            raise SandboxError(
                f"workspace: mount needs {self.agent_dir} writable by the sandbox user "
                f"{self.spec.user}; make it so, or use workspace: copy"
            )
        if done.exit_code == _NO_HOME:
            raise SandboxError(f"cannot make a HOME folder under /tmp in image {image}")
        if done.exit_code != 0:
            raise SandboxError(
                f"the sandbox's start-up check failed in image {image} (exit {done.exit_code})"
            )

    def _start_failure(self, reason: str) -> str:
        """Why start-up failed: a container that already exited had an image it cannot run."""
        with contextlib.suppress(Exception):
            state = self.client.api.inspect_container(self.container_id)["State"]
            if not state.get("Running"):
                return (
                    f"image {self.spec.image} cannot keep the sandbox running: it needs /bin/sh "
                    f"and a sleep program (the container exited with code {state.get('ExitCode')})"
                )
        return f"the container failed at start: {reason}"

    def protect(self, files: Mapping[Path, bytes]) -> dict[Path, str]:
        """Copies for a `check`, in its own space (CHECK_DIR: a tmpfs of the check uid, mode
        0700), which no tool can read, change or fill. Written by execs as the check uid; the
        folder's random name is made with a plain `mkdir`. Where the original still holds the
        bytes read at start, the check runs it in place (its own folder's modules and files at
        hand): the sweep has just confirmed that no tool process is left to change it."""
        self.start()
        self._settle()
        folder = f"{CHECK_DIR}/copies-{secrets.token_hex(16)}"
        paths: dict[Path, str] = {}
        script = (
            'set -e; umask 022; [ "$3" = 0 ] && mkdir "$1"; cat >"$1/$2"; chmod 0755 "$1/$2"; '
            'if [ -f "$4" ] && cmp -s "$1/$2" "$4" 2>/dev/null; then echo same; fi'
        )
        for i, (original, content) in enumerate(files.items()):
            name = f"{i}-{original.name}"
            try:
                in_place = str(self._container_path(original.parent) / original.name)
            except ValueError:
                in_place = ""

            said = self._place(
                ["/bin/sh", "-c", script, "protect", folder, name, str(i), in_place],
                self._check_user,
                content,
                original.name,
            )
            same = in_place and said == b"same"
            paths[original] = in_place if same else f"{folder}/{name}"
        return paths

    def _place(self, argv: list[str], user: str, content: bytes, what: str) -> bytes:
        """Run a script that places a copy of `what` (`content` on its stdin) as `user`; what it
        said, stripped. A failure is the sandbox's."""

        def send(sock: socket.socket) -> None:
            sock.sendall(content)

        try:
            done = self._run(argv, user, send)
        except (_EngineError, OSError) as exc:
            raise SandboxError(f"cannot place a copy of {what}: {exc}") from exc
        if done.pid == 0 or done.exit_code != 0:
            raise SandboxError(
                f"cannot place a copy of {what} in the sandbox "
                f"(exit {done.exit_code}): {done.stdout.decode(errors='replace')[:200]}"
            )
        return bytes(done.stdout.strip())

    def _program_copy(self, program: PinnedProgram, original: str) -> tuple[str, bool]:
        """The container copy of a program as read at start, placed at its first use (by root,
        in PROGRAMS_DIR), and whether the original still holds the same bytes now."""
        key = (program.path, program.content)
        placed = self._programs.get(key)
        if placed is not None:
            return placed[0], placed[0] in self._same
        folder = f"{PROGRAMS_DIR}/{len(self._programs)}"
        name = program.path.name

        said = self._place(
            ["/bin/sh", "-c", _PLACE, "place", folder, name, original],
            ROOT,
            program.content,
            program.entry,
        )
        copy = f"{folder}/{name}"
        self._programs[key] = (copy, original)
        same = said == b"same"
        if same:
            self._same.add(copy)
        return copy, same

    def _pinned(
        self, argv: Sequence[str], workdir: PurePosixPath, programs: Sequence[PinnedProgram]
    ) -> tuple[list[str], bool]:
        """argv where each pinned program whose file no longer holds what it held at start runs
        from its copy (one that does runs in place: `$0`'s folder is unchanged), and whether
        argv[0] is one of them. Decided after the previous call's sweep: no tool process is
        alive to change a file between this look and the exec."""
        pinned = list(argv)
        for program in programs:
            copy, same = self._program_copy(program, str(workdir / program.entry))
            if not same:
                pinned[program.index] = copy
        return pinned, any(p.index == 0 for p in programs)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            container, self.container = self.container, None
        if container is not None:
            with contextlib.suppress(Exception):
                self.client.api.remove_container(container.id, force=True)

    # -- calls ---------------------------------------------------------------------------

    def _container_path(self, workdir: Path) -> PurePosixPath:
        try:
            relative = workdir.resolve().relative_to(self.agent_dir)
        except ValueError:
            raise ValueError(
                f"working directory {workdir} is outside the agent's directory {self.agent_dir}, "
                "which is all the container sees"
            ) from None
        return WORKSPACE / relative.as_posix() if relative.parts else WORKSPACE

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
        try:
            self.start()
            self._settle()
            command, first_pinned = self._pinned(argv, container_workdir, programs)
            refusal = None
            if first_pinned:
                refusal = kernel_refusal(next(p for p in programs if p.index == 0).content)
            # A HOME and TMPDIR no earlier call could write (made after its sweep); the tool's
            # own `env` comes last, as on the host.
            call_env = {"HOME": self._home, "TMPDIR": f"{self._home}/tmp", **env}
            exec_id = self._create_exec(
                command, self.spec.user, str(container_workdir), call_env, False
            )
        except (SandboxError, _EngineError) as exc:
            return self._failed(begun, f"{exc}", EMPTY, EMPTY, started=False)
        call = _Call(argv, command, str(container_workdir), self._uid, refusal)
        return self._run_call(exec_id, call, begun, timeout, cancel, sweep_after=True)

    def _workdir_in_container(self, workdir: Path, begun: float) -> PurePosixPath | ExecResult:
        """A host working directory's path in the container, or the call's error when it lies
        outside the agent's folder (all the container sees)."""
        try:
            return self._container_path(workdir)
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
        try:
            self.start()
            self._settle()
            self._new_oom_kill()  # the count so far: no tool process is alive to add to it
            exec_id = self._create_exec(
                argv,
                self._check_user,
                str(container_workdir),
                {"HOME": CHECK_DIR, "TMPDIR": CHECK_DIR},
                False,
            )
        except (SandboxError, _EngineError) as exc:
            return self._failed(begun, f"{exc}", EMPTY, EMPTY, started=False)
        call = _Call(argv, argv, str(container_workdir), self._check_uid, None)
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
        call: _Call,
        begun: float,
        timeout: float,
        cancel: threading.Event | None,
        sweep_after: bool,
    ) -> ExecResult:
        try:
            # From here on the engine may have started the program: a failure counts as started.
            sock = self._open_stream(exec_id)
        except _EngineError as exc:
            return self._failed(begun, str(exc), EMPTY, EMPTY, started=True)
        try:
            return self._supervise(exec_id, sock, call, begun, timeout, cancel)
        finally:
            sock.close()
            if sweep_after:
                self._sweep_later()

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

    def _supervise(
        self,
        exec_id: str,
        sock: socket.socket,
        call: _Call,
        begun: float,
        timeout: float,
        cancel: threading.Event | None,
    ) -> ExecResult:
        out, err = Sink(self.log_limit), Sink(self.log_limit)
        frames = _Frames(out, err)
        deadline = begun + timeout
        killer: _Background | None = None
        killed_at: float | None = None
        timed_out = interrupted = False
        heard = time.monotonic()
        while True:
            now = time.monotonic()
            if killer is None and (now >= deadline or (cancel is not None and cancel.is_set())):
                timed_out, interrupted = now >= deadline, now < deadline
                # The stream is read on while the kill runs: an exec still printing otherwise
                # holds up the engine's other execs, the kill's among them.
                killer = _Background(lambda: self._sweep(call.uid))
            if killer is not None and killed_at is None and killer.done():
                if killer.failure is not None:
                    return self._failed(
                        begun, killer.failure, out.captured(), err.captured(), started=True
                    )
                killed_at = now
            # Output held open by a process the kill could not reach must not hold us forever.
            if killed_at is not None and now >= killed_at + 2 * KILL_GRACE_S:
                break
            if (
                killer is not None
                and killed_at is None
                and now >= killer.began + 2 * (ENGINE_TIMEOUT_S + _KILL_TRIES_S)
            ):
                reason = "the call's processes could not be stopped in time"
                return self._failed(begun, reason, out.captured(), err.captured(), started=True)
            if now - heard >= PROBE_AFTER_S:
                problem = self._probe()
                if problem is not None:
                    return self._failed(
                        begun, problem, out.captured(), err.captured(), started=True
                    )
                heard = now
            wait = max(0.001, min(0.1, deadline - now if killer is None else 0.05))
            try:
                readable, _, _ = select.select([sock], [], [], wait)
                if not readable:
                    continue
                chunk = sock.recv(_READ_CHUNK)
            except BlockingIOError:
                continue
            except OSError as exc:
                reason = f"the engine's stream broke: {_first_line(exc)}"
                return self._failed(begun, reason, out.captured(), err.captured(), started=True)
            if not chunk:
                if killer is not None and killed_at is None:
                    killer.wait()  # the stream ended: the kill's word is still needed
                    if killer.failure is not None:
                        return self._failed(
                            begun, killer.failure, out.captured(), err.captured(), started=True
                        )
                break
            frames.feed(chunk)
            heard = time.monotonic()
        return self._conclude(exec_id, call, begun, out, err, timed_out, interrupted)

    def _conclude(
        self,
        exec_id: str,
        call: _Call,
        begun: float,
        out: Sink,
        err: Sink,
        timed_out: bool,
        interrupted: bool,
    ) -> ExecResult:
        """Read the exec's end from the engine: started or not, its exit, the container's fate."""
        stdout, stderr = out.captured(), err.captured()
        try:
            info = self._inspect_exec(exec_id)
        except _EngineError as exc:
            return self._failed(begun, self._fate(str(exc)), stdout, stderr, started=True)
        duration = time.monotonic() - begun
        if timed_out or interrupted:
            return ExecResult(
                None, stdout, stderr, duration, timed_out=timed_out, interrupted=interrupted
            )
        pid, code = int(info.get("Pid") or 0), info.get("ExitCode")
        argv, workdir = call.argv, call.workdir
        if pid == 0 and not info.get("Running"):
            # The runtime never started the program: what it said is its own, not the program's.
            reason = _not_started_reason(
                stdout.data.decode(errors="replace"), argv, workdir, self.where
            )
            return ExecResult(None, EMPTY, EMPTY, duration, error=reason, started=False)
        if info.get("Running") or code is None:
            reason = self._fate("the exec's stream ended while the command was still running")
            return self._failed(begun, reason, stdout, stderr, started=True)
        exit_code = int(code)
        refused = self._kernel_refused(call, exit_code, stdout, stderr)
        if refused is not None:
            return refused.result(argv, workdir, self.where, stdout, stderr, duration)
        if exit_code >= 128:  # a signal: the container's own death kills every exec with 137
            dead = self._dead_after_signal()
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

    def _kernel_refused(
        self, call: _Call, exit_code: int, stdout: Captured, stderr: Captured
    ) -> _Refusal | None:
        """Whether the runtime says the kernel refused the program (exit 1, nothing on stdout,
        `exec PROGRAM: REASON` alone on stderr), and whether that can be believed."""
        prefix = f"exec {call.command[0]}: ".encode(errors="surrogateescape")
        said = stderr.data
        if exit_code != 1 or stdout.total or not said.startswith(prefix):
            return None
        if not said.endswith(b"\n") or said.count(b"\n") != 1 or stderr.cut:
            return None
        reason = said[len(prefix) : -1].decode(errors="replace")
        expected = call.refusal
        if expected is not None and expected.startswith("interpreter:"):
            interpreter = expected.removeprefix("interpreter:")
            expected = "no such file or directory" if self._missing(interpreter) else None
        # Believed only for a program whose bytes mm-batch read at start and knows the kernel
        # refuses: any program can print these words.
        return _Refusal(reason, verified=expected is not None and reason == expected)

    def _missing(self, interpreter: str) -> bool:
        """Whether a `#!` interpreter is missing in a way no call could have arranged: a path
        outside every writable mount that exists nowhere, with no link on its way (root's look,
        which no tool process can touch)."""
        if posixpath.normpath(interpreter) != interpreter or any(
            interpreter == top or interpreter.startswith(top + "/") for top in _WRITABLE
        ):
            return False  # `..`, `//`, a writable place: it may have been there at the exec
        try:
            done = self._run(["/bin/sh", "-c", _INTERPRETER_MISSING, "look", interpreter], ROOT)
        except _EngineError:
            return False
        folder = done.stdout.decode(errors="replace").strip()
        if done.pid == 0 or done.exit_code != 0 or not folder.startswith("/"):
            return False
        return not any(folder == top or folder.startswith(top + "/") for top in _WRITABLE)

    def _fate(self, reason: str) -> str:
        """The container's death, when that is why the engine could not answer about an exec."""
        dead = self._container_dead()
        return dead if dead is not None else reason

    def _container_dead(self) -> str | None:
        """Why the container cannot run calls any more, or None while it is running."""
        container = self.container
        if container is None:
            return "the sandbox was closed during the call"
        try:
            state = self._bounded(lambda: self.client.api.inspect_container(container.id))
        except _EngineError as exc:
            return str(exc)
        state = state.get("State", {}) if isinstance(state, dict) else {}
        if state.get("Running"):
            return None
        oom = ", out of memory" if state.get("OOMKilled") else ""
        return f"the container stopped during the call (exit code {state.get('ExitCode')}{oom})"

    def _dead_after_signal(self) -> str | None:
        """Whether the signal that ended a call was the container's own death.

        The engine may still call the container running for a moment after it was killed, but
        its pid namespace dies with its init at once: a fresh exec cannot start there then.
        """
        try:
            if self._run(["/bin/sh", "-c", ":"], ROOT).pid != 0:
                return None
        except _EngineError:
            pass
        for _ in range(20):  # the engine's account of it, once the engine has caught up
            dead = self._container_dead()
            if dead is not None:
                return dead
            time.sleep(0.1)
        return None  # running all along: the exec found no free pid, which a call can cause

    def _probe(self) -> str | None:
        """Whether the engine still answers (and the container runs), within PROBE_TIMEOUT_S."""
        return self._container_dead()

    def _bounded(self, request: Callable[[], Any]) -> Any:
        """An engine request that gives up after PROBE_TIMEOUT_S, whatever the socket does."""
        box: list[Any] = []
        failure: list[BaseException] = []

        def call() -> None:
            try:
                box.append(request())
            except Exception as exc:
                failure.append(exc)

        worker = threading.Thread(target=call, daemon=True, name="mm-batch-engine-probe")
        worker.start()
        worker.join(PROBE_TIMEOUT_S)
        if failure:
            if _is_not_found(failure[0]):
                raise _EngineError("the container disappeared during the call")
            raise _EngineError(f"the Docker engine failed: {_first_line(failure[0])}")
        if not box:
            raise _EngineError(
                f"the Docker engine stopped answering (no reply in {PROBE_TIMEOUT_S:g} s)"
            )
        return box[0]

    # -- engine requests ------------------------------------------------------------------

    def _create_exec(
        self,
        argv: Sequence[str],
        user: str,
        workdir: str,
        env: Mapping[str, str] | None,
        stdin: bool,
    ) -> str:
        container = self.container
        if container is None:
            raise _EngineError("the sandbox was closed")
        try:
            return str(
                self.client.api.exec_create(
                    container.id,
                    list(argv),  # a list: a string would be split by the SDK
                    stdout=True,
                    stderr=True,
                    stdin=stdin,
                    user=user,
                    workdir=workdir,
                    environment=dict(env) if env is not None else None,
                )["Id"]
            )
        except Exception as exc:
            raise _EngineError(self._request_failure(exc)) from exc

    def _open_stream(self, exec_id: str) -> socket.socket:
        """Start the exec; its attached stream, as a socket of our own with our own timeouts."""
        try:
            raw = self.client.api.exec_start(exec_id, socket=True)
            sock = socket.socket(fileno=os.dup(raw.fileno()))
        except Exception as exc:
            raise _EngineError(self._request_failure(exc)) from exc
        # The SDK's objects would only keep the connection: ours is a duplicate of it.
        with contextlib.suppress(Exception):
            response = getattr(raw, "_response", None)
            raw.close()
            if response is not None:
                response.close()
        sock.setblocking(False)
        return sock

    def _inspect_exec(self, exec_id: str) -> dict[str, Any]:
        try:
            info = self.client.api.exec_inspect(exec_id)
        except Exception as exc:
            raise _EngineError(self._request_failure(exc)) from exc
        return info if isinstance(info, dict) else {}

    def _request_failure(self, exc: BaseException) -> str:
        if _is_not_found(exc):
            return "the container disappeared"
        return f"the Docker engine failed: {_first_line(exc)}"

    def _run(
        self,
        argv: Sequence[str],
        user: str,
        send: Callable[[socket.socket], None] | None = None,
    ) -> _Done:
        """An exec of our own, bounded in time: its stdin from `send`, its output to the end."""
        exec_id = self._create_exec(argv, user, str(WORKSPACE), None, send is not None)
        sock = self._open_stream(exec_id)
        out, err = Sink(self.log_limit), Sink(self.log_limit)
        frames = _Frames(out, err)
        deadline = time.monotonic() + ENGINE_TIMEOUT_S
        try:
            if send is not None:
                sock.settimeout(ENGINE_TIMEOUT_S)
                send(sock)
                sock.shutdown(socket.SHUT_WR)  # tar reads to the end of its stdin
            sock.setblocking(False)
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise _EngineError(
                        f"the Docker engine stopped answering (an exec took {ENGINE_TIMEOUT_S:g} s)"
                    )
                readable, _, _ = select.select([sock], [], [], left)
                if not readable:
                    continue
                try:
                    chunk = sock.recv(_READ_CHUNK)
                except BlockingIOError:
                    continue
                if not chunk:
                    break
                frames.feed(chunk)
        finally:
            sock.close()
        info = self._inspect_exec(exec_id)
        code = info.get("ExitCode")
        return _Done(
            int(info.get("Pid") or 0),
            int(code) if code is not None else None,
            out.captured().data + err.captured().data,
        )

    # -- what calls leave behind -------------------------------------------------------------

    def _sweep_later(self) -> None:
        """Sweep what the call left running and make the next call's HOME, off the caller's
        path; the next call (or check) waits for both, and fails if they failed."""
        if self.container is None:
            return
        self._sweeper = _Background(self._sweep_and_reset)

    def _sweep_and_reset(self) -> None:
        self._sweep(self._uid)
        if not self.fresh_home_per_call:
            return
        pairs = [item for copy, original in self._programs.values() for item in (copy, original)]
        # The swept processes count against the pids limit until init reaps them: after a fork
        # bomb, the reset may find no pid for a moment. Tried again, with a new HOME's name,
        # while the sweep's own tries would be.
        give_up = time.monotonic() + _KILL_TRIES_S
        while True:
            home = _fresh_home()
            done = self._run(["/bin/sh", "-c", _RESET, "reset", home, *pairs], self.spec.user)
            lines = done.stdout.decode(errors="replace").splitlines()
            if done.pid != 0 and done.exit_code == 0 and lines and lines[-1] == "ready":
                break
            detail = "; ".join(lines[:3]) or f"exit {done.exit_code}"
            no_pid = done.pid == 0 or "can't fork" in detail or "temporarily unavailable" in detail
            if not no_pid or time.monotonic() >= give_up:
                raise _EngineError(f"cannot make a fresh HOME for the next call ({detail})")
            time.sleep(0.05)
        kept = [line.removeprefix("kept ") for line in lines if line.startswith("kept ")]
        if kept:
            hint = (
                f"; image {self.spec.image} has no ipcrm program, which removes them: add it "
                "(util-linux or busybox)"
                if "no ipcrm" in lines
                else ""
            )
            raise _EngineError(
                f"what a call left in {', '.join(kept[:3])} could not be removed{hint}"
            )
        self._same = {line.removeprefix("same ") for line in lines if line.startswith("same ")}
        self._home = home

    def _settle(self) -> None:
        """Wait for the previous call's sweep: no call may start while another's processes live."""
        sweeper, self._sweeper = self._sweeper, None
        if sweeper is not None:
            if not sweeper.wait(2 * (ENGINE_TIMEOUT_S + _KILL_TRIES_S)):
                self._sweep_failure = "the previous call's processes could not be stopped in time"
            elif sweeper.failure is not None:
                self._sweep_failure = sweeper.failure
        if self._sweep_failure is not None:
            raise SandboxError(
                f"what the previous call left could not be cleared away: {self._sweep_failure}"
            )

    def _sweep(self, uid: int) -> None:
        """SIGKILL every process of `uid` from a root exec holding CAP_KILL, until a pass finds
        none; raises _EngineError when some are left (the call then fails the task run).

        Under a fork bomb the sweep's exec may find no free pid (the runtime then starts
        nothing, Pid 0): it is tried again while the bomb's processes come and go.
        """
        give_up = time.monotonic() + _KILL_TRIES_S
        while True:
            done = self._run(["/bin/sh", "-c", _SWEEP, "sweep", str(uid)], ROOT)
            if done.pid != 0:
                break
            if time.monotonic() >= give_up:
                raise _EngineError("the calls' processes could not be killed (no free pid)")
            time.sleep(0.05)
        said = done.stdout.decode(errors="replace").strip()
        if done.exit_code != 0 or said != "clean":
            raise _EngineError(
                f"processes of uid {uid} are still alive after the sweep ({said[:200]})"
            )

    def _new_oom_kill(self) -> bool:
        """Whether the memory cgroup killed a process since the last look (cgroup v1 and v2)."""
        script = (
            "cat /sys/fs/cgroup/memory.events /sys/fs/cgroup/memory/memory.oom_control "
            "2>/dev/null | grep oom_kill"
        )
        try:
            done = self._run(["/bin/sh", "-c", script], ROOT)
            lines = done.stdout.decode().splitlines()
            count = max(int(line.split()[-1]) for line in lines)
        except Exception:
            return False
        new = count > self._oom_kills
        self._oom_kills = count
        return new
