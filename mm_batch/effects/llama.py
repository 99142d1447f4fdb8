"""The embedded default: a llama.cpp server on a free loopback port, serving one local model."""

from __future__ import annotations

import os
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

from mm_batch.config.local_catalog import LocalModel
from mm_batch.effects.gguf import LOCAL_EXTRA_HINT, LocalModelError, server_binary
from mm_batch.effects.host import start_service, stop_service

HEALTH_DEADLINE_S = 180.0
CONTEXT_PER_SLOT = 4096


class ServerError(Exception):
    """The model server could not start, or died."""


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class LlamaServer:
    """One llama-server process, with as many slots as the run has parallel jobs for it."""

    def __init__(self, model: LocalModel, slots: int, binary: Path, gguf: Path) -> None:
        """`binary` from check_installed, `gguf` from ensure_gguf: resolved once, before runs."""
        self.model = model
        self.slots = max(1, slots)
        self.binary = binary
        self.gguf = gguf
        self.port = 0
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = (
            Path(tempfile.gettempdir()) / f"mm-batch-llama-{os.getpid()}-{model.name}.log"
        )

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    @staticmethod
    def check_installed(model: LocalModel) -> Path:
        """The server binary; raises LocalModelError when the extra is not there."""
        binary = server_binary()
        if binary is None:
            raise LocalModelError(f"{model.model} needs llama.cpp's server: {LOCAL_EXTRA_HINT}")
        return binary

    def start(self, deadline_s: float = HEALTH_DEADLINE_S) -> None:
        self.port = _free_port()
        argv = [
            str(self.binary),
            "-m",
            str(self.gguf),
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--jinja",
            "--parallel",
            str(self.slots),
            "--ctx-size",
            str(CONTEXT_PER_SLOT * self.slots),
            "--threads",
            str(os.cpu_count() or 2),
            "--offline",
        ]
        self.proc = start_service(argv, self.log_path)
        deadline = time.monotonic() + deadline_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise ServerError(
                    f"llama-server for {self.model.model} exited with {self.proc.returncode} "
                    f"while starting: {self.log_tail()}"
                )
            if self._healthy():
                return
            time.sleep(0.2)
        self.stop()
        raise ServerError(
            f"llama-server for {self.model.model} was not ready within {deadline_s:g} s: "
            f"{self.log_tail()}"
        )

    def _healthy(self) -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=2) as r:
                return int(r.status) == 200
        except (urllib.error.URLError, OSError, ValueError):
            return False

    def died(self) -> str | None:
        """Why the server is gone, or None while it runs."""
        if self.proc is None or self.proc.poll() is None:
            return None
        return (
            f"llama-server for {self.model.model} died (exit {self.proc.returncode}): "
            f"{self.log_tail()}"
        )

    def log_tail(self, lines: int = 5) -> str:
        try:
            text = self.log_path.read_text(errors="replace").strip().splitlines()
        except OSError:
            return "(no log)"
        tail = " | ".join(line.strip() for line in text[-lines:])
        return tail or "(empty log)"

    def stop(self) -> None:
        if self.proc is not None:
            stop_service(self.proc)
        self.log_path.unlink(missing_ok=True)
