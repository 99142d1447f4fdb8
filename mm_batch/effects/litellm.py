"""Model clients. This module is the only one that imports litellm, and only when a run needs it."""

from __future__ import annotations

import importlib.metadata
import os
import random
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from mm_batch.config.model import OWN_MODEL_OPTIONS
from mm_batch.plan import DEFAULT_MODEL_TIMEOUT_S
from mm_batch.run.ports import ModelError, ModelReply, ToolCallRequest

MODEL_TRIES = 3
_TRANSIENT_STATUS = {408, 409, 429}
_import_lock = threading.Lock()


class _SharedBackoff:
    """When a provider answers 429 to one run, every run of that model waits the same pause."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._until: dict[str, float] = {}

    def pause(self, model: str, seconds: float) -> None:
        with self._lock:
            self._until[model] = max(self._until.get(model, 0.0), time.monotonic() + seconds)

    def remaining(self, model: str) -> float:
        with self._lock:
            return max(0.0, self._until.get(model, 0.0) - time.monotonic())


SHARED_BACKOFF = _SharedBackoff()


def litellm_version() -> str:
    try:
        return importlib.metadata.version("litellm")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def load_litellm() -> Any:
    """Import litellm offline: no cost-map fetch, no .env loading, no banners."""
    with _import_lock:
        os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
        os.environ.setdefault("LITELLM_MODE", "PRODUCTION")
        os.environ.setdefault("LITELLM_TELEMETRY", "False")
        import litellm

        litellm.suppress_debug_info = True
        litellm.telemetry = False
        return litellm


def _status_code(exc: BaseException) -> int | None:
    code = getattr(exc, "status_code", None)
    return code if isinstance(code, int) else None


def is_transient(exc: BaseException) -> bool:
    """Connection errors, timeouts, 429 and 5xx are worth another try; nothing else is."""
    code = _status_code(exc)
    if code is not None:
        return code in _TRANSIENT_STATUS or code >= 500
    names = {c.__name__ for c in type(exc).__mro__}
    return bool(
        names
        & {"APIConnectionError", "Timeout", "APITimeoutError", "TimeoutError", "ConnectionError"}
    )


def _short(exc: BaseException, limit: int = 300) -> str:
    text = " ".join(str(exc).split())
    if len(text) > limit:
        text = text[: limit - 3] + "..."
    code = _status_code(exc)
    prefix = f"{type(exc).__name__}" + (f" (HTTP {code})" if code is not None else "")
    return f"{prefix}: {text}"


class LiteLLMClient:
    """Calls any litellm model; retries transient errors with backoff, and only those."""

    def __init__(
        self,
        model: str,
        options: Mapping[str, Any],
        *,
        timeout: float = DEFAULT_MODEL_TIMEOUT_S,
        tries: int = MODEL_TRIES,
        backoff_s: float = 1.0,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.model = model
        self.options = {k: v for k, v in options.items() if k not in OWN_MODEL_OPTIONS}
        self.timeout = timeout
        self.tries = tries
        self.backoff_s = backoff_s
        self._sleep = sleep

    def complete(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]], timeout: float
    ) -> ModelReply:
        litellm = load_litellm()
        call_timeout = max(1.0, min(self.timeout, timeout))
        started = time.monotonic()
        last: BaseException | None = None
        for attempt in range(1, self.tries + 1):
            wait = SHARED_BACKOFF.remaining(self.model)
            if wait > 0:
                self._sleep(wait)
            try:
                response = litellm.completion(
                    model=self.model,
                    messages=messages,
                    tools=tools or None,
                    timeout=call_timeout,
                    num_retries=0,
                    **self.options,
                )
            except Exception as exc:
                if not is_transient(exc):
                    raise ModelError(f"the model refused the request: {_short(exc)}") from exc
                last = exc
                if attempt < self.tries:
                    delay = self.backoff_s * 2 ** (attempt - 1) * (1 + random.random() / 4)
                    if _status_code(exc) == 429:
                        SHARED_BACKOFF.pause(self.model, delay)  # the others wait with this run
                    else:
                        self._sleep(delay)
                continue
            return _reply(response, time.monotonic() - started, attempt)
        assert last is not None
        raise ModelError(
            f"the model could not be reached after {self.tries} tries: {_short(last)}"
        ) from last


def _reply(response: Any, latency_s: float, attempts: int) -> ModelReply:
    try:
        choice = response.choices[0]
        message = choice.message
    except (AttributeError, IndexError, TypeError) as exc:
        raise ModelError("the model sent a response with no choices") from exc
    calls: list[ToolCallRequest] = []
    for i, call in enumerate(getattr(message, "tool_calls", None) or []):
        function = getattr(call, "function", None)
        name = getattr(function, "name", None)
        arguments = getattr(function, "arguments", None)
        calls.append(
            ToolCallRequest(
                id=str(getattr(call, "id", None) or f"call_{i}"),
                name=str(name or ""),
                raw_arguments=arguments
                if isinstance(arguments, str) or arguments is None
                else str(arguments),
            )
        )
    usage = getattr(response, "usage", None)
    content = getattr(message, "content", None)
    return ModelReply(
        text=content if isinstance(content, str) else None,
        tool_calls=tuple(calls),
        finish_reason=getattr(choice, "finish_reason", None),
        prompt_tokens=getattr(usage, "prompt_tokens", None),
        completion_tokens=getattr(usage, "completion_tokens", None),
        latency_s=latency_s,
        attempts=attempts,
    )
