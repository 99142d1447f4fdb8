"""What a model call's failure says: whether a server answered it and with which status,
whether another try may help, the wait a rate limit asks for, and the masked one-line reason
a record gives. Read alike from litellm's errors, OpenAI's SDK's, httpx's and the local
client's own (`effects.model_calls` asks and retries by it)."""

from __future__ import annotations

import email.utils
import re
from collections.abc import Iterator
from datetime import UTC, datetime

from mm_batch.config.secrets import Masker, folded, head

_TRANSIENT_STATUS = {408, 409, 429}
# Errors of a call that got no reply: litellm's, OpenAI's SDK's, httpx's, the standard library's.
_NO_REPLY = frozenset(
    {"APIConnectionError", "APITimeoutError", "Timeout", "TransportError"}
    | {"ConnectionError", "TimeoutError"}
)
# What litellm 1.110 says when a provider answered with something that is not a completion:
# a broken or hostile answer is not retried, it is named.
_MALFORMED_MARKS = ("Invalid response object", "Unable to get json response", "provider returned")
_DELTA_SECONDS = re.compile(r"[0-9]+(\.[0-9]+)?")
# A protobuf Duration in JSON, as a RetryInfo quotes it in an error's body: `"retryDelay": "37s"`.
_RETRY_DELAY = re.compile(r'"retryDelay"\s*:\s*"([0-9]+(?:\.[0-9]+)?)s"')
REASON_LIMIT = 300  # characters of a provider's error in a reason


def _chain(exc: BaseException) -> Iterator[BaseException]:
    """`exc`, then what caused it (its cause, else its context), each once."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        yield current
        seen.add(id(current))
        current = current.__cause__ or current.__context__


def _no_reply(exc: BaseException) -> bool:
    """The call got no reply at all (refused, reset, timed out), whatever status its error
    carries: litellm gives a refused connection a 500 of its own, its Timeout a 408."""
    return any(_NO_REPLY & {cls.__name__ for cls in type(e).__mro__} for e in _chain(exc))


def _status(exc: BaseException) -> int | None:
    """The status the error carries, whether a server said it or not."""
    code = getattr(exc, "status_code", None)
    return code if isinstance(code, int) and not isinstance(code, bool) else None


def status_code(exc: BaseException) -> int | None:
    """The HTTP status a failed call was answered with, where a server answered."""
    return None if _no_reply(exc) else _status(exc)


def is_malformed(exc: BaseException) -> bool:
    """The provider answered, but not with a chat completion (a 200 that cannot be read)."""
    return status_code(exc) == 200 or any(mark in str(exc) for mark in _MALFORMED_MARKS)


def missing_module(exc: BaseException) -> bool:
    """The call failed because a module it needs is not installed (a provider's SDK, which
    litellm reports as a connection error): no retry will install it."""
    return any(isinstance(e, ImportError) for e in _chain(exc))


def is_transient(exc: BaseException) -> bool:
    """Connection errors, timeouts, 429 and 5xx are worth another try; nothing else is."""
    if _no_reply(exc):
        return True
    code = _status(exc)
    return code is not None and (code in _TRANSIENT_STATUS or code >= 500)


def retry_after_s(exc: BaseException, now: datetime | None = None) -> float | None:
    """The wait a `Retry-After` header of the failed reply asks for (seconds or an HTTP date),
    else the `retryDelay` of a Google API's error body (`google.rpc.RetryInfo`: Gemini says
    its wait there, with no header)."""
    asked = _header_retry_after_s(exc, now)
    if asked is not None:
        return asked
    delay = _RETRY_DELAY.search(str(exc))
    return float(delay.group(1)) if delay else None


def _header_retry_after_s(exc: BaseException, now: datetime | None) -> float | None:
    value: object = None
    response = getattr(exc, "response", None)
    for headers in (
        getattr(exc, "litellm_response_headers", None),
        getattr(response, "headers", None),
        getattr(exc, "headers", None),
    ):
        getter = getattr(headers, "get", None)
        if callable(getter):
            value = getter("retry-after") or getter("Retry-After")
            if value:
                break
    if not isinstance(value, str):
        return None
    text = value.strip()
    if _DELTA_SECONDS.fullmatch(text):
        return float(text)  # never raises; a hostile 5000-digit value is inf, past any deadline
    try:
        when = email.utils.parsedate_to_datetime(text)
    except (TypeError, ValueError, IndexError, OverflowError):
        return None
    when = when.replace(tzinfo=when.tzinfo or UTC)  # a date without a zone is in UTC
    return max(0.0, (when - (now or datetime.now(UTC))).total_seconds())


def short_reason(exc: BaseException, masker: Masker, limit: int = REASON_LIMIT) -> str:
    """A provider's error as a reason: masked where it enters, before it is cut at its
    traceback, folded to one line and cut to `limit` characters (it may quote the key)."""
    masked = masker.quoted_by_others(str(exc))
    # litellm puts a traceback in some messages: the reason is what comes before it.
    before = masked.split("Traceback (most recent call last)")[0]
    text = folded(masker.text(before))
    if len(text) > limit:
        text = masker.text(head(text, limit - 3) + "...")
    code = status_code(exc)
    prefix = f"{type(exc).__name__}" + (f" (HTTP {code})" if code is not None else "")
    return f"{prefix}: {text}"
