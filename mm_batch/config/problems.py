"""Configuration problems that point at a file, a line and a key path, and how they quote."""

from __future__ import annotations

import re
from dataclasses import dataclass

MAX_QUOTED = 120  # characters of an offending value that a message quotes
# Control characters are shown escaped, so that a message never writes them to the terminal.
_UNPRINTABLE_RE = re.compile("[\x00-\x08\x0b-\x1f\x7f\ud800-\udfff]")


def excerpt(text: str) -> str:
    """A value as a message quotes it: at most MAX_QUOTED characters, control characters escaped."""
    cut = text[:MAX_QUOTED]
    shown = _UNPRINTABLE_RE.sub(lambda m: m.group().encode("unicode_escape").decode(), cut)
    if len(text) > MAX_QUOTED:
        shown += f"... ({len(text)} characters)"
    return shown


def join_key(path: str, name: str) -> str:
    """The key path of `name` inside the mapping at `path` (`tools[0].name`)."""
    name = excerpt(name)
    return f"{path}.{name}" if path else name


@dataclass(frozen=True)
class Problem:
    """One thing wrong in one file, at one place."""

    file: str
    line: int
    path: str
    message: str

    def __str__(self) -> str:
        where = f"{self.path}: " if self.path else ""
        return f"{self.file}:{self.line}: {where}{self.message}"


WARNING = "warning: "


@dataclass(frozen=True)
class ProgramProblem(Problem):
    """A tool's program as this machine has it (missing, not executable, not on the PATH).
    `run` says it as a warning, since each call would only be answered "program not found";
    `validate` refuses it where `refuses` is set (where the tool runs on this machine's
    files), and warns otherwise (a docker sandbox's image may hold what the host lacks)."""

    refuses: bool = True

    def as_error(self) -> Problem:
        return Problem(self.file, self.line, self.path, self.message.removeprefix(WARNING))


class ConfigError(Exception):
    """Raised once loading is over, carrying every problem found in every file."""

    def __init__(self, problems: list[Problem]) -> None:
        self.problems = sorted(problems, key=lambda p: (p.file, p.line, p.path))
        super().__init__("\n".join(str(p) for p in self.problems))
