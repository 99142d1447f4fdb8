"""The watchdog: nothing of a run outlives mm-batch, even when mm-batch is SIGKILLed.

A small process of its own session (a kill of mm-batch's process group does not reach it),
started once per mm-batch process. mm-batch tells it, through a socket pair, of each host
command's process group as it starts and ends; when that closes without a goodbye, mm-batch
died: the watchdog waits until mm-batch's process is really gone, SIGKILLs the groups still
registered, removes the containers labelled with mm-batch's pid and start time on this host,
and exits.

This file is also the watchdog's program, run as `python -I -S watchdog.py` (no site-packages:
it starts in about 10 ms). So it imports only the standard library, and little of it at the top.

A process group is killed only while it is provably the one registered. mm-batch reaps a
command's leader only after it unregistered its group, so while mm-batch lives a registered
group id is pinned by its leader (alive or a zombie): no other process can be given that number.
With each registration comes a pidfd of the leader: while that very process exists (a zombie
too), the id is still its group's. Once it is gone, a process holding the id is another one (the
number was recycled: never touched); with no such process, members left in the group still pin
the number (Linux frees a pid only once no process uses it as pid, group or session id), and
they must be in the leader's session. Without pidfds (Linux before 5.3) the leader's kernel start
time stands in for one.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import http.client

# The labels the Docker sandbox puts on a run's containers (a test pins them to its constants).
LABEL_PID = "mm-batch.pid"
LABEL_PID_START = "mm-batch.pid-start"
LABEL_HOST = "mm-batch.host"
DEFAULT_ENGINE = "unix:///var/run/docker.sock"
CLEANUP_S = 4.5  # containers are removed within this, so that all is gone within 5 s
SECOND_PASS_S = 1.0  # a container the engine was still creating when mm-batch died
CLOSE_WAIT_S = 2.0  # how long a normal exit waits for the watchdog to leave

_REGISTER, _UNREGISTER, _CONTAINERS, _QUIT = b"+", b"-", b"c", b"q"


# -- processes, read from /proc ------------------------------------------------------------


@dataclass(frozen=True)
class ProcStat:
    """The fields of /proc/PID/stat the watchdog decides by."""

    state: str
    pgrp: int
    session: int
    start: str  # clock ticks after boot at which the process started: with the pid, an identity


def proc_stat(pid: int) -> ProcStat | None:
    """What the kernel says of a process now, or None when there is no such process."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            raw = f.read()
    except OSError:
        return None
    # The command name may hold spaces and parentheses: the fields start after the last ')'.
    fields = raw.rsplit(b")", 1)[-1].split()
    try:
        return ProcStat(fields[0].decode(), int(fields[2]), int(fields[3]), fields[19].decode())
    except (IndexError, ValueError):
        return None


def process_start(pid: int) -> str:
    """A process's kernel start time ("" when it is gone), as the sandbox labels containers."""
    stat = proc_stat(pid)
    return stat.start if stat is not None else ""


def _all_stats() -> Iterator[ProcStat]:
    for name in os.listdir("/proc"):
        if name.isdigit():
            stat = proc_stat(int(name))
            if stat is not None:
                yield stat


def _dead(stat: ProcStat | None, start: str) -> bool:
    """Gone, a zombie, or the pid reused by another process."""
    return stat is None or stat.start != start or stat.state in ("Z", "X")


def _still_registered(pgid: int, leader: int | None, leader_start: str) -> bool:
    """Whether the group with this id is still the one registered (see the module's doc)."""
    if leader is not None:
        try:
            signal.pidfd_send_signal(leader, 0)
            return True  # the registered leader itself still holds the id
        except ProcessLookupError:
            pass
    else:
        stat = proc_stat(pgid)
        if stat is not None and stat.start == leader_start:
            return True
    if proc_stat(pgid) is not None:
        return False  # the number now belongs to another process: never touch its group
    return any(s.pgrp == pgid and s.session == pgid for s in _all_stats())


def kill_registered_group(pgid: int, leader: int | None, leader_start: str) -> bool:
    """SIGKILL the group when it is still the one registered; say whether it was signalled."""
    if not _still_registered(pgid, leader, leader_start):
        return False
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def _wait_for_death(pid: int, start: str) -> None:
    """Block until the process (pid, start) has exited."""
    pidfd: int | None = None
    with contextlib.suppress(OSError, AttributeError):
        pidfd = os.pidfd_open(pid)
    try:
        # Checked after the pidfd is open, so that the pidfd is known to be that very process.
        if _dead(proc_stat(pid), start):
            return
        if pidfd is not None:
            import select

            select.select([pidfd], [], [])  # readable once the process has exited
            return
        while not _dead(proc_stat(pid), start):
            time.sleep(0.05)
    finally:
        if pidfd is not None:
            os.close(pidfd)


