"""What every model client does alike, whatever it speaks to: a turn retried on transient
failures with backoff and never past the task's deadline, a provider's error as a masked
one-line reason, and a completion's first choice read as a `ModelReply`.

litellm's client (`effects.litellm`) and the local models' own (`effects.llama_client`) both go
through here: a turn's retries, deadline, reasons and record are the same whichever asked.
"""

from __future__ import annotations

import functools
import json
import random
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Protocol, TypeAlias, TypeVar

from mm_batch.config.secrets import Masker
from mm_batch.effects.model_errors import (
    is_malformed,
    is_transient,
    missing_module,
    retry_after_s,
    short_reason,
    status_code,
)
from mm_batch.jsontypes import JsonValue
from mm_batch.run import threads
from mm_batch.run.ports import (
    ModelDeadlineError,
    ModelError,
    ModelRateLimitError,
    ModelReply,
    ToolCallRequest,
)

MODEL_TRIES = 3
# How long after its own timeout a call's thread may answer before it is given up on (an HTTP
# client's timeout bounds each read, not the whole reply: a trickling server is cut here).
CALL_GRACE_S = 1.0
DEADLINE_REASON = "the task's deadline came before the model answered"

T = TypeVar("T")

# A turn's chat messages and tool schemas in OpenAI's shape, as the run built them: JSON, read
# only, sent on as it is (in a request body, a cache key, to litellm).
Messages: TypeAlias = Sequence[Mapping[str, JsonValue]]
ToolSchemas: TypeAlias = Sequence[Mapping[str, JsonValue]]


class TurnClient(Protocol):
    """A model client as effects/ writes them: `run.ports.ModelClient`, taking the turn read
    only (any sequence of mappings), so that one client can wrap another (`cache.CachedClient`)."""

    def complete(self, messages: Messages, tools: ToolSchemas, timeout: float) -> ModelReply: ...


class _SharedBackoff:
    """When a provider answers 429 to one run, every run of that model waits the same pause;
    each remembers the wait the 429 asked (its `rate_limit_reason`)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._until: dict[str, tuple[float, str]] = {}

    def pause(self, key: str, seconds: float, asked: str = "") -> None:
        with self._lock:
            until = time.monotonic() + seconds
            if until > self._until.get(key, (0.0, ""))[0]:
                self._until[key] = (until, asked)

    def pending(self, key: str) -> tuple[float, str]:
        """Seconds left of the pause, and the wait its 429 asked."""
        with self._lock:
            until, asked = self._until.get(key, (0.0, ""))
            return max(0.0, until - time.monotonic()), asked


SHARED_BACKOFF = _SharedBackoff()


def _seconds(value: float) -> str:
    return f"{round(value, 1):g}"


def rate_limit_reason(asked: float | None, delay: float) -> str:
    """Why a run ends when a 429's wait would pass its deadline: the rate limit and the wait
    asked (`Retry-After`), else the backoff mm-batch would have waited (SPEC 6)."""
    wait = (
        f"Retry-After {_seconds(asked)} s" if asked is not None else f"backoff {_seconds(delay)} s"
    )
    return f"rate limited (429, {wait}): the task's deadline comes first"


class _OverdueError(Exception):
    """A call's thread did not answer within its timeout and grace."""


def _within(seconds: float, call: Callable[[], T]) -> T:
    """Run `call` on a thread of its own: its result, its exception, or `_OverdueError`."""
    pending = threads.start(call, "mm-batch-model-call")
    if not pending.wait(max(seconds, 0.0)):
        raise _OverdueError()
    return pending.result()


@dataclass(frozen=True)
class Retries:
    """How a client retries a turn: how many tries in all, the first backoff (doubled after
    each try, plus up to a quarter at random), how it sleeps, and its date (a test's clocks)."""

    tries: int = MODEL_TRIES
    backoff_s: float = 1.0
    sleep: Callable[[float], None] = time.sleep
    now: Callable[[], datetime] = lambda: datetime.now(UTC)


