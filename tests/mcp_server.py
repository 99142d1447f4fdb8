"""A real MCP server over Streamable HTTP, run by the tests on a thread (uvicorn)."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import uvicorn
from mcp.server.mcpserver import MCPServer
from pydantic import BaseModel


def project_server() -> MCPServer:
    server = MCPServer("proj")
    calls: list[tuple[str, dict[str, object]]] = []
    server.calls = calls  # type: ignore[attr-defined]

    @server.tool()
    def release(version: str, channel: str) -> str:
        """Release a version of the product to a channel."""
        calls.append(("release", {"version": version, "channel": channel}))
        return f"released {version} to {channel}"

    @server.tool()
    def scale(replicas: int, dry_run: bool = False) -> str:
        """Scale the service."""
        calls.append(("scale", {"replicas": replicas, "dry_run": dry_run}))
        return f"scaled to {replicas}" + (" (dry run)" if dry_run else "")

    @server.tool()
    def broken() -> str:
        """Always fails."""
        raise ValueError("the backend is down")

    @server.tool()
    def slow() -> str:
        """Takes its time."""
        time.sleep(5)
        return "late"

    @server.tool()
    def status() -> str:
        """Clashes with a declared tool of the same exposed name."""
        return "from MCP"

    return server


class Label(BaseModel):
    key: str
    value: str


def catalog_server() -> MCPServer:
    """A server whose tool takes an array, and an array of objects (a nested model: pydantic
    writes its schema as a reference to the input schema's `$defs`)."""
    server = MCPServer("cat")
    calls: list[tuple[str, dict[str, object]]] = []
    server.calls = calls  # type: ignore[attr-defined]

    @server.tool()
    def tag(names: list[str], labels: list[Label] | None = None) -> str:
        """Tag the named images."""
        given = [label.model_dump() for label in labels or []]
        calls.append(("tag", {"names": names, "labels": given}))
        return "tagged " + ", ".join(names)

    return server


@contextmanager
def serve(server: MCPServer) -> Iterator[str]:
    """Serve on a free loopback port; yields the endpoint URL."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    config = uvicorn.Config(
        server.streamable_http_app(), host="127.0.0.1", port=port, log_level="warning"
    )
    runner = uvicorn.Server(config)
    thread = threading.Thread(target=runner.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not runner.started:
        assert time.monotonic() < deadline, "the MCP server did not start"
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        runner.should_exit = True
        thread.join(timeout=5)
