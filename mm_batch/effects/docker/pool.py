"""The sandboxes of a batch: one connection to the engine (orphans of killed runs removed once),
one sandbox per task run that asks for one, and every live one closed at the end."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from mm_batch.plan import RunSpec
from mm_batch.run.ports import (
    ExecResult,
    Executor,
    PinnedProgram,
    SandboxError,
    UnreadProgram,
)

if TYPE_CHECKING:
    from mm_batch.effects.docker.engine import DockerClient
    from mm_batch.effects.docker.sandbox import DockerSandbox


class DockerSandboxes:
    """Connects to the engine once (removing orphans of killed runs), and tracks live sandboxes."""

    def __init__(self, out_dir: Path) -> None:
        self._out_dir = out_dir  # a copied workspace leaves the results folder out
        self._lock = threading.Lock()
        self._client: DockerClient | None = None
        self._failure: SandboxError | None = None
        self._live: set[DockerSandbox] = set()

    def _connect(self) -> DockerClient:
        # Loaded here, not at import: a run without Docker never loads the sandbox's modules.
        from mm_batch.effects.docker.engine import connect
        from mm_batch.effects.docker.lifecycle import remove_orphans

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

    def prepare(self) -> None:
        """Connect now (on a thread, while litellm imports); a failure waits for `open`."""
        with contextlib.suppress(SandboxError):
            self._connect()

    def open(self, spec: RunSpec) -> Executor:
        from mm_batch.effects.docker.sandbox import DockerSandbox

        sandbox = DockerSandbox(
            self._connect(),
            spec.sandbox,
            spec.task.agent.directory,
            spec.run_id,
            out_dir=self._out_dir,
        )
        with self._lock:
            self._live.add(sandbox)
        try:
            # A missing image, or a folder that does not fit, fails the run now: before the
            # model is asked, not at its first call.
            sandbox.start()
        except BaseException:
            sandbox.close()
            self.forget(sandbox)
            raise
        return _Tracked(sandbox, self)

    def forget(self, sandbox: DockerSandbox) -> None:
        with self._lock:
            self._live.discard(sandbox)

    def close_all(self) -> None:
        with self._lock:
            live, self._live = list(self._live), set()
        for sandbox in live:
            sandbox.close()


class _Tracked:
    """A sandbox that leaves the live set when closed."""

    def __init__(self, sandbox: DockerSandbox, owner: DockerSandboxes) -> None:
        self._sandbox = sandbox
        self._owner = owner

    @property
    def where(self) -> str:
        return self._sandbox.where

    def execute(
        self,
        argv: Sequence[str],
        workdir: Path,
        env: Mapping[str, str],
        timeout: float,
        cancel: threading.Event | None = None,
        *,
        programs: Sequence[PinnedProgram] = (),
    ) -> ExecResult:
        return self._sandbox.execute(argv, workdir, env, timeout, cancel, programs=programs)

    def changed(
        self, workdir: Path, unread: Sequence[UnreadProgram], *, check: bool = False
    ) -> UnreadProgram | None:
        return self._sandbox.changed(workdir, unread, check=check)

    def protect(self, files: Mapping[Path, bytes]) -> dict[Path, str]:
        return self._sandbox.protect(files)

    def execute_check(
        self, argv: Sequence[str], workdir: Path, timeout: float, cancel: threading.Event | None
    ) -> ExecResult:
        return self._sandbox.execute_check(argv, workdir, timeout, cancel)

    def settled(self) -> str | None:
        return self._sandbox.settled()

    def close(self) -> None:
        self._sandbox.close()
        self._owner.forget(self._sandbox)
