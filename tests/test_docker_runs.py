"""`mm-batch run --sandbox docker`: the example in a container, and every way the sandbox fails."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from mm_batch.effects.docker import LABEL, LABEL_PID_NS, LABEL_RUN, pid_namespace
from mm_batch.effects.watchdog import LABEL_HOST, LABEL_PID, LABEL_PID_START
from mm_batch.testing.fake_openai import by_prompt, text, tool_call
from tests.docker_support import (
    BASE_IMAGE,
    TEST_IMAGE,
    containers_of,
    require_image,
    when_running,
)
from tests.helpers import GOOD, Cli, Fake, check_report, model_args, read_calls, received, write

DOCKER = ("--sandbox", "docker", "--image", TEST_IMAGE)

pytestmark = pytest.mark.docker


@pytest.fixture
def writable_example(release_example: Path) -> Path:
    release_example.chmod(0o777)  # the sandbox's uid 1000 appends to calls-received.log there
    return release_example


def test_release_example_runs_in_containers(
    docker_client: Any, cli: Cli, fake_model: Fake, writable_example: Path, tmp_path: Path
) -> None:
    fake = fake_model(by_prompt(GOOD))
    out = tmp_path / "out"
    result = cli("run", writable_example / "tasks.yaml", *model_args(fake), *DOCKER, "--out", out)
    assert result.code == 0, result.err
    tools = [r for r in read_calls(out) if r["kind"] == "tool"]
    assert len(tools) == 6
    assert {r["where"] for r in tools} == {f"docker:{TEST_IMAGE}"}
    assert {r["outcome"] for r in tools} == {"ran"}
    releases = [r["stdout"] for r in tools if r["tool"] == "release"]
    assert releases == ["Released version 1.4.2 (beta channel).\n"] * 2
    # The workspace is a copy (the default): what the scripts appended never reached the host.
    assert received(writable_example) == []
    assert containers_of(docker_client, "release-") == []


def test_release_example_on_the_default_base_image(
    docker_client: Any, cli: Cli, fake_model: Fake, writable_example: Path, tmp_path: Path
) -> None:
    require_image(docker_client, BASE_IMAGE)
    fake = fake_model(by_prompt(GOOD))
    out = tmp_path / "out"
    result = cli(
        "run",
        writable_example / "tasks.yaml",
        *model_args(fake),
        "--sandbox",
        "docker",
        "--out",
        out,
        "--filter",
        "release-*",
    )
    assert result.code == 0, result.err
    tools = [r for r in read_calls(out) if r["kind"] == "tool"]
    assert {r["where"] for r in tools} == {f"docker:{BASE_IMAGE}"}
    assert [r["stdout"] for r in tools] == ["Released version 1.4.2 (beta channel).\n"] * 2
    assert received(writable_example) == []


def test_engine_down_is_one_clear_error_per_run(
    cli: Cli,
    fake_model: Fake,
    release_example: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/no-engine.sock")
    fake = fake_model(by_prompt(GOOD))
    out = tmp_path / "out"
    result = cli(
        "run",
        release_example / "tasks.yaml",
        *model_args(fake),
        *DOCKER,
        "--out",
        out,
        "--filter",
        "status-*",
    )
    assert result.code == 3
    assert "Traceback" not in result.err
    tasks = [r for r in read_calls(out) if r["kind"] == "task"]
    assert len(tasks) == 2
    for task in tasks:
        assert task["status"] == "error"
        assert task["reason"].startswith(
            "the sandbox is not available: the Docker engine is unreachable ("
        )
        assert task["reason"].endswith("is dockerd running?")
        assert "\n" not in task["reason"]
    assert fake.requests == []  # nothing was asked of the model for a run that cannot be judged


def test_missing_image_names_the_image_and_how_to_build_it(
    docker_client: Any, cli: Cli, fake_model: Fake, release_example: Path, tmp_path: Path
) -> None:
    fake = fake_model(by_prompt(GOOD))
    out = tmp_path / "out"
    result = cli(
        "run",
        release_example / "tasks.yaml",
        *model_args(fake),
        "--sandbox",
        "docker",
        "--image",
        "mm-batch/sandbox:not-built",
        "--out",
        out,
        "--filter",
        "status-en",
    )
    assert result.code == 3
    (task,) = [r for r in read_calls(out) if r["kind"] == "task"]
    assert task["reason"] == (
        "the sandbox is not available: image mm-batch/sandbox:not-built not found (no image is "
        "pulled); build it first: containers/build.sh base, or see containers/README.md"
    )


def test_container_dying_mid_run_is_an_error(
    docker_client: Any, cli: Cli, fake_model: Fake, tmp_path: Path
) -> None:
    tmp_path.chmod(0o777)
    write(
        tmp_path,
        "agent.yaml",
        """
        yolo: true
        sandbox: {kind: docker, image: mm-batch/sandbox:tiny}
        tools: [{name: ping, description: Ping., command: ["echo", "pong"]}]
    """,
    )
    write(tmp_path, "tasks.yaml", "agent: agent.yaml\ntasks: [{id: dies, prompt: go}]\n")

    def kill_then_call(request: dict[str, Any]) -> Any:
        for container in containers_of(docker_client, "dies["):
            container.kill()
        return tool_call("ping", {}) if len(request["messages"]) <= 2 else text("done")

    fake = fake_model(kill_then_call)
    out = tmp_path / "out"
    assert cli("run", tmp_path / "tasks.yaml", *model_args(fake), "--out", out).code == 3
    task = read_calls(out)[-1]
    assert task["status"] == "error" and task["reason"].startswith("the sandbox failed: ")
    assert containers_of(docker_client, "dies[") == []


def test_sigterm_mid_call_leaves_no_container(
    docker_client: Any, fake_model: Fake, tmp_path: Path
) -> None:
    tmp_path.chmod(0o777)
    write(
        tmp_path,
        "agent.yaml",
        """
        yolo: true
        sandbox: {kind: docker, image: mm-batch/sandbox:tiny}
        tools:
          - {name: slow, description: Slow., command: ["sh", "-c", "touch started; sleep 300"]}
    """,
    )
    write(
        tmp_path,
        "tasks.yaml",
        """
        agent: agent.yaml
        tasks: [{id: sig-a, prompt: go}, {id: sig-b, prompt: go}]
    """,
    )
    fake = fake_model(by_prompt({"go": [tool_call("slow", {}), text("never")]}))
    out = tmp_path / "out"
    # The workspace is the container's own copy: the marker is looked for in the containers.
    both = threading.Event()
    seen: set[str] = set()

    def mark(container: Any) -> None:
        seen.add(container.id)
        if len(seen) == 2:
            both.set()

    for task in "ab":
        when_running(docker_client, f"sig-{task}", "sleep 300", mark)
    tasks = str(tmp_path / "tasks.yaml")
    argv = [sys.executable, "-m", "mm_batch", "run", tasks, "--out", str(out)]
    proc = subprocess.Popen(
        [*argv, *model_args(fake)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=tmp_path,
    )
    try:
        assert both.wait(60), "the tools never started"
        assert len(containers_of(docker_client, "sig-")) == 2
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err.decode()
    assert containers_of(docker_client, "sig-") == []
    check_report(out / "junit.xml")
    finals = [json.loads(line) for line in (out / "calls.jsonl").read_text().splitlines()]
    assert {r["status"] for r in finals if r["kind"] == "task"} == {"error"}


def _labelled(client: Any, run: str, pid: int, start: str) -> Any:
    import socket

    container = client.containers.create(
        TEST_IMAGE,
        command=["sleep", "300"],
        labels={
            LABEL: "1",
            LABEL_RUN: run,
            LABEL_PID: str(pid),
            LABEL_PID_START: start,
            LABEL_PID_NS: pid_namespace(),
            LABEL_HOST: socket.gethostname(),
        },
    )
    container.start()
    return container


def test_orphans_of_a_killed_run_are_removed_but_never_a_live_runs(
    docker_client: Any, cli: Cli, fake_model: Fake, release_example: Path, tmp_path: Path
) -> None:
    from mm_batch.effects.watchdog import process_start

    dead = subprocess.Popen(["true"])
    dead.wait()
    _labelled(docker_client, "orphan-of-killed-run", dead.pid, "1")
    live = _labelled(docker_client, "live-run", os.getpid(), process_start(os.getpid()))
    try:
        fake = fake_model(by_prompt(GOOD))
        cli(
            "run",
            release_example / "tasks.yaml",
            *model_args(fake),
            *DOCKER,
            "--out",
            tmp_path / "out",
            "--filter",
            "status-en",
        )
        assert containers_of(docker_client, "orphan-of-killed-run") == []
        assert [c.id for c in containers_of(docker_client, "live-run")] == [live.id]
    finally:
        live.remove(force=True)
