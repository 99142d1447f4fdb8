"""A results folder read back (by `merge`, `--rerun-failed`, `compare` and report.html) into the
typed records the run writes, as hostile input.

A results folder may come from another machine, an artifact store or a cache: every file is
checked against its shipped schema (`mm_batch/schemas/`) field by field before anything of it is
believed, and whatever is wrong is a usage error naming the file and the field's path
(`summary.json: not an mm-batch summary: runs[3].duration_s: expected a number from 0 to
1209600, got "x"`), never a traceback. What an older mm-batch did not write yet (the plan, the
provenance, the tokens) reads as unknown.

This is the one module that reads a record's fields by name; everything after it reads typed
fields.
"""

from __future__ import annotations

import contextlib
import json
import os
import stat
import xml.etree.ElementTree as ET
from collections.abc import Callable, Collection, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from mm_batch.config.model import WEEK_S
from mm_batch.config.paths import NotRegularFileError, read_regular
from mm_batch.config.secrets import Masker
from mm_batch.errors import UsageError
from mm_batch.jsontypes import JsonObject, JsonValue
from mm_batch.report.calls_log import record_line, record_lines
from mm_batch.report.files import CALLS, JUNIT, SUMMARY_JSON
from mm_batch.report.jsonfields import (
    FieldError,
    Fields,
    anything,
    at,
    boolean,
    check_tree,
    each,
    integer,
    nullable,
    number,
    one_of,
    parse,
    string,
    wrong,
)
from mm_batch.report.summary import ProvenanceValue, one_line
from mm_batch.run.records import (
    CallAsked,
    Check,
    HookRecord,
    ModelRecord,
    Outcome,
    Record,
    RunResult,
    Status,
    TaskRecord,
    ToolRecord,
)


class ResultsError(UsageError):
    """A folder that cannot be read as results: missing, damaged or inconsistent files."""

    consequence = "nothing written"


class MergeError(ResultsError):
    """Folders that cannot be merged: overlapping, incomplete or from different plans."""


@contextlib.contextmanager
def refusing(consequence: str) -> Iterator[None]:
    """Unusable results met inside say what the command did not do (`nothing merged`)."""
    try:
        yield
    except ResultsError as exc:
        exc.consequence = consequence
        raise


# No run lasts longer than its timeout (a week at most) and the grace after it; no batch spends
# more than this. Bounded, a merge's sums of a thousand folders stay finite numbers JSON can hold.
MAX_RUN_SECONDS = 2 * WEEK_S
MAX_USD = 1e9
# Far above any results file mm-batch writes (each text of a record is cut at 1 MiB): a
# bigger one is not read into memory.
RESULTS_FILE_LIMIT = 1024**3
# As deep as the files mm-batch reads may nest (SPEC 1): a record deeper is not one it wrote,
# and could not be walked (masked) without exhausting the stack.
RECORD_DEPTH_LIMIT = 64


