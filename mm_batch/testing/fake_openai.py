"""A scripted fake model: a real HTTP server speaking the OpenAI chat-completions API.

It records every request it receives. A script maps each request to a reply; `by_prompt`
scripts conversations by their first user message and turn number, so parallel runs are
deterministic. Useful to test a pipeline offline, without any model. A reply is an assistant
message, an `HttpFailure`, a `Finished` message (any `finish_reason`), a `RawReply` (any bytes,
status and headers: what a hostile or broken provider sends), or one of these `Delayed`.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import socket
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from mm_batch.jsontypes import JsonObject, JsonValue


@dataclass(frozen=True)
class HttpFailure:
    """Answer a request with an HTTP error instead of a completion."""

    status: int
    message: str = "scripted failure"
    headers: Mapping[str, str] = field(default_factory=dict)  # e.g. {"Retry-After": "4"}


@dataclass(frozen=True)
class RawReply:
    """Answer with exactly these bytes, this status and these headers (Content-Length added)."""

    body: bytes
    status: int = 200
    headers: Mapping[str, str] = field(default_factory=lambda: {"Content-Type": "application/json"})


@dataclass(frozen=True)
class Finished:
    """A completion whose choice ends with this `finish_reason` (e.g. "length")."""

    message: JsonObject
    finish_reason: str | None


@dataclass(frozen=True)
class Delayed:
    """Send this reply after a pause, for this request only."""

    reply: Reply
    seconds: float


Reply = JsonObject | HttpFailure | RawReply | Finished | Delayed
Script = Callable[[JsonObject], Reply]
_ids = itertools.count(1)


def text(content: str) -> JsonObject:
    """An assistant message with a final answer."""
    return {"role": "assistant", "content": content}


def tool_call(
    name: str, arguments: str | Mapping[str, object], *more: tuple[str, str | Mapping[str, object]]
) -> dict[str, Any]:
    """An assistant message asking for one tool call (or several, with `more`); a test may
    edit it into what a hostile model sends."""
    calls = [(name, arguments), *more]
    return {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": f"call_{next(_ids)}",
                "type": "function",
                "function": {
                    "name": n,
                    "arguments": a if isinstance(a, str) else json.dumps(a),
                },
            }
            for n, a in calls
        ],
    }


def messages(request: Mapping[str, JsonValue]) -> list[JsonObject]:
    """The messages of a chat-completions request."""
    sent = request.get("messages")
    return [m for m in sent if isinstance(m, dict)] if isinstance(sent, list) else []


def first_user_message(request: Mapping[str, JsonValue]) -> str:
    return next((str(m.get("content")) for m in messages(request) if m.get("role") == "user"), "")


def turn(request: Mapping[str, JsonValue]) -> int:
    """0 for the first model turn of a conversation, 1 for the next, and so on."""
    return sum(1 for m in messages(request) if m.get("role") == "assistant")


def by_prompt(conversations: Mapping[str, Sequence[Reply]], default: Reply | None = None) -> Script:
    """Reply with the n-th scripted message of the conversation that starts with this prompt."""

    def script(request: JsonObject) -> Reply:
        replies = conversations.get(first_user_message(request))
        n = turn(request)
        if replies is None or n >= len(replies):
            return default if default is not None else text("done")
        return replies[n]

    return script


class _QuietServer(ThreadingHTTPServer):
    """A client that hangs up mid-reply (its timeout passed) is normal here, not a traceback."""

    def handle_error(
        self, request: socket.socket | tuple[bytes, socket.socket], client_address: object
    ) -> None:
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


class FakeOpenAI:
    """Serve chat completions on a free loopback port; use as a context manager."""

    def __init__(self, script: Script, latency_s: float = 0.0) -> None:
        self.script = script
        self.latency_s = latency_s
        # As litellm sent them, for tests to read by key wherever they look.
        self.requests: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self._connections: set[socket.socket] = set()
        self._server = _QuietServer(("127.0.0.1", 0), self._handler())
        self._server.daemon_threads = True
        # A short poll: stopping the server waits for it, once per test that uses one.
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True
        )

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_port}/v1"

    def __enter__(self) -> FakeOpenAI:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        with self._lock:  # kept-alive connections would otherwise go on being served
            for connection in self._connections:
                with contextlib.suppress(OSError):
                    connection.shutdown(socket.SHUT_RDWR)

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # connections kept alive, as real providers do
            disable_nagle_algorithm = True  # else headers and body wait on each other's ACK

            def setup(self) -> None:
                super().setup()
                with fake._lock:
                    fake._connections.add(self.connection)

            def finish(self) -> None:
                with fake._lock:
                    fake._connections.discard(self.connection)
                super().finish()

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                try:
                    body = json.loads(self.rfile.read(length) or b"{}")
                except ValueError:
                    self._send(400, {"error": {"message": "invalid JSON body"}})
                    return
                with fake._lock:
                    fake.requests.append(body)
                if fake.latency_s:
                    time.sleep(fake.latency_s)
                reply = fake.script(body)
                while isinstance(reply, Delayed):
                    time.sleep(reply.seconds)
                    reply = reply.reply
                if isinstance(reply, RawReply):
                    self._send_bytes(reply.status, reply.body, reply.headers)
                    return
                if isinstance(reply, HttpFailure):
                    error: JsonObject = {
                        "message": reply.message,
                        "type": "scripted",
                        "code": reply.status,
                    }
                    self._send(reply.status, {"error": error}, reply.headers)
                    return
                if isinstance(reply, Finished):
                    message, finish = reply.message, reply.finish_reason
                else:
                    message = reply
                    finish = "tool_calls" if reply.get("tool_calls") else "stop"
                self._send(
                    200,
                    {
                        "id": f"chatcmpl-{next(_ids)}",
                        "object": "chat.completion",
                        "created": int(time.time()),
                        "model": body.get("model", "fake"),
                        "choices": [{"index": 0, "message": message, "finish_reason": finish}],
                        "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15},
                    },
                )

            def _send(
                self, status: int, payload: JsonObject, headers: Mapping[str, str] | None = None
            ) -> None:
                # ensure_ascii: a scripted lone surrogate goes out as its JSON escape
                data = json.dumps(payload).encode()
                self._send_bytes(
                    status, data, {"Content-Type": "application/json", **(headers or {})}
                )

            def _send_bytes(self, status: int, data: bytes, headers: Mapping[str, str]) -> None:
                self.send_response(status)
                for name, value in headers.items():
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                with contextlib.suppress(OSError):  # the client may have given up waiting
                    self.wfile.write(data)

            def log_message(self, *_args: object) -> None:
                return

        return Handler
