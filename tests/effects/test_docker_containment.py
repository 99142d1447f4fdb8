"""Containment inside the Docker sandbox, read from inside the container itself.

Each case is an attack a command (or the world outside) could make, and asserts what really
happened: on the host's files, in the container, and in the call's result.
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from mm_batch.config.model import SandboxSpec
from mm_batch.effects.docker import (
    LABEL,
    LABEL_PID_NS,
    LABEL_RUN,
    DockerSandbox,
    pid_namespace,
    remove_orphans,
)
from mm_batch.effects.watchdog import LABEL_HOST, LABEL_PID, LABEL_PID_START
from mm_batch.run.ports import SandboxError
from tests.docker_support import (
    BASE_IMAGE,
    TEST_IMAGE,
    build_image_without,
    containers_of,
    require_image,
)

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
    for cap in ("CapInh", "CapPrm", "CapEff", "CapAmb"):
        assert int(status[cap], 16) == 0, cap
    # The bounding set keeps CAP_KILL (bit 5) alone, for the sweep's root exec: with
    # no-new-privileges and no capability of its own, no tool process can ever gain it.
    assert int(status["CapBnd"], 16) == 1 << 5
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


def test_an_ipc_namespace_of_its_own_where_unheld_shared_memory_dies(
    box: DockerSandbox, docker_client: Any
) -> None:
    said = sh(box, "readlink /proc/self/ns/ipc; cat /proc/sys/kernel/shm_rmid_forced")
    namespace, forced = said.stdout.data.decode().split()
    assert namespace != os.readlink("/proc/self/ns/ipc") and forced == "1"
    config = docker_client.api.inspect_container(box.container_id)["HostConfig"]
    assert config["IpcMode"] == "private"  # no other container may join it


def test_read_only_root_writable_workspace_and_tmp(box: DockerSandbox) -> None:
    assert sh(box, "touch /etc/mm-batch-test").exit_code != 0
    assert sh(box, "touch /bin/mm-batch-test").exit_code != 0
    assert sh(box, "echo hi > /workspace/written && echo ok > /tmp/t && cat /tmp/t").exit_code == 0
    assert sh(box, "cat /workspace/written").stdout.data == b"hi\n"
    assert not (box.agent_dir / "written").exists()  # the copy is the container's own


def test_fork_bomb_is_held_by_the_pids_limit(box: DockerSandbox, docker_client: Any) -> None:
    result = sh(box, "b() { b | b & }; b; sleep 100", timeout=3)
    # Held: the bomb meets the limit (its own shell may be the one that cannot fork, and end).
    assert result.timed_out or result.exit_code != 0
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


# -- workspaces -------------------------------------------------------------------------------


def _sandbox(client: Any, agent_dir: Path, name: str, **fields: Any) -> DockerSandbox:
    spec = SandboxSpec(kind="docker", image=TEST_IMAGE, pids=64, memory="64m", **fields)
    return DockerSandbox(client, spec, agent_dir, f"containment-{name}")


@pytest.fixture
def agent_dir(tmp_path: Path) -> Path:
    folder = tmp_path / "agent"
    (folder / "hooks").mkdir(parents=True)
    (folder / "hooks" / "pre.sh").write_text("#!/bin/sh\nexit 0\n")
    (folder / "agent.yaml").write_text("sandbox: {kind: docker}\n")
    return folder


def test_copy_leaves_the_host_folder_unchanged_whatever_runs(
    docker_client: Any, agent_dir: Path, tmp_path: Path
) -> None:
    before = {p: p.read_bytes() for p in agent_dir.rglob("*") if p.is_file()}
    box = _sandbox(docker_client, agent_dir, "copy-rewrite")
    try:
        attack = (
            "echo 'touch /tmp/PWNED' > hooks/pre.sh && echo 'sandbox: {kind: host}' > agent.yaml"
            " && cp /bin/busybox suid && chmod 4755 suid && mkdir -p new && echo x > new/file"
            " && rm -rf hooks && cat agent.yaml"
        )
        result = sh(box, attack)
        assert result.exit_code == 0, result
        assert result.stdout.data == b"sandbox: {kind: host}\n"  # the container's copy changed
    finally:
        box.close()
    after = {p: p.read_bytes() for p in agent_dir.rglob("*") if p.is_file()}
    assert after == before  # the host's: not a byte, not a new file, no setuid file


def test_every_sandbox_starts_from_a_fresh_copy(docker_client: Any, agent_dir: Path) -> None:
    for repeat in (1, 2):
        box = _sandbox(docker_client, agent_dir, f"fresh-{repeat}")
        try:
            seen = sh(
                box, "cat left-by-repeat 2>/dev/null || echo fresh; echo dirty > left-by-repeat"
            )
            assert seen.stdout.data == b"fresh\n", f"repeat {repeat} saw an earlier repeat"
        finally:
            box.close()


def test_copy_keeps_links_as_links_and_leaves_the_results_folder_out(
    docker_client: Any, agent_dir: Path, tmp_path: Path
) -> None:
    secret = tmp_path / "outside-secret"
    secret.write_text("host secret\n")
    (agent_dir / "link").symlink_to(secret)
    (agent_dir / "dirlink").symlink_to(tmp_path)
    out = agent_dir / "results"
    out.mkdir()
    (out / "junit.xml").write_text("<earlier/>")
    spec = SandboxSpec(kind="docker", image=TEST_IMAGE, pids=64, memory="64m")
    box = DockerSandbox(docker_client, spec, agent_dir, "containment-links", out_dir=out)
    try:
        result = sh(
            box, "readlink link; cat link dirlink/outside-secret 2>&1; test -e results; echo $?"
        )
        lines = result.stdout.data.decode().splitlines()
        assert lines[0] == str(secret)  # the link itself, pointing at a host path...
        assert "host secret" not in result.stdout.data.decode()  # ...that is not there
        assert lines[-1] == "1"  # the results folder is not even in the copy
    finally:
        box.close()


def test_a_folder_that_does_not_fit_is_refused_before_anything_runs(
    docker_client: Any, agent_dir: Path
) -> None:
    (agent_dir / "big.bin").write_bytes(b"\0" * (3 * 1024 * 1024))
    box = _sandbox(docker_client, agent_dir, "too-big", workspace_size="2m")
    try:
        with pytest.raises(SandboxError) as caught:
            box.start()
        assert str(caught.value).startswith(
            f"the agent's folder {agent_dir} does not fit the sandbox"
        )
        assert "\n" not in str(caught.value)
        assert box.container is None  # refused before a container was even made
    finally:
        box.close()
    assert containers_of(docker_client, "containment-too-big") == []


def test_a_full_workspace_is_enospc_and_the_sandbox_goes_on(
    docker_client: Any, agent_dir: Path
) -> None:
    box = _sandbox(docker_client, agent_dir, "fill", workspace_size="8m")
    try:
        result = sh(box, "dd if=/dev/zero of=fill bs=1M count=64")
        assert result.exit_code != 0 and result.error is None and not result.sandbox_failed
        assert b"No space left on device" in result.stderr.data
        after = sh(box, "rm fill && echo usable")
        assert after.stdout.data == b"usable\n"  # not OOM-killed: the container is alive
    finally:
        box.close()
    assert not (agent_dir / "fill").exists()


def test_mount_writes_through_and_must_be_writable(docker_client: Any, agent_dir: Path) -> None:
    agent_dir.chmod(0o755)  # owned by the test's uid, not the sandbox's
    box = _sandbox(docker_client, agent_dir, "mount-ro", workspace="mount")
    try:
        with pytest.raises(SandboxError) as caught:
            box.start()
        assert str(caught.value) == (
            f"workspace: mount needs {agent_dir} writable by the sandbox user 1000:1000; "
            "make it so, or use workspace: copy"
        )
    finally:
        box.close()
    agent_dir.chmod(0o777)
    box = _sandbox(docker_client, agent_dir, "mount-rw", workspace="mount")
    try:
        assert sh(box, "echo through > written").exit_code == 0
    finally:
        box.close()
    assert (agent_dir / "written").read_text() == "through\n"
    assert (agent_dir / "written").stat().st_uid == 1000  # never root's


def test_readonly_allows_only_tmp(docker_client: Any, agent_dir: Path) -> None:
    agent_dir.chmod(0o777)
    box = _sandbox(docker_client, agent_dir, "readonly", workspace="readonly")
    try:
        denied = sh(box, "echo x > /workspace/written")
        assert denied.exit_code != 0 and b"Read-only file system" in denied.stderr.data
        assert sh(box, "cat agent.yaml && echo ok > /tmp/t").exit_code == 0
    finally:
        box.close()
    assert not (agent_dir / "written").exists()


@pytest.mark.parametrize("user", ["1000:1000", "1234:1234", "2147483646:7"])
def test_no_tool_call_runs_as_root(docker_client: Any, agent_dir: Path, user: str) -> None:
    box = _sandbox(docker_client, agent_dir, f"uid-{user.replace(':', '-')}", user=user)
    try:
        status = sh(box, "cat /proc/self/status; id -G").stdout.data.decode()
        uid, gid = user.split(":")
        ids = dict(line.split(":\t", 1) for line in status.splitlines() if ":\t" in line)
        assert ids["Uid"].split() == [uid] * 4  # real, effective, saved, filesystem
        assert ids["Gid"].split() == [gid] * 4
        assert ids["Groups"].split() in ([], [gid])
        made = sh(box, "cp /bin/busybox suid && chmod 4755 suid && stat -c %u suid")
        assert made.stdout.data == f"{uid}\n".encode()  # a set-uid file, but never root's
    finally:
        box.close()


# -- pristine copies ---------------------------------------------------------------------------


def test_protect_places_copies_the_tools_cannot_change(docker_client: Any, agent_dir: Path) -> None:
    verify = agent_dir / "verify.sh"
    verify.write_text("#!/bin/sh\necho pristine\n")
    verify.chmod(0o755)
    box = _sandbox(docker_client, agent_dir, "protect")
    try:
        assert sh(box, "echo 'echo rewritten' > verify.sh").exit_code == 0
        (copy,) = box.protect({verify: verify.read_bytes()}).values()
        assert copy.startswith("/.mm-batch-check/copies-")
        attacks = [
            f"echo 'echo pwned' > {copy}",
            f"rm -f {copy}",
            f"mv {copy} /tmp/elsewhere",
            f"rm -rf {copy.rsplit('/', 1)[0]}",
            f"chmod 777 {copy}",
            f"cat {copy}",  # the checks' space is not even readable by the tools
            "dd if=/dev/zero of=/.mm-batch-check/fill bs=1M count=1",
        ]
        for attack in attacks:
            assert sh(box, attack).exit_code != 0, attack
        ran = box.execute_check([copy], agent_dir, 10, None)
        assert ran.exit_code == 0 and ran.stdout.data == b"pristine\n"
        owner = box.execute_check(["stat", "-c", "%u %a", copy], agent_dir, 10, None)
        assert owner.stdout.data == b"65532 755\n"
    finally:
        box.close()


# -- a container that dies or vanishes mid-call -------------------------------------------------


def _during_the_call(box: DockerSandbox, action: Callable[[Any], None]) -> Any:
    """Run `sleep 300` in the box; once it runs, do `action` to its container from outside."""

    sdk: Any = box.client  # the SDK's client: `top` is none of the sandbox's own requests

    def strike() -> None:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            with contextlib.suppress(Exception):
                top = sdk.api.top(box.container_id)
                if any("sleep 300" in " ".join(p) for p in top.get("Processes") or []):
                    action(box)
                    return
            time.sleep(0.05)

    box.start()
    thread = threading.Thread(target=strike, daemon=True)
    thread.start()
    result = box.execute(["sh", "-c", "touch started; sleep 300"], box.agent_dir, {}, 60)
    thread.join()
    return result


@pytest.mark.parametrize(
    ("how", "reason"),
    [
        ("kill", "the container failed: the container stopped during the call (exit code 137"),
        ("remove", "the container failed: "),
        ("stop", "the container failed: the container stopped during the call (exit code"),
    ],
)
def test_a_container_killed_mid_call_is_a_sandbox_failure(
    docker_client: Any, agent_dir: Path, how: str, reason: str
) -> None:
    box = _sandbox(docker_client, agent_dir, f"dies-{how}")
    actions: dict[str, Callable[[Any], None]] = {
        "kill": lambda b: b.client.api.kill(b.container_id),
        "remove": lambda b: b.client.api.remove_container(b.container_id, force=True),
        "stop": lambda b: b.client.api.stop(b.container_id, timeout=0),
    }
    try:
        result = _during_the_call(box, actions[how])
    finally:
        box.close()
    # Found as the container's end before the call's own timeout: 60 s, SPEC 3's deadline for a
    # container that vanishes mid-call (a timed-out result otherwise).
    assert result.sandbox_failed and result.started and result.exit_code is None
    assert not result.timed_out
    assert (result.error or "").startswith(reason), result.error
    assert "\n" not in (result.error or "")


# -- images that cannot hold a sandbox -----------------------------------------------------------


@pytest.fixture(scope="module")
def crippled_images(docker_client: Any) -> Iterator[dict[str, str]]:
    """The busybox image less `sleep`, and less `/bin/sh`, built here from the local image."""
    images = {missing: build_image_without(docker_client, missing) for missing in ("sleep", "sh")}
    # busybox's shell runs its own tar applet even without the link: take it out of Debian's.
    require_image(docker_client, BASE_IMAGE)
    images["tar"] = build_image_without(docker_client, "tar", BASE_IMAGE)
    yield images
    for tag in images.values():
        with contextlib.suppress(Exception):
            docker_client.images.remove(tag, force=True)


@pytest.mark.parametrize(
    ("missing", "message"),
    [
        ("sleep", "image mm-batch/sandbox:test-no-sleep cannot keep the sandbox running"),
        ("sh", "image mm-batch/sandbox:test-no-sh has no /bin/sh, which the sandbox needs"),
        ("tar", "image mm-batch/sandbox:test-no-tar has no tar program, which the copied"),
    ],
)
def test_an_image_without_sleep_sh_or_tar_is_refused_at_start(
    docker_client: Any,
    crippled_images: dict[str, str],
    agent_dir: Path,
    missing: str,
    message: str,
) -> None:
    spec = SandboxSpec(kind="docker", image=crippled_images[missing], pids=64, memory="64m")
    box = DockerSandbox(docker_client, spec, agent_dir, f"containment-no-{missing}")
    try:
        with pytest.raises(SandboxError) as caught:
            box.start()
        text = str(caught.value)
        assert text.startswith(message) or (
            missing == "sleep"
            and text == f"image {spec.image} has no sleep program, which the sandbox needs"
        ), text
        assert "\n" not in text
    finally:
        box.close()
    assert containers_of(docker_client, f"containment-no-{missing}") == []


# -- the orphan scan -----------------------------------------------------------------------------


def test_the_orphan_scan_never_raises_and_leaves_what_it_cannot_judge(docker_client: Any) -> None:
    odd = [
        {LABEL: "1", LABEL_RUN: "odd-no-pid"},
        {LABEL: "1", LABEL_RUN: "odd-pid", LABEL_PID: "x", LABEL_HOST: socket.gethostname()},
        {
            LABEL: "1",
            LABEL_RUN: "odd-other-ns",
            LABEL_PID: "1",
            LABEL_PID_START: "1",
            LABEL_HOST: socket.gethostname(),
            LABEL_PID_NS: "pid:[1]",
        },
        {
            LABEL: "1",
            LABEL_RUN: "odd-negative",
            LABEL_PID: "-1",
            LABEL_PID_START: "1",
            LABEL_HOST: socket.gethostname(),
            LABEL_PID_NS: pid_namespace(),
        },
    ]
    made = [
        docker_client.api.create_container(TEST_IMAGE, ["true"], labels=labels)["Id"]
        for labels in odd
    ]
    vanishing = docker_client.api.create_container(
        TEST_IMAGE,
        ["true"],
        labels={
            LABEL: "1",
            LABEL_RUN: "odd-vanishing",
            LABEL_PID: "999999999",
            LABEL_PID_START: "1",
            LABEL_HOST: socket.gethostname(),
            LABEL_PID_NS: pid_namespace(),
        },
    )["Id"]

    class RemovedDuringTheScan:
        """The real engine, where someone removes a container between the listing and us."""

        def __init__(self) -> None:
            self.api = self

        def containers(self, **kwargs: Any) -> Any:
            listed = docker_client.api.containers(**kwargs)
            docker_client.api.remove_container(vanishing, force=True)
            return listed

        def remove_container(self, container: str, force: bool) -> None:
            docker_client.api.remove_container(container, force=force)

    try:
        remove_orphans(RemovedDuringTheScan())
        remaining = {c.labels[LABEL_RUN] for c in containers_of(docker_client, "odd-")}
        assert remaining == {"odd-no-pid", "odd-pid", "odd-other-ns", "odd-negative"}
    finally:
        for container in made:
            with contextlib.suppress(Exception):
                docker_client.api.remove_container(container, force=True)
