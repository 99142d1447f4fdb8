"""Files read once at start, so that nothing a command does during the run changes what runs.

Every hook argv entry and every `check` program that names a file under its agent file's folder
is read when the run starts. Hooks run on the host from sealed copies; a check's files are
handed to the executor, which places copies where the sandboxed commands cannot change them.
So is every declared tool's program (argv[0], the command a wrapper runs, and the script an
interpreter is given: `python3 deploy.py`, `env sh release.sh`): the executor runs what was read
at start. A program that names a path of the folder where no file was read at start (nothing,
or a link out of the folder) runs only while that is still so where it runs: a program a
command wrote since is never run.

What an entry names is decided once, at start, keyed by the entry as written: nothing is looked
up again later, so a file swapped for a symlink (or created) during the run is never what runs.
"""

from __future__ import annotations

import os
import posixpath
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from mm_batch.config.model import TaskSpec
from mm_batch.config.paths import (
    NOT_A_LINK,
    drop_sealed,
    link_state,
    read_regular,
    sealed_copy,
)
from mm_batch.run.argv_programs import (
    HiddenProgramError,
    known_programs,
    names_a_path,
    program_entries,
)
from mm_batch.run.ports import PinnedProgram, UnreadProgram

MAX_PRISTINE_BYTES = 64 * 1024 * 1024  # a hook or check file larger than this is refused


# What makes a file named in a tool's command code, wherever it stands in the argv (behind a
# wrapper such as `env`, `timeout`, `nice`, or an interpreter's option with a value): its
# extension, a `#!` line or an ELF header. Data files (`input.csv`, `config.json`) stay
# workspace data.
_CODE_SUFFIXES = (
    ".sh",
    ".bash",
    ".zsh",
    ".ksh",
    ".py",
    ".pl",
    ".pm",
    ".rb",
    ".js",
    ".mjs",
    ".cjs",
    ".ts",
    ".php",
    ".lua",
    ".r",
    ".tcl",
    ".awk",
    ".sed",
    ".jar",
)


def _is_code(path: Path, content: bytes) -> bool:
    return path.suffix.lower() in _CODE_SUFFIXES or content.startswith((b"#!", b"\x7fELF"))


def _under(directory: Path, entry: str, top: Path | None = None) -> Path | None:
    """The file an argv entry names now, when it is a regular file inside the agent's folder."""
    if not entry or "\x00" in entry:
        return None
    try:
        path = (directory / entry).resolve()
        path.relative_to((top or directory).resolve())
        if not path.is_file() or path.stat().st_size > MAX_PRISTINE_BYTES:
            return None
    except (ValueError, OSError, RuntimeError):
        return None
    return path


def _inside(directory: Path, entry: str) -> bool:
    """Whether a path entry points into the agent's folder, read as written (no link followed)."""
    written = Path(os.path.normpath(directory / entry))
    return written == directory or directory in written.parents


MAX_HOPS = 40  # links followed from one entry, as the kernel follows them


def _hops(directory: Path, entry: str, top: Path) -> tuple[UnreadProgram, ...]:
    """Each link on the way from `entry` (relative to `directory`) while it stays inside the
    agent's folder (`top`), with what it was at start, and what the last one led to there:
    nothing (a link to a file not made yet) or something. A link out of the folder ends it."""
    hops = []
    where = entry
    for _ in range(MAX_HOPS):
        state = link_state(directory / where)
        hops.append(UnreadProgram(where, state))
        if state is None or state == NOT_A_LINK:
            break
        target = posixpath.normpath(posixpath.join(posixpath.dirname(where), state))
        if not _inside(top, str(directory / target)):
            break
        where = os.path.relpath(directory / target, directory) if target.startswith("/") else target
    return tuple(hops)


def changed_here(directory: Path, unread: Sequence[UnreadProgram]) -> UnreadProgram | None:
    """The first of `unread` that is no longer what it was at start in this process's own
    view of `directory` (where hooks, and the host's commands, run)."""
    return next((p for p in unread if link_state(directory / p.entry) != p.link), None)


class MissingAtStartError(Exception):
    """A program (a tool's, a hook's, a check's) of the agent's folder cannot run as what was
    there at start: nothing was, something else is there now, or it cannot be told."""


