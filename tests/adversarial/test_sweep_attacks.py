"""A tool call that attacks the sweep after it (SPEC 3, "Calls are isolated from each other").

A process the call leaves behind loops `kill -STOP -1`: it stopped the sweep's own exec of the
tools' uid while that exec was still `runc init` (after the runtime set its uid, before it ran
the program), and the stopped `runc init` held up the engine's every request about the
container, its removal included; a last call's unconfirmed sweep was read by no one, so the run
passed. The sweep now stops and kills the uid's processes from root before it starts an exec of
that uid, and the last call's sweep is waited for before the verdict.
"""

from __future__ import annotations

import contextlib
import time
from pathlib import Path
from typing import Any

import pytest

from mm_batch.config.model import SandboxSpec
from mm_batch.effects.docker.sandbox import DockerSandbox
from mm_batch.testing.fake_openai import by_prompt, text, tool_call
from tests.docker_support import TEST_IMAGE
from tests.helpers import Cli, Fake, model_args, read_calls, write

pytestmark = pytest.mark.docker

# Stops every process of the tools' uid, over and over (the sweep's exec of that uid among them),
# for STOP_S seconds; then lets them all go on, so that a failing case leaves nothing wedged.
STOP_S = 100
STOPPER = (
    "setsid sh -c 'read u _ </proc/uptime; end=$((${u%.*} + "
    f"{STOP_S}"
    ")); while read u _ </proc/uptime; [ ${u%.*} -lt $end ]; do kill -STOP -1; done; "
    "kill -CONT -1' >/dev/null 2>&1 </dev/null &"
)


def _listed(docker_client: Any, run_prefix: str) -> list[dict[str, Any]]:
    """Containers of mm-batch runs whose run id starts with the prefix, as the engine lists them
    (the SDK's own listing inspects each one, which a stopped `runc init` holds up)."""
    found = docker_client.api.containers(all=True, filters={"label": "mm-batch"})
    return [c for c in found if c["Labels"].get("mm-batch.run", "").startswith(run_prefix)]


def _unwedge(docker_client: Any, run_prefix: str) -> None:
    """Remove what a failing case left, once the stopper has let the sweep's exec go on."""
    give_up = time.monotonic() + STOP_S + 60
    while (left := _listed(docker_client, run_prefix)) and time.monotonic() < give_up:
        for container in left:
            with contextlib.suppress(Exception):
                docker_client.api.remove_container(container["Id"], force=True)
        time.sleep(1)


def test_a_last_call_leaving_a_stopper_is_judged_after_its_sweep_ended_it(
    docker_client: Any, cli: Cli, fake_model: Fake, tmp_path: Path
) -> None:
    agent = tmp_path / "agent"
    sandbox = f"{{kind: docker, image: {TEST_IMAGE}, workspace: copy}}"
    tool = f'  - {{name: stop, description: stop., command: ["sh", "-c", "{STOPPER} echo ok"]}}\n'
    write(agent, "agent.yaml", f"yolo: true\nsandbox: {sandbox}\ntools:\n{tool}")
    tasks = write(agent, "tasks.yaml", "agent: agent.yaml\ntasks: [{id: stopper, prompt: go}]\n")
    fake = fake_model(by_prompt({"go": [tool_call("stop", {}), text("done")]}))
    out = tmp_path / "out"
    try:
        result = cli("run", tasks, *model_args(fake), "--out", out)
        (final,) = [r for r in read_calls(out) if r["kind"] == "task"]
        # Judged once the last call's sweep confirmed that the stopper is gone.
        assert final["status"] == "passed", final
        assert result.code == 0, result.err
        assert not _listed(docker_client, "stopper["), "the run's container outlived it"
    finally:
        _unwedge(docker_client, "stopper[")


def test_a_stopper_left_by_a_call_stops_no_sweep_and_close_removes_the_container(
    docker_client: Any, tmp_path: Path
) -> None:
    folder = tmp_path / "agent"
    folder.mkdir()
    folder.chmod(0o777)
    spec = SandboxSpec(kind="docker", image=TEST_IMAGE, pids=128, memory="256m", workspace="mount")
    box = DockerSandbox(docker_client, spec, folder, "sweep-stopped")
    try:
        # The call times out: the sweep runs while the call's stream is still read.
        first = box.execute(["sh", "-c", f"{STOPPER} sleep 100"], folder, {}, 2.0)
        assert first.timed_out, first
        second = box.execute(["sh", "-c", "echo next"], folder, {}, 10.0)
        assert second.exit_code == 0 and second.stdout.data == b"next\n", second
        container_id = box.container_id
        box.close()
        time.sleep(1)
        left = [c["Id"] for c in _listed(docker_client, "sweep-stopped")]
        # The container (and the stopper, burning a CPU) outlives close() otherwise: a later
        # run's orphan removal times out on it the same way.
        assert container_id not in left, "the container outlived close()"
    finally:
        box.close()
        _unwedge(docker_client, "sweep-stopped")
