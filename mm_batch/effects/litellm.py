"""Model clients. This module is the only one that imports litellm, and only when a run needs it."""

from __future__ import annotations

import contextlib
import gc
import importlib.metadata
import logging
import math
import os
import sys
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from mm_batch.config.local_catalog import local_model
from mm_batch.config.model import LOCAL_MODEL_OPTIONS, OWN_MODEL_OPTIONS
from mm_batch.config.secrets import Masker
from mm_batch.effects.cache import CacheUse, cache_kwargs, served
from mm_batch.effects.model_calls import MODEL_TRIES, Retries, ask, read_reply
from mm_batch.errors import UsageError
from mm_batch.plan import DEFAULT_MODEL_TIMEOUT_S
from mm_batch.run.ports import ModelReply


def litellm_version() -> str:
    try:
        return importlib.metadata.version("litellm")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


class LiteLLMImportError(UsageError):
    """litellm cannot be imported: the installation is broken, and no model can be asked."""


# What litellm 1.110's first completion imports (a tiktoken encoding, the proxy's types, the
# HTTP/1.1 stack): imported with litellm instead, off the first request's path. A name a later
# litellm moved is skipped: only the head start is lost.
_FIRST_CALL_MODULES = (
    "litellm.litellm_core_utils.default_encoding",
    "litellm.proxy.openai_files_endpoints.common_utils",
    "httpcore",
    "h11",
)


class BackgroundImport:
    """litellm's one import in this process, on a thread of its own: started as early as a
    command knows it will need litellm, waited for by whatever needs it, failed for all alike."""

    def __init__(self, load: Callable[[], Any]) -> None:
        self._load_module = load
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._done = threading.Event()
        self._module: Any = None
        self._failure: BaseException | None = None

    def start(self) -> None:
        with self._lock:
            if self._thread is None:
                # A daemon: a configuration error exits at once, not once litellm is imported.
                self._thread = threading.Thread(
                    target=self._load, daemon=True, name="mm-batch-import-litellm"
                )
                self._thread.start()

    def result(self) -> Any:
        self.start()
        self._done.wait()
        if self._failure is not None:
            failure = self._failure
            raise LiteLLMImportError(
                f"litellm cannot be imported ({type(failure).__name__}: {failure}); "
                "reinstall mm-batch with its dependencies"
            ) from failure
        return self._module

    def _load(self) -> None:
        try:
            self._module = self._load_module()
        except BaseException as exc:  # handed to every caller of `result`
            self._failure = exc
        finally:
            self._done.set()


def _import_offline() -> Any:
    """Import litellm offline: no cost-map fetch, no .env loading, no banners.

    The collector is paused meanwhile: the import allocates about 600,000 objects, and the
    collections they trigger are a quarter of its time; what it leaves is litellm's modules,
    frozen, so that no later collection walks them again (during the runs either)."""
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    os.environ.setdefault("LITELLM_MODE", "PRODUCTION")
    os.environ.setdefault("LITELLM_TELEMETRY", "False")
    collecting = gc.isenabled()
    gc.disable()
    try:
        import litellm

        litellm.suppress_debug_info = True
        litellm.telemetry = False
        _silence_logs()
        _tolerate_unreadable_arguments()
        _keep_native_finishes()
        _skip_litellm_pricing()
        for name in _FIRST_CALL_MODULES:
            with contextlib.suppress(ImportError):
                importlib.import_module(name)
    finally:
        if collecting:
            gc.enable()
    gc.freeze()
    return litellm


def _unlogged(litellm: Any, **kwargs: Any) -> Any:
    """`litellm.completion` as an internal sub-call: litellm then skips its success logging.

    mm-batch records every call itself and registers no litellm callback, yet for each call
    litellm builds its standard logging payload on its own executor threads: a third of its
    CPU per call, under the one interpreter lock, so at 16 jobs it slowed every other run's
    turn. An internal sub-call is one whose parent logs it; here the parent is mm-batch's
    records. Its response cache is written before that logging, so it works as before."""
    context = importlib.import_module("litellm._internal_context")
    with context.internal_sub_call():
        return litellm.completion(**kwargs)


class _Completion:
    """What one completion call gave: litellm's response, and the finish reasons the provider
    sent that litellm turned into a normal end (see `_keep_native_finishes`)."""

    def __init__(self, response: Any, folded_finishes: tuple[str, ...]) -> None:
        self.response = response
        self.folded_finishes = folded_finishes


def _completion(litellm: Any, **kwargs: Any) -> _Completion:
    """`_unlogged`, on the calling thread, noting the provider's finish reasons as it goes."""
    seen: list[str] = []
    _FOLDED.reasons = seen
    try:
        return _Completion(_unlogged(litellm, **kwargs), tuple(seen))
    finally:
        _FOLDED.reasons = None


