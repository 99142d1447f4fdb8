"""The HTTP server under the fakes: JSON requests in, scripted bytes out, on a loopback port.

A fake gives two functions: `read` turns a request (path, headers, JSON object body) into what
it records and answers from, `respond` turns that into a `RawReply`. The server keeps each
connection alive as real providers do, records every request before answering it, and on
leaving its `with` block stops serving and drops the connections still open, so a client holding
one sees the provider gone. A body that is not a JSON object is answered 400, never recorded.
"""

from __future__ import annotations

import contextlib
import json
import socket
import sys
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Generic, Self, TypeVar

from mm_batch.jsontypes import JsonObject, JsonValue

Kept = TypeVar("Kept")


@dataclass(frozen=True)
class Request:
    """A request as it came in."""

    path: str
    headers: Mapping[str, str]
    body: JsonObject


@dataclass(frozen=True)
class RawReply:
    """Answer with exactly these bytes, this status and these headers (Content-Length added)."""

    body: bytes
    status: int = 200
    headers: Mapping[str, str] = field(default_factory=lambda: {"Content-Type": "application/json"})


def json_reply(
    status: int, payload: JsonValue, headers: Mapping[str, str] | None = None
) -> RawReply:
    """`payload` as JSON (a lone surrogate goes out as its escape), with these extra headers."""
    data = json.dumps(payload).encode()
    return RawReply(data, status, {"Content-Type": "application/json", **(headers or {})})


class _QuietServer(ThreadingHTTPServer):
    """A client that hangs up mid-reply (its timeout passed) is normal here, not a traceback."""

    def handle_error(
        self, request: socket.socket | tuple[bytes, socket.socket], client_address: object
    ) -> None:
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


class JsonHttpServer(Generic[Kept]):
    """Answer POSTs on a free loopback port with `respond(read(request))`; a context manager.

    `requests` holds what `read` made of each request, in the order they were read."""

    def __init__(
        self, read: Callable[[Request], Kept], respond: Callable[[Kept], RawReply]
    ) -> None:
        self.requests: list[Kept] = []
        self._read = read
        self._respond = respond
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
        return f"http://127.0.0.1:{self._server.server_port}"

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        with self._lock:  # kept-alive connections would otherwise go on being served
            for connection in self._connections:
                with contextlib.suppress(OSError):
                    connection.shutdown(socket.SHUT_RDWR)

    def _answer(self, request: Request) -> RawReply:
        kept = self._read(request)
        with self._lock:
            self.requests.append(kept)
        return self._respond(kept)

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # connections kept alive, as real providers do
            disable_nagle_algorithm = True  # else headers and body wait on each other's ACK

            def setup(self) -> None:
                super().setup()
                with server._lock:
                    server._connections.add(self.connection)

            def finish(self) -> None:
                with server._lock:
                    server._connections.discard(self.connection)
                super().finish()

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                try:
                    body: JsonValue = json.loads(self.rfile.read(length) or b"{}")
                except ValueError:
                    body = None
                if isinstance(body, dict):
                    reply = server._answer(Request(self.path, dict(self.headers.items()), body))
                else:
                    reply = json_reply(400, {"error": {"message": "invalid JSON body"}})
                self.send_response(reply.status)
                for name, value in reply.headers.items():
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(reply.body)))
                self.end_headers()
                with contextlib.suppress(OSError):  # the client may have given up waiting
                    self.wfile.write(reply.body)

            def log_message(self, *_args: object) -> None:
                return

        return Handler
