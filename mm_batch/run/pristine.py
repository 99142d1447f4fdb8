"""Files read once at start, so that nothing a command does during the run changes what runs.

Every hook argv entry and every `check` argv entry that names a file under its agent file's
folder is read when the run starts. Hooks run on the host from private copies; a check's files
are handed to the executor, which places copies where the sandboxed commands cannot change them.
So is every declared tool's program (argv[0], and the script an interpreter is given:
`python3 deploy.py`, `sh release.sh`): the executor runs what was read at start.

What an entry names is decided once, at start, keyed by the entry as written: nothing is looked
up again later, so a file swapped for a symlink (or created) during the run is never what runs.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from mm_batch.config.model import TaskSpec
from mm_batch.config.paths import read_regular
from mm_batch.run.ports import PinnedProgram

MAX_PRISTINE_BYTES = 64 * 1024 * 1024  # a hook or check file larger than this is refused


@dataclass(frozen=True)
class _Syntax:
    """How a program that runs another reads its command line.

    `takes_value`: its options that take a value (`-W ignore`, or attached: `-Wignore`).
    `code`: options after which no operand is a program it runs: the code comes from the
    command line or a module (`sh -c`, `python3 -m`, `env -S`), or the operand is read
    elsewhere (`env -C DIR` moves where a relative path points; `taskset -p PID`).
    An interpreter (`script`) runs its first operand as a script, a bare name included;
    a wrapper runs its first operand as a command (looked up on the PATH unless a path),
    after `skipped` operands of its own (`timeout`'s DURATION) and, for `env`, NAME=VALUE.
    """

    takes_value: frozenset[str] = frozenset()
    code: frozenset[str] = frozenset()
    script: bool = False
    skipped: int = 0
    assignments: bool = False


def _interp(takes_value: set[str], code: set[str]) -> _Syntax:
    return _Syntax(frozenset(takes_value), frozenset(code | {"-"}), script=True)


def _wrapper(
    takes_value: set[str] | None = None, code: set[str] | None = None, skipped: int = 0
) -> _Syntax:
    return _Syntax(frozenset(takes_value or ()), frozenset(code or ()), skipped=skipped)


_SHELL = _interp({"-o", "+o", "-O", "+O", "--rcfile", "--init-file"}, {"-c"})
_SYNTAX: dict[str, _Syntax] = {
    # Interpreters: the first operand is the script they run.
    "python": _interp({"-W", "-X", "-Q", "--check-hash-based-pycs"}, {"-c", "-m"}),
    "sh": _SHELL,
    "bash": _SHELL,
    "dash": _SHELL,
    "ash": _SHELL,
    "zsh": _SHELL,
    "ksh": _SHELL,
    "node": _interp({"-r", "--require", "--import", "--loader"}, {"-e", "--eval", "-p", "--print"}),
    "perl": _interp({"-I", "-M", "-m"}, {"-e", "-E"}),
    "ruby": _interp({"-I", "-r"}, {"-e"}),
    "php": _interp({"-d", "-c"}, {"-r"}),
    "lua": _interp({"-l"}, {"-e"}),
    "Rscript": _interp(set(), {"-e"}),
    "tclsh": _interp(set(), set()),
    # Wrappers: the first operand (after their own) is the command they run.
    "env": _Syntax(
        frozenset({"-u", "--unset"}),
        frozenset({"-S", "--split-string", "-C", "--chdir"}),
        assignments=True,
    ),
    "timeout": _wrapper({"-s", "--signal", "-k", "--kill-after"}, skipped=1),
    "nice": _wrapper({"-n", "--adjustment"}),
    "nohup": _wrapper(),
    "setsid": _wrapper(),
    "stdbuf": _wrapper({"-i", "-o", "-e", "--input", "--output", "--error"}),
    "ionice": _wrapper(
        {"-c", "--class", "-n", "--classdata"}, {"-p", "--pid", "-P", "--pgid", "-u", "--uid"}
    ),
    "chrt": _wrapper({"-T", "-P", "-D"}, {"-p", "--pid", "-m", "--max"}, skipped=1),
    "taskset": _wrapper(code={"-p", "--pid"}, skipped=1),
    "flock": _wrapper(
        {"-w", "--timeout", "-E", "--conflict-exit-code"}, {"-c", "--command"}, skipped=1
    ),
    "time": _wrapper({"-f", "--format", "-o", "--output"}),
    "xargs": _wrapper(
        {
            "-a",
            "--arg-file",
            "-d",
            "--delimiter",
            "-E",
            "-I",
            "-L",
            "--max-lines",
            "-n",
            "--max-args",
            "-P",
            "--max-procs",
            "-s",
            "--max-chars",
            "--process-slot-var",
        }
    ),
    "busybox": _wrapper(),
}


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


def _names_a_path(entry: str) -> bool:
    """Whether a program entry is a path (`./x`, `hooks/x`), not a name looked up on the PATH."""
    return "/" in entry


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


def _syntax(program: str) -> _Syntax | None:
    """How a program reads its command line, when it runs another (`python3.11` is python)."""
    name = program.rsplit("/", 1)[-1]
    return _SYNTAX.get(name, _SYNTAX.get(name.rstrip("0123456789.")))


def _first_operand(argv: Sequence[str], i: int, syntax: _Syntax) -> int | None:
    """The index of the first operand from `i` on, past the options and their values; None
    when a code option comes first or no operand is left."""
    while i < len(argv):
        entry = argv[i]
        if entry == "--":
            return i + 1 if i + 1 < len(argv) else None
        if entry in syntax.code:
            return None
        if entry.startswith("--"):
            name, attached, _ = entry.partition("=")
            if name in syntax.code:
                return None
            i += 2 if name in syntax.takes_value and not attached else 1
            continue
        if len(entry) > 1 and entry.startswith(("-", "+")):
            # A cluster of short options (`-eu`, `-ec`, `-Wignore`, `-uW ignore`): a letter
            # that takes a value takes the rest of the cluster, or the next entry.
            step = 1
            for k in range(1, len(entry)):
                option = entry[0] + entry[k]
                if option in syntax.code:
                    return None
                if option in syntax.takes_value:
                    step = 2 if k == len(entry) - 1 else 1
                    break
            i += step
            continue
        if syntax.assignments and (entry == "-" or "=" in entry):  # env's `-` and NAME=VALUE
            i += 1
            continue
        return i
    return None


MAX_WRAPPERS = 16  # wrappers nested deeper than this are not followed


def program_entries(argv: Sequence[str]) -> tuple[int, ...]:
    """The indexes of an argv that name a program to run: argv[0] when it is a path, the
    command a wrapper runs when it is a path (`env`, `timeout 5`, `nice -n 5`, nested), and
    the script an interpreter is given (its first operand, a bare name included), unless the
    code comes from an option (`sh -c`, `python3 -m`)."""
    found: list[int] = []
    i: int | None = 0
    for _ in range(MAX_WRAPPERS):
        if i is None or i >= len(argv):
            break
        if _names_a_path(argv[i]):
            found.append(i)
        syntax = _syntax(argv[i])
        if syntax is None:
            break
        i = _first_operand(argv, i + 1, syntax)
        if i is None:
            break
        if syntax.script:
            found.append(i)
            break
        i += syntax.skipped
    return tuple(sorted(set(found)))


class MissingAtStartError(Exception):
    """A program (a tool's, a hook's, a check's) is a file of the agent's folder that was not
    there at start."""


@dataclass
class Pristine:
    """What each hook and check entry named at start, its content, and the hooks' host copies."""

    # (agent folder, entry as written) -> the file it named at start
    named: dict[tuple[Path, str], Path] = field(default_factory=dict)
    contents: dict[Path, bytes] = field(default_factory=dict)
    # (tool's workdir, entry as written) of a tool's command that named a file of code at start
    code: set[tuple[Path, str]] = field(default_factory=set)
    # (folder, entry as written) that named anything at start, copied or not (a link out of the
    # agent's folder, a file too big to copy): never taken for a program planted since
    present: set[tuple[Path, str]] = field(default_factory=set)
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
            for tool in agent.tools:
                programs = set(program_entries(tool.command))
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
        with contextlib.suppress(OSError, ValueError):
            if entry and os.path.lexists(directory / entry):
                self.present.add(key)
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
        if path in self._copies:
            return
        if self._folder is None:
            self._folder = Path(tempfile.mkdtemp(prefix="mm-batch-hooks-"))
        copy = self._folder / f"{len(self._copies)}-{path.name}"
        copy.write_bytes(self.contents[path])
        copy.chmod(0o500)
        self._copies[path] = copy

    def _check_not_planted(
        self, directory: Path, argv: Sequence[str], top: Path | None = None
    ) -> None:
        """No program of `argv` run in `directory` (argv[0] when a path, and the script an
        interpreter runs, a bare name included: `sh verify.sh` opens ./verify.sh) may be a path
        into the agent's folder (`top`; `directory` itself by default) that named no file at
        start: a tool may have written it since."""
        for i in program_entries(argv):
            entry = argv[i]
            there = (directory, entry) in self.named or (directory, entry) in self.present
            if there or not _inside(top or directory, str(directory / entry)):
                continue
            # argv[0] as a path must have been there; a later entry taken for a script (a bare
            # name, or an option's value read as one) only when a file is there now.
            if (i == 0 and _names_a_path(entry)) or (i > 0 and os.path.lexists(directory / entry)):
                raise MissingAtStartError(
                    f"{entry} was not a file of the agent's folder when the run started"
                )

    def hook_argv(self, directory: Path, argv: tuple[str, ...]) -> tuple[str, ...]:
        """A hook's argv, each entry that named one of the agent's files at start swapped for
        its copy. Raises MissingAtStartError for a path into the folder that named none."""
        self._check_not_planted(directory, argv)
        swapped = []
        for entry in argv:
            path = self.named.get((directory, entry))
            swapped.append(entry if path is None else str(self._copies[path]))
        return tuple(swapped)

    def check_files(self, directory: Path, argv: tuple[str, ...]) -> dict[int, tuple[Path, bytes]]:
        """For each entry of a `check` argv that named one of the agent's files at start: its
        index, the file and the content read then. Raises MissingAtStartError as hook_argv."""
        self._check_not_planted(directory, argv)
        files: dict[int, tuple[Path, bytes]] = {}
        for i, entry in enumerate(argv):
            path = self.named.get((directory, entry))
            if path is not None:
                files[i] = (path, self.contents[path])
        return files

    def programs(
        self, workdir: Path, argv: Sequence[str], agent_dir: Path
    ) -> tuple[PinnedProgram, ...]:
        """The programs of a tool call's argv that named one of the agent's files at start:
        argv[0], the script an interpreter is given, and any other entry of the tool's command
        that named a file of code (`env sh deploy.sh`, `timeout 5 python3 deploy.py`): each
        with the content read then, which is what the executor runs. Raises
        MissingAtStartError for a program in the agent's folder (`agent_dir`) that named no
        file at start."""
        self._check_not_planted(workdir, argv, agent_dir)
        pinned = []
        programs = set(program_entries(argv))
        for i, entry in enumerate(argv):
            path = self.named.get((workdir, entry))
            if path is not None and (i in programs or (workdir, entry) in self.code):
                pinned.append(PinnedProgram(i, entry, path, self.contents[path]))
        return tuple(pinned)

    def close(self) -> None:
        if self._folder is not None:
            shutil.rmtree(self._folder, ignore_errors=True)
            self._folder = None


def replaced(argv: tuple[str, ...], copies: Mapping[int, str]) -> tuple[str, ...]:
    """argv with the entries at these indexes replaced."""
    return tuple(copies.get(i, entry) for i, entry in enumerate(argv))
