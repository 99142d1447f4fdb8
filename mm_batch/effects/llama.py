"""The embedded default: a llama.cpp server on a free loopback port, serving one local model
(asked by `effects.llama_client`)."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import tempfile
import threading
import time
import urllib.error
import urllib.request
import weakref
from collections import deque
from dataclasses import dataclass
from pathlib import Path

from mm_batch.config.local_catalog import LocalModel
from mm_batch.effects.gguf import (
    LOCAL_EXTRA_HINT,
    LocalModelError,
    ServerBuild,
    prompt_dir,
    prompt_name,
    prune_prompts,
    server_build,
)
from mm_batch.effects.host import start_service, stop_service

HEALTH_DEADLINE_S = 180.0
# How often a starting server's health is asked: a model loads in a second or more, and each
# poll it is not asked is up to this much of waiting added to the run's start.
HEALTH_POLL_S = 0.05
CONTEXT_PER_SLOT = 4096
# A turn of a small model longer than this is a loop, not an answer: the task's tool calls and
# answers measured on the examples take under 60 tokens. The agent's or CLI's `max_tokens` wins.
MAX_TOKENS = 512
# A slot's prompt saves or loads in milliseconds (15 MB for the 1.5B's 500 tokens); a server
# that takes longer to answer is not waited for: the next run computes the prompt again.
SLOT_FILE_TIMEOUT_S = 2.0


# The server listens on loopback: no proxy of the environment (HTTP_PROXY in a CI) may stand
# between. mm-batch's own requests to it (these, and `llama_client`'s) never read one.
_LOOPBACK = urllib.request.build_opener(urllib.request.ProxyHandler({}))


class ServerError(Exception):
    """The model server could not start, or died."""


def cores() -> int:
    """The CPUs this process may run on (a container's limit, not the host's count)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@dataclass(eq=False)
class SlotLease:
    """A run's slot of its server (None: every slot is held, the server chooses one), held
    while the lease lives: as long as the run's client."""

    slot: int | None


class SlotLeases:
    """Which slot of a server each run's conversation lives in. llama-server gives a request
    the idle slot whose cached prompt shares most with it, and its slots share no cache: a
    run's second turn could land in the slot another run's first turn had just taken over,
    and compute again what it had computed (and the other run lose its own). So each run
    holds one slot for as long as its client lives, and asks for it by number."""

    def __init__(self, count: int) -> None:
        self._held: list[weakref.ref[SlotLease] | None] = [None] * count
        self._lock = threading.Lock()

    def lease(self) -> SlotLease:
        with self._lock:
            for slot, held in enumerate(self._held):
                if held is None or held() is None:
                    lease = SlotLease(slot)
                    self._held[slot] = weakref.ref(lease)
                    return lease
        return SlotLease(None)


