"""Output files: the names mm-batch owns in --out, and atomic writes."""

from __future__ import annotations

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


def clear_outputs(directory: Path) -> None:
    """Replace previous results: remove the files mm-batch writes there, and nothing else."""
    directory.mkdir(parents=True, exist_ok=True)
    for name in OUTPUT_FILES:
        (directory / name).unlink(missing_ok=True)
