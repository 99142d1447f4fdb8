"""A sandbox's container: made hardened (create + start, never `run`), checked and filled at
start by one exec, and labelled so that one left by a killed mm-batch is removed later.

The container holds one capability, CAP_KILL, for the sweep's root exec (sweep.py); tools run
as a non-root uid, so they hold none.
"""

from __future__ import annotations

import contextlib
import os
import socket
import tarfile
from collections.abc import Mapping
from pathlib import Path
from typing import Protocol

from mm_batch.config.model import SandboxSpec
from mm_batch.effects.docker.engine import ROOT, Container, DockerClient, Engine
from mm_batch.effects.docker.stream import EngineError, first_line
from mm_batch.effects.docker.workspace import (
    CHECK_BYTES,
    CHECK_DIR,
    PROGRAMS_BYTES,
    PROGRAMS_DIR,
    TMP_BYTES,
    WORKSPACE,
    Mounts,
    Snapshot,
    Users,
    does_not_fit,
    size_bytes,
)
from mm_batch.effects.watchdog import LABEL_HOST, LABEL_PID, LABEL_PID_START, process_start
from mm_batch.jsontypes import JsonValue
from mm_batch.run.ports import SandboxError

LABEL = "mm-batch"
LABEL_RUN = "mm-batch.run"
LABEL_PID_NS = "mm-batch.pid-ns"
_KEEPALIVE = ["sleep", "2147483647"]
_COPY_ERRORS = "/tmp/.mm-batch-copy-errors"
# Exit codes of the start-up script, each a clear reason (no program picks them: it runs first).
_NO_SLEEP, _COPY_FAILED, _NOT_WRITABLE, _NO_TAR, _NO_HOME = 90, 91, 92, 93, 94


def pid_namespace() -> str:
    """mm-batch's pid namespace, as the labels name it ("" when it cannot be read)."""
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return ""


class _Listing(Protocol):
    """What removing orphans asks of the engine's low-level client (`EngineApi`)."""

    def containers(
        self, *, all: bool = False, filters: Mapping[str, str] | None = None
    ) -> JsonValue: ...

    def remove_container(self, container: str, *, force: bool) -> None: ...


class _Lister(Protocol):
    @property
    def api(self) -> _Listing: ...


def remove_orphans(client: _Lister) -> int:
    """Remove containers of mm-batch runs whose mm-batch process is provably gone; never raises.

    Only containers of this host and pid namespace are judged; one whose labels are missing or
    odd is left alone, and one removed by someone else during the scan is skipped.
    """
    try:
        found = client.api.containers(all=True, filters={"label": LABEL})
    except Exception:
        return 0
    host, namespace = socket.gethostname(), pid_namespace()
    removed = 0
    for item in found if isinstance(found, list) else []:
        try:
            if not isinstance(item, dict):
                continue
            labels = item.get("Labels")
            if not isinstance(labels, dict) or labels.get(LABEL_HOST) != host:
                continue
            if not namespace or labels.get(LABEL_PID_NS) != namespace:
                continue  # another pid namespace: its pids mean nothing here
            pid, start = int(str(labels.get(LABEL_PID))), labels.get(LABEL_PID_START)
            if pid <= 0 or not isinstance(start, str):
                continue
            if process_start(pid) == start:
                continue  # a live run: never touch it
            client.api.remove_container(str(item["Id"]), force=True)
            removed += 1
        except Exception:
            continue
    return removed


def create(
    client: DockerClient, spec: SandboxSpec, agent_dir: Path, run_id: str, users: Users
) -> Container:
    """The hardened container, created (not started); a missing image is never pulled."""
    from docker.errors import ImageNotFound
    from docker.types import LogConfig

    # `exec`: Docker's tmpfs default is noexec, and ./release.sh runs from the workspace,
    # a program's copy from PROGRAMS_DIR and a `check` from its copy in CHECK_DIR.
    check_uid = users.check_uid
    workspace = Mounts.of(spec, agent_dir, users.uid, users.gid)
    tmpfs = {
        "/tmp": f"rw,exec,nosuid,nodev,size={TMP_BYTES},mode=1777",
        CHECK_DIR: (
            f"rw,exec,nosuid,nodev,size={CHECK_BYTES},uid={check_uid},gid={check_uid},mode=0700"
        ),
        PROGRAMS_DIR: f"rw,exec,nosuid,nodev,size={PROGRAMS_BYTES},mode=0755",
        **workspace.tmpfs,
    }
    memory = size_bytes(spec.memory) + TMP_BYTES + CHECK_BYTES + PROGRAMS_BYTES
    memory += workspace.memory
    pid = os.getpid()
    try:
        # create + start, never `run`: run would pull a missing image.
        return client.containers.create(
            spec.image,
            command=_KEEPALIVE,
            detach=True,
            init=True,
            # Root for the container's own processes, so that the sweep (a root exec) holds
            # CAP_KILL, the one capability kept: a non-root exec gets none (no-new-privileges
            # and no file capabilities), so no tool can signal, stop or trace a root process.
            # ptrace is denied to tools by uid, not by a seccomp profile: without
            # CAP_SYS_PTRACE the kernel refuses tracing another uid (the sweep, mm-batch's
            # probes: root; a check: its own uid), and the verified sweep leaves no process
            # of an earlier call to trace a later one, so what a tool can still trace is its
            # own call's processes, which it could change anyway. A profile would also break
            # strace and debuggers that tools may legitimately run.
            user=ROOT,
            network_mode=spec.network,
            # An IPC namespace of the container's own, which no other container may join:
            # what its calls make there is theirs alone, for the reset to remove. Shared
            # memory no process holds is destroyed at once (defence in depth: a segment
            # left by a call is gone with its last process, even in an image the reset
            # cannot remove SysV objects in).
            ipc_mode="private",
            sysctls={"kernel.shm_rmid_forced": "1"},
            cap_drop=["ALL"],
            cap_add=["KILL"],
            security_opt=["no-new-privileges"],
            privileged=False,
            read_only=True,
            tmpfs=tmpfs,
            pids_limit=spec.pids,
            mem_limit=memory,
            memswap_limit=memory,
            nano_cpus=int(spec.cpus * 1e9),
            volumes=workspace.volumes,
            working_dir=str(WORKSPACE),
            environment={"HOME": "/tmp"},
            labels={
                LABEL: "1",
                LABEL_RUN: run_id,
                LABEL_PID: str(pid),
                LABEL_PID_START: process_start(pid),
                LABEL_PID_NS: pid_namespace(),
                LABEL_HOST: socket.gethostname(),
            },
            log_config=LogConfig(type="json-file", config={"max-size": "1m", "max-file": "1"}),
        )
    except ImageNotFound as exc:
        raise SandboxError(
            f"image {spec.image} not found (no image is pulled); build it first: "
            "containers/build.sh base, or see containers/README.md"
        ) from exc
    except Exception as exc:
        raise SandboxError(f"cannot create the container: {first_line(exc)}") from exc


