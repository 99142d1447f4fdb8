"""Docker fixtures: the tests run against a real engine; in CI they must run, never skip."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest

from mm_batch.run.ports import SandboxError

TEST_IMAGE = "mm-batch/sandbox:tiny"
BASE_IMAGE = "mm-batch/sandbox:base"
# .ci/run sets this: there a missing engine or image fails the suite instead of skipping it.
REQUIRED = os.environ.get("MM_BATCH_REQUIRE_DOCKER") == "1"


def _unavailable(reason: str) -> None:
    if REQUIRED:
        pytest.fail(f"Docker is required here: {reason}")
    pytest.skip(reason)


@pytest.fixture(scope="session")
def docker_client() -> Iterator[Any]:
    from mm_batch.effects.docker import connect

    try:
        client = connect()
    except SandboxError as exc:
        _unavailable(str(exc))
    require_image(client, TEST_IMAGE)
    yield client
    client.close()


def containers_of(client: Any, run_prefix: str = "") -> list[Any]:
    """Containers of mm-batch runs (stopped ones too) whose run id starts with the prefix."""
    found = client.containers.list(all=True, filters={"label": "mm-batch"})
    return [c for c in found if c.labels.get("mm-batch.run", "").startswith(run_prefix)]


def require_image(client: Any, image: str) -> None:
    try:
        client.images.get(image)
    except Exception:
        _unavailable(f"image {image} is missing: run containers/build.sh {image.rsplit(':', 1)[1]}")


def build_image_without(client: Any, program: str, base: str = TEST_IMAGE) -> str:
    """A local image less one program (`sleep`, `sh`, `tar`), built here from `base`."""
    import io

    tag = f"mm-batch/sandbox:test-no-{program}"
    dockerfile = f"FROM {base}\nUSER 0\nRUN rm /bin/{program}\nUSER 1000:1000\n"
    client.images.build(fileobj=io.BytesIO(dockerfile.encode()), tag=tag, rm=True)
    return tag


def when_running(client: Any, run_prefix: str, text: str, action: Any, within: float = 30) -> Any:
    """A thread that calls `action(container)` once a process whose argv holds `text` runs in a
    container of a run whose id starts with the prefix."""
    import contextlib
    import threading
    import time

    def watch() -> None:
        deadline = time.monotonic() + within
        found: list[Any] = []
        while time.monotonic() < deadline:
            with contextlib.suppress(Exception):  # containers come and go meanwhile
                found = containers_of(client, run_prefix)
            for container in found:
                with contextlib.suppress(Exception):
                    processes = client.api.top(container.id).get("Processes") or []
                    if any(text in " ".join(p) for p in processes):
                        action(container)
                        return
            time.sleep(0.05)

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return thread


class EngineProxy:
    """A unix socket that forwards to the real engine until `cut()` closes every connection."""

    def __init__(self, path: str, engine: str = "/var/run/docker.sock") -> None:
        import socket
        import threading

        self.path, self.engine = path, engine
        self._server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._server.bind(path)
        self._server.listen(64)
        self._open: list[socket.socket] = []
        self._lock = threading.Lock()
        self.cut_done = False
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def url(self) -> str:
        return f"unix://{self.path}"

    def _accept(self) -> None:
        import socket
        import threading

        while True:
            try:
                client, _ = self._server.accept()
            except OSError:
                return
            upstream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            upstream.connect(self.engine)
            with self._lock:
                if self.cut_done:
                    client.close()
                    upstream.close()
                    return
                self._open += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    @staticmethod
    def _pump(source: Any, target: Any) -> None:
        import contextlib
        import socket

        with contextlib.suppress(OSError):
            while chunk := source.recv(65536):
                target.sendall(chunk)
        with contextlib.suppress(OSError):
            target.shutdown(socket.SHUT_WR)

    def cut(self) -> None:
        """The engine's socket closes: every connection now, and no new one is accepted."""
        import contextlib
        import os
        import socket

        with self._lock:
            self.cut_done = True
            sockets, self._open = self._open, []
        self._server.close()
        with contextlib.suppress(OSError):
            os.unlink(self.path)
        for sock in sockets:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()
