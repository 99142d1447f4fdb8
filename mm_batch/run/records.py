"""The records of a task run — what calls.jsonl holds, what the judge and the reports read.

Every record is a frozen dataclass built by keyword. `fields(masker)` is its JSON line (less the
identity that `RunRecorder` stamps on it): secrets are masked in the text of each field, never in
the keys or the closed vocabularies, and text is cut to 1 MiB after masking.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from decimal import Decimal
from typing import ClassVar, Literal, Protocol

from mm_batch.config.secrets import Masked, Masker, head_bytes
from mm_batch.jsontypes import JsonObject, JsonValue

Outcome = Literal["ran", "refused", "invalid", "timeout", "error", "loop"]
Status = Literal["passed", "failed", "error"]
Kind = Literal["model", "tool", "task"]

TEXT_LIMIT = 1024 * 1024  # bytes of any one text a record keeps (model text, output, answer)


def timestamp() -> str:
    """RFC 3339, UTC, microseconds: 2026-12-02T15:04:05.123456Z."""
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def cut_text(text: Masked, limit: int = TEXT_LIMIT) -> str:
    """At most `limit` bytes of UTF-8, with a marker saying how much was cut; only a masked
    text is cut, so that a secret straddling the cut leaks no prefix."""
    kept, left_out = head_bytes(text, limit)
    if not left_out:
        return text
    total = len(kept.encode("utf-8", "surrogatepass")) + left_out
    return f"{kept}\n[... {total - limit} more bytes cut; {total} in all ...]"


def _text(masker: Masker, value: str | None, *, cut_before: bool = False) -> str | None:
    """Masked first, then cut: a secret straddling the cut leaks no prefix. `cut_before`: the
    text was cut short where it was captured (see `Masker.text`)."""
    if value is None:
        return None
    return cut_text(masker.text(value, cut=cut_before))


@dataclass(frozen=True)
class Check:
    """One expectation of the task, and whether it held."""

    name: str
    ok: bool
    detail: str

    def masked(self, masker: Masker) -> Check:
        return Check(masker.text(self.name), self.ok, masker.text(self.detail))

    def as_json(self) -> JsonObject:
        return {"check": self.name, "ok": self.ok, "detail": self.detail}


@dataclass(frozen=True)
class HookRecord:
    """One run of a pre- or post-call hook."""

    argv: tuple[str, ...]
    exit_code: int | None
    stdout: str
    stderr: str
    timed_out: bool
    error: str | None

    def as_json(self, masker: Masker) -> JsonObject:
        return {
            "argv": _argv(masker, self.argv),
            "exit_code": self.exit_code,
            "stdout": masker.text(self.stdout),
            "stderr": masker.text(self.stderr),
            "timed_out": self.timed_out,
            "error": None if self.error is None else masker.text(self.error),
        }


@dataclass(frozen=True)
class ToolRecord:
    """One tool call the model asked for, and what became of it."""

    kind: ClassVar[Kind] = "tool"
    tool: str
    raw_arguments: str | None
    arguments: Mapping[str, JsonValue] | None  # coerced; None: the call was not valid
    outcome: Outcome
    started: bool
    where: str
    recovered_from_text: bool = False
    reason: str | None = None
    rule: str | None = None
    argv: tuple[str, ...] | None = None
    exit_code: int | None = None
    duration_s: float | None = None
    stdout: str | None = None
    stderr: str | None = None
    stdout_bytes: int | None = None
    stderr_bytes: int | None = None
    truncated: bool = False  # the executor kept only the first bytes of a stream
    hooks: Mapping[str, HookRecord] = field(default_factory=dict)

    def fields(self, masker: Masker) -> JsonObject:
        arguments: JsonObject | None = None if self.arguments is None else dict(self.arguments)
        return {
            "tool": masker.text(self.tool),
            "raw_arguments": _text(masker, self.raw_arguments),
            "arguments": masker.data(arguments),
            "outcome": self.outcome,
            "reason": _text(masker, self.reason),
            "rule": self.rule,
            "argv": None if self.argv is None else _argv(masker, self.argv),
            "where": self.where,
            "started": self.started,
            "exit_code": self.exit_code,
            "duration_s": None if self.duration_s is None else round(self.duration_s, 6),
            "stdout": _text(masker, self.stdout, cut_before=self.truncated),
            "stderr": _text(masker, self.stderr, cut_before=self.truncated),
            "stdout_bytes": self.stdout_bytes,
            "stderr_bytes": self.stderr_bytes,
            "truncated": self.truncated,
            "recovered_from_text": self.recovered_from_text,
            "hooks": {k: h.as_json(masker) for k, h in self.hooks.items()} or None,
        }


@dataclass(frozen=True)
class CallAsked:
    """A tool call as the model wrote it, for the model record."""

    name: str
    arguments: str | None


@dataclass(frozen=True)
class ModelRecord:
    """One model turn."""

    kind: ClassVar[Kind] = "model"
    latency_s: float
    prompt_tokens: int | None
    completion_tokens: int | None
    finish_reason: str | None
    tool_calls: tuple[CallAsked, ...]
    content: str | None
    attempts: int
    cost_usd: float | None = None  # None where litellm knows no price for the model
    cached: bool = False  # answered from the response cache (`run --cache`): cost 0

    def fields(self, masker: Masker) -> JsonObject:
        return {
            "latency_s": round(self.latency_s, 6),
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "finish_reason": self.finish_reason,
            "tool_calls": [
                {"name": masker.text(c.name), "arguments": _text(masker, c.arguments)}
                for c in self.tool_calls
            ],
            "content": _text(masker, self.content),
            "attempts": self.attempts,
            "cost_usd": self.cost_usd,
            "cached": self.cached,
        }


@dataclass(frozen=True)
class TaskRecord:
    """The verdict of a task run: always its last record."""

    kind: ClassVar[Kind] = "task"
    status: Status
    reason: str
    checks: tuple[Check, ...]
    duration_s: float
    answer: str | None
    prompt: str | None = None  # the task's, so that a report of merged shards can show it
    rerun: bool = False  # a run of `--rerun-failed`: it failed or erred in the results before
    traceback: str | None = None

    def fields(self, masker: Masker) -> JsonObject:
        data: JsonObject = {
            "status": self.status,
            "checks": [c.masked(masker).as_json() for c in self.checks],
            "duration_s": round(self.duration_s, 6),
            "reason": masker.text(self.reason),
            "answer": _text(masker, self.answer),
            "prompt": _text(masker, self.prompt),
            "rerun": self.rerun,
        }
        if self.traceback is not None:
            data["traceback"] = masker.text(self.traceback)
        return data


Record = ToolRecord | ModelRecord | TaskRecord


@dataclass(frozen=True)
class RunResult:
    """What the reports need of a finished task run; its texts are masked already."""

    run_id: str
    task: str
    model: str
    repeat: int
    status: Status
    reason: str
    checks: tuple[Check, ...]
    duration_s: float
    answer: str | None
    calls: tuple[str, ...]
    line: int = 0  # the task's line in the tasks file
    index: int = 0  # the run's position in the whole plan
    failed_calls: tuple[str, ...] = ()  # the lines of `calls` that exited non-zero with stderr
    rerun: bool = False  # run again by `--rerun-failed`
    # What the run's model turns used, summed; None where unknown (a cost litellm could not
    # price, a run read back from results written before these were counted).
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    cost_usd: float | None = None


COST_LIMIT_REASON = "cost limit reached"  # the reason of a run `--max-cost` did not start


def usd(amount: float) -> str:
    """An amount of USD in plain decimals, to 12 significant digits and no exponent:
    0.0000135, 1.25, 0.000000001."""
    if not math.isfinite(amount):
        return str(amount)
    text = format(Decimal(f"{amount:.12g}"), "f")
    if "." in text:
        text = text.rstrip("0").rstrip(".")
    return text if text not in ("", "-0") else "0"


def total_usd(amounts: Iterable[float | None]) -> float | None:
    """The exact sum of the amounts (math.fsum: no drift over many small costs), or None when
    any is unknown or the sum is beyond what a float holds."""
    known: list[float] = []
    for amount in amounts:
        if amount is None:
            return None
        known.append(amount)
    try:
        total = math.fsum(known)
    except OverflowError:
        return None
    return total if math.isfinite(total) else None


def usage(result: RunResult, turns: Sequence[ModelRecord]) -> RunResult:
    """The result with what its model turns used: the tokens they reported, and their cost,
    unknown (None) when any turn's is."""
    return replace(
        result,
        prompt_tokens=sum(t.prompt_tokens or 0 for t in turns),
        completion_tokens=sum(t.completion_tokens or 0 for t in turns),
        cost_usd=total_usd(t.cost_usd for t in turns),
    )


