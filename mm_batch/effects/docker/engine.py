"""The Docker engine as the sandbox uses it: the SDK's client, typed by what mm-batch calls of it;
one clear line when the engine is down; one container's requests, each bounded in time.

The SDK ships no types: the protocols below name the calls made of it, so that mypy checks
every use. When the runtime cannot start the program of an exec (not found, not executable),
the exec's `Pid` is 0 and its message comes on stdout.
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol, TypeVar

from mm_batch.effects.docker.stream import EngineError, Frames, first_line, read_to_end
from mm_batch.effects.host import Sink
from mm_batch.jsontypes import JsonObject, JsonValue
from mm_batch.run.ports import SandboxError

ENGINE_TIMEOUT_S = 20.0  # every engine request; with the probe below, a stall fails in < 60 s
PROBE_TIMEOUT_S = 10.0
ROOT = "0:0"  # the sweep, the program copies and mm-batch's probes: root holding only CAP_KILL

_Result = TypeVar("_Result")


class Container(Protocol):
    """A container of the SDK (`docker.models.containers.Container`): its id is all we keep."""

    @property
    def id(self) -> str: ...


class ContainerCollection(Protocol):
    """The SDK's `client.containers`: `create` only (never `run`, which pulls a missing image)."""

    def create(
        self, image: str, command: Sequence[str] | None = None, **kwargs: object
    ) -> Container: ...


class AttachedSocket(Protocol):
    """What the SDK's `exec_start(socket=True)` returns: the exec's stream, as a socket."""

    def fileno(self) -> int: ...

    def close(self) -> None: ...


class EngineApi(Protocol):
    """The SDK's low-level client (`docker.APIClient`): the requests the sandbox sends."""

    def containers(
        self, *, all: bool = False, filters: Mapping[str, str] | None = None
    ) -> JsonValue: ...

    def start(self, container: str) -> None: ...

    def remove_container(self, container: str, *, force: bool = False) -> None: ...

    def inspect_container(self, container: str) -> JsonValue: ...

    def exec_create(
        self,
        container: str,
        cmd: list[str],
        *,
        stdout: bool = True,
        stderr: bool = True,
        stdin: bool = False,
        user: str = "",
        environment: dict[str, str] | None = None,
        workdir: str | None = None,
    ) -> JsonObject: ...

    def exec_start(self, exec_id: str, *, socket: bool = False) -> AttachedSocket: ...

    def exec_inspect(self, exec_id: str) -> JsonValue: ...


class DockerClient(Protocol):
    """The SDK's client (`docker.DockerClient`), as far as mm-batch uses it."""

    @property
    def api(self) -> EngineApi: ...

    @property
    def containers(self) -> ContainerCollection: ...

    def ping(self) -> bool: ...

    def close(self) -> None: ...


def connect() -> DockerClient:
    """A client of the local engine. Raises SandboxError with one clear line when it is down."""
    import docker

    try:
        # use_context=False: CI must not follow a developer's docker CLI context.
        client: DockerClient = docker.from_env(use_context=False, timeout=ENGINE_TIMEOUT_S)
        client.ping()
    except Exception as exc:  # the SDK raises its own errors, requests' and OSError alike
        raise SandboxError(
            f"the Docker engine is unreachable ({first_line(exc)}); is dockerd running?"
        ) from exc
    return client


def is_not_found(exc: BaseException) -> bool:
    from docker.errors import NotFound

    return isinstance(exc, NotFound)


@dataclass(frozen=True)
class Done:
    """How an exec of our own (start-up, kill, protect) went."""

    pid: int
    exit_code: int | None
    stdout: bytes


@dataclass(frozen=True)
class ExecState:
    """The engine's account of an exec: its pid (0 when the runtime never started the
    program), its exit code once it ended, and whether it still runs."""

    pid: int
    exit_code: int | None
    running: bool

    @classmethod
    def of(cls, info: JsonValue) -> ExecState:
        fields = info if isinstance(info, dict) else {}
        return cls(
            _number(fields.get("Pid")) or 0,
            _number(fields.get("ExitCode")),
            bool(fields.get("Running")),
        )


def _number(value: JsonValue) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool | int | float | str):
        return int(value)
    raise EngineError(f"the Docker engine sent {value!r} where a number belongs")


