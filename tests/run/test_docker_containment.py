"""Containment inside the Docker sandbox, read from inside the container itself."""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from mm_batch.config.model import SandboxSpec
from mm_batch.effects.docker import DockerSandbox
from tests.docker_support import TEST_IMAGE, containers_of

pytestmark = pytest.mark.docker


@pytest.fixture
def box(
    docker_client: Any, tmp_path: Path, request: pytest.FixtureRequest
) -> Iterator[DockerSandbox]:
    tmp_path.chmod(0o777)
    spec = SandboxSpec(kind="docker", image=TEST_IMAGE, pids=64, memory="64m")
    sandbox = DockerSandbox(docker_client, spec, tmp_path, f"containment-{request.node.name}")
    yield sandbox
    sandbox.close()


def sh(box: DockerSandbox, script: str, timeout: float = 30) -> Any:
    return box.execute(["sh", "-c", script], box.agent_dir, {}, timeout)


def test_no_capabilities_and_no_new_privileges(box: DockerSandbox) -> None:
    status = dict(
        line.split(":\t", 1)
        for line in sh(box, "cat /proc/self/status").stdout.data.decode().splitlines()
        if ":\t" in line
    )
    for cap in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"):
        assert int(status[cap], 16) == 0, cap
    assert status["NoNewPrivs"].strip() == "1"
    assert status["Uid"].split()[0] == "1000"


def test_no_network(box: DockerSandbox) -> None:
    # A server on the host's loopback: the container, with a network of its own, cannot reach it.
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    port = server.getsockname()[1]

    def accept() -> None:
        with contextlib.suppress(OSError):  # closed at the end of the test
            server.accept()

    threading.Thread(target=accept, daemon=True).start()
    try:
        result = sh(box, f"nc -w 2 127.0.0.1 {port} </dev/null && echo connected || echo refused")
        assert result.stdout.data.strip().endswith(b"refused")
        interfaces = sh(box, "cat /proc/net/dev").stdout.data.decode()
        assert [line.split(":")[0].strip() for line in interfaces.splitlines()[2:]] == ["lo"]
    finally:
        server.close()


def test_read_only_root_writable_workspace_and_tmp(box: DockerSandbox) -> None:
    assert sh(box, "touch /etc/mm-batch-test").exit_code != 0
    assert sh(box, "touch /bin/mm-batch-test").exit_code != 0
    assert sh(box, "echo hi > /workspace/written && echo ok > /tmp/t && cat /tmp/t").exit_code == 0
    assert (box.agent_dir / "written").read_text() == "hi\n"


def test_fork_bomb_is_held_by_the_pids_limit(box: DockerSandbox, docker_client: Any) -> None:
    result = sh(box, "b() { b | b & }; b; sleep 100", timeout=3)
    assert result.timed_out
    assert b"can't fork" in result.stderr.data or b"Resource temporarily unavailable" in (
        result.stderr.data
    )
    assert sh(box, "echo usable").stdout.data == b"usable\n"
    box.close()
    assert containers_of(docker_client, box.run_id) == []


def test_memory_bomb_ends_as_an_error(box: DockerSandbox, docker_client: Any) -> None:
    result = sh(box, "x=a; while :; do x=$x$x; done")
    assert result.exit_code == 137
    assert result.error == "killed: out of memory (the sandbox limit is 64m)"
    assert not result.sandbox_failed
    box.close()
    assert containers_of(docker_client, box.run_id) == []
