"""Configuration problems that point at a file, a line and a key path."""

from __future__ import annotations

from dataclasses import dataclass


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


class ConfigError(Exception):
    """Raised once loading is over, carrying every problem found in every file."""

    def __init__(self, problems: list[Problem]) -> None:
        self.problems = sorted(problems, key=lambda p: (p.file, p.line, p.path))
        super().__init__("\n".join(str(p) for p in self.problems))