class Engine:
    """One container's requests to the engine, each bounded in time. `container` is set once
    the container is created, and None again once the sandbox is closed."""

    def __init__(self, client: DockerClient, log_limit: int, workdir: str) -> None:
        self.client = client
        self.log_limit = log_limit
        self.workdir = workdir  # where execs of our own run
        self.container: Container | None = None

    def create_exec(
        self,
        argv: Sequence[str],
        user: str,
        workdir: str,
        env: Mapping[str, str] | None,
        stdin: bool,
    ) -> str:
        container = self.container
        if container is None:
            raise EngineError("the sandbox was closed")
        try:
            return str(
                self.client.api.exec_create(
                    container.id,
                    list(argv),  # a list: a string would be split by the SDK
                    stdout=True,
                    stderr=True,
                    stdin=stdin,
                    user=user,
                    workdir=workdir,
                    environment=dict(env) if env is not None else None,
                )["Id"]
            )
        except Exception as exc:
            raise EngineError(self.request_failure(exc)) from exc

    def open_stream(self, exec_id: str) -> socket.socket:
        """Start the exec; its attached stream, as a socket of our own with our own timeouts."""
        try:
            raw = self.client.api.exec_start(exec_id, socket=True)
            sock = socket.socket(fileno=os.dup(raw.fileno()))
        except Exception as exc:
            raise EngineError(self.request_failure(exc)) from exc
        # The SDK's objects would only keep the connection: ours is a duplicate of it.
        with contextlib.suppress(Exception):
            response = getattr(raw, "_response", None)
            raw.close()
            if response is not None:
                response.close()
        sock.setblocking(False)
        return sock

    def inspect_exec(self, exec_id: str) -> ExecState:
        try:
            info = self.client.api.exec_inspect(exec_id)
        except Exception as exc:
            raise EngineError(self.request_failure(exc)) from exc
        return ExecState.of(info)

    def request_failure(self, exc: BaseException) -> str:
        if is_not_found(exc):
            return "the container disappeared"
        return f"the Docker engine failed: {first_line(exc)}"

    def run(
        self,
        argv: Sequence[str],
        user: str,
        send: Callable[[socket.socket], None] | None = None,
    ) -> Done:
        """An exec of our own, bounded in time: its stdin from `send`, its output to the end."""
        exec_id = self.create_exec(argv, user, self.workdir, None, send is not None)
        sock = self.open_stream(exec_id)
        out, err = Sink(self.log_limit), Sink(self.log_limit)
        deadline = time.monotonic() + ENGINE_TIMEOUT_S
        try:
            if send is not None:
                sock.settimeout(ENGINE_TIMEOUT_S)
                send(sock)
                sock.shutdown(socket.SHUT_WR)  # tar reads to the end of its stdin
            sock.setblocking(False)
            if not read_to_end(sock, Frames(out, err), deadline):
                raise EngineError(
                    f"the Docker engine stopped answering (an exec took {ENGINE_TIMEOUT_S:g} s)"
                )
        finally:
            sock.close()
        state = self.inspect_exec(exec_id)
        return Done(state.pid, state.exit_code, out.captured().data + err.captured().data)

    def bounded(self, request: Callable[[], _Result]) -> _Result:
        """An engine request that gives up after PROBE_TIMEOUT_S, whatever the socket does."""
        box: list[_Result] = []
        failure: list[BaseException] = []

        def call() -> None:
            try:
                box.append(request())
            except Exception as exc:
                failure.append(exc)

        worker = threading.Thread(target=call, daemon=True, name="mm-batch-engine-probe")
        worker.start()
        worker.join(PROBE_TIMEOUT_S)
        if failure:
            if is_not_found(failure[0]):
                raise EngineError("the container disappeared during the call")
            raise EngineError(f"the Docker engine failed: {first_line(failure[0])}")
        if not box:
            raise EngineError(
                f"the Docker engine stopped answering (no reply in {PROBE_TIMEOUT_S:g} s)"
            )
        return box[0]

    def container_dead(self) -> str | None:
        """Why the container cannot run calls any more, or None while it is running (asked
        within PROBE_TIMEOUT_S: a quiet call's probe)."""
        container = self.container
        if container is None:
            return "the sandbox was closed during the call"
        try:
            info = self.bounded(lambda: self.client.api.inspect_container(container.id))
        except EngineError as exc:
            return str(exc)
        state = info.get("State", {}) if isinstance(info, dict) else {}
        state = state if isinstance(state, dict) else {}
        if state.get("Running"):
            return None
        oom = ", out of memory" if state.get("OOMKilled") else ""
        return f"the container stopped during the call (exit code {state.get('ExitCode')}{oom})"

    def fate(self, reason: str) -> str:
        """The container's death, when that is why the engine could not answer about an exec."""
        dead = self.container_dead()
        return dead if dead is not None else reason