def _silence_logs() -> None:
    """litellm logs its own warnings and errors to stderr, unmasked (a provider's error text
    may quote a key) and through the live progress line: what matters of them reaches the
    records and reports, masked."""
    for name in ("LiteLLM", "LiteLLM Router", "LiteLLM Proxy"):
        logger = logging.getLogger(name)
        logger.handlers.clear()
        logger.addHandler(logging.NullHandler())
        logger.propagate = False


_IMPORT = BackgroundImport(_import_offline)


def start_litellm_import() -> None:
    """Begin importing litellm in the background (once a process): its seconds overlap the
    command's own start-up. `load_litellm` waits for this same import."""
    _IMPORT.start()


def load_litellm() -> Any:
    """litellm, imported and set up (waiting for the import in flight, or starting it); raises
    `LiteLLMImportError`, for every caller, when it cannot be imported."""
    return _IMPORT.result()


_READER = "litellm.litellm_core_utils.llm_response_utils.convert_dict_to_response"
_FIXER = "handle_invalid_parallel_tool_calls"


def _tolerate_unreadable_arguments() -> None:
    """litellm json.loads every tool call's arguments (to undo one OpenAI quirk) and lets all but
    JSONDecodeError escape: a 5000-digit integer or deep nesting loses the whole reply. Such
    arguments are the model's mistake, answered as an invalid call: litellm keeps them as sent."""
    module = importlib.import_module(_READER)
    original = getattr(module, _FIXER, None)
    if original is None or getattr(original, "mm_batch_tolerant", False):
        return

    def tolerant(tool_calls: Any) -> Any:
        try:
            return original(tool_calls)
        except (ValueError, RecursionError):  # raised before it changed anything
            return tool_calls

    tolerant.mm_batch_tolerant = True  # type: ignore[attr-defined]
    # Where litellm imported it by name, the name is rebound too.
    for name, loaded in list(sys.modules.items()):
        if name.startswith("litellm") and getattr(loaded, _FIXER, None) is original:
            setattr(loaded, _FIXER, tolerant)


_FINISH_MODULE = "litellm.litellm_core_utils.core_helpers"
_FINISH_MAPPER = "map_finish_reason"
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
_LITELLM_NORMAL = ("stop", "tool_calls", "function_call")
_FOLDED = threading.local()  # `reasons`: the list a completion on this thread notes into


def _keep_native_finishes() -> None:
    """litellm maps every provider's finish reason through one function, which calls "stop"
    any reason it does not know: a cut or filtered answer would pass. That function is wrapped
    so that, during a completion of `_completion` on the same thread, each reason it folds into
    a normal end is noted as the provider sent it. litellm's own answer is unchanged."""
    module = importlib.import_module(_FINISH_MODULE)
    original = getattr(module, _FINISH_MAPPER, None)
    if original is None or getattr(original, "mm_batch_native", False):
        return

    def noting(finish_reason: Any) -> Any:
        mapped = original(finish_reason)
        seen = getattr(_FOLDED, "reasons", None)
        if (
            seen is not None
            and mapped in _LITELLM_NORMAL
            and str(finish_reason) not in NORMAL_NATIVE_FINISHES
        ):
            seen.append(str(finish_reason))
        return mapped

    noting.mm_batch_native = True  # type: ignore[attr-defined]
    # Where litellm imported it by name, the name is rebound too.
    for name, loaded in list(sys.modules.items()):
        if name.startswith("litellm") and getattr(loaded, _FINISH_MAPPER, None) is original:
            setattr(loaded, _FINISH_MAPPER, noting)


def provider_finish(choice: Any, folded: tuple[str, ...] = ()) -> str | None:
    """A turn's finish reason in the provider's own words where litellm would have said
    "stop" or "tool_calls" for something else (noted as it mapped, in `folded`, or kept by
    litellm as `native_finish_reason`, also in a reply replayed from the cache); otherwise
    litellm's name (`length`, `content_filter`)."""
    given = getattr(choice, "finish_reason", None)
    if given is None:
        return None
    reason = str(given)
    if reason not in _LITELLM_NORMAL:
        return reason
    fields = getattr(choice, "provider_specific_fields", None)
    native: object = fields.get("native_finish_reason") if isinstance(fields, dict) else None
    said = (*(() if native is None else (str(native),)), *folded)
    return next((word for word in said if word not in NORMAL_NATIVE_FINISHES), reason)


_LOGGING = "litellm.litellm_core_utils.litellm_logging"


def _skip_litellm_pricing() -> None:
    """litellm prices every response as it reads it, for its logging payload and its response
    headers; mm-batch prices each turn itself from the token counts (`_cost_usd`) and reads
    nothing of litellm's price. For a model litellm has no price for (`hosted_vllm/`, the local
    models) that calculation is about 100 regular-expression searches a call, then a zero-cost
    diagnostic: 30 % of litellm's CPU per call, under the one interpreter lock that every run of
    a batch shares. So litellm's calculation answers "no cost" at once."""
    logging_class = getattr(importlib.import_module(_LOGGING), "Logging", None)
    if logging_class is None or not hasattr(logging_class, "response_cost_calculator"):
        return  # a litellm that moved it: its calculation runs, and nothing else changes

    def no_price(self: object, *args: object, **kwargs: object) -> None:
        return None

    logging_class.response_cost_calculator = no_price
    logging_class._response_cost_calculator = no_price


