"""Files read once at start, so that nothing a command does during the run changes what runs.

Every hook argv entry and every `check` argv entry that names a file under its agent file's
folder is read when the run starts. Hooks run on the host from private copies; a check's files
are handed to the executor, which places copies where the sandboxed commands cannot change them.

What an entry names is decided once, at start, keyed by the entry as written: nothing is looked
up again later, so a file swapped for a symlink (or created) during the run is never what runs.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from mm_batch.config.model import TaskSpec

MAX_PRISTINE_BYTES = 64 * 1024 * 1024  # a hook or check file larger than this is refused


def _names_a_path(entry: str) -> bool:
    """Whether a program entry is a path (`./x`, `hooks/x`), not a name looked up on the PATH."""
    return "/" in entry


def _under(directory: Path, entry: str) -> Path | None:
    """The file an argv entry names now, when it is a regular file inside the agent's folder."""
    if not entry or "\x00" in entry:
        return None
    try:
        path = (directory / entry).resolve()
        path.relative_to(directory.resolve())
        if not path.is_file() or path.stat().st_size > MAX_PRISTINE_BYTES:
            return None
    except (ValueError, OSError, RuntimeError):
        return None
    return path


def _inside(directory: Path, entry: str) -> bool:
    """Whether a path entry points into the agent's folder, read as written (no link followed)."""
    written = Path(os.path.normpath(directory / entry))
    return written == directory or directory in written.parents


class MissingAtStartError(Exception):
    """A hook or check names a file of the agent's folder that was not there at start."""


@dataclass
class Pristine:
    """What each hook and check entry named at start, its content, and the hooks' host copies."""

    # (agent folder, entry as written) -> the file it named at start
    named: dict[tuple[Path, str], Path] = field(default_factory=dict)
    contents: dict[Path, bytes] = field(default_factory=dict)
    _folder: Path | None = None
    _copies: dict[Path, Path] = field(default_factory=dict)

    @classmethod
    def take(cls, tasks: Iterable[TaskSpec]) -> Pristine:
        """Read the hooks and `check` files of these tasks' agents, now."""
        pristine = cls()
        for task in tasks:
            agent = task.agent
            for argv in (agent.hooks.pre_tool_call, agent.hooks.post_tool_call):
                for entry in argv or ():
                    path = pristine._read(agent.directory, entry)
                    if path is not None:
                        pristine._copy_for_host(path)
            for entry in task.expect.check or () if task.expect is not None else ():
                pristine._read(agent.directory, entry)
        return pristine

    def _read(self, directory: Path, entry: str) -> Path | None:
        key = (directory, entry)
        if key in self.named:
            return self.named[key]
        path = _under(directory, entry)
        if path is None:
            return None
        try:
            self.contents.setdefault(path, path.read_bytes())
        except OSError:
            return None
        self.named[key] = path
        return path

    def _copy_for_host(self, path: Path) -> None:
        if path in self._copies:
            return
        if self._folder is None:
            self._folder = Path(tempfile.mkdtemp(prefix="mm-batch-hooks-"))
        copy = self._folder / f"{len(self._copies)}-{path.name}"
        copy.write_bytes(self.contents[path])
        copy.chmod(0o500)
        self._copies[path] = copy

    def _check_not_planted(self, directory: Path, entry: str) -> None:
        """A path into the agent's folder that named no file at start must not run now."""
        planted = (directory, entry) not in self.named and _names_a_path(entry)
        if planted and _inside(directory, entry):
            raise MissingAtStartError(
                f"{entry} was not a file of the agent's folder when the run started"
            )

    def hook_argv(self, directory: Path, argv: tuple[str, ...]) -> tuple[str, ...]:
        """A hook's argv, each entry that named one of the agent's files at start swapped for
        its copy. Raises MissingAtStartError for a path into the folder that named none."""
        swapped = []
        for i, entry in enumerate(argv):
            path = self.named.get((directory, entry))
            if path is not None:
                swapped.append(str(self._copies[path]))
                continue
            if i == 0:
                self._check_not_planted(directory, entry)
            swapped.append(entry)
        return tuple(swapped)

    def check_files(self, directory: Path, argv: tuple[str, ...]) -> dict[int, tuple[Path, bytes]]:
        """For each entry of a `check` argv that named one of the agent's files at start: its
        index, the file and the content read then. Raises MissingAtStartError as hook_argv."""
        if argv:
            self._check_not_planted(directory, argv[0])
        files: dict[int, tuple[Path, bytes]] = {}
        for i, entry in enumerate(argv):
            path = self.named.get((directory, entry))
            if path is not None:
                files[i] = (path, self.contents[path])
        return files

    def close(self) -> None:
        if self._folder is not None:
            shutil.rmtree(self._folder, ignore_errors=True)
            self._folder = None


def replaced(argv: tuple[str, ...], copies: Mapping[int, str]) -> tuple[str, ...]:
    """argv with the entries at these indexes replaced."""
    return tuple(copies.get(i, entry) for i, entry in enumerate(argv))
