"""File paths as messages show them, and the digest reports carry of each config file."""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import secrets
import stat
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Literal


def display_path(path: Path) -> str:
    """The path as a user reads it in a message: relative to the working directory when inside;
    a link by its own name (a link to nothing or to a FIFO is what the message is about)."""
    try:
        shown = path.parent.resolve() / path.name if path.is_symlink() else path.resolve()
        return str(shown.relative_to(Path.cwd().resolve()))
    except (ValueError, OSError, RuntimeError):  # outside, or no real path (a link loop)
        return str(path)


def report_path(path: Path, environ: Mapping[str, str] | None = None) -> str:
    """The path a CI links to a file by: relative to $GITHUB_WORKSPACE when set, else as shown."""
    workspace = (os.environ if environ is None else environ).get("GITHUB_WORKSPACE")
    if workspace:
        try:
            return path.resolve().relative_to(Path(workspace).resolve()).as_posix()
        except (ValueError, OSError, RuntimeError):
            pass
    return Path(display_path(path)).as_posix()


class NotRegularFileError(OSError):
    """A path mm-batch reads as a file names something else (SPEC 1): a FIFO, a device, a
    folder or a socket. Refused before a byte is read, so that reading it can never block."""

    def __init__(self, what: str) -> None:
        super().__init__(f"{what}, not a regular file: mm-batch reads only regular files")
        self.what = what

    def __str__(self) -> str:
        return str(self.args[0])


_KINDS = (
    (stat.S_ISDIR, "a folder"),
    (stat.S_ISFIFO, "a FIFO (named pipe)"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)
# Opening never waits (a FIFO without a writer), never makes a terminal ours, never leaks.
_OPEN_FLAGS = os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC


def _refuse_unless_regular(mode: int) -> None:
    if not stat.S_ISREG(mode):
        raise NotRegularFileError(next((w for test, w in _KINDS if test(mode)), "no file"))


def open_regular(path: Path, *, follow: bool = True) -> int:
    """A descriptor on the regular file `path` names, or NotRegularFileError; with `follow`
    False, a link in its place is an OSError (ELOOP) too.

    The name is looked at first, so that a device is never opened at all (opening some has
    effects); then what was opened is looked at again, since the name may have been swapped
    for a FIFO in between. Reads on the descriptor never block."""
    _refuse_unless_regular(os.stat(path, follow_symlinks=follow).st_mode)
    fd = os.open(path, _OPEN_FLAGS if follow else _OPEN_FLAGS | os.O_NOFOLLOW)
    try:
        _refuse_unless_regular(os.fstat(fd).st_mode)
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_regular(path: Path, limit: int, *, follow: bool = True) -> bytes:
    """At most `limit` bytes of the regular file `path` names, a chunk at a time: the one way
    mm-batch reads a file it was given (tasks, agent, SKILL.md, hook and check files, results
    folders). Raises OSError, and NotRegularFileError for a FIFO, a device, a folder or a
    socket; with `follow` False, a link is refused as in `open_regular`."""
    fd = open_regular(path, follow=follow)
    try:
        chunks: list[bytes] = []
        left = limit
        while left > 0:
            chunk = os.read(fd, min(left, 1024 * 1024))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


FILE_MODE = 0o666  # less the umask, like any file the user writes
_CREATE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


def write_atomically(dir_fd: int, name: str, text: str) -> None:
    """Write `name` in the folder open as `dir_fd`: beside it first, then renamed over it, so a
    reader sees the old file or the new one whole, and never through a link. A character UTF-8
    cannot hold (a lone surrogate) is written as its backslash escape."""
    temporary = f".{name}.{secrets.token_hex(6)}.tmp"
    fd = os.open(temporary, _CREATE_FLAGS, FILE_MODE, dir_fd=dir_fd)
    try:
        with os.fdopen(fd, "w", encoding="utf-8", errors="backslashreplace") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary, dir_fd=dir_fd)
        raise


