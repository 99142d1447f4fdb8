"""The sandbox's files: where the agent's folder appears (`copy`, `mount`, `readonly`), the tar
stream that fills a copied workspace, and the pristine copies placed in the container (a
check's, and the tools' programs as read at start).

`put_archive` cannot write into a tmpfs, so a `copy` workspace is a tar stream into `tar -xf -`
run as the tools' uid.
"""

from __future__ import annotations

import io
import os
import re
import secrets
import socket
import stat
import tarfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING

from mm_batch.config.model import SandboxSpec
from mm_batch.effects.docker.engine import ROOT, Engine
from mm_batch.effects.docker.stream import EngineError
from mm_batch.run.ports import PinnedProgram, SandboxError

if TYPE_CHECKING:
    from _typeshed import ReadableBuffer

WORKSPACE = PurePosixPath("/workspace")
# The sandbox's own tmpfs space, counted in the memory limit: /tmp (each call's HOME and TMPDIR),
# the checks' space and the program copies, 256 MiB in all.
TMP_BYTES = 192 * 1024 * 1024
CHECK_DIR = "/.mm-batch-check"  # the checks' copies, HOME and TMPDIR: owned by the check uid
CHECK_BYTES = 32 * 1024 * 1024
PROGRAMS_DIR = "/.mm-batch-programs"  # copies of the tools' programs: root's, read-only to tools
PROGRAMS_BYTES = 32 * 1024 * 1024
# Where tools can write in any container (its tmpfs mounts): an interpreter path there may
# have been made and removed by a call, so its absence proves nothing.
WRITABLE = ("/tmp", "/dev", str(WORKSPACE), "/proc", "/sys", CHECK_DIR, PROGRAMS_DIR)
_PAGE = 4096
_SIZE_UNITS = {"": 1, "b": 1, "k": 1024, "m": 1024**2, "g": 1024**3, "t": 1024**4}
# Whether no part of a path below the workspace is a link ($1): only then is an original
# compared with its copy, as whatever looks at it and whatever runs it reach the same file
# (a link to /proc/self/cwd/... leads each to its own working directory).
PLAIN = r"""
plain() {
  p=$1
  while [ -n "$p" ] && [ "$p" != / ] && [ "$p" != @WORKSPACE@ ]; do
    [ -L "$p" ] && return 1
    p=${p%/*}
  done
  return 0
}
""".replace("@WORKSPACE@", str(WORKSPACE))
# As root: place one program copy ($1 folder, $2 name, content on stdin), then say whether the
# original ($3) still holds the same bytes.
_PLACE = (
    PLAIN
    + r"""
set -e; umask 022
mkdir "$1"; cat >"$1/$2"; chmod 0755 "$1/$2"
if [ -f "$3" ] && plain "$3" && cmp -s "$1/$2" "$3" 2>/dev/null; then echo same
else echo changed; fi
"""
)
# As the check uid: place one check copy ($1 folder, made for the first, $3 = 0; $2 name,
# content on stdin), then say whether the original ($4) still holds the same bytes.
_PROTECT = PLAIN + (
    'set -e; umask 022; [ "$3" = 0 ] && mkdir "$1"; cat >"$1/$2"; chmod 0755 "$1/$2"; '
    'if [ -f "$4" ] && plain "$4" && cmp -s "$1/$2" "$4" 2>/dev/null; then echo same; fi'
)


@dataclass(frozen=True)
class Users:
    """Who runs what in the container: the tools (the spec's `user`, uid and gid) and a `check`,
    never as the tools' uid (so no tool can signal, trace or fill it)."""

    tools: str
    uid: int
    gid: int
    check: str
    check_uid: int

    @classmethod
    def of(cls, user: str) -> Users:
        uid, _, gid = user.partition(":")
        check = "65531:65531" if user.split(":", maxsplit=1)[0] == "65532" else "65532:65532"
        return cls(user, int(uid), int(gid or uid), check, int(check.split(":", maxsplit=1)[0]))

    @property
    def check_gid(self) -> int:
        return int(self.check.split(":")[1])


def size_bytes(text: str) -> int:
    """Bytes of a Docker size (`512m`, `1g`, `1.5g`, `1048576`)."""
    match = re.fullmatch(r"(\d+(?:\.\d+)?)([bkmgt]?)b?", text.strip().lower())
    if match is None:
        raise SandboxError(f"cannot read the size {text!r} (expected e.g. 512m or 1g)")
    return int(float(match[1]) * _SIZE_UNITS[match[2]])


def container_path(agent_dir: Path, workdir: Path) -> PurePosixPath:
    """A host folder's path in the container; ValueError when it lies outside the agent's
    folder, which is all the container sees."""
    try:
        relative = workdir.resolve().relative_to(agent_dir)
    except ValueError:
        raise ValueError(
            f"working directory {workdir} is outside the agent's directory {agent_dir}, "
            "which is all the container sees"
        ) from None
    return WORKSPACE / relative.as_posix() if relative.parts else WORKSPACE


