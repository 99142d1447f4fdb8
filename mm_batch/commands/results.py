"""Results folders read back (by `merge` and `compare`) as hostile input.

A results folder may come from another machine, an artifact store or a cache: every file is
checked before anything of it is believed, and whatever is wrong is a usage error naming the
file, never a traceback.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import xml.etree.ElementTree as ET
from collections.abc import Collection, Iterator
from pathlib import Path
from typing import Any, TypeGuard

from mm_batch.config.paths import NotRegularFileError, open_regular
from mm_batch.config.tasks import WEEK_S
from mm_batch.errors import UsageError
from mm_batch.report.calls_log import record_lines
from mm_batch.report.files import CALLS, JUNIT, SUMMARY_JSON
from mm_batch.report.summary import one_line


class ResultsError(UsageError):
    """A folder that cannot be read as results: missing, damaged or inconsistent files."""

    consequence = "nothing written"


@contextlib.contextmanager
def refusing(consequence: str) -> Iterator[None]:
    """Unusable results met inside say what the command did not do (`nothing merged`)."""
    try:
        yield
    except ResultsError as exc:
        exc.consequence = consequence
        raise


_RUN_KEYS = {"run", "task", "model", "repeat", "status", "reason", "duration_s", "line", "index"}


def is_number(value: object) -> TypeGuard[int | float]:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


# No run lasts longer than its timeout (a week at most) and the grace after it; no batch spends
# more than this. Bounded, a merge's sums of a thousand folders stay finite numbers JSON can hold.
MAX_RUN_SECONDS = 2 * WEEK_S
MAX_USD = 1e9


def _is_run(run: object) -> bool:
    return (
        isinstance(run, dict)
        and run.keys() >= _RUN_KEYS
        and all(type(run[k]) is int for k in ("repeat", "line", "index"))
        and run["repeat"] >= 1
        and run["line"] >= 1
        and run["index"] >= 0
        and all(isinstance(run[k], str) for k in ("run", "task", "model", "reason"))
        and run["status"] in ("passed", "failed", "error")
        and is_number(run["duration_s"])
        and 0 <= run["duration_s"] <= MAX_RUN_SECONDS
        and run["run"] == f"{run['task']}[{run['model']}]#{run['repeat']}"
        and isinstance(run.get("rerun", False), bool)
        # Absent from results written before they were counted, null where unknown.
        and all(_is_count(run.get(k)) for k in ("prompt_tokens", "completion_tokens"))
        and _is_usd(run.get("cost_usd"))
    )


def _is_count(value: object) -> bool:
    return value is None or (type(value) is int and value >= 0)


def _is_usd(value: object) -> bool:
    return value is None or (is_number(value) and 0 <= value <= MAX_USD)


def _is_summary(data: object) -> bool:
    if not isinstance(data, dict):
        return False
    plan, rate = data.get("plan", {}), data.get("min_pass_rate", 1.0)
    whole_runs = plan.get("whole_runs", 0) if isinstance(plan, dict) else None
    return (
        isinstance(data.get("runs"), list)
        and all(_is_run(r) for r in data["runs"])
        and isinstance(plan, dict)
        and type(whole_runs) is int
        and whole_runs >= 0
        and isinstance(plan.get("shard", ""), str | None)
        and isinstance(data.get("provenance", {}), dict)
        and isinstance(data.get("suite", ""), str)
        and is_number(rate)
        and 0 <= rate <= 1
    )


# Far above any results file mm-batch writes (each text of a record is cut at 1 MiB): a
# bigger one is not read into memory.
RESULTS_FILE_LIMIT = 1024**3


def read_text(path: Path) -> str:
    """A results file's text; a link (it could point anywhere), a file over the limit or a
    damaged file is refused."""
    if path.is_symlink():
        raise ResultsError(f"{path}: a symbolic link, not a results file: refused")
    try:
        # Never through a link, never a FIFO or a device (each read could wait for ever).
        fd = open_regular(path, follow=False)
        with os.fdopen(fd, "rb") as handle:
            size = os.fstat(fd).st_size
            if size > RESULTS_FILE_LIMIT:
                raise ResultsError(
                    f"{path}: {size} bytes, over the {RESULTS_FILE_LIMIT} a results file may hold"
                )
            return handle.read(RESULTS_FILE_LIMIT + 1).decode("utf-8")
    except NotRegularFileError as exc:
        raise ResultsError(f"{path}: {exc}") from None
    except UnicodeDecodeError as exc:
        raise ResultsError(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    except MemoryError:
        raise ResultsError(f"{path}: too large to read into this process's memory") from None
    except OSError as exc:
        raise ResultsError(f"{path}: cannot be read ({exc.strerror or exc})") from None


def read_json(text: str, where: str, what: str = "valid JSON") -> Any:
    try:
        return json.loads(text)
    except (ValueError, RecursionError) as exc:  # a nesting deep enough exhausts the stack
        raise ResultsError(f"{where}: not {what} ({one_line(str(exc), 120)})") from None


def read_summary(directory: Path) -> dict[str, Any]:
    """A results folder's summary.json, checked field by field (runs, plan, provenance)."""
    for name in (CALLS, JUNIT, SUMMARY_JSON):
        if not (directory / name).is_file():
            raise ResultsError(f"{directory}: no {name} here: not an mm-batch results folder")
    path = directory / SUMMARY_JSON
    data = read_json(read_text(path), str(path))
    if not _is_summary(data):
        raise ResultsError(f"{path}: not an mm-batch summary")
    return dict(data)


_KINDS = frozenset({"model", "tool", "task"})
# As deep as the files mm-batch reads may nest (SPEC 1): a record deeper is not one it wrote,
# and could not be walked (masked) without exhausting the stack.
RECORD_DEPTH_LIMIT = 64


def _depth(value: object) -> int:
    """How deep JSON data nests (a scalar is 0), found without recursion."""
    deepest, stack = 0, [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict | list):
            deepest = max(deepest, depth + 1)
            stack.extend(
                (v, depth + 1) for v in (item.values() if isinstance(item, dict) else item)
            )
    return deepest


def read_records(path: Path, runs: Collection[str]) -> list[dict[str, Any]]:
    """calls.jsonl's records, its lines split as they were written (`record_lines`). A line
    that is not a record of one of `runs` (the runs summary.json lists) is named, never
    copied."""
    records: list[dict[str, Any]] = []
    for number, line in record_lines(read_text(path)):
        record = read_json(line, f"{path}:{number}", "a JSON record")
        if not isinstance(record, dict) or record.get("kind") not in _KINDS:
            raise ResultsError(f"{path}:{number}: not an mm-batch record")
        if _depth(record) > RECORD_DEPTH_LIMIT:
            raise ResultsError(
                f"{path}:{number}: nested deeper than {RECORD_DEPTH_LIMIT}: not an mm-batch record"
            )
        run = record.get("run")
        if not isinstance(run, str) or run not in runs:
            raise ResultsError(
                f"{path}:{number}: a record of {one_line(str(run), 120)}, a run that "
                f"{SUMMARY_JSON} does not list: the folder is damaged"
            )
        records.append(record)
    return records


def read_junit(path: Path) -> ET.Element:
    try:
        return ET.fromstring(read_text(path))
    except ET.ParseError as exc:
        raise ResultsError(f"{path}: not valid XML ({exc})") from None