# -- the engine, over its socket (the docker SDK would cost a second to import) --------------


def _engine_connection(timeout: float) -> http.client.HTTPConnection | None:
    """An HTTP connection to the engine DOCKER_HOST names (unix or plain tcp), else None."""
    import http.client

    address = os.environ.get("DOCKER_HOST") or DEFAULT_ENGINE
    if address.startswith("unix://"):
        path = address.removeprefix("unix://")

        class UnixConnection(http.client.HTTPConnection):
            def connect(self) -> None:
                self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                self.sock.settimeout(timeout)
                self.sock.connect(path)

        return UnixConnection("localhost", timeout=timeout)
    if address.startswith("tcp://") and not os.environ.get("DOCKER_TLS_VERIFY"):
        return http.client.HTTPConnection(address.removeprefix("tcp://"), timeout=timeout)
    return None  # TLS or ssh: a later run removes the orphans


def _engine_request(method: str, path: str, deadline: float) -> tuple[int, bytes]:
    left = deadline - time.monotonic()
    if left <= 0:
        raise TimeoutError("past the cleanup deadline")
    connection = _engine_connection(left)
    if connection is None:
        raise ConnectionError("unsupported DOCKER_HOST")
    try:
        connection.request(method, path)
        response = connection.getresponse()
        return response.status, response.read()
    finally:
        connection.close()


def remove_containers(owner: int, owner_start: str, host: str, deadline: float) -> int:
    """Remove every container labelled with this owner process on this host; return how many."""
    import json
    from urllib.parse import quote

    labels = [f"{LABEL_PID}={owner}", f"{LABEL_PID_START}={owner_start}", f"{LABEL_HOST}={host}"]
    query = quote(json.dumps({"label": labels}))
    status, body = _engine_request("GET", f"/containers/json?all=1&filters={query}", deadline)
    if status != 200:
        return 0
    removed = 0
    for container in json.loads(body):
        with contextlib.suppress(OSError, TimeoutError):
            status, _ = _engine_request(
                "DELETE", f"/containers/{quote(container['Id'])}?force=1&v=1", deadline
            )
            removed += status in (204, 404)
    return removed


# -- the watchdog process --------------------------------------------------------------------


def watch(
    channel: socket.socket, owner: int, owner_start: str, host: str, containers: bool
) -> None:
    """Read the registrations until the channel closes, then clean up after the owner."""
    groups: dict[int, tuple[int | None, str]] = {}  # group id: the leader's pidfd, start time
    goodbye = False
    while True:
        try:
            message, fds, _, _ = socket.recv_fds(channel, 256, 1)
        except OSError:
            message, fds = b"", []
        if not message:
            break
        kind, rest = message[:1], message[1:]
        if kind == _REGISTER:
            number, _, ticks = rest.partition(b" ")
            if number.isdigit():
                _forget(groups, int(number))
                groups[int(number)] = (fds.pop() if fds else None, ticks.decode("ascii", "replace"))
        elif kind == _UNREGISTER and rest.isdigit():
            _forget(groups, int(rest))
        elif kind == _CONTAINERS:
            containers = True
        elif kind == _QUIT:
            goodbye = True
        for fd in fds:
            os.close(fd)
    if not goodbye:
        # The channel closes as the owner dies; act only once it is really gone.
        _wait_for_death(owner, owner_start)
    # On a goodbye, groups still registered are calls of abandoned task runs: they go too.
    for pgid, (leader, start) in groups.items():
        kill_registered_group(pgid, leader, start)
    if containers and not goodbye:
        deadline = time.monotonic() + CLEANUP_S
        with contextlib.suppress(Exception):  # the engine may be down: a later run cleans up
            remove_containers(owner, owner_start, host, deadline)
            time.sleep(min(SECOND_PASS_S, max(deadline - time.monotonic() - 1.0, 0.0)))
            remove_containers(owner, owner_start, host, deadline)


def _forget(groups: dict[int, tuple[int | None, str]], pgid: int) -> None:
    leader, _ = groups.pop(pgid, (None, ""))
    if leader is not None:
        os.close(leader)