@dataclass(frozen=True)
class Mounts:
    """The workspace's mount: a tmpfs the folder is copied into (`copy`: its size counts in the
    memory limit, so a full workspace is ENOSPC, not an OOM kill), or the folder itself, bound
    read-write (`mount`) or read-only (`readonly`)."""

    tmpfs: dict[str, str]
    volumes: dict[str, dict[str, str]]
    memory: int  # bytes the workspace adds to the memory limit

    @classmethod
    def of(cls, spec: SandboxSpec, agent_dir: Path, uid: int, gid: int) -> Mounts:
        if spec.workspace == "copy":
            room = size_bytes(spec.workspace_size)
            # `exec`: Docker's tmpfs default is noexec, and ./release.sh runs from the workspace.
            options = f"rw,exec,nosuid,nodev,size={room},uid={uid},gid={gid},mode=0755"
            return cls({str(WORKSPACE): options}, {}, room)
        mode = "rw" if spec.workspace == "mount" else "ro"
        return cls({}, {str(agent_dir): {"bind": str(WORKSPACE), "mode": mode}}, 0)


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
            raise SandboxError(does_not_fit(top, needed, room))
        return cls(top, tuple(entries), needed)

    def send(self, sock: socket.socket, uid: int, gid: int) -> None:
        """Write the tar stream to the socket; set-id bits are dropped."""
        with tarfile.open(fileobj=_SocketWriter(sock), mode="w|", format=tarfile.GNU_FORMAT) as tar:
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


def does_not_fit(top: Path, needed: int, room: int) -> str:
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

    def write(self, data: ReadableBuffer) -> int:
        self._sock.sendall(data)
        return memoryview(data).nbytes


class Copies:
    """Pristine copies of files read at start, placed in the container: a check's (by the check
    uid, in CHECK_DIR) and the tools' programs (by root, in PROGRAMS_DIR, at first use)."""

    def __init__(self, engine: Engine, agent_dir: Path, check_user: str) -> None:
        self._engine = engine
        self._agent_dir = agent_dir
        self._check_user = check_user  # Users.check
        # Program copies placed in the container: (file at start, content, the way to it in
        # the container) -> (copy, that way); and which copies the originals still equalled at
        # the last look.
        self._programs: dict[tuple[Path, bytes, str], tuple[str, str]] = {}
        self.same: set[str] = set()
        self.checked_in_place: set[str] = set()  # check programs `protect` let run in place

    def program_pairs(self) -> list[str]:
        """Each program copy and its original in the container, one after the other."""
        return [item for copy, original in self._programs.values() for item in (copy, original)]

    def protect(self, files: Mapping[Path, bytes]) -> dict[Path, str]:
        """Copies for a `check`, in its own space (CHECK_DIR: a tmpfs of the check uid, mode
        0700), which no tool can read, change or fill. Written by execs as the check uid; the
        folder's random name is made with a plain `mkdir`. Where the original still holds the
        bytes read at start, the check runs it in place (its own folder's modules and files at
        hand): the caller has just had the sweep confirm that no tool process is left to change
        it."""
        folder = f"{CHECK_DIR}/copies-{secrets.token_hex(16)}"
        paths: dict[Path, str] = {}
        for i, (original, content) in enumerate(files.items()):
            name = f"{i}-{original.name}"
            try:
                in_place = str(container_path(self._agent_dir, original.parent) / original.name)
            except ValueError:
                in_place = ""

            said = self._place(
                ["/bin/sh", "-c", _PROTECT, "protect", folder, name, str(i), in_place],
                self._check_user,
                content,
                original.name,
            )
            same = in_place and said == b"same"
            paths[original] = in_place if same else f"{folder}/{name}"
            if same:
                self.checked_in_place.add(in_place)
        return paths

    def pinned(
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

    def _program_copy(self, program: PinnedProgram, original: str) -> tuple[str, bool]:
        """The container copy of a program as read at start, placed at its first use (by root,
        in PROGRAMS_DIR), and whether the original still holds the same bytes now."""
        key = (program.path, program.content, original)  # each way to it compared on its own
        placed = self._programs.get(key)
        if placed is not None:
            return placed[0], placed[0] in self.same
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
            self.same.add(copy)
        return copy, same

    def _place(self, argv: list[str], user: str, content: bytes, what: str) -> bytes:
        """Run a script that places a copy of `what` (`content` on its stdin) as `user`; what it
        said, stripped. A failure is the sandbox's."""

        def send(sock: socket.socket) -> None:
            sock.sendall(content)

        try:
            done = self._engine.run(argv, user, send)
        except (EngineError, OSError) as exc:
            raise SandboxError(f"cannot place a copy of {what}: {exc}") from exc
        if done.pid == 0 or done.exit_code != 0:
            raise SandboxError(
                f"cannot place a copy of {what} in the sandbox "
                f"(exit {done.exit_code}): {done.stdout.decode(errors='replace')[:200]}"
            )
        return bytes(done.stdout.strip())
