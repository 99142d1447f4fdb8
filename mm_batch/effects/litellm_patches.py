"""Every change mm-batch makes to litellm's own code and settings, in one place, applied by
one function (`import_patched`) when litellm is imported.

Each patch names the litellm internal it replaces (pinned: litellm 1.110) and keeps litellm's
answer where it can; where a later litellm moved that internal, the patch is skipped and only
its gain is lost. `tests/effects/test_litellm_patches.py` fails when one of them moves, so that
an upgrade says what it broke instead of quietly losing a patch.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import os
import sys
import threading
from collections.abc import Callable, Iterator
from types import ModuleType

from mm_batch.effects.model_calls import LITELLM_NORMAL, NORMAL_NATIVE_FINISHES

# Set (where the user has not) before litellm is imported: its bundled price map, never a
# fetch of the newest one at import; production mode (no .env loading).
OFFLINE_ENVIRONMENT = {"LITELLM_LOCAL_MODEL_COST_MAP": "True", "LITELLM_MODE": "PRODUCTION"}
LOGGERS = ("LiteLLM", "LiteLLM Router", "LiteLLM Proxy")

READER_MODULE = "litellm.litellm_core_utils.llm_response_utils.convert_dict_to_response"
FIXER = "handle_invalid_parallel_tool_calls"
FINISH_MODULE = "litellm.litellm_core_utils.core_helpers"
FINISH_MAPPER = "map_finish_reason"
LOGGING_MODULE = "litellm.litellm_core_utils.litellm_logging"
PRICERS = ("response_cost_calculator", "_response_cost_calculator")
CONTEXT_MODULE = "litellm._internal_context"
SUB_CALL = "internal_sub_call"

_FOLDED = threading.local()  # `reasons`: the list a completion on this thread notes into
# What each patch replaced, by the patched name (what the canary tests check litellm still has).
ORIGINALS: dict[str, object] = {}


def import_patched() -> ModuleType:
    """Import litellm offline (`OFFLINE_ENVIRONMENT`), quiet, and patched."""
    for name, value in OFFLINE_ENVIRONMENT.items():
        os.environ.setdefault(name, value)
    import litellm

    litellm.suppress_debug_info = True  # no "Provider List" or "Give Feedback" banners
    _silence_logs()
    _tolerate_unreadable_arguments()
    _note_folded_finishes()
    _skip_litellm_pricing()
    return litellm


def _silence_logs() -> None:
    """litellm logs its own warnings and errors to stderr, unmasked (a provider's error text
    may quote a key) and through the live progress line: what matters of them reaches the
    records and reports, masked."""
    for name in LOGGERS:
        logger = logging.getLogger(name)
        logger.handlers.clear()
        logger.addHandler(logging.NullHandler())
        logger.propagate = False


def _rebind(name: str, original: object, replacement: object) -> None:
    """Replace a litellm function everywhere litellm imported it by name."""
    for module_name, loaded in list(sys.modules.items()):
        if module_name.startswith("litellm") and getattr(loaded, name, None) is original:
            setattr(loaded, name, replacement)


def _tolerate_unreadable_arguments() -> None:
    """litellm json.loads every tool call's arguments (to undo one OpenAI quirk) and lets all but
    JSONDecodeError escape: a 5000-digit integer or deep nesting loses the whole reply. Such
    arguments are the model's mistake, answered as an invalid call: litellm keeps them as sent."""
    original = getattr(importlib.import_module(READER_MODULE), FIXER, None)
    if not callable(original) or getattr(original, "mm_batch_tolerant", False):
        return
    fix: Callable[[object], object] = original

    def tolerant(tool_calls: object) -> object:
        try:
            return fix(tool_calls)
        except (ValueError, RecursionError):  # raised before it changed anything
            return tool_calls

    tolerant.mm_batch_tolerant = True  # type: ignore[attr-defined]
    ORIGINALS[FIXER] = original
    _rebind(FIXER, original, tolerant)


def _note_folded_finishes() -> None:
    """litellm maps every provider's finish reason through one function, which calls "stop"
    any reason it does not know: a cut or filtered answer would pass. That function is wrapped
    so that, inside `folded_finishes` on the same thread, each reason it folds into a normal
    end is noted as the provider sent it. litellm's own answer is unchanged."""
    original = getattr(importlib.import_module(FINISH_MODULE), FINISH_MAPPER, None)
    if not callable(original) or getattr(original, "mm_batch_native", False):
        return
    mapper: Callable[[object], object] = original

    def noting(finish_reason: object) -> object:
        mapped = mapper(finish_reason)
        seen: list[str] | None = getattr(_FOLDED, "reasons", None)
        if (
            seen is not None
            and mapped in LITELLM_NORMAL
            and str(finish_reason) not in NORMAL_NATIVE_FINISHES
        ):
            seen.append(str(finish_reason))
        return mapped

    noting.mm_batch_native = True  # type: ignore[attr-defined]
    ORIGINALS[FINISH_MAPPER] = original
    _rebind(FINISH_MAPPER, original, noting)


@contextlib.contextmanager
def folded_finishes() -> Iterator[list[str]]:
    """The finish reasons litellm folds into a normal end on this thread meanwhile, as the
    provider sent them (read by `model_calls.provider_finish`)."""
    seen: list[str] = []
    _FOLDED.reasons = seen
    try:
        yield seen
    finally:
        _FOLDED.reasons = None


def _skip_litellm_pricing() -> None:
    """litellm prices every response as it reads it, for its logging payload and its response
    headers; mm-batch prices each turn itself from the token counts and reads nothing of
    litellm's price. For a model litellm has no price for (`hosted_vllm/`, the local models)
    that calculation is about 100 regular-expression searches a call, then a zero-cost
    diagnostic: 30 % of litellm's CPU per call, under the one interpreter lock that every run of
    a batch shares. So litellm's calculation answers "no cost" at once."""
    logging_class = getattr(importlib.import_module(LOGGING_MODULE), "Logging", None)
    if logging_class is None or not all(hasattr(logging_class, name) for name in PRICERS):
        return  # a litellm that moved it: its calculation runs, and nothing else changes

    def no_price(self: object, *args: object, **kwargs: object) -> None:
        return None

    for name in PRICERS:
        ORIGINALS.setdefault(f"Logging.{name}", getattr(logging_class, name))
        setattr(logging_class, name, no_price)


def unlogged() -> contextlib.AbstractContextManager[None]:
    """A `litellm.completion` inside is an internal sub-call: litellm then skips its success
    logging.

    mm-batch records every call itself and registers no litellm callback, yet for each call
    litellm builds its standard logging payload on its own executor threads: a third of its
    CPU per call, under the one interpreter lock, so at 16 jobs it slowed every other run's
    turn. An internal sub-call is one whose parent logs it; here the parent is mm-batch's
    records."""
    sub_call: Callable[[], contextlib.AbstractContextManager[None]] = getattr(
        importlib.import_module(CONTEXT_MODULE), SUB_CALL
    )
    return sub_call()
