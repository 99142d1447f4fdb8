"""The results folder: resolved once, written through a descriptor, never through a symlink.

A sandboxed command may replace the folder, or a file in it, with a symlink while the run goes
on; every write here goes to the folder opened at start, refuses to follow a link, and lands
atomically (a reader sees the old file or the new, never half).
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import tempfile
from collections.abc import Collection
from pathlib import Path
from typing import TextIO

from mm_batch.config.paths import FILE_MODE, write_atomically

CALLS = "calls.jsonl"
JUNIT = "junit.xml"
SUMMARY_MD = "summary.md"
SUMMARY_JSON = "summary.json"
REPORT_HTML = "report.html"
OUTPUT_FILES = (CALLS, JUNIT, SUMMARY_MD, SUMMARY_JSON, REPORT_HTML)
_NOFOLLOW = os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)


def _dangling(link: Path) -> bool:
    """Whether a link points to nothing (a loop of links is said where the path is resolved)."""
    try:
        link.resolve(strict=True)
    except FileNotFoundError:
        return True
    except (OSError, RuntimeError):
        return False
    return False


def unwritable(directory: Path, names: Collection[str] = OUTPUT_FILES) -> str | None:
    """Why results (the files `names`) cannot be written in `directory`, or None if they can;
    creates nothing. Everything `ResultsFolder` would trip on is found here, before anything
    runs: a file or a link to nowhere on the way, a folder where a report goes."""
    existing = directory
    while not existing.exists() and existing != existing.parent:
        if existing.is_symlink() and _dangling(existing):  # `mkdir` cannot make a folder there
            return f"--out {directory}: {existing} is a link to nothing: results cannot go there"
        existing = existing.parent  # the folder that `mkdir(parents=True)` would create in
    try:
        if not existing.is_dir():
            raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR))
        with tempfile.TemporaryFile(dir=existing):
            pass
    except OSError as exc:
        return f"--out {directory}: results cannot be written there ({exc.strerror or exc})"
    if existing == directory:
        for name in names:  # each is replaced by a rename, or removed: a folder cannot be
            with contextlib.suppress(OSError):
                if stat.S_ISDIR(os.lstat(directory / name).st_mode):
                    return (
                        f"--out {directory}: {name} there is a folder, where mm-batch writes "
                        "its report: move it away or choose another --out"
                    )
    return None


class ResultsFolder:
    """The results folder opened once: every later write goes to that folder, whatever its path
    has become meanwhile."""

    def __init__(self, directory: Path) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self.path = directory.resolve()
        self._fd = os.open(self.path, os.O_RDONLY | os.O_DIRECTORY | _NOFOLLOW)

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def clear(self, keep: Collection[str] = ()) -> None:
        """Replace previous results: remove the files mm-batch writes here (but those to
        `keep` until they are written anew), and nothing else."""
        for name in OUTPUT_FILES:
            if name in keep:
                continue
            with contextlib.suppress(FileNotFoundError):
                os.unlink(name, dir_fd=self._fd)

    def open_log(self, name: str) -> TextIO:
        """A file to append lines to (calls.jsonl); a link in its place is refused."""
        fd = os.open(
            name,
            os.O_WRONLY | os.O_CREAT | os.O_APPEND | _NOFOLLOW,
            FILE_MODE,
            dir_fd=self._fd,
        )
        return os.fdopen(fd, "w", encoding="utf-8", errors="backslashreplace")

    def holds(self, name: str, inode: int) -> bool:
        """Whether `name` here is still the regular file of that inode (no link in its place)."""
        try:
            info = os.stat(name, dir_fd=self._fd, follow_symlinks=False)
        except OSError:
            return False
        return stat.S_ISREG(info.st_mode) and info.st_ino == inode

    def write(self, name: str, text: str) -> None:
        """Write beside the target, then rename over it: atomic, and never through a link."""
        write_atomically(self._fd, name, text)
