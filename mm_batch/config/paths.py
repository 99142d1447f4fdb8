"""File paths as messages show them, and the digest reports carry of each config file."""

from __future__ import annotations

import hashlib
from pathlib import Path


def display_path(path: Path) -> str:
    """The path as a user reads it in a message: relative to the working directory when inside."""
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


def sha256(path: Path) -> str:
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError:
        return ""