class Recorder(Protocol):
    """Where record lines go (calls.jsonl in production, a list in tests)."""

    def write(self, record: JsonObject) -> None: ...


class RunRecorder:
    """Stamps each record of one task run with its identity and its sequence number."""

    def __init__(
        self, recorder: Recorder, masker: Masker, run: str, task: str, model: str, repeat: int
    ) -> None:
        self._recorder = recorder
        self.masker = masker
        self._identity: JsonObject = {
            "run": masker.text(run),
            "task": masker.text(task),
            "model": masker.text(model),
            "repeat": repeat,
        }
        self._seq = 0
        self._closed = False
        self._lock = threading.Lock()
        self.records: list[Record] = []
        self.final: TaskRecord | None = None

    def emit(self, record: Record) -> None:
        with self._lock:
            self._write(record)

    def close_with(self, record: TaskRecord) -> TaskRecord:
        """Write the run's last record and close; the record that stands is returned (an
        earlier one, when another thread closed the run first)."""
        with self._lock:
            if self.final is None:
                self._write(record)
                self.final = record
            self._closed = True
            return self.final

    def _write(self, record: Record) -> None:
        if self._closed:
            return
        self._seq += 1
        self.records.append(record)
        line: JsonObject = {
            "ts": timestamp(),
            **self._identity,
            "seq": self._seq,
            "kind": record.kind,
            **record.fields(self.masker),
        }
        self._recorder.write(line)

    def tools(self) -> Sequence[ToolRecord]:
        with self._lock:
            return [r for r in self.records if isinstance(r, ToolRecord)]

    def turns(self) -> Sequence[ModelRecord]:
        with self._lock:
            return [r for r in self.records if isinstance(r, ModelRecord)]


def _argv(masker: Masker, argv: tuple[str, ...]) -> list[JsonValue]:
    """An argv as records keep it: each entry masked, a secret split over entries too."""
    return [*masker.argv(argv)]
