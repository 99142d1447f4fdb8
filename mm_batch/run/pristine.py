"""Files read once at start, so that nothing a command does during the run changes what runs.

Every hook argv entry and every `check` program that names a file under its agent file's folder
is read when the run starts. Hooks run on the host from private copies; a `check` program is
handed to the executor, which places a copy where the sandboxed commands cannot change it.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from mm_batch.config.model import TaskSpec

MAX_PRISTINE_BYTES = 64 * 1024 * 1024  # a hook or check program larger than this is not copied


def _under(directory: Path, entry: str) -> Path | None:
    """The file an argv entry names, when it is a regular file inside the agent's folder."""
    if not entry or "\x00" in entry:
        return None
    try:
        path = (directory / entry).resolve()
        path.relative_to(directory.resolve())
    except (ValueError, OSError, RuntimeError):
        return None
    try:
        if not path.is_file() or path.stat().st_size > MAX_PRISTINE_BYTES:
            return None
    except OSError:
        return None
    return path


@dataclass
class Pristine:
    """The contents read at start, and the host copies of the hooks."""

    contents: dict[Path, bytes] = field(default_factory=dict)
    _folder: Path | None = None
    _copies: dict[Path, Path] = field(default_factory=dict)

    @classmethod
    def take(cls, tasks: Iterable[TaskSpec]) -> Pristine:
        """Read the hooks and `check` programs of these tasks' agents, now."""
        pristine = cls()
        for task in tasks:
            agent = task.agent
            for argv in (agent.hooks.pre_tool_call, agent.hooks.post_tool_call):
                for entry in argv or ():
                    pristine._copy_for_host(agent.directory, entry)
            if task.expect is not None and task.expect.check:
                pristine._read(agent.directory, task.expect.check[0])
        return pristine

    def _read(self, directory: Path, entry: str) -> Path | None:
        path = _under(directory, entry)
        if path is not None and path not in self.contents:
            try:
                self.contents[path] = path.read_bytes()
            except OSError:
                return None
        return path

    def _copy_for_host(self, directory: Path, entry: str) -> None:
        path = self._read(directory, entry)
        if path is None or path in self._copies:
            return
        if self._folder is None:
            self._folder = Path(tempfile.mkdtemp(prefix="mm-batch-hooks-"))
        copy = self._folder / f"{len(self._copies)}-{path.name}"
        copy.write_bytes(self.contents[path])
        copy.chmod(path.stat().st_mode & 0o555 | 0o400)
        self._copies[path] = copy

    def hook_argv(self, directory: Path, argv: tuple[str, ...]) -> tuple[str, ...]:
        """A hook's argv, each entry that names one of the agent's files swapped for its copy."""
        swapped = []
        for entry in argv:
            path = _under(directory, entry) if entry else None
            copy = self._copies.get(path) if path is not None else None
            swapped.append(str(copy) if copy is not None else entry)
        return tuple(swapped)

    def check_program(self, directory: Path, argv: tuple[str, ...]) -> Mapping[Path, bytes]:
        """The content read at start of the `check` program, when it is one of the agent's files."""
        path = _under(directory, argv[0]) if argv else None
        if path is None or path not in self.contents:
            return {}
        return {path: self.contents[path]}

    def close(self) -> None:
        if self._folder is not None:
            shutil.rmtree(self._folder, ignore_errors=True)
            self._folder = None