DEFAULT_RETRIES = Retries()


def ask(
    send: Callable[[float], T],
    *,
    call_timeout: float,
    deadline: float,
    pause_key: str,
    masker: Masker,
    retries: Retries,
) -> tuple[T, int]:
    """`send(timeout)`'s answer and the try that gave it. Connection errors, timeouts, 429 and
    5xx are tried again after a backoff (at least what `Retry-After` asks; a 429 pauses every
    run of `pause_key` alike); a malformed answer or a refusal is a `ModelError` at once, and
    no call, retry or wait outlives `deadline` (time.monotonic()): that is a
    `ModelDeadlineError`, a `ModelRateLimitError` where a 429's wait would pass it."""
    last: BaseException | None = None
    began = time.monotonic()
    for attempt in range(1, retries.tries + 1):
        paused, asked_then = SHARED_BACKOFF.pending(pause_key)
        if paused > 0 and time.monotonic() + paused >= deadline:
            # Another run's (or this run's) 429 asked for a pause that outlasts the task.
            raise ModelRateLimitError(
                asked_then or rate_limit_reason(None, paused),
                attempts=attempt - 1,
                latency_s=time.monotonic() - began,
            ) from last
        _wait(paused, deadline, retries.sleep)
        left = deadline - time.monotonic()
        if left <= 0:
            raise ModelDeadlineError(DEADLINE_REASON)
        timeout = min(call_timeout, left)
        try:
            return _within(timeout + CALL_GRACE_S, functools.partial(send, timeout)), attempt
        except _OverdueError:
            if time.monotonic() >= deadline:
                raise ModelDeadlineError(DEADLINE_REASON) from None
            last = TimeoutError(f"no answer within {timeout:g} s")
        except Exception as exc:
            if time.monotonic() >= deadline:
                raise ModelDeadlineError(DEADLINE_REASON) from exc
            if missing_module(exc):
                reason = short_reason(exc, masker)
                raise ModelError(f"the model's provider cannot be used here: {reason}") from exc
            if is_malformed(exc):
                reason = short_reason(exc, masker)
                raise ModelError(f"the model sent a malformed response: {reason}") from exc
            if not is_transient(exc):
                reason = short_reason(exc, masker)
                raise ModelError(f"the model refused the request: {reason}") from exc
            last = exc
        if attempt < retries.tries:
            delay = retries.backoff_s * 2 ** (attempt - 1) * (1 + random.random() / 4)
            asked = retry_after_s(last, retries.now())
            delay = max(delay, asked) if asked is not None else delay
            limited = status_code(last) == 429
            if time.monotonic() + delay >= deadline:
                if limited:  # said as what it is, with the wait asked: no mere timeout
                    raise ModelRateLimitError(
                        rate_limit_reason(asked, delay),
                        attempts=attempt,
                        latency_s=time.monotonic() - began,
                    ) from last
                raise ModelDeadlineError(DEADLINE_REASON) from last
            if limited:  # the others wait with this run
                SHARED_BACKOFF.pause(pause_key, delay, rate_limit_reason(asked, delay))
            else:
                retries.sleep(delay)
    assert last is not None
    reason = short_reason(last, masker)
    raise ModelError(
        f"the model could not be reached after {retries.tries} tries: {reason}"
    ) from last


def _wait(seconds: float, deadline: float, sleep: Callable[[float], None]) -> None:
    """Sleep, unless the wait would pass the deadline: then the task has timed out."""
    if seconds <= 0:
        return
    if time.monotonic() + seconds >= deadline:
        raise ModelDeadlineError(DEADLINE_REASON)
    sleep(seconds)


# -- a completion read as a reply ------------------------------------------------------------


def field(part: object, name: str) -> object:
    """A field of a part of a completion: a key of a JSON object as a server sent it, or an
    attribute of litellm's object for it; nothing of any other JSON value."""
    if isinstance(part, dict):
        return part.get(name)
    if part is None or isinstance(part, str | int | float | list):
        return None
    return getattr(part, name, None)