@dataclass
class Pristine:
    """What each hook and check entry named at start, its content, and the hooks' host copies."""

    # (agent folder, entry as written) -> the file it named at start
    named: dict[tuple[Path, str], Path] = field(default_factory=dict)
    contents: dict[Path, bytes] = field(default_factory=dict)
    # (tool's workdir, entry as written) of a tool's command that named a file of code at start
    code: set[tuple[Path, str]] = field(default_factory=set)
    # (folder, entry as written) that named something at start: its link_state then (a link's
    # target; NOT_A_LINK for a file, read or too big to read, a folder, a FIFO)
    present: dict[tuple[Path, str], str] = field(default_factory=dict)
    # (folder, entry as written) that was a link not read at start: each link on its way while
    # it stays in the agent's folder, and what was there then (`_hops`)
    hops: dict[tuple[Path, str], tuple[UnreadProgram, ...]] = field(default_factory=dict)
    _copies: dict[Path, str] = field(default_factory=dict)  # the hooks' sealed copies

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
            check = task.expect.check or () if task.expect is not None else ()
            for i in known_programs(check):  # the rest of a check's argv is workspace data
                pristine._read(agent.directory, check[i])
            for tool in agent.tools:
                programs = set(known_programs(tool.command))
                for i, entry in enumerate(tool.command):
                    if "{{" in entry:  # a value the model sends is not a program
                        continue
                    path = pristine._read(tool.workdir, entry, agent.directory)
                    if path is not None and (
                        i in programs or _is_code(path, pristine.contents[path])
                    ):
                        pristine.code.add((tool.workdir, entry))
        return pristine

    def _read(self, directory: Path, entry: str, top: Path | None = None) -> Path | None:
        """Read what `entry`, relative to `directory`, names now, when it is inside `top`
        (the agent's folder; `directory` itself by default)."""
        key = (directory, entry)
        if key in self.named:
            return self.named[key]
        state = link_state(directory / entry) if entry and "\x00" not in entry else None
        if state is not None:
            self.present[key] = state
        if state not in (None, NOT_A_LINK):
            self.hops[key] = _hops(directory, entry, top or directory)
        path = _under(directory, entry, top)
        if path is None:
            return None
        try:
            if path not in self.contents:
                # Read as every given file is: a FIFO swapped in after `_under` looked is
                # refused, never waited on (SPEC 1).
                content = read_regular(path, MAX_PRISTINE_BYTES + 1)
                if len(content) > MAX_PRISTINE_BYTES:
                    return None
                self.contents[path] = content
        except OSError:
            return None
        self.named[key] = path
        return path

    def _copy_for_host(self, path: Path) -> None:
        """A hook's copy, sealed: no command, not even one running as the same user on the
        host, can change it."""
        if path not in self._copies:
            self._copies[path] = sealed_copy(self.contents[path], path.name)

    def _unread(
        self, directory: Path, argv: Sequence[str], top: Path | None = None
    ) -> tuple[UnreadProgram, ...]:
        """The programs of `argv` run in `directory` (argv[0] when a path, the command a wrapper
        runs, the script an interpreter runs, a bare name included: `sh verify.sh` opens
        ./verify.sh) that name a path in the agent's folder (`top`; `directory` itself by
        default) where no file was read at start, each with what was there then: the executor
        checks, where it runs them, that this is still so. Raises MissingAtStartError for one
        that can never run: argv[0] as a path to nothing, or something there that could not be
        read (a folder, a file over MAX_PRISTINE_BYTES)."""
        unread: list[UnreadProgram] = []
        try:
            entries = program_entries(argv)
        except HiddenProgramError as exc:
            raise MissingAtStartError(str(exc)) from exc
        for i in entries:
            entry = argv[i]
            key = (directory, entry)
            if key in self.named or not _inside(top or directory, str(directory / entry)):
                continue
            state = self.present.get(key)
            if state == NOT_A_LINK:
                raise MissingAtStartError(
                    f"{entry} was no file mm-batch could read when the run started (a folder, "
                    f"or a file over {MAX_PRISTINE_BYTES >> 20} MiB)"
                )
            if state is None and i == 0 and names_a_path(entry):
                raise MissingAtStartError(UnreadProgram(entry, None).refusal())
            hops = self.hops.get(key, (UnreadProgram(entry, state),))
            if any(hop.link == NOT_A_LINK for hop in hops):
                raise MissingAtStartError(
                    f"{entry} led to no file mm-batch could read when the run started"
                )
            unread += hops
        return tuple(unread)

    def hook_argv(self, directory: Path, argv: tuple[str, ...]) -> tuple[str, ...]:
        """A hook's argv, each entry that named one of the agent's files at start swapped for
        its copy. Raises MissingAtStartError for a program of the folder that is not what was
        there at start (hooks run on the host: it is looked at here)."""
        moved = changed_here(directory, self._unread(directory, argv))
        if moved is not None:
            raise MissingAtStartError(moved.refusal())
        swapped = []
        for entry in argv:
            path = self.named.get((directory, entry))
            swapped.append(entry if path is None else self._copies[path])
        return tuple(swapped)

    def check_files(
        self, directory: Path, argv: tuple[str, ...]
    ) -> tuple[dict[int, tuple[Path, bytes]], tuple[UnreadProgram, ...]]:
        """For each program of a `check` argv that named one of the agent's files at start:
        its index, the file and the content read then (the rest of the argv is workspace
        data, read as it is when the check runs); and the programs no file was read for, for
        the executor to look at. Raises MissingAtStartError as `_unread`."""
        unread = self._unread(directory, argv)
        files: dict[int, tuple[Path, bytes]] = {}
        for i in known_programs(argv):
            path = self.named.get((directory, argv[i]))
            if path is not None:
                files[i] = (path, self.contents[path])
        return files, unread

    def programs(
        self, workdir: Path, argv: Sequence[str], agent_dir: Path
    ) -> tuple[tuple[PinnedProgram, ...], tuple[UnreadProgram, ...]]:
        """The programs of a tool call's argv that named one of the agent's files at start:
        argv[0], the command a wrapper runs, the script an interpreter is given, and any other
        entry of the tool's command that named a file of code: each with the content read
        then, which is what the executor runs; and the programs no file was read for, for the
        executor to look at (`_unread`; `agent_dir` is the agent's folder)."""
        unread = self._unread(workdir, argv, agent_dir)
        pinned = []
        programs = set(known_programs(argv))
        for i, entry in enumerate(argv):
            path = self.named.get((workdir, entry))
            if path is not None and (i in programs or (workdir, entry) in self.code):
                pinned.append(PinnedProgram(i, entry, path, self.contents[path]))
        return tuple(pinned), unread

    def close(self) -> None:
        for copy in self._copies.values():
            drop_sealed(copy)
        self._copies.clear()


def replaced(argv: tuple[str, ...], copies: Mapping[int, str]) -> tuple[str, ...]:
    """argv with the entries at these indexes replaced."""
    return tuple(copies.get(i, entry) for i, entry in enumerate(argv))
