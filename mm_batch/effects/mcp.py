"""MCP tools over Streamable HTTP. This module is the only one that imports the mcp SDK.

Each operation opens its own short session (tens of milliseconds on loopback): no event loop
outlives a call, so worker threads stay plain threads.
"""

from __future__ import annotations

import importlib.util
import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, TypeVar

from mm_batch.config.model import McpServerSpec
from mm_batch.jsontypes import JsonObject
from mm_batch.run.ports import McpAnswer, McpError, McpErrorAnswer, McpResult, McpTool

if TYPE_CHECKING:  # the SDK is an extra: imported where a session opens
    from mcp.client.session import ClientSession

MCP_EXTRA_HINT = "pip install 'mm-batch[mcp]'"
T = TypeVar("T")


def installed() -> bool:
    return importlib.util.find_spec("mcp") is not None


def _first_cause(exc: BaseException) -> BaseException:
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return exc


def _run(
    server: McpServerSpec, timeout: float, action: Callable[[ClientSession], Awaitable[T]]
) -> T:
    import anyio
    from mcp.client.session import ClientSession
    from mcp.client.streamable_http import streamable_http_client

    for noisy in ("httpx", "httpx2", "mcp", "mcp.client"):
        logging.getLogger(noisy).setLevel(logging.WARNING)

    async def session() -> T:
        with anyio.fail_after(timeout):
            async with streamable_http_client(server.url) as streams:  # noqa: SIM117
                # The session needs the streams the transport yields: two steps.
                async with ClientSession(streams[0], streams[1]) as client:
                    await client.initialize()
                    return await action(client)

    try:
        return anyio.run(session)
    except TimeoutError as exc:
        raise McpError(
            f"MCP server {server.name} ({server.url}) did not answer within {timeout:g} s"
        ) from exc
    except Exception as exc:
        cause = _first_cause(exc)
        raise McpError(
            f"MCP server {server.name} ({server.url}) is unreachable: "
            f"{type(cause).__name__}: {cause}"
        ) from exc


def list_tools(server: McpServerSpec, timeout: float = 30.0) -> list[McpTool]:
    async def action(client: ClientSession) -> list[McpTool]:
        result = await client.list_tools()
        return [
            McpTool(server.name, t.name, t.description or "", dict(t.input_schema or {}))
            for t in result.tools
        ]

    return _run(server, timeout, action)


def call_tool(server: McpServerSpec, name: str, arguments: JsonObject, timeout: float) -> McpResult:
    """The tool's answer, flagged as an error answer when the tool says it is one."""

    async def action(client: ClientSession) -> McpResult:
        result = await client.call_tool(name, arguments, read_timeout_seconds=timeout)
        parts = [getattr(c, "text", None) or repr(c) for c in result.content or []]
        text = "\n".join(parts)
        return McpErrorAnswer(text) if result.is_error else McpAnswer(text)

    return _run(server, timeout, action)


class McpHttpClient:
    """The `McpClient` of production runs: MCP servers over Streamable HTTP."""

    def list_tools(self, server: McpServerSpec, timeout: float = 30.0) -> list[McpTool]:
        return list_tools(server, timeout)

    def call_tool(
        self, server: McpServerSpec, name: str, arguments: JsonObject, timeout: float
    ) -> McpResult:
        return call_tool(server, name, arguments, timeout)