def text_of(value: object) -> str | None:
    return value if isinstance(value, str) else None


# What providers say of a turn that ended normally, which litellm rightly calls "stop" or
# "tool_calls". Whatever else it calls so is no normal end (SPEC 6): a reason litellm does not
# know (`model_length`, `max_output_tokens`, one a provider adds) or one it folds into "stop"
# (`ERROR`, `MALFORMED_FUNCTION_CALL`, `network_error`); the provider's word is kept for it.
NORMAL_NATIVE_FINISHES = frozenset(
    {
        *("stop", "tool_calls", "function_call"),  # OpenAI and the servers compatible with it
        *("end_turn", "stop_sequence", "tool_use"),  # Anthropic, Bedrock
        *("COMPLETE", "STOP_SEQUENCE", "TOOL_CALL"),  # Cohere
        *("eos", "eos_token"),  # Hugging Face, Together AI
        "STOP",  # Gemini, Vertex AI
    }
)
# litellm's names of a normal end.
LITELLM_NORMAL = ("stop", "tool_calls", "function_call")


def provider_finish(choice: object, folded: Sequence[str] = ()) -> str | None:
    """A turn's finish reason in the provider's own words where litellm would have said
    "stop" or "tool_calls" for something else (noted as it mapped, in `folded`, or kept by
    litellm as `native_finish_reason`, also in a reply stored in the response cache);
    otherwise litellm's name (`length`, `content_filter`)."""
    given = field(choice, "finish_reason")
    if given is None:
        return None
    reason = str(given)
    if reason not in LITELLM_NORMAL:
        return reason
    native = field(field(choice, "provider_specific_fields"), "native_finish_reason")
    said = (*(() if native is None else (str(native),)), *folded)
    return next((word for word in said if word not in NORMAL_NATIVE_FINISHES), reason)


def completion_problem(response: object) -> str | None:
    """Why a completion's JSON is not one (what litellm refuses to read as one), or None."""
    choices = field(response, "choices")
    if not isinstance(response, dict) or not isinstance(choices, list) or not choices:
        return "it has no choices"
    if not isinstance(response.get("usage"), dict | None):
        return "its usage is not an object"
    for choice in choices:
        message = field(choice, "message")
        if not isinstance(choice, dict) or not isinstance(message, dict):
            return "its choice has no message"
        if not isinstance(message.get("content"), str | None):
            return "its content is not text"
        calls = message.get("tool_calls")
        if not isinstance(calls, list | None):
            return "its tool_calls are not a list"
        for call in calls or ():
            function = field(call, "function")
            if not isinstance(function, dict):
                return "a tool call has no function"
            if not isinstance(function.get("name"), str | None):
                return "a tool call's name is not text"
            if not isinstance(function.get("arguments"), str | dict | None):
                return "a tool call's arguments are neither text nor an object"
    return None


# A token count past this is no count (and JSON readers in JavaScript lose its digits).
_COUNT_LIMIT = 2**53


def count_of(value: object) -> int | None:
    """A token count as reported; a negative, huge or non-integer one (a hostile or broken
    provider's) is unknown, so that every report keeps counts that add up."""
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < _COUNT_LIMIT:
        return value
    return None


