"""The production effects of a run: litellm clients, and host or Docker executors."""

from __future__ import annotations

import threading
from typing import Any

from mm_batch.plan import RunSpec
from mm_batch.run.batch import Effects
from mm_batch.run.executor import Executor, HostExecutor, SandboxError
from mm_batch.run.model_client import LiteLLMClient, ModelClient, load_litellm


class _DockerSandboxes:
    """Connects to the engine once (removing orphans of killed runs), and tracks live sandboxes."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._client: Any = None
        self._failure: SandboxError | None = None
        self._live: set[Any] = set()

    def _connect(self) -> Any:
        from mm_batch.run.docker_sandbox import connect, remove_orphans

        with self._lock:
            if self._failure is not None:
                raise self._failure
            if self._client is None:
                try:
                    self._client = connect()
                except SandboxError as exc:
                    self._failure = exc
                    raise
                remove_orphans(self._client)
            return self._client

    def open(self, spec: RunSpec) -> Executor:
        from mm_batch.run.docker_sandbox import DockerSandbox

        sandbox = DockerSandbox(
            self._connect(), spec.sandbox, spec.task.agent.directory, spec.run_id
        )
        with self._lock:
            self._live.add(sandbox)
        sandbox.start()  # a missing image fails the run now, not at its first call
        return _Tracked(sandbox, self)

    def forget(self, sandbox: Any) -> None:
        with self._lock:
            self._live.discard(sandbox)

    def close_all(self) -> None:
        with self._lock:
            live, self._live = list(self._live), set()
        for sandbox in live:
            sandbox.close()


class _Tracked:
    """A sandbox that leaves the live set when closed."""

    def __init__(self, sandbox: Any, owner: _DockerSandboxes) -> None:
        self._sandbox = sandbox
        self._owner = owner
        self.where = sandbox.where
        self.execute = sandbox.execute

    def close(self) -> None:
        self._sandbox.close()
        self._owner.forget(self._sandbox)


def default_effects() -> Effects:
    """litellm clients (one per model and options); the host executor or a Docker sandbox."""
    clients: dict[str, ModelClient] = {}
    lock = threading.Lock()
    sandboxes = _DockerSandboxes()

    def client_for(spec: RunSpec) -> ModelClient:
        key = f"{spec.model}\0{sorted(spec.model_options.items())!r}"
        with lock:
            if key not in clients:
                clients[key] = LiteLLMClient(spec.model, spec.model_options)
            return clients[key]

    def executor_for(spec: RunSpec) -> Executor:
        if spec.sandbox.kind == "docker":
            return sandboxes.open(spec)  # raises SandboxError: the run ends as an error
        return HostExecutor()

    # Import litellm (seconds) before the first run starts, so that no run's time includes it.
    load_litellm()
    return Effects(client_for, executor_for, sandboxes.close_all)
