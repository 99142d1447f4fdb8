"""The model response cache: a `ModelClient` around any other (`CachedClient`: litellm's, the
local models' own, a test's fake) that answers a request it has answered before from a folder
of JSON files, one per request, and keeps what the client it wraps answered. A request is
keyed by what it asks (`request_key`), never by where it is sent.

The folder is input like any other, and may come from anywhere (a CI cache, a checkout): a file
that cannot be used, whatever it holds, is a miss and the model is asked; nothing in it is ever
unpickled or executed, and no read can block or take unbounded memory. An entry holds a chat
completion in OpenAI's shape, as litellm's own caching wrote them before: a folder filled then
is read now.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import tempfile
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import click

from mm_batch.config.model import CacheMode, CacheSettings
from mm_batch.config.paths import display_path, read_regular, write_atomically
from mm_batch.config.secrets import Masker
from mm_batch.effects.model_calls import (
    CALL_PARTS,
    Messages,
    ToolSchemas,
    TurnClient,
    completion_problem,
    field,
    provider_finish,
    read_reply,
)
from mm_batch.errors import UsageError
from mm_batch.jsontypes import JsonObject, JsonValue
from mm_batch.run.ports import ModelReply

FORMAT = "mm-batch-cache/1"
MAX_ENTRY_BYTES = 32 * 1024 * 1024  # far above any completion: a bigger file is not ours
# Where and how a request is sent, not what it asks: a local model's server listens on a new
# port each run, and a timeout or a key changes no reply. Everything else the client is given
# is in the key, provider-specific options too.
UNKEYED_OPTIONS = frozenset({"api_base", "base_url", "api_key", "timeout", "num_retries"})
_KEY_RE = re.compile(r"[0-9a-f]{64}")
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)


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
    messages: Messages,
    tools: ToolSchemas,
    options: Mapping[str, object],
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


# -- an entry: a chat completion ------------------------------------------------------------


def _read_entry(path: Path) -> bytes:
    """A regular file's bytes, never through a link, never blocking (a FIFO), bounded: else
    an OSError (FileNotFoundError: no entry) or a ValueError."""
    data = read_regular(path, MAX_ENTRY_BYTES + 1, follow=False)
    if len(data) > MAX_ENTRY_BYTES:
        raise ValueError("too large")
    return data


def _counts_problem(usage: object) -> bool:
    """Token counts that are neither a number nor missing: litellm refused such an entry."""
    counts = (field(usage, name) for name in ("prompt_tokens", "completion_tokens"))
    return any(not isinstance(count, int | float | None) for count in counts)


def _stored_completion(entry: object, key: str) -> JsonObject | None:
    """The stored completion, when the entry is one this module wrote for this key and it
    reads as a completion."""
    if not isinstance(entry, dict) or entry.get("format") != FORMAT or entry.get("key") != key:
        return None
    response = entry.get("response")
    if not isinstance(response, dict) or "detail" in response:  # litellm: "detail" is an error
        return None
    if completion_problem(response) is not None or _counts_problem(response.get("usage")):
        return None
    return response


def _free(_prompt_tokens: int | None, _completion_tokens: int | None) -> float | None:
    return 0.0


def stored_reply(response: JsonObject, latency_s: float) -> ModelReply:
    """A stored completion as the reply it was: answered from the cache, at no cost. Its
    finish reason is the provider's word where litellm stored its own name for a normal end
    beside it (SPEC 6: a cut answer must fail on a replay as it did when the model was asked);
    a `ModelError` where it is no reply."""
    return read_reply(
        response,
        latency_s,
        1,
        finish=provider_finish,
        cost=_free,
        cached=True,
        keep_provider_parts=True,
    )


def completion_of(reply: ModelReply) -> JsonObject:
    """A reply as the chat completion it came as: what the cache stores of it, read back by
    `stored_reply` as the same reply (its provider parts included, which the next turn sends
    back, so that the next request's key is the same on a replay)."""
    message: JsonObject = {"role": "assistant", "content": reply.text}
    message.update(reply.provider_parts)
    if reply.tool_calls:
        calls: list[JsonValue] = []
        for call in reply.tool_calls:
            parts = dict(call.provider_fields)
            inner = parts.pop("function", None)
            function: JsonObject = {"name": call.name, "arguments": call.raw_arguments}
            if isinstance(inner, dict):
                function.update(inner)
            stored: JsonObject = {"id": call.id, "type": "function", "function": function}
            stored.update((k, v) for k, v in parts.items() if k in CALL_PARTS)
            calls.append(stored)
        message["tool_calls"] = calls
    usage: JsonObject = {
        "prompt_tokens": reply.prompt_tokens,
        "completion_tokens": reply.completion_tokens,
    }
    choice: JsonObject = {"index": 0, "message": message, "finish_reason": reply.finish_reason}
    return {"object": "chat.completion", "choices": [choice], "usage": usage}


# -- the folder and its entries --------------------------------------------------------------


class CacheFolder:
    """The cache folder opened once: entries are read by name, and written through the folder
    opened at start, atomically, never through a link (a tool may swap the folder mid-run)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | _CLOEXEC)

    def read(self, name: str) -> bytes:
        return _read_entry(self.path / name)

    def write(self, name: str, text: str) -> None:
        """Write beside the entry, then rename over it."""
        write_atomically(self._fd, name, text)

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


class ResponseStore:
    """The entries of a cache folder, `<key>.json` each, shared by every client of a run: what
    cannot be used or stored is said once on stderr, never raised into a run."""

    def __init__(self, folder: CacheFolder, masker: Masker) -> None:
        self.folder = folder
        self._masker = masker
        self._lock = threading.Lock()
        self._warned: set[str] = set()

    def get(self, key: str, started: float) -> ModelReply | None:
        """The reply stored for `key` (its latency counted from `started`), or None: a miss."""
        if not _KEY_RE.fullmatch(key):
            return None
        name = f"{key}.json"
        try:
            response = _stored_completion(json.loads(self.folder.read(name)), key)
            if response is not None:
                return stored_reply(response, time.monotonic() - started)
        except FileNotFoundError:
            return None  # a plain miss
        except Exception:  # a link, a FIFO, deep nesting, a shape that reads as no reply
            pass
        self._warn(name, f"the cache entry {name} cannot be used; the model is asked instead")
        return None

    def put(self, key: str, reply: ModelReply, model: str) -> None:
        if not _KEY_RE.fullmatch(key):
            return
        try:
            entry = {"format": FORMAT, "key": key, "model": model, "response": completion_of(reply)}
            # A provider may echo a secret it was sent (a key in an error text): masked, as in
            # every file mm-batch writes.
            text = json.dumps(
                self._masker.data(entry, keys=False), ensure_ascii=True, indent=1, sort_keys=True
            )
            if len(text) + 1 > MAX_ENTRY_BYTES:  # it could never be read back
                self._warn("", "a model reply too large for the cache is not stored")
                return
            self.folder.write(f"{key}.json", text + "\n")
        except (OSError, ValueError, TypeError, RecursionError) as exc:
            self._warn("", f"a model reply cannot be stored in the cache: {exc}")

    def _warn(self, topic: str, message: str) -> None:
        """Say it on stderr once per topic: the run goes on without that entry."""
        with self._lock:
            if topic in self._warned:
                return
            self._warned.add(topic)
        click.echo(f"mm-batch: {message}", err=True)


class CachedClient:
    """A `ModelClient` whose replies are kept in the response cache. read: a hit answers, a
    miss asks the client and stores nothing; write: always asks, and stores; readwrite: both.
    A hit costs nothing, and waits for no server, retry or turn on the CPU."""

    def __init__(
        self,
        client: TurnClient,
        store: ResponseStore,
        use: CacheUse,
        model: str,
        options: Mapping[str, object],
    ) -> None:
        """`model` and `options`: what the key is made of besides the turn, as litellm was
        given them for the same request (a local model as `hosted_vllm/<name>`), so that a
        folder filled by either client is read by both."""
        self._client = client
        self._store = store
        self._use = use
        self._model = model
        self._options = dict(options)

    def complete(self, messages: Messages, tools: ToolSchemas, timeout: float) -> ModelReply:
        started = time.monotonic()
        key = request_key(self._model, messages, tools, self._options, self._use.repeat)
        if self._use.mode != "write":
            stored = self._store.get(key, started)
            if stored is not None:
                return stored
        reply = self._client.complete(messages, tools, timeout)
        if self._use.mode != "read":
            self._store.put(key, reply, self._model)
        return reply


def open_folder(settings: CacheSettings) -> CacheFolder:
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
        return CacheFolder(folder)
    except (OSError, RuntimeError) as exc:  # RuntimeError: a loop of links, before 3.13
        reason = getattr(exc, "strerror", None) or exc
        raise UsageError(f"the cache folder {given} cannot be used ({reason})") from None