def arguments_of(value: object) -> str:
    """Tool-call arguments as the string they should be: none as an empty string, an object
    some servers send as its JSON (as litellm writes both)."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    try:
        return json.dumps(value)
    except (TypeError, ValueError, RecursionError):
        return str(value)


# The parts of an assistant turn that litellm gives in provider-specific fields, where the
# provider must get them back on the next turn (SPEC 6): Anthropic's and Bedrock's signed
# thinking blocks (`thinking_blocks`; also inside `provider_specific_fields`), the reasoning text
# (`reasoning_content`: vLLM, DeepSeek, Ollama's `thinking`), and what litellm keeps of Gemini's
# thought signatures and Anthropic's compaction and server-tool blocks
# (`provider_specific_fields`). litellm translates each back into its provider's wire format,
# and leaves out what a provider does not take. A part the reply does not have is not sent.
MESSAGE_PARTS = ("thinking_blocks", "reasoning_content", "provider_specific_fields")
# Of a tool call, and of its function: Gemini's thought signature of the call.
CALL_PARTS = ("provider_specific_fields",)


def _plain(value: object, depth: int = 0) -> JsonValue:
    """JSON-like data of a part as litellm holds it (its pydantic objects as their fields);
    what is not data (or nests past any reply's depth) is left out."""
    if depth > 64:
        return None
    if value is None or isinstance(value, str | bool | int | float):
        return value
    dump = getattr(value, "model_dump", None)
    if callable(dump) and not isinstance(value, dict):
        try:
            value = dump()
        except Exception:
            return None
    if isinstance(value, dict):
        return {str(k): _plain(v, depth + 1) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v, depth + 1) for v in value]
    return None


def provider_parts(part: object, names: tuple[str, ...]) -> dict[str, JsonValue]:
    """The named provider-specific fields of a message or tool call, as data; empty ones
    (litellm's `None`, an empty object or list) left out."""
    kept: dict[str, JsonValue] = {}
    for name in names:
        value = _plain(field(part, name))
        if value is not None and value not in ({}, []):
            kept[name] = value
    return kept


def _call_parts(call: object) -> dict[str, JsonValue]:
    """A tool call's provider fields, with its function's under `function`."""
    parts = provider_parts(call, CALL_PARTS)
    inner = provider_parts(field(call, "function"), CALL_PARTS)
    return {**parts, "function": inner} if inner else parts


def read_reply(
    response: object,
    latency_s: float,
    attempts: int,
    *,
    finish: Callable[[object], str | None],
    cost: Callable[[int | None, int | None], float | None],
    cached: bool = False,
    keep_provider_parts: bool = False,
) -> ModelReply:
    """The first choice as a `ModelReply`; a reply that has none is a `ModelError`. `finish`
    reads the choice's finish reason, `cost` prices the turn from its token counts; `cached`:
    the response cache served it. `keep_provider_parts`: the turn's and its calls'
    provider-specific parts (`MESSAGE_PARTS`, `CALL_PARTS`) go into the reply, to be sent back."""
    choices = field(response, "choices")
    if not isinstance(choices, list | tuple) or not choices:
        raise ModelError("the model sent a malformed response: it has no choices")
    choice = choices[0]
    message = field(choice, "message")
    if message is None:
        raise ModelError("the model sent a malformed response: its choice has no message")
    raw_calls = field(message, "tool_calls")
    calls: list[ToolCallRequest] = []
    for i, call in enumerate(raw_calls if isinstance(raw_calls, list | tuple) else []):
        function = field(call, "function")
        call_id = field(call, "id")
        calls.append(
            ToolCallRequest(
                id=call_id if isinstance(call_id, str) and call_id else f"call_{i}",
                # A call without a usable name is answered as a call of no tool, never guessed.
                name=text_of(field(function, "name")) or "",
                raw_arguments=arguments_of(field(function, "arguments")),
                provider_fields=_call_parts(call) if keep_provider_parts else {},
            )
        )
    usage = field(response, "usage")
    prompt_tokens = count_of(field(usage, "prompt_tokens"))
    completion_tokens = count_of(field(usage, "completion_tokens"))
    return ModelReply(
        text=text_of(field(message, "content")),
        tool_calls=tuple(calls),
        finish_reason=finish(choice),
        prompt_tokens=prompt_tokens,
        completion_tokens=completion_tokens,
        latency_s=latency_s,
        attempts=attempts,
        cost_usd=0.0 if cached else cost(prompt_tokens, completion_tokens),
        cached=cached,
        provider_parts=provider_parts(message, MESSAGE_PARTS) if keep_provider_parts else {},
    )
