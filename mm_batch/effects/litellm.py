"""Model clients. This module is the only one that imports litellm, and only when a run needs it."""

from __future__ import annotations

import contextlib
import gc
import importlib
import importlib.metadata
import math
import threading
import time
from collections.abc import Callable, Mapping
from types import ModuleType

from mm_batch.config.local_catalog import local_model
from mm_batch.config.model import LOCAL_MODEL_OPTIONS, OWN_MODEL_OPTIONS
from mm_batch.config.secrets import Masker
from mm_batch.effects.litellm_patches import folded_finishes, import_patched, unlogged
from mm_batch.effects.model_calls import (
    MODEL_TRIES,
    Messages,
    Retries,
    ToolSchemas,
    ask,
    provider_finish,
    read_reply,
)
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

    def __init__(self, load: Callable[[], ModuleType]) -> None:
        self._load_module = load
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._done = threading.Event()
        self._module: ModuleType | None = None
        self._failure: BaseException | None = None

    def start(self) -> None:
        with self._lock:
            if self._thread is None:
                # A daemon: a configuration error exits at once, not once litellm is imported.
                self._thread = threading.Thread(
                    target=self._load, daemon=True, name="mm-batch-import-litellm"
                )
                self._thread.start()

    def result(self) -> ModuleType:
        self.start()
        self._done.wait()
        if self._failure is not None or self._module is None:
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


def _import_offline() -> ModuleType:
    """Import litellm offline and patched (`litellm_patches`).

    The collector is paused meanwhile: the import allocates about 600,000 objects, and the
    collections they trigger are a quarter of its time; what it leaves is litellm's modules,
    frozen, so that no later collection walks them again (during the runs either)."""
    collecting = gc.isenabled()
    gc.disable()
    try:
        litellm = import_patched()
        for name in _FIRST_CALL_MODULES:
            with contextlib.suppress(ImportError):
                importlib.import_module(name)
    finally:
        if collecting:
            gc.enable()
    gc.freeze()
    return litellm


class _Completion:
    """What one completion call gave: litellm's response, and the finish reasons the provider
    sent that litellm turned into a normal end (`litellm_patches.folded_finishes`)."""

    def __init__(self, response: object, folded: tuple[str, ...]) -> None:
        self.response = response
        self.folded = folded


def _completion(litellm: ModuleType, **kwargs: object) -> _Completion:
    """`litellm.completion`, unlogged (`litellm_patches.unlogged`), on the calling thread,
    noting the provider's finish reasons as it goes."""
    with folded_finishes() as seen, unlogged():
        response: object = litellm.completion(**kwargs)
    return _Completion(response, tuple(seen))


_IMPORT = BackgroundImport(_import_offline)


def start_litellm_import() -> None:
    """Begin importing litellm in the background (once a process): its seconds overlap the
    command's own start-up. `load_litellm` waits for this same import."""
    _IMPORT.start()


def load_litellm() -> ModuleType:
    """litellm, imported and set up (waiting for the import in flight, or starting it); raises
    `LiteLLMImportError`, for every caller, when it cannot be imported."""
    return _IMPORT.result()


class LiteLLMClient:
    """Calls any litellm model; retries transient errors with backoff, and only those (as
    every model client does: `model_calls.ask`)."""

    def __init__(
        self,
        model: str,
        options: Mapping[str, object],
        *,
        masker: Masker,
        timeout: float = DEFAULT_MODEL_TIMEOUT_S,
        tries: int = MODEL_TRIES,
        backoff_s: float = 1.0,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.model = model
        # What litellm is given beside the turn (and what a response cache keys it by).
        self.options = {
            k: v
            for k, v in options.items()
            if k not in OWN_MODEL_OPTIONS and k not in LOCAL_MODEL_OPTIONS
        }
        self.priced_as = price_model(model, self.options)
        self.masker = masker  # a provider's error may quote the key: masked where it enters
        self.timeout = timeout
        self.retries = Retries(tries, backoff_s, sleep)

    def complete(self, messages: Messages, tools: ToolSchemas, timeout: float) -> ModelReply:
        """One model turn, retried on transient errors; nothing outlives `timeout` seconds."""
        started = time.monotonic()
        litellm = load_litellm()
        completion, attempt = ask(
            lambda call_timeout: _completion(
                litellm,
                model=self.model,
                messages=messages,
                tools=tools or None,
                timeout=call_timeout,
                num_retries=0,
                **self.options,
            ),
            call_timeout=self.timeout,
            deadline=started + timeout,
            pause_key=f"{self.model}\0{self.options.get('api_base')}",
            masker=self.masker,
            retries=self.retries,
        )
        return _reply(
            completion.response,
            time.monotonic() - started,
            attempt,
            model=self.priced_as,
            folded_finishes=completion.folded,
        )


def price_model(model: str, options: Mapping[str, object]) -> str:
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
    response: object,
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