def main(argv: Sequence[str]) -> int:
    owner, owner_start, host, containers = argv
    # Its own session has no terminal; Ctrl-C and a hang-up are mm-batch's, never its watchdog's.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    watch(socket.socket(fileno=0), int(owner), owner_start, host, containers == "1")
    return 0


# -- mm-batch's side -------------------------------------------------------------------------


class Watchdog:
    """mm-batch's end of the channel: a registration is one small message (and a pidfd)."""

    def __init__(self, process: subprocess.Popen[bytes], channel: socket.socket) -> None:
        self.process = process
        self.channel: socket.socket | None = channel
        self._lock = threading.Lock()  # a closed fd number must never be written to once reused

    @classmethod
    def spawn(cls, owner: int, containers: bool, host: str | None = None) -> Watchdog:
        """Start a watchdog of the process `owner` (raises OSError when it cannot start)."""
        # Here, not at the top: this file also runs alone, as the watchdog, without mm_batch.
        from mm_batch.effects.environment import service_environment

        # Records keep their bounds (one message, its pidfd); the end closes as its holder dies.
        # Not inherited: only mm-batch holds its end, so no command keeps the watchdog waiting.
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            process = subprocess.Popen(
                [
                    sys.executable,
                    "-I",
                    "-S",
                    os.path.abspath(__file__),
                    str(owner),
                    process_start(owner),
                    host if host is not None else socket.gethostname(),
                    "1" if containers else "0",
                ],
                stdin=theirs.fileno(),
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,
                close_fds=True,
                env=service_environment("DOCKER_"),  # the engine's address; no secret
                cwd="/",  # hold no directory of the run
            )
        except OSError:
            ours.close()
            raise
        finally:
            theirs.close()
        # A watchdog that stops reading must never block a tool call: a full channel drops one.
        ours.setblocking(False)
        return cls(process, ours)

    def _send(self, message: bytes, fds: Sequence[int] = ()) -> None:
        with self._lock:
            if self.channel is not None:
                with contextlib.suppress(OSError):
                    socket.send_fds(self.channel, [message], list(fds))

    def register(self, pgid: int) -> None:
        """A command's process group started (its leader not reaped until it is unregistered)."""
        try:
            leader = os.pidfd_open(pgid)
        except (OSError, AttributeError):
            self._send(b"+%d %s" % (pgid, process_start(pgid).encode()))
            return
        try:
            self._send(b"+%d" % pgid, [leader])
        finally:
            os.close(leader)

    def unregister(self, pgid: int) -> None:
        self._send(b"-%d" % pgid)

    def expect_containers(self) -> None:
        self._send(_CONTAINERS)

    def alive(self) -> bool:
        return self.channel is not None and self.process.poll() is None

    def drop(self) -> None:
        """Close mm-batch's end without a goodbye, as its death does."""
        with self._lock:
            channel, self.channel = self.channel, None
        if channel is not None:
            channel.close()

    def close(self) -> None:
        """The owner exits normally: the watchdog leaves without touching any container."""
        self._send(_QUIT)
        self.drop()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=CLOSE_WAIT_S)


class _ThisProcess:
    """The one watchdog of this mm-batch process."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.watchdog: Watchdog | None = None
        self.closer_registered = False

    def start(self, containers: bool) -> Watchdog | None:
        with self.lock:
            if self.watchdog is not None and self.watchdog.alive():
                if containers:
                    self.watchdog.expect_containers()
                return self.watchdog
            try:
                self.watchdog = Watchdog.spawn(os.getpid(), containers)
            except OSError as exc:
                print(f"mm-batch: warning: cannot start the watchdog: {exc}", file=sys.stderr)
                self.watchdog = None
                return None
            if not self.closer_registered:
                import atexit

                atexit.register(self.close)  # a normal exit says goodbye
                self.closer_registered = True
            return self.watchdog

    def close(self) -> None:
        if self.watchdog is not None:
            self.watchdog.close()


_THIS_PROCESS = _ThisProcess()


def start_watchdog(containers: bool) -> Watchdog | None:
    """Start this process's watchdog (once; later calls only widen what it cleans up)."""
    return _THIS_PROCESS.start(containers)


def current_watchdog() -> Watchdog | None:
    """The watchdog host commands register with, when one was started."""
    return _THIS_PROCESS.watchdog


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