def sha256(path: Path) -> str:
    """The digest of a regular file (reports carry it); "" where there is none to take."""
    try:
        fd = open_regular(path)
    except OSError:
        return ""
    digest = hashlib.sha256()
    try:
        while chunk := os.read(fd, 1024 * 1024):
            digest.update(chunk)
    except OSError:
        return ""
    finally:
        os.close(fd)
    return digest.hexdigest()


PathKind = Literal["file", "folder", "missing", "other"]


def path_kind(path: Path) -> PathKind | OSError:
    """What a path names, or why it cannot be looked at (a name too long, a loop of links)."""
    try:
        mode = path.stat().st_mode
    except (FileNotFoundError, NotADirectoryError):
        return "missing"
    except OSError as exc:
        return exc
    if stat.S_ISREG(mode):
        return "file"
    return "folder" if stat.S_ISDIR(mode) else "other"


def unusable(exc: OSError) -> str:
    """An OSError about a path, as a message that does not repeat the (maybe huge) path."""
    return f"cannot use this path: {exc.strerror or exc}"


def program_problem(directory: Path, program: str) -> str | None:
    """What is wrong with a hook's or a check's program (argv[0]) when it names a file of the
    agent's folder (`directory`), which mm-batch reads at start: something there that is not a
    regular file, or a link to nothing. A name looked up on the PATH, a path outside the folder
    (a container's own program) or a file not there at all is not judged here."""
    if "/" not in program or "\x00" in program:
        return None
    written = Path(os.path.normpath(directory / program))
    if directory not in written.parents:
        return None
    shown = program if len(program) <= 120 else program[:117] + "..."
    try:
        mode = written.stat().st_mode
    except FileNotFoundError:
        return f"the program {shown} is a link to nothing" if written.is_symlink() else None
    except (OSError, ValueError):
        return None
    try:
        _refuse_unless_regular(mode)
    except NotRegularFileError as exc:
        return f"the program {shown} is {exc}"
    return None


# What `link_state` says of something that is there and is no link: no link's target holds NUL.
NOT_A_LINK = "\x00"


def link_state(path: Path) -> str | None:
    """What a path names, as mm-batch compares it over a run without reading a file: a link's
    target, `NOT_A_LINK` for anything else that is there, None for nothing."""
    try:
        return os.readlink(path)
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        return NOT_A_LINK if os.path.lexists(path) else None


# Sealed copies: what no process can change, not even one of the user who made them.
_SEALS = fcntl.F_SEAL_SEAL | fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_WRITE
_SEALED_PREFIX = "/dev/fd/"
_sealed: set[int] = set()


def sealed_copy(content: bytes, name: str) -> str:
    """A copy of `content` that nothing can write, grow or shrink once made (a sealed memfd),
    as the path a command started by this process opens it by (`/dev/fd/N`: `sealed_fds`
    says which descriptors to pass it). A copy in a private folder is still a file that any
    process of its owner can rewrite, and on the host commands run as that owner."""
    fd = os.memfd_create(name, os.MFD_ALLOW_SEALING | os.MFD_CLOEXEC)
    try:
        view = memoryview(content)
        while view:
            view = view[os.write(fd, view) :]
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, _SEALS)
    except OSError:
        os.close(fd)
        raise
    _sealed.add(fd)
    return f"{_SEALED_PREFIX}{fd}"


def sealed_fds(argv: Iterable[str]) -> tuple[int, ...]:
    """The descriptors of the sealed copies `argv` names, for its process to be given."""
    named = (entry.removeprefix(_SEALED_PREFIX) for entry in argv)
    return tuple(
        sorted({int(n) for n in named if n.isascii() and n.isdigit() and int(n) in _sealed})
    )


def drop_sealed(path: str) -> None:
    """Close a sealed copy made by `sealed_copy`."""
    fd = int(path.removeprefix(_SEALED_PREFIX))  # made by `sealed_copy`: ASCII digits
    if fd in _sealed:
        _sealed.discard(fd)
        os.close(fd)