def prepare(
    engine: Engine,
    spec: SandboxSpec,
    agent_dir: Path,
    snapshot: Snapshot | None,
    users: Users,
    home: str,
) -> None:
    """One exec as the tools' uid: check `sleep`, then fill or check the workspace, and make
    the first call's HOME."""
    # A file on the PATH, as the keep-alive needs: busybox's shell would find its applet.
    script = (
        'found=; IFS=:; for d in $PATH; do [ -f "$d/sleep" ] && [ -x "$d/sleep" ] && found=1; '
        f'done; unset IFS; [ -n "$found" ] || exit {_NO_SLEEP}\n'
    )
    if snapshot is not None:
        script += (
            f"tar -xf - -C {WORKSPACE} 2>{_COPY_ERRORS}; copied=$?\n"
            f"[ $copied -ne 127 ] || exit {_NO_TAR}\n"
            f"[ $copied -eq 0 ] || {{ head -c 2000 {_COPY_ERRORS}; exit {_COPY_FAILED}; }}\n"
            f"rm -f {_COPY_ERRORS}\n"
        )
    elif spec.workspace == "mount":
        script += f"[ -w {WORKSPACE} ] || exit {_NOT_WRITABLE}\n"
    script += f"mkdir -m 700 {home} {home}/tmp || exit {_NO_HOME}\n"

    def send(sock: socket.socket) -> None:
        assert snapshot is not None
        snapshot.send(sock, users.uid, users.gid)

    image = spec.image
    try:
        done = engine.run(
            ["/bin/sh", "-c", script], users.tools, send if snapshot is not None else None
        )
    except EngineError as exc:
        raise SandboxError(_start_failure(engine, image, str(exc))) from exc
    except (OSError, tarfile.TarError) as exc:
        # The stream broke while tar was reading it: tar's own message says why.
        reason = f"the copy broke off: {first_line(exc)}"
        raise SandboxError(_start_failure(engine, image, reason)) from exc
    output = done.stdout.decode(errors="replace").strip()
    if done.pid == 0:
        dead = _start_failure(engine, image, "")
        if dead.startswith("image "):  # the keep-alive exited first: no sleep to run
            raise SandboxError(dead)
        raise SandboxError(
            f"image {image} has no /bin/sh, which the sandbox needs "
            f"(the runtime said: {output.splitlines()[0][:200] if output else 'nothing'})"
        )
    if done.exit_code == _NO_SLEEP:
        raise SandboxError(f"image {image} has no sleep program, which the sandbox needs")
    if done.exit_code == _NO_TAR:
        raise SandboxError(
            f"image {image} has no tar program, which the copied workspace needs "
            "(workspace: copy, the default); add tar to the image"
        )
    if done.exit_code == _COPY_FAILED:
        if "space" in output.lower():
            room = size_bytes(spec.workspace_size)
            needed = snapshot.needed if snapshot is not None else 0
            raise SandboxError(does_not_fit(agent_dir, max(needed, room + 1), room))
        detail = output.splitlines()[0][:200] if output else "no reason given"
        raise SandboxError(f"cannot copy the agent's folder into the sandbox: {detail}")
    if done.exit_code == _NOT_WRITABLE:
        raise SandboxError(
            f"workspace: mount needs {agent_dir} writable by the sandbox user "
            f"{spec.user}; make it so, or use workspace: copy"
        )
    if done.exit_code == _NO_HOME:
        raise SandboxError(f"cannot make a HOME folder under /tmp in image {image}")
    if done.exit_code != 0:
        raise SandboxError(
            f"the sandbox's start-up check failed in image {image} (exit {done.exit_code})"
        )


def _start_failure(engine: Engine, image: str, reason: str) -> str:
    """Why start-up failed: a container that already exited had an image it cannot run."""
    container = engine.container
    with contextlib.suppress(Exception):
        info = engine.client.api.inspect_container(container.id) if container is not None else None
        state = info["State"] if isinstance(info, dict) else None
        if isinstance(state, dict) and not state.get("Running"):
            return (
                f"image {image} cannot keep the sandbox running: it needs /bin/sh "
                f"and a sleep program (the container exited with code {state.get('ExitCode')})"
            )
    return f"the container failed at start: {reason}"
