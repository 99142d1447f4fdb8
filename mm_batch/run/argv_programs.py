"""Which words of a command line are programs to run: argv[0] when it is a path, the command a
wrapper runs (`env`, `timeout 5`, `find -exec`), the script an interpreter is given
(`python3 deploy.py`), the program file an option names (`awk -f report.awk`). Read from each
program's own syntax (its options that take a value, those after which the code comes from the
command line), so that `Pristine` can hold each of them to what was read at start.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

Kind = Literal["script", "command", "options"]


@dataclass(frozen=True)
class _Syntax:
    """How a program that runs another reads its command line.

    `kind`: an interpreter (`script`) runs its first operand as a script, a bare name
    included; a wrapper (`command`) runs its first operand as a command (looked up on the PATH
    unless a path), after `skipped` operands of its own (`timeout`'s DURATION) and, for `env`,
    NAME=VALUE; for the rest (`options`: `awk`, `make`, `sed`) no operand is a program.
    `takes_value`: options that take a value (`-W ignore`, or attached: `-Wignore`).
    `programs`: options whose value is a program file (`awk -f prog.awk`, `make -f build.mk`).
    `code`: options after which no operand is a program: the code comes from the command
    line or a module (`sh -c`, `python3 -m`, `env -S`), or there is no command (`taskset -p`).
    `moves`: options that move where a relative path is looked up (`env -C DIR`): what the
    program is cannot be told from the line then (`HiddenProgramError`).
    `commands_after`: words after which a command follows, anywhere (`find -exec`).
    """

    kind: Kind
    takes_value: frozenset[str] = frozenset()
    code: frozenset[str] = frozenset()
    programs: frozenset[str] = frozenset()
    moves: frozenset[str] = frozenset()
    skipped: int = 0
    assignments: bool = False
    commands_after: frozenset[str] = frozenset()


class HiddenProgramError(Exception):
    """A command line whose program cannot be held to what was read at start by its words: an
    option moves where its relative paths are looked up (`env -C DIR ./deploy.sh`), or names
    the program file inside its own word (`make --file=build.mk`)."""


def _syntax_of(
    kind: Kind,
    takes_value: Iterable[str] = (),
    code: Iterable[str] = (),
    *,
    programs: Iterable[str] = (),
    moves: Iterable[str] = (),
    skipped: int = 0,
) -> _Syntax:
    return _Syntax(
        kind,
        frozenset(takes_value) | frozenset(programs) | frozenset(moves),
        frozenset(code),
        frozenset(programs),
        frozenset(moves),
        skipped,
    )


def _interp(takes_value: Iterable[str], code: Iterable[str], **more: Any) -> _Syntax:
    """An interpreter: `-` alone is its standard input (code), unless `more` says otherwise."""
    return _syntax_of("script", takes_value, {*code, "-"}, **more)


# A shell reads `-` as the end of its options (`sh - x.sh`), as `--`.
_SHELL = _syntax_of("script", {"-o", "+o", "-O", "+O", "--rcfile", "--init-file"}, {"-c", "-s"})
_NODE = _interp(
    {
        *("-r", "--require", "--import", "--loader", "--experimental-loader", "--title"),
        *("--conditions", "-C", "--env-file", "--input-type", "--inspect-port"),
        *("--openssl-config", "--redirect-warnings", "--report-dir", "--stack-trace-limit"),
    },
    {"-e", "--eval", "-p", "--print"},
)
_AWK = _syntax_of(
    "options", {"-v", "-F", "--assign", "--field-separator"}, programs={"-f", "--file"}
)
_SYNTAX: dict[str, _Syntax] = {
    # Interpreters: the first operand is the script they run.
    "python": _interp({"-W", "-X", "-Q", "--check-hash-based-pycs"}, {"-c", "-m"}),
    "sh": _SHELL,
    "bash": _SHELL,
    "dash": _SHELL,
    "ash": _SHELL,
    "zsh": _SHELL,
    "ksh": _SHELL,
    "mksh": _SHELL,
    "node": _NODE,
    "nodejs": _NODE,
    "perl": _interp({"-I", "-M", "-m"}, {"-e", "-E"}),
    "ruby": _interp({"-I", "-r", "-E", "--encoding"}, {"-e"}, moves={"-C"}),
    "php": _interp({"-d", "-c"}, {"-r"}),
    "lua": _interp({"-l"}, {"-e"}),
    "Rscript": _interp(set(), {"-e"}),
    "tclsh": _interp({"-encoding"}, set()),
    "wish": _interp({"-encoding"}, set()),
    # Programs given by an option only.
    "awk": _AWK,
    "gawk": _AWK,
    "mawk": _AWK,
    "nawk": _AWK,
    "sed": _syntax_of("options", {"-l", "--line-length"}, programs={"-f", "--file"}),
    "make": _syntax_of(
        "options",
        {"-I", "--include-dir", "-j", "--jobs", "-l", "-o", "-W", "--what-if"},
        programs={"-f", "--file", "--makefile"},
        moves={"-C", "--directory"},
    ),
    # Wrappers: the first operand (after their own) is the command they run.
    "env": _Syntax(
        "command",
        frozenset({"-u", "--unset", "-C", "--chdir"}),
        frozenset({"-S", "--split-string"}),
        moves=frozenset({"-C", "--chdir"}),
        assignments=True,
    ),
    "timeout": _syntax_of("command", {"-s", "--signal", "-k", "--kill-after"}, skipped=1),
    "nice": _syntax_of("command", {"-n", "--adjustment"}),
    "nohup": _syntax_of("command"),
    "setsid": _syntax_of("command"),
    "stdbuf": _syntax_of("command", {"-i", "-o", "-e", "--input", "--output", "--error"}),
    "ionice": _syntax_of(
        "command",
        {"-c", "--class", "-n", "--classdata"},
        {"-p", "--pid", "-P", "--pgid", "-u", "--uid"},
    ),
    "chrt": _syntax_of("command", {"-T", "-P", "-D"}, {"-p", "--pid", "-m", "--max"}, skipped=1),
    "taskset": _syntax_of("command", code={"-p", "--pid"}, skipped=1),
    "flock": _syntax_of(
        "command", {"-w", "--timeout", "-E", "--conflict-exit-code"}, {"-c", "--command"}, skipped=1
    ),
    "time": _syntax_of("command", {"-f", "--format", "-o", "--output"}),
    "xargs": _syntax_of(
        "command",
        {
            *("-a", "--arg-file", "-d", "--delimiter", "-E", "-I", "-L", "--max-lines", "-n"),
            *("--max-args", "-P", "--max-procs", "-s", "--max-chars", "--process-slot-var"),
        },
    ),
    "busybox": _syntax_of("command"),
    "setarch": _syntax_of("command", skipped=1),
    "prlimit": _syntax_of("command", {"-o", "--output"}, {"-p", "--pid"}),
    "sudo": _syntax_of(
        "command",
        {"-u", "--user", "-g", "--group", "-C", "-h", "--host", "-p", "-r", "-t"},
        moves={"-D", "--chdir"},
    ),
    "doas": _syntax_of("command", {"-u", "-C"}),
    "runuser": _syntax_of("command", {"-u", "-g", "-G", "--user", "--group"}, {"-c", "--command"}),
    "strace": _syntax_of(
        "command",
        {"-o", "-e", "-s", "-u", "-E", "-P", "-I", "-a", "-X", "-b", "-O", "-S", "-U"},
        {"-p", "--attach"},
    ),
    "ltrace": _syntax_of("command", {"-o", "-e", "-s", "-u", "-a", "-n", "-F"}, {"-p"}),
    "valgrind": _syntax_of("command"),
    "unbuffer": _syntax_of("command"),
    "faketime": _syntax_of("command", {"-m", "-f"}, skipped=1),
    "numactl": _syntax_of(
        "command",
        {"-N", "-m", "-C", "-p", "-i", "--cpunodebind", "--membind", "--physcpubind"},
        {"-s", "--show", "-H", "--hardware"},
    ),
    "find": _Syntax("options", commands_after=frozenset({"-exec", "-execdir", "-ok", "-okdir"})),
}


def names_a_path(entry: str) -> bool:
    """Whether a program entry is a path (`./x`, `hooks/x`), not a name looked up on the PATH."""
    return "/" in entry


def _syntax(program: str) -> _Syntax | None:
    """How a program reads its command line, when it runs another (`python3.11` is python)."""
    name = program.rsplit("/", 1)[-1]
    return _SYNTAX.get(name, _SYNTAX.get(name.rstrip("0123456789.")))


def _first_operand(argv: Sequence[str], i: int, syntax: _Syntax, found: list[int]) -> int | None:
    """The index of the first operand from `i` on, past the options and their values (the
    value of an option that names a program goes to `found`); None when a code option comes
    first or no operand is left. Raises HiddenProgramError at an option that moves where
    paths are looked up."""
    while i < len(argv):
        entry = argv[i]
        if entry == "--" or (entry == "-" and syntax is _SHELL):
            return i + 1 if i + 1 < len(argv) else None
        if entry == "-" and entry in syntax.code:  # an interpreter's standard input
            return None
        if entry.startswith("--"):
            name, _, attached = entry.partition("=")
            option, takes = name, name in syntax.takes_value and not attached
        elif len(entry) > 1 and entry.startswith(("-", "+")):
            # A cluster of short options (`-eu`, `-ec`, `-Wignore`, `-uW ignore`): a letter
            # that takes a value takes the rest of the cluster, or the next entry.
            option, takes, attached = entry, False, ""
            for k in range(1, len(entry)):
                letter = entry[0] + entry[k]
                if letter in syntax.code or letter in syntax.takes_value:
                    option, attached = letter, entry[k + 1 :]
                    takes = not attached and letter in syntax.takes_value
                    break
        elif syntax.assignments and (entry == "-" or "=" in entry):  # env's `-` and NAME=VALUE
            i += 1
            continue
        else:
            return i
        if option in syntax.code or entry in syntax.code:
            return None
        if option in syntax.moves:
            raise HiddenProgramError(
                f"{option} moves where {argv[0]} looks for its program: mm-batch cannot hold "
                "what it runs to what it read at start (set the tool's workdir instead)"
            )
        if option in syntax.programs:
            if attached:
                raise HiddenProgramError(
                    f"{entry} names {argv[0]}'s program file inside its own word: give it as "
                    f"a word of its own ({option} FILE)"
                )
            if i + 1 < len(argv):
                found.append(i + 1)
        i += 2 if takes else 1
    return None


def program_entries(argv: Sequence[str]) -> tuple[int, ...]:
    """The indexes of an argv that name a program to run: argv[0] when it is a path, the
    command a wrapper runs when it is a path (`env`, `timeout 5`, `nice -n 5`, `find -exec`,
    nested), the script an interpreter is given (its first operand, a bare name included),
    unless the code comes from an option (`sh -c`, `python3 -m`), and the program file an
    option names (`awk -f prog.awk`, `make -f build.mk`). Raises HiddenProgramError for a line
    whose program cannot be told from it (`env -C DIR ./x.sh`)."""
    found: list[int] = []
    i: int | None = 0
    while i is not None and i < len(argv):  # each turn moves on: nested wrappers end
        if names_a_path(argv[i]):
            found.append(i)
        syntax = _syntax(argv[i])
        if syntax is None:
            break
        if syntax.commands_after:  # each command after them (`find -exec ./x {} ;`)
            for k in range(i + 1, len(argv)):
                if argv[k] in syntax.commands_after:
                    found += (k + 1 + j for j in program_entries(argv[k + 1 :]))
            break
        i = _first_operand(argv, i + 1, syntax, found)
        if syntax.kind == "options":  # its program options may follow operands (`make all -f x`)
            while i is not None:
                i = _first_operand(argv, i + 1, syntax, found)
            break
        if i is None:
            break
        if syntax.kind == "script":
            found.append(i)
            break
        i = _first_operand(argv, i + syntax.skipped, syntax, found) if syntax.skipped else i
    return tuple(sorted(set(found)))


def known_programs(argv: Sequence[str]) -> tuple[int, ...]:
    """`program_entries`, none for a line whose program is hidden (refused when it runs)."""
    try:
        return program_entries(argv)
    except HiddenProgramError:
        return ()
