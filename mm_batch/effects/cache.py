"""The model response cache: a folder of JSON files, one per request, read and written by
litellm's own caching (its per-request controls make the modes). litellm 1.110 ships no disk
backend any more, so this module is that backend.

The folder is input like any other, and may come from anywhere (a CI cache, a checkout): a file
that cannot be used, whatever it holds, is a miss and the model is asked; nothing in it is ever
unpickled or executed, and no read can block or take unbounded memory.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import stat
import tempfile
import threading
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import click

from mm_batch.config.model import CacheMode, CacheSettings
from mm_batch.config.paths import display_path
from mm_batch.config.secrets import Masker
from mm_batch.errors import UsageError
from mm_batch.report.files import ResultsFolder

FORMAT = "mm-batch-cache/1"
MAX_ENTRY_BYTES = 32 * 1024 * 1024  # far above any completion: a bigger file is not ours
# Where and how a request is sent, not what it asks: a local model's server listens on a new
# port each run, and a timeout or a key changes no reply. Everything else litellm is given is
# in the key, provider-specific options too.
UNKEYED_OPTIONS = frozenset({"api_base", "base_url", "api_key", "timeout", "num_retries"})
# litellm's per-request cache controls: "no-cache" skips the lookup, "no-store" the write.
_CONTROLS: dict[CacheMode, dict[str, bool]] = {
    "read": {"no-store": True},
    "write": {"no-cache": True},
    "readwrite": {},
}
_KEY_RE = re.compile(r"[0-9a-f]{64}")
_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)


@dataclass(frozen=True)
class CacheUse:
    """How one task run uses the cache: the mode, and its repeat, which is in every key, so
    that each repeat replays its own replies and repeats stay separate trials."""

    mode: CacheMode
    repeat: int = 1


def cache_use(settings: CacheSettings | None, repeat: int) -> CacheUse | None:
    return None if settings is None else CacheUse(settings.mode, repeat)


def request_key(
    model: str,
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]],
    options: Mapping[str, Any],
    repeat: int = 1,
) -> str:
    """The cache key: a digest of the request as it matters (model, messages, tools, and the
    options that shape the reply) and of the repeat, the same whenever they are."""
    material = {
        "format": FORMAT,
        "repeat": repeat,
        "model": model,
        "messages": messages,
        "tools": tools or None,
        "options": {k: v for k, v in options.items() if k not in UNKEYED_OPTIONS},
    }
    text = json.dumps(
        material, sort_keys=True, ensure_ascii=True, separators=(",", ":"), default=str
    )
    return hashlib.sha256(text.encode("ascii")).hexdigest()


def cache_kwargs(
    use: CacheUse | None,
    model: str,
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]],
    options: Mapping[str, Any],
) -> dict[str, Any]:
    """What `litellm.completion` gets for the cache: nothing when it is off; else our key (in
    place of litellm's, which leaves provider-specific options out) and the mode's controls."""
    if use is None:
        return {}
    return {
        "caching": True,
        "cache": dict(_CONTROLS[use.mode]),
        "cache_key": request_key(model, messages, tools, options, use.repeat),
    }


def _read_entry(path: Path) -> bytes:
    """A regular file's bytes, never through a link, never blocking (a FIFO), bounded: else
    an OSError (FileNotFoundError: no entry) or a ValueError."""
    fd = os.open(path, _READ_FLAGS)
    with os.fdopen(fd, "rb") as handle:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise ValueError("not a regular file")
        data = handle.read(MAX_ENTRY_BYTES + 1)
    if len(data) > MAX_ENTRY_BYTES:
        raise ValueError("too large")
    return data


def _response(entry: object, key: str) -> dict[str, Any] | None:
    """The stored completion, when the entry is one this module wrote for this key."""
    if not isinstance(entry, dict) or entry.get("format") != FORMAT or entry.get("key") != key:
        return None
    response = entry.get("response")
    if not isinstance(response, dict) or "detail" in response:  # litellm: "detail" is an error
        return None
    choices = response.get("choices")
    if not isinstance(choices, list) or not choices:
        return None
    if not all(isinstance(c, dict) and isinstance(c.get("message"), dict) for c in choices):
        return None
    for choice in choices:
        # litellm stores its name for the finish ("stop") and the provider's word beside it,
        # which it drops when it replays the entry: replayed, the provider's word is read again
        # (SPEC 6: a cut answer must fail on a replay as it did when the model was asked).
        fields = choice.get("provider_specific_fields")
        native = fields.get("native_finish_reason") if isinstance(fields, dict) else None
        if isinstance(native, str):
            choice["finish_reason"] = native
    return response


class FolderCache:
    """litellm's cache backend: `<key>.json` in one folder, each written atomically.

    `check` builds litellm's response object from a stored completion: litellm does so outside
    its own error handling, so an entry is handed over only once it is known to convert."""

    def __init__(
        self, folder: ResultsFolder, check: Callable[[dict[str, Any]], object], masker: Masker
    ) -> None:
        self.folder = folder
        self._check = check
        self._masker = masker
        self._lock = threading.Lock()
        self._warned: set[str] = set()
        self._served: Counter[str] = Counter()  # keys answered from the folder, not yet claimed

    def served(self, key: str) -> bool:
        """Whether the folder answered a request of this key (once for each time it did)."""
        with self._lock:
            if self._served[key] <= 0:
                return False
            self._served[key] -= 1
            return True

    def get_cache(self, key: object, **_: object) -> dict[str, Any] | None:
        if not isinstance(key, str) or not _KEY_RE.fullmatch(key):
            return None
        name = f"{key}.json"
        try:
            response = _response(json.loads(_read_entry(self.folder.path / name)), key)
            if response is not None:
                self._check(response)
        except FileNotFoundError:
            return None  # a plain miss
        except Exception:  # a link, a FIFO, deep nesting, a shape litellm cannot convert
            response = None
        if response is None:
            self._warn(name, f"the cache entry {name} cannot be used; the model is asked instead")
        else:
            with self._lock:
                self._served[key] += 1
        return response

    def set_cache(self, key: object, value: object, **kwargs: object) -> None:
        if not isinstance(key, str) or not _KEY_RE.fullmatch(key) or not isinstance(value, dict):
            return
        response = value.get("response")
        try:
            if isinstance(response, str):  # litellm hands the completion over as JSON text
                response = json.loads(response)
            entry = {
                "format": FORMAT,
                "key": key,
                "model": kwargs.get("model"),
                "response": response,
            }
            # A provider may echo a secret it was sent (a key in an error text): masked, as in
            # every file mm-batch writes.
            text = json.dumps(self._masker.data(entry), ensure_ascii=True, indent=1, sort_keys=True)
            if len(text) + 1 > MAX_ENTRY_BYTES:  # it could never be read back
                self._warn("", "a model reply too large for the cache is not stored")
                return
            self.folder.write(f"{key}.json", text + "\n")
        except (OSError, ValueError, TypeError) as exc:
            self._warn("", f"a model reply cannot be stored in the cache: {exc}")

    def _warn(self, topic: str, message: str) -> None:
        """Say it on stderr once per topic: the run goes on without that entry."""
        with self._lock:
            if topic in self._warned:
                return
            self._warned.add(topic)
        click.echo(f"mm-batch: {message}", err=True)


def open_folder(settings: CacheSettings) -> ResultsFolder:
    """The cache folder, resolved and opened once at start; a `UsageError` when it cannot
    serve its mode (read: a folder to read; otherwise one to create and write in)."""
    given = display_path(settings.folder)
    try:
        folder = settings.folder.resolve()
        if settings.mode == "read":
            if not folder.is_dir():
                raise UsageError(
                    f"the cache folder {given} does not exist (read mode only reads: fill it "
                    "with a write or readwrite run first)"
                )
            with os.scandir(folder):  # a folder that cannot be listed cannot be read
                pass
        else:
            folder.mkdir(parents=True, exist_ok=True)
            with tempfile.TemporaryFile(dir=folder):
                pass
        return ResultsFolder(folder)
    except (OSError, RuntimeError) as exc:  # RuntimeError: a loop of links, before 3.13
        reason = getattr(exc, "strerror", None) or exc
        raise UsageError(f"the cache folder {given} cannot be used ({reason})") from None


def _tolerate_missing_proxy(handler: Any) -> None:
    """litellm 1.110 imports its proxy server (FastAPI, an extra mm-batch does not install) on
    every cache hit, only to ask whether the reply is a stream to replay: mm-batch never
    streams, so where that import fails the answer is no."""
    original = handler._should_defer_streaming_cache_hit_callbacks
    if getattr(original, "mm_batch_tolerant", False):
        return

    def tolerant(*, cached_result: object) -> bool:
        try:
            return bool(original(cached_result=cached_result))
        except ImportError:
            return False

    tolerant.mm_batch_tolerant = True  # type: ignore[attr-defined]
    handler._should_defer_streaming_cache_hit_callbacks = tolerant


def install(litellm: Any, folder: ResultsFolder, masker: Masker) -> FolderCache:
    """Make the folder litellm's cache for this process (every request: no message limit)."""
    from litellm.caching import caching_handler
    from litellm.caching.caching import Cache
    from litellm.litellm_core_utils.llm_response_utils.convert_dict_to_response import (
        convert_to_model_response_object,
    )
    from litellm.types.utils import ModelResponse

    _tolerate_missing_proxy(caching_handler)

    def check(response: dict[str, Any]) -> object:
        return convert_to_model_response_object(
            response_object=response, model_response_object=ModelResponse()
        )

    backend = FolderCache(folder, check, masker)
    # Duck-typed: a BaseCache subclass would import litellm along with this module.
    litellm.cache = Cache(_backend=cast(Any, backend), max_messages=None)
    return backend


def uninstall(litellm: Any, folder: ResultsFolder) -> None:
    """The process's litellm has no cache again; the folder is closed."""
    litellm.cache = None
    folder.close()


def served(litellm: Any, key: str) -> bool:
    """Whether the installed cache answered a request of this key (see `FolderCache.served`)."""
    backend = getattr(litellm.cache, "cache", None)
    return isinstance(backend, FolderCache) and backend.served(key)
