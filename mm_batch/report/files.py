"""Output files: the names mm-batch owns in --out, and atomic writes."""

from __future__ import annotations

import errno
import os
import tempfile
from pathlib import Path

CALLS = "calls.jsonl"
JUNIT = "junit.xml"
SUMMARY_MD = "summary.md"
SUMMARY_JSON = "summary.json"
OUTPUT_FILES = (CALLS, JUNIT, SUMMARY_MD, SUMMARY_JSON)


def write_atomic(path: Path, text: str) -> None:
    """Write beside the target, then rename: a reader sees the old file or the new, never half."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def unwritable(directory: Path) -> str | None:
    """Why results cannot be written in `directory`, or None if they can; creates nothing."""
    existing = directory
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent  # the folder that `mkdir(parents=True)` would create in
    try:
        if not existing.is_dir():
            raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR))
        with tempfile.TemporaryFile(dir=existing):
            pass
    except OSError as exc:
        return f"--out {directory}: results cannot be written there ({exc.strerror or exc})"
    return None


def clear_outputs(directory: Path) -> None:
    """Replace previous results: remove the files mm-batch writes there, and nothing else."""
    directory.mkdir(parents=True, exist_ok=True)
    for name in OUTPUT_FILES:
        (directory / name).unlink(missing_ok=True)