class LiteLLMClient:
    """Calls any litellm model; retries transient errors with backoff, and only those (as
    every model client does: `model_calls.ask`)."""

    def __init__(
        self,
        model: str,
        options: Mapping[str, Any],
        *,
        masker: Masker,
        timeout: float = DEFAULT_MODEL_TIMEOUT_S,
        tries: int = MODEL_TRIES,
        backoff_s: float = 1.0,
        sleep: Callable[[float], None] = time.sleep,
        cache: CacheUse | None = None,
    ) -> None:
        self.model = model
        self.options = {
            k: v
            for k, v in options.items()
            if k not in OWN_MODEL_OPTIONS and k not in LOCAL_MODEL_OPTIONS
        }
        self.priced_as = price_model(model, self.options)
        self.masker = masker  # a provider's error may quote the key: masked where it enters
        self.timeout = timeout
        self.cache = cache  # how the run uses the response cache, once `effects.cache.install` ran
        self.retries = Retries(tries, backoff_s, sleep)

    def complete(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]], timeout: float
    ) -> ModelReply:
        """One model turn, retried on transient errors; nothing outlives `timeout` seconds."""
        started = time.monotonic()
        litellm = load_litellm()
        cached = cache_kwargs(self.cache, self.model, messages, tools, self.options)
        completion, attempt = ask(
            lambda call_timeout: _completion(
                litellm,
                model=self.model,
                messages=messages,
                tools=tools or None,
                timeout=call_timeout,
                num_retries=0,
                **self.options,
                **cached,
            ),
            call_timeout=self.timeout,
            deadline=started + timeout,
            pause_key=f"{self.model}\0{self.options.get('api_base')}",
            masker=self.masker,
            retries=self.retries,
        )
        # Only the cache's own word says a reply came from it, never the reply's body.
        hit = bool(cached) and served(litellm, cached["cache_key"])
        return _reply(
            completion.response,
            time.monotonic() - started,
            attempt,
            model=self.priced_as,
            cached=hit,
            folded_finishes=completion.folded_finishes,
        )


def price_model(model: str, options: Mapping[str, Any]) -> str:
    """The model whose prices a turn costs: `model_options.base_model` when given (an Azure
    deployment's name says nothing of the model behind it: litellm's documented way), else the
    model string itself (SPEC 6)."""
    base = options.get("base_model")
    return base if isinstance(base, str) and base.strip() else model


def _usd(value: object) -> float | None:
    """A cost as litellm gives it: a finite amount of at least 0, else unknown."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        amount = float(value)
        if math.isfinite(amount) and amount >= 0:
            return amount
    return None


def _cost_usd(model: str, prompt_tokens: int | None, completion_tokens: int | None) -> float | None:
    """What the turn cost by litellm's bundled price map (offline: see `_import_offline`), for
    the model asked and the token counts reported (checked by `model_calls.count_of`); None
    where litellm knows no price for the model or a count is missing. Nothing else the reply
    says about its cost is believed (a provider's body can claim a price, a cache hit or
    another model). A lookup that raises is an unknown cost, never the end of a run."""
    if prompt_tokens is None or completion_tokens is None or not knows_price(model):
        return None
    try:
        prompt_cost, completion_cost = load_litellm().cost_per_token(
            model=model, prompt_tokens=prompt_tokens, completion_tokens=completion_tokens
        )
        return _usd(prompt_cost + completion_cost)
    except Exception:
        return None


_PRICED: dict[str, bool] = {}  # a lookup of the price map per model, once a process


def knows_price(model: str) -> bool:
    """Whether litellm's bundled price map has a price for the model's tokens (never for a
    `local/` model, whose server litellm reaches as an unpriced `hosted_vllm/` one)."""
    if local_model(model) is not None:
        return False  # and litellm is not imported for it
    known = _PRICED.get(model)
    if known is None:
        try:
            info = load_litellm().get_model_info(model)
            prices = (info.get(k) for k in ("input_cost_per_token", "output_cost_per_token"))
            known = any(_usd(price) for price in prices)
        except Exception:  # litellm raises when the model is not in its map
            known = False
        _PRICED[model] = known
    return known


def _reply(
    response: Any,
    latency_s: float,
    attempts: int,
    *,
    model: str,
    cached: bool = False,
    folded_finishes: tuple[str, ...] = (),
) -> ModelReply:
    """The first choice as a `ModelReply`; a reply that has none is a `ModelError`. `cached`:
    the response cache served it (a cached turn costs nothing). Its finish reason is the
    provider's own where litellm folded it into a normal end (`provider_finish`)."""
    return read_reply(
        response,
        latency_s,
        attempts,
        finish=lambda choice: provider_finish(choice, folded_finishes),
        cost=lambda prompt, completion: _cost_usd(model, prompt, completion),
        cached=cached,
        keep_provider_parts=True,
    )
