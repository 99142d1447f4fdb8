"""The MCP stand-in of the design note: the three actions as typed tools of an MCP HTTP server.

Each tool runs the same script as the other approaches, with an argv list (no shell).
Run: python mcp_standin.py PORT   (serves http://127.0.0.1:PORT/mcp)
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import uvicorn
from mcp.server.mcpserver import MCPServer

HERE = Path(__file__).resolve().parent
server = MCPServer("proj")


def _run(*argv: str) -> str:
    done = subprocess.run(
        [str(HERE / argv[0]), *argv[1:]],
        capture_output=True,
        text=True,
        cwd=HERE,
        timeout=60,
        check=False,
    )
    return (done.stdout + done.stderr).strip() or f"exit {done.returncode}"


@server.tool()
def release(version: str, channel: str) -> str:
    """Release a version of the product to a channel (beta or stable)."""
    return _run("release.sh", version, f"--channel={channel}")


@server.tool()
def pkgtest(package: str) -> str:
    """Run the test suite of one package."""
    return _run("pkgtest.sh", package)


@server.tool()
def status(service: str) -> str:
    """Report the status of one of the company's services."""
    return _run("status.sh", service)


if __name__ == "__main__":
    uvicorn.run(
        server.streamable_http_app(), host="127.0.0.1", port=int(sys.argv[1]), log_level="warning"
    )