def read_text(path: Path) -> str:
    """A results file's text; a link (it could point anywhere), a file over the limit or a
    damaged file is refused."""
    try:
        info = os.lstat(path)
        if stat.S_ISLNK(info.st_mode):
            raise ResultsError(f"{path}: a symbolic link, not a results file: refused")
        if info.st_size > RESULTS_FILE_LIMIT:
            raise ResultsError(
                f"{path}: {info.st_size} bytes, over the {RESULTS_FILE_LIMIT} "
                "a results file may hold"
            )
        # Never through a link, never a FIFO or a device (each read could wait for ever).
        data = read_regular(path, RESULTS_FILE_LIMIT + 1, follow=False)
        if len(data) > RESULTS_FILE_LIMIT:  # it grew after it was looked at
            raise ResultsError(f"{path}: over the {RESULTS_FILE_LIMIT} a results file may hold")
        return data.decode("utf-8")
    except NotRegularFileError as exc:
        raise ResultsError(f"{path}: {exc}") from None
    except UnicodeDecodeError as exc:
        raise ResultsError(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    except MemoryError:
        raise ResultsError(f"{path}: too large to read into this process's memory") from None
    except OSError as exc:
        raise ResultsError(f"{path}: cannot be read ({exc.strerror or exc})") from None


def _json(text: str, where: str, what: str) -> JsonValue:
    try:
        return parse(text)
    except (ValueError, RecursionError) as exc:  # a nesting deep enough exhausts the stack
        raise ResultsError(f"{where}: not {what} ({one_line(str(exc), 120)})") from None


def read_junit(path: Path) -> ET.Element:
    """junit.xml's tree (an entity is never expanded: the parser reads no outside file)."""
    try:
        return ET.fromstring(read_text(path))
    except ET.ParseError as exc:
        raise ResultsError(f"{path}: not valid XML ({exc})") from None


# -- summary.json --------------------------------------------------------------------------------

_STATUSES: dict[str, Status] = {"passed": "passed", "failed": "failed", "error": "error"}
_STATUS = one_of(_STATUSES)
_OUTCOMES: tuple[Outcome, ...] = ("ran", "refused", "invalid", "timeout", "error", "loop")
_OUTCOME = one_of({o: o for o in _OUTCOMES})
_text = nullable(string)
_count = nullable(integer(0))  # of tokens or bytes: null where unknown
_usd = nullable(number(MAX_USD))
_seconds = number()


@dataclass(frozen=True)
class Summary:
    """summary.json read back: its runs as results (less the checks and calls that junit.xml
    and calls.jsonl keep), and what it says of the plan; `whole_runs` is None where an older
    mm-batch did not say."""

    suite: str
    provenance: Mapping[str, ProvenanceValue]
    shard: str | None
    whole_runs: int | None
    min_pass_rate: float
    runs: tuple[RunResult, ...]

    @property
    def started_at(self) -> str | None:
        """When the run began (provenance), None where not said."""
        return _fact(self.provenance, "started_at")

    @property
    def mm_batch_version(self) -> str | None:
        return _fact(self.provenance, "mm_batch_version")


def _fact(provenance: Mapping[str, ProvenanceValue], name: str) -> str | None:
    return str(provenance[name]) if name in provenance else None


def _identity(fields: Fields, path: str) -> tuple[str, str, str, int]:
    """A run's id, task, model and repeat; the id is `<task>[<model>]#<repeat>`."""
    run_id, task = fields.need("run", string), fields.need("task", string)
    model, repeat = fields.need("model", string), fields.need("repeat", integer(1))
    if run_id != f"{task}[{model}]#{repeat}":
        its = f'"{task}[{model}]#{repeat}" (its task, model and repeat)'
        raise wrong(at(path, "run"), one_line(its, 120), run_id)
    return run_id, task, model, repeat


def _run(value: JsonValue, path: str) -> RunResult:
    run = Fields(value, path)
    run_id, task, model, repeat = _identity(run, path)
    return run.done(
        RunResult(
            run_id,
            task,
            model,
            repeat,
            run.need("status", _STATUS),
            run.need("reason", string),
            (),
            run.need("duration_s", number(MAX_RUN_SECONDS)),
            None,
            (),
            line=run.need("line", integer(1)),
            index=run.need("index", integer(0)),
            rerun=run.may("rerun", boolean, False),
            # Absent from results written before tokens and cost were counted: unknown.
            prompt_tokens=run.may("prompt_tokens", _count, None),
            completion_tokens=run.may("completion_tokens", _count, None),
            cost_usd=run.may("cost_usd", _usd, None),
        )
    )


def _provenance(value: JsonValue, path: str) -> dict[str, ProvenanceValue]:
    """Facts, each a string, a number, a boolean or null (the schema allows no nesting)."""
    found: dict[str, ProvenanceValue] = {}
    for key, fact in Fields(value, path).data.items():
        if isinstance(fact, dict | list):
            raise wrong(at(path, key), "a string, a number, true, false or null", fact)
        found[key] = fact
    return found


_COUNTS = ("runs", "passed", "failed", "errors")


def _model_line(value: JsonValue, path: str) -> None:
    """A line of `models`: derived from the runs, checked, never read."""
    line = Fields(value, path)
    line.need("model", string)
    for key in _COUNTS:
        line.need(key, integer(0))
    line.need("mean_s", _seconds)
    for key, read in (("prompt_tokens", _count), ("completion_tokens", _count)):
        line.may(key, read, None)
    line.done(line.may("cost_usd", _usd, None))


def _task_line(value: JsonValue, path: str) -> None:
    """A line of `tasks`: derived from the runs, checked, never read."""
    line = Fields(value, path)
    line.need("task", string)
    line.need("model", string)
    for key in _COUNTS:
        line.need(key, integer(0))
    line.need("pass_rate", number(1))
    line.done(line.need("status", _STATUS))


_EXIT_CODES = (0, 1, 2, 3, 4, 130)  # SPEC 8


def _exit_code(value: JsonValue, path: str) -> int:
    if type(value) is not int or value not in _EXIT_CODES:
        raise wrong(path, f"one of {', '.join(map(str, _EXIT_CODES))}", value)
    return value


def summary_of(value: JsonValue) -> Summary:
    """summary.json's document checked field by field (a `FieldError` names the first wrong
    one); the parts an older mm-batch did not write read as unknown."""
    check_tree(value, RECORD_DEPTH_LIMIT)
    data = Fields(value, "")
    empty: JsonValue = {}
    plan = Fields(data.may("plan", anything, empty), "plan")
    for key, read in (("models", _model_line), ("tasks", _task_line)):
        if key in data.data:
            data.need(key, each(read))
    data.may("exit_code", _exit_code, None)
    coverage = (plan.may("shard", _text, None), plan.may("whole_runs", integer(0), None))
    plan.done(coverage)
    runs = data.need("runs", each(_run, unique=lambda run: run.run_id))
    # An unsharded plan's runs are all here (one left out would drop its verdict unseen).
    shard, whole = coverage
    if whole is not None and (len(runs) > whole or (shard is None and len(runs) != whole)):
        part = "the plan is not sharded" if shard is None else "a shard holds no more"
        raise FieldError("runs", f"{len(runs)} run(s), but plan.whole_runs says {whole} and {part}")
    return data.done(
        Summary(
            suite=data.may("suite", string, ""),
            provenance=data.may("provenance", _provenance, {}),
            shard=shard,
            whole_runs=whole,
            min_pass_rate=float(data.may("min_pass_rate", number(1), 1.0)),
            runs=runs,
        )
    )


def read_summary(directory: Path) -> Summary:
    """A results folder's summary.json, checked field by field."""
    for name in (CALLS, JUNIT, SUMMARY_JSON):
        if not (directory / name).is_file():
            raise ResultsError(f"{directory}: no {name} here: not an mm-batch results folder")
    path = directory / SUMMARY_JSON
    document = _json(read_text(path), str(path), "valid JSON")
    try:
        return summary_of(document)
    except FieldError as exc:
        raise ResultsError(f"{path}: not an mm-batch summary: {exc}") from None


# -- calls.jsonl -------------------------------------------------------------------------------


@dataclass(frozen=True)
class LoggedRecord:
    """One line of calls.jsonl: the run it belongs to, its place there, and the record."""

    ts: str
    run: str
    task: str
    model: str
    repeat: int
    seq: int
    record: Record
    # The line as read, for a copy into another calls.jsonl that changes no byte of it.
    source: JsonObject = field(repr=False, compare=False)

    def line(self) -> str:
        """The record as calls.jsonl holds it (see `record_line`)."""
        return record_line(self.source)

    def masked(self, masker: Masker) -> LoggedRecord:
        """The record with the secrets of `masker` masked in every string it holds."""
        masked: JsonObject = masker.data(self.source)
        return logged_record(masked)


_argv = nullable(each(string))
_exit = nullable(integer())


def _arguments(value: JsonValue, path: str) -> JsonObject | None:
    if value is not None and not isinstance(value, dict):
        raise wrong(path, "an object or null", value)
    return value


def _hook(value: JsonValue, path: str) -> HookRecord:
    hook = Fields(value, path)
    argv = hook.need("argv", each(string))
    if not argv:
        raise wrong(at(path, "argv"), "a list of one string or more", [])
    return hook.done(
        HookRecord(
            argv=argv,
            exit_code=hook.need("exit_code", _exit),
            stdout=hook.need("stdout", string),
            stderr=hook.need("stderr", string),
            timed_out=hook.need("timed_out", boolean),
            error=hook.need("error", _text),
        )
    )


def _hooks(value: JsonValue, path: str) -> dict[str, HookRecord]:
    if value is None:
        return {}
    hooks = Fields(value, path)
    if not hooks.data:
        raise wrong(path, "a hook or null", value)
    names: tuple[str, ...] = ("preToolCall", "postToolCall")
    return hooks.done({k: hooks.need(k, _hook) for k in names if k in hooks.data})


def _where(value: JsonValue, path: str) -> str:
    where = string(value, path)
    if where not in ("host", "skill") and not where.startswith(("docker:", "mcp:")):
        raise wrong(path, "host, skill, docker:<image> or mcp:<server>", value)
    return where


def _tool(line: Fields) -> ToolRecord:
    return ToolRecord(
        tool=line.need("tool", string),
        raw_arguments=line.need("raw_arguments", _text),
        arguments=line.need("arguments", _arguments),
        outcome=line.need("outcome", _OUTCOME),
        started=line.need("started", boolean),
        where=line.need("where", _where),
        recovered_from_text=line.need("recovered_from_text", boolean),
        reason=line.need("reason", _text),
        rule=line.need("rule", _text),
        argv=line.need("argv", _argv),
        exit_code=line.need("exit_code", _exit),
        duration_s=line.need("duration_s", nullable(_seconds)),
        stdout=line.need("stdout", _text),
        stderr=line.need("stderr", _text),
        stdout_bytes=line.need("stdout_bytes", _count),
        stderr_bytes=line.need("stderr_bytes", _count),
        truncated=line.need("truncated", boolean),
        hooks=line.need("hooks", _hooks),
    )


def _asked(value: JsonValue, path: str) -> CallAsked:
    call = Fields(value, path)
    return call.done(CallAsked(call.need("name", string), call.need("arguments", _text)))


def _model(line: Fields) -> ModelRecord:
    return ModelRecord(
        latency_s=line.need("latency_s", _seconds),
        prompt_tokens=line.need("prompt_tokens", _count),
        completion_tokens=line.need("completion_tokens", _count),
        finish_reason=line.need("finish_reason", _text),
        tool_calls=line.need("tool_calls", each(_asked)),
        content=line.need("content", _text),
        attempts=line.need("attempts", integer(1)),
        cost_usd=line.may("cost_usd", _usd, None),
        cached=line.may("cached", boolean, False),
    )


def _check(value: JsonValue, path: str) -> Check:
    check = Fields(value, path)
    name, ok = check.need("check", string), check.need("ok", boolean)
    return check.done(Check(name, ok, check.need("detail", string)))


def _task(line: Fields) -> TaskRecord:
    return TaskRecord(
        status=line.need("status", _STATUS),
        reason=line.need("reason", string),
        checks=line.need("checks", each(_check)),
        duration_s=line.need("duration_s", _seconds),
        answer=line.need("answer", _text),
        prompt=line.may("prompt", _text, None),
        rerun=line.may("rerun", boolean, False),
        traceback=line.may("traceback", string, None),
    )


_KINDS: dict[str, Callable[[Fields], Record]] = {"tool": _tool, "model": _model, "task": _task}


def logged_record(value: JsonValue) -> LoggedRecord:
    """One record of calls.jsonl checked field by field (a `FieldError` names the first wrong
    one)."""
    line = Fields(value, "")
    read = line.need("kind", one_of(_KINDS))
    check_tree(line.data, RECORD_DEPTH_LIMIT)
    return line.done(
        LoggedRecord(
            line.need("ts", string),
            *_identity(line, ""),
            seq=line.need("seq", integer(1)),
            record=read(line),
            source=line.data,
        )
    )


def read_records(
    path: Path, runs: Collection[str], verdicts: Mapping[str, Status] | None = None
) -> tuple[LoggedRecord, ...]:
    """calls.jsonl's records, its lines split as they were written (`record_lines`). A line
    that is not a record of one of `runs` (the runs summary.json lists) is named, never
    copied; so is a run's second task record, or one whose status is not the one `verdicts`
    (summary.json's, by run) gives."""
    records: list[LoggedRecord] = []
    ended: set[str] = set()
    for number_, line in record_lines(read_text(path)):
        where = f"{path}:{number_}"
        document = _json(line, where, "a JSON record")
        try:
            record = logged_record(document)
        except FieldError as exc:
            raise ResultsError(f"{where}: not an mm-batch record: {exc}") from None
        if record.run not in runs:
            raise ResultsError(
                f"{where}: a record of {one_line(record.run, 120)}, a run that "
                f"{SUMMARY_JSON} does not list: the folder is damaged"
            )
        if isinstance(record.record, TaskRecord):
            said = (verdicts or {}).get(record.run, record.record.status)
            if record.run in ended or said != record.record.status:
                problem = f"status: {record.record.status}, but {SUMMARY_JSON} says {said}"
                problem = "a second task record of the run" if record.run in ended else problem
                raise ResultsError(f"{where}: {problem}: the folder is damaged")
            ended.add(record.run)
        records.append(record)
    return tuple(records)


def log_records(text: str) -> list[LoggedRecord]:
    """The records of a calls.jsonl this process wrote (its text as written); a line that is no
    record (none is) is skipped."""
    records = []
    for _, line in record_lines(text):
        try:
            records.append(logged_record(json.loads(line)))
        except (ValueError, RecursionError):  # FieldError is a ValueError
            continue
    return records