class LlamaServer:
    """One llama-server process, with as many slots as the run has parallel jobs for it."""

    def __init__(self, model: LocalModel, slots: int, server: ServerBuild, gguf: Path) -> None:
        """`server` from check_installed, `gguf` from ensure_gguf: resolved once, before runs."""
        self.model = model
        self.slots = max(1, slots)
        self.leases = SlotLeases(self.slots)
        self.server = server
        self.gguf = gguf
        self.port = 0
        self.proc: subprocess.Popen[bytes] | None = None
        self.ready = False
        self.prompt_file = prompt_name(model, server)
        self.log_path = (
            Path(tempfile.gettempdir()) / f"mm-batch-llama-{os.getpid()}-{model.name}.log"
        )

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    @staticmethod
    def check_installed(model: LocalModel) -> ServerBuild:
        """The server to start; raises LocalModelError when the extra is not there."""
        server = server_build()
        if server is None:
            raise LocalModelError(f"{model.model} needs llama.cpp's server: {LOCAL_EXTRA_HINT}")
        return server

    def argv(self) -> list[str]:
        """The server's command line. Local servers take turns on the CPU (`CpuTurns`), so each
        may use every core; `--poll 0` puts its threads to sleep as soon as they have no work,
        instead of spinning on cores that another server's turn needs. The prompt cache is on
        by default: a request's slot is the one whose cached prompt shares the longest prefix
        with it (the agent's system prompt and tools), and only the rest is computed; the
        slots' prompts are saved to and loaded from `prompt_dir()` (see `_restore_prompt`), when
        it exists: llama-server does not start with a folder that is not there."""
        saves = ["--slot-save-path", str(prompt_dir())] if prompt_dir().is_dir() else []
        return [
            *self.server.command,
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
            str(cores()),
            "--poll",
            "0",
            "--offline",
            *saves,
        ]

    def launch(self) -> None:
        """Start the process without waiting for it: servers load their models side by side.
        Called from the main thread: the server dies with it (see `start_service`)."""
        self.port = _free_port()
        with contextlib.suppress(OSError):  # without it, no prompt is saved: nothing else changes
            prompt_dir().mkdir(parents=True, exist_ok=True)
        self.proc = start_service(self.argv(), self.log_path)

    def wait_ready(self, deadline_s: float = HEALTH_DEADLINE_S) -> None:
        """Wait until the launched server answers its health check; raises ServerError."""
        assert self.proc is not None, "launch() first"
        deadline = time.monotonic() + deadline_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise ServerError(
                    f"llama-server for {self.model.model} exited with {self.proc.returncode} "
                    f"while starting: {self.log_tail()}"
                )
            if self._healthy():
                self.ready = True
                self._restore_prompt()
                return
            time.sleep(HEALTH_POLL_S)
        self.stop()
        raise ServerError(
            f"llama-server for {self.model.model} was not ready within {deadline_s:g} s: "
            f"{self.log_tail()}"
        )

    def _healthy(self) -> bool:
        try:
            with _LOOPBACK.open(f"http://127.0.0.1:{self.port}/health", timeout=2) as r:
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

    def _restore_prompt(self) -> None:
        """Load the prompt an earlier run's server saved into every slot. The runs of an agent
        share its system prompt and tools, so the first request finds them in a slot (the
        longest common prefix) instead of computing them cold: 8 s for the 1.5B's 467 tokens
        here. The rest of the saved prompt (that run's task) is not reused. A slot the server
        cannot load stays empty and its first request computes the prompt as before."""
        if not (prompt_dir() / self.prompt_file).is_file():
            return
        for slot in range(self.slots):
            if self._slot_file(slot, "restore", self.prompt_file) is None:
                return

    def share(self, slot: int) -> None:
        """Copy `slot`'s prompt into every other slot, through a file of the prompts folder
        (milliseconds): the first request computed the agent's system prompt and tools, and
        the other runs' first requests find them in their own slots instead of each computing
        them again (slots share no cache). Without the folder, or where the server refuses,
        each slot computes its own, as before."""
        if self.slots < 2 or not prompt_dir().is_dir():
            return
        shared = prompt_dir() / f"{self.prompt_file}.{os.getpid()}-shared.part"
        try:
            if self._slot_file(slot, "save", shared.name):
                for other in range(self.slots):
                    if other != slot:
                        self._slot_file(other, "restore", shared.name)
        finally:
            shared.unlink(missing_ok=True)

    def _save_prompt(self) -> None:
        """Save the prompt of the first idle slot that holds one, for the next run's server.
        A busy slot (a run stopped mid-turn) is not asked: its save would wait for the turn.
        The server writes the file under a name of this process, renamed once whole: a server
        loading it never reads half of it, and two runs ending at once each replace it whole."""
        if not prompt_dir().is_dir():  # the server was started without a folder to save to
            return
        for slot in self._idle_slots():
            partial = prompt_dir() / f"{self.prompt_file}.{os.getpid()}-{slot}.part"
            try:
                saved = self._slot_file(slot, "save", partial.name)
                if saved:
                    with contextlib.suppress(OSError):  # the run's end never fails on a cache
                        os.replace(partial, prompt_dir() / self.prompt_file)
                    prune_prompts(self.model)
                if saved != 0:  # saved, or the server no longer answers
                    return
            finally:
                partial.unlink(missing_ok=True)

    def _idle_slots(self) -> list[int]:
        """The slots not computing now, from the server's /slots; none when it does not say."""
        url = f"http://127.0.0.1:{self.port}/slots"
        try:
            with _LOOPBACK.open(url, timeout=SLOT_FILE_TIMEOUT_S) as response:
                return [int(s["id"]) for s in json.loads(response.read()) if not s["is_processing"]]
        except (urllib.error.URLError, OSError, ValueError, KeyError, TypeError):
            return []

    def _slot_file(self, slot: int, action: str, filename: str) -> int | None:
        """Save or restore one slot's prompt; the number of tokens, or None when it failed."""
        request = urllib.request.Request(
            f"http://127.0.0.1:{self.port}/slots/{slot}?action={action}",
            data=json.dumps({"filename": filename}).encode(),
            headers={"Content-Type": "application/json"},
        )
        try:
            with _LOOPBACK.open(request, timeout=SLOT_FILE_TIMEOUT_S) as response:
                answer = json.loads(response.read())
            return int(answer["n_saved" if action == "save" else "n_restored"])
        except (urllib.error.URLError, OSError, ValueError, KeyError, TypeError):
            return None

    def stop(self) -> None:
        """Stop the server; one that is up first saves a slot's prompt for the next run."""
        if self.proc is not None:
            if self.ready and self.proc.poll() is None:
                self._save_prompt()
            stop_service(self.proc)
        self.log_path.unlink(missing_ok=True)


