"""The Docker sandbox: one hardened container per task run, each call an exec of the argv list.

This module is the only one that imports the docker SDK. Measured facts it relies on:
`exec_run` has no timeout and closing its stream leaves the process running, so a deadline is
enforced by `kill -9 -1` run as the tools' uid; the container's keep-alive process runs as
another uid, so the kill takes down the call's whole tree and the container stays usable.
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path, PurePosixPath
from typing import Any

from mm_batch.config.model import SandboxSpec
from mm_batch.effects.host import KILL_GRACE_S, LOG_LIMIT, Sink
from mm_batch.run.ports import EMPTY, ExecResult, SandboxError

WORKSPACE = PurePosixPath("/workspace")
LABEL = "mm-batch"
LABEL_RUN = "mm-batch.run"
LABEL_PID = "mm-batch.pid"
LABEL_PID_START = "mm-batch.pid-start"
LABEL_HOST = "mm-batch.host"
_KEEPALIVE = ["sleep", "2147483647"]
_NOT_FOUND_MARKERS = ("executable file not found", "no such file or directory")


def _process_start(pid: int) -> str:
    """The kernel's start time of a process: with the pid, it tells a live run from a reused pid."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return ""


def connect() -> Any:
    """A client of the local engine. Raises SandboxError with one clear line when it is down."""
    import docker
    from docker.errors import DockerException

    try:
        # use_context=False: CI must not follow a developer's docker CLI context.
        client = docker.from_env(use_context=False, timeout=60)
        client.ping()
    except DockerException as exc:
        raise SandboxError(
            f"the Docker engine is unreachable ({_first_line(exc)}); is dockerd running?"
        ) from exc
    return client


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0][:300] if text else type(exc).__name__


def remove_orphans(client: Any) -> int:
    """Remove containers of mm-batch runs on this host whose mm-batch process is gone."""
    removed = 0
    host = socket.gethostname()
    for container in client.containers.list(all=True, filters={"label": LABEL}):
        labels = container.labels or {}
        if labels.get(LABEL_HOST) != host:
            continue
        try:
            pid = int(labels.get(LABEL_PID, ""))
        except ValueError:
            continue
        if _process_start(pid) == labels.get(LABEL_PID_START) and _process_start(pid):
            continue  # a live run: never touch it
        with contextlib.suppress(Exception):
            container.remove(force=True)
            removed += 1
    return removed


def _keepalive_user(user: str) -> str:
    """Another non-root uid for the container's own process, out of reach of `kill -1`."""
    return "65533:65533" if user.split(":", maxsplit=1)[0] == "65534" else "65534:65534"


