"""File paths as messages show them, and the digest reports carry of each config file."""

from __future__ import annotations

import hashlib
import os
import stat
from collections.abc import Mapping
from pathlib import Path
from typing import Literal


def display_path(path: Path) -> str:
    """The path as a user reads it in a message: relative to the working directory when inside."""
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
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


def sha256(path: Path) -> str:
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError:
        return ""


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