class _Ticket:
    """A request waiting for its server's turn; `admitted` once the turn is handed to it."""

    def __init__(self, server: str) -> None:
        self.server = server
        self.admitted = False


class CpuTurns:
    """Local servers take turns on the CPU: two llama.cpp servers computing at once on the same
    cores make each many times slower than both one after the other.

    Requests to the server whose turn it is run together (llama.cpp batches its slots), unless
    another server waits: then new requests queue too, and when the current ones are done the
    turn goes to the server that has waited longest, with all of its waiting requests. So no
    server waits for more than one turn of each other server.

    A server's first request runs alone until its prompt is computed and copied into every
    slot (`warmed`): the runs of one agent share the system prompt and tools, and the requests
    after the first find them in their slots instead of each computing them at once."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._owner: str | None = None
        self._active = 0
        self._queue: deque[str] = deque()  # servers waiting, first come first
        self._waiting: dict[str, list[_Ticket]] = {}
        self._warm: set[str] = set()  # servers that have answered a request

    def acquire(self, server: str, deadline: float) -> bool:
        """Wait for `server`'s turn until `deadline` (time.monotonic()); False when it passed."""
        with self._cond:
            if not self._queue and (
                self._owner is None or (self._owner == server and server in self._warm)
            ):
                self._owner = server
                self._active += 1
                return True
            ticket = _Ticket(server)
            if server not in self._waiting:
                self._queue.append(server)
            self._waiting.setdefault(server, []).append(ticket)
            while not ticket.admitted:
                left = deadline - time.monotonic()
                if left <= 0:
                    self._give_up(ticket)
                    return False
                self._cond.wait(left)
            return True

    def warm(self, server: str) -> bool:
        """Whether `server` has a request's prompt computed: false for its first request."""
        with self._cond:
            return server in self._warm

    def warmed(self, server: str) -> None:
        """`server`'s first request has its prompt computed: the requests that wait for it run
        beside it now (unless another server waits for the turn: then they wait their turn)."""
        with self._cond:
            self._warm.add(server)
            if self._owner != server or not self._queue or self._queue[0] != server:
                return
            tickets = self._waiting.pop(server)
            self._queue.popleft()
            for ticket in tickets:
                ticket.admitted = True
            self._active += len(tickets)
            self._cond.notify_all()

    def release(self, server: str) -> None:
        """The end of one request of `server`: the last one hands the turn on."""
        with self._cond:
            assert self._owner == server and self._active > 0, "release without acquire"
            self._warm.add(server)
            self._active -= 1
            if self._active == 0:
                self._hand_on()

    def _give_up(self, ticket: _Ticket) -> None:
        tickets = self._waiting[ticket.server]
        tickets.remove(ticket)
        if not tickets:
            del self._waiting[ticket.server]
            self._queue.remove(ticket.server)

    def _hand_on(self) -> None:
        if not self._queue:
            self._owner = None
            return
        server = self._queue[0]
        tickets = self._waiting[server]
        admitted = tickets[:] if server in self._warm else tickets[:1]
        del tickets[: len(admitted)]
        if not tickets:  # else the server's next requests stay first in the queue
            del self._waiting[server]
            self._queue.popleft()
        for ticket in admitted:
            ticket.admitted = True
        self._owner = server
        self._active = len(admitted)
        self._cond.notify_all()