class DockerSandbox:
    """An Executor whose commands run in one container, started at the first call."""

    def __init__(
        self,
        client: Any,
        spec: SandboxSpec,
        agent_dir: Path,
        run_id: str,
        log_limit: int = LOG_LIMIT,
    ) -> None:
        self.client = client
        self.spec = spec
        self.agent_dir = agent_dir.resolve()
        self.run_id = run_id
        self.log_limit = log_limit
        self.container: Any = None
        self._lock = threading.Lock()
        self._oom_kills = 0
        self._closed = False

    @property
    def where(self) -> str:
        return f"docker:{self.spec.image}"

    # -- lifecycle -----------------------------------------------------------------------

    def start(self) -> None:
        from docker.errors import APIError, DockerException, ImageNotFound
        from docker.types import LogConfig

        with self._lock:
            if self.container is not None:
                return
            if self._closed:
                raise SandboxError("the sandbox was closed")
            pid = os.getpid()
            try:
                # create + start, never `run`: run would pull a missing image.
                container = self.client.containers.create(
                    self.spec.image,
                    command=_KEEPALIVE,
                    detach=True,
                    init=True,
                    user=_keepalive_user(self.spec.user),
                    network_mode=self.spec.network,
                    cap_drop=["ALL"],
                    security_opt=["no-new-privileges"],
                    privileged=False,
                    read_only=True,
                    tmpfs={"/tmp": "rw,nosuid,nodev,size=256m,mode=1777"},
                    pids_limit=self.spec.pids,
                    mem_limit=self.spec.memory,
                    memswap_limit=self.spec.memory,
                    nano_cpus=int(self.spec.cpus * 1e9),
                    volumes={str(self.agent_dir): {"bind": str(WORKSPACE), "mode": "rw"}},
                    working_dir=str(WORKSPACE),
                    environment={"HOME": "/tmp"},
                    labels={
                        LABEL: "1",
                        LABEL_RUN: self.run_id,
                        LABEL_PID: str(pid),
                        LABEL_PID_START: _process_start(pid),
                        LABEL_HOST: socket.gethostname(),
                    },
                    log_config=LogConfig(
                        type="json-file", config={"max-size": "1m", "max-file": "1"}
                    ),
                )
            except ImageNotFound as exc:
                raise SandboxError(
                    f"image {self.spec.image} not found (no image is pulled); build it first: "
                    "containers/build.sh base, or see containers/README.md"
                ) from exc
            except (APIError, DockerException) as exc:
                raise SandboxError(f"cannot create the container: {_first_line(exc)}") from exc
            self.container = container
            try:
                container.start()
            except (APIError, DockerException) as exc:
                raise SandboxError(f"cannot start the container: {_first_line(exc)}") from exc

    def protect(self, files: Mapping[Path, bytes]) -> dict[Path, str]:
        raise NotImplementedError("pristine copies in the container")

    def close(self) -> None:
        with self._lock:
            self._closed = True
            container, self.container = self.container, None
        if container is not None:
            with contextlib.suppress(Exception):
                container.remove(force=True)

    # -- calls ---------------------------------------------------------------------------

    def _container_path(self, workdir: Path) -> PurePosixPath:
        try:
            relative = workdir.resolve().relative_to(self.agent_dir)
        except ValueError:
            raise ValueError(
                f"working directory {workdir} is outside the agent's directory {self.agent_dir}, "
                "which is all the container sees"
            ) from None
        return WORKSPACE / relative.as_posix() if relative.parts else WORKSPACE

    def execute(
        self,
        argv: Sequence[str],
        workdir: Path,
        env: Mapping[str, str],
        timeout: float,
        cancel: threading.Event | None = None,
    ) -> ExecResult:
        from docker.errors import APIError, DockerException

        started = time.monotonic()
        empty = EMPTY
        try:
            container_workdir = self._container_path(workdir)
        except ValueError as exc:
            return ExecResult(
                None, empty, empty, time.monotonic() - started, error=str(exc), started=False
            )
        try:
            self.start()
            exec_id = self.client.api.exec_create(
                self.container.id,
                list(argv),  # a list: a string would be split by the SDK
                stdout=True,
                stderr=True,
                user=self.spec.user,
                workdir=str(container_workdir),
                environment={"HOME": "/tmp", **env},
            )["Id"]
            stream = self.client.api.exec_start(exec_id, stream=True, demux=True)
        except SandboxError as exc:
            return ExecResult(
                None, empty, empty, time.monotonic() - started, error=str(exc), sandbox_failed=True
            )
        except (APIError, DockerException) as exc:
            message = f"the container failed: {_first_line(exc)}"
            return ExecResult(
                None, empty, empty, time.monotonic() - started, error=message, sandbox_failed=True
            )
        return self._supervise(exec_id, stream, argv, started, timeout, cancel)

    def _supervise(
        self,
        exec_id: str,
        stream: Iterator[tuple[bytes | None, bytes | None]],
        argv: Sequence[str],
        started: float,
        timeout: float,
        cancel: threading.Event | None,
    ) -> ExecResult:
        out, err = Sink(self.log_limit), Sink(self.log_limit)
        failure: list[BaseException] = []

        def pump() -> None:
            try:
                for stdout, stderr in stream:
                    if stdout:
                        out.add(stdout)
                    if stderr:
                        err.add(stderr)
            except Exception as exc:  # the stream broke: the container died under us
                failure.append(exc)

        reader = threading.Thread(target=pump, daemon=True)
        reader.start()
        deadline = started + timeout
        killed_at: float | None = None
        timed_out = interrupted = False
        while reader.is_alive():
            now = time.monotonic()
            if killed_at is None and (now >= deadline or (cancel is not None and cancel.is_set())):
                timed_out, interrupted = now >= deadline, now < deadline
                self._kill_calls()
                killed_at = now
            if killed_at is not None and now >= killed_at + 2 * KILL_GRACE_S:
                break
            reader.join(timeout=0.05)
        exit_code = self._exit_code(exec_id)
        duration = time.monotonic() - started
        if failure or (exit_code is None and not (timed_out or interrupted)):
            reason = _first_line(failure[0]) if failure else "the exec did not finish"
            return ExecResult(
                None,
                out.captured(),
                err.captured(),
                duration,
                error=f"the container failed: {reason}",
                sandbox_failed=True,
            )
        if timed_out or interrupted:
            return ExecResult(
                None,
                out.captured(),
                err.captured(),
                duration,
                timed_out=timed_out,
                interrupted=interrupted,
            )
        stdout = out.captured()
        if exit_code in (126, 127) and any(
            m in stdout.data.decode(errors="replace").lower() for m in _NOT_FOUND_MARKERS
        ):
            return ExecResult(
                None,
                stdout,
                err.captured(),
                duration,
                error=f"program not found: {argv[0]} (in {self.where})",
            )
        if exit_code == 137 and self._new_oom_kill():
            return ExecResult(
                exit_code,
                stdout,
                err.captured(),
                duration,
                error=f"killed: out of memory (the sandbox limit is {self.spec.memory})",
            )
        return ExecResult(exit_code, stdout, err.captured(), duration)

    def _exit_code(self, exec_id: str) -> int | None:
        with contextlib.suppress(Exception):
            info = self.client.api.exec_inspect(exec_id)
            if not info.get("Running"):
                code = info.get("ExitCode")
                return int(code) if code is not None else None
        return None

    def _kill_calls(self) -> None:
        """SIGKILL every process of the tools' uid: the call's whole tree, not the container.

        Under a fork bomb the kill itself may find no free pid: it is tried again while the
        bomb's processes come and go, and as a last resort the container is restarted.
        """
        for _ in range(10):
            with contextlib.suppress(Exception):
                killed = self.container.exec_run(["kill", "-9", "-1"], user=self.spec.user)
                if killed.exit_code == 0:
                    return
            time.sleep(0.1)
        with contextlib.suppress(Exception):
            self.container.restart(timeout=0)

    def _new_oom_kill(self) -> bool:
        """Whether the memory cgroup killed a process since the last look (cgroup v1 and v2)."""
        script = (
            "cat /sys/fs/cgroup/memory.events /sys/fs/cgroup/memory/memory.oom_control "
            "2>/dev/null | grep oom_kill"
        )
        try:
            result = self.container.exec_run(["sh", "-c", script], user=self.spec.user)
            count = max(int(line.split()[-1]) for line in result.output.decode().splitlines())
        except Exception:
            return False
        new = count > self._oom_kills
        self._oom_kills = count
        return new
