"""What a call leaves behind, cleared before the next one starts: the verified sweep of its
processes, then the reset of the places outside the workspace it could write, and a fresh HOME.

`exec_run` has no timeout and closing its stream leaves the process running, so what a call
leaves running (and a timed-out call) is killed by the sweep, in two parts that need each other:

- An exec as the swept uid runs `kill -9 -1`: the kernel signals every process of the uid (but
  the caller) in one walk of the task list under the lock that fork takes too, so no process is
  born during it or escapes it. A scan of /proc cannot promise that: a fork bomb's lineage is
  born after the scan read /proc and lives on past each pass (seen: "clean" said of a live bomb).
  Any process of the uid may kill this exec before it acts, though.
- A root exec whose only capability is CAP_KILL (the container holds no other; tools run as a
  non-root uid, so they hold none) scans /proc and SIGKILLs every process of the uid until a
  pass finds none, and says so. No tool process can signal, stop or trace it (another uid, no
  capability): it ends a process that kills the first exec, and confirms what that one did.

Both are tried again until the first says it struck and the second says clean after it; a call
whose processes they cannot end makes the task run an error.
"""

from __future__ import annotations

import secrets
import time

from mm_batch.effects.docker.engine import ENGINE_TIMEOUT_S, ROOT, Engine
from mm_batch.effects.docker.stream import Background, EngineError
from mm_batch.effects.docker.workspace import PLAIN, Copies
from mm_batch.run.ports import SandboxError

KILL_TRIES_S = 5.0
# Each pass lists the processes of the uid ($1) and SIGKILLs them; a pass that finds none prints
# `clean`. Each pass stops all it found before it kills any (a stopped process can neither fork
# nor signal the next exec). `kill` may be the shell's built-in and its status is not trusted:
# only the next pass's count is. The shell's own pid is skipped (it runs as root, never the uid
# swept).
# A leader whose own thread exited shows Z while its other threads run: a process is dead only
# when it is Z or X with one thread left (SIGKILL to its pid ends the others).
# Zombies are dead already, but each holds its pid (against the pids limit) until docker-init
# reaps it: after a fork bomb, the next exec would find no pid free. So once none is alive the
# passes go on until none is left at all (init reaps them in moments; after 300 passes, dead
# ones that remain are let be: they cannot run).
_SWEEP = r"""
u=$1; n=0; z=0
while :; do
  left=; dead=
  for d in /proc/[0-9]*; do
    p=${d#/proc/}
    [ "$p" = "$$" ] && continue
    s=; r=; e=; t=
    { while read -r k a b c; do
        case $k in State:) s=$a ;; Uid:) r=$a; e=$b ;; Threads:) t=$a; break ;; esac
      done <"$d/status"; } 2>/dev/null
    [ "$r" = "$u" ] || [ "$e" = "$u" ] || continue
    case $s$t in Z1|X1|Z|X) dead="$dead $p" ;; *) left="$left $p" ;; esac
  done
  if [ -z "$left" ]; then
    { [ -z "$dead" ] || [ $z -gt 300 ]; } && { echo clean; exit 0; }
    z=$((z + 1)); continue
  fi
  n=$((n + 1))
  [ $n -gt 300 ] && { echo "left$left"; exit 3; }
  kill -STOP $left 2>/dev/null
  kill -9 $left 2>/dev/null
done
"""
# As the swept uid, with a gid none of its processes has (`KILL_GIDS`): ptrace needs uid and
# gid both to match, so no tool can trace this exec and make its kill do nothing (it can still
# signal it: a stopped or killed exec never says `swept`). `kill` is the shell's built-in, so
# no child of the exec is there for it to kill first; `swept` says the kill(-1) ran. Its status
# is not read (ESRCH when none was left).
_KILL_ALL = "kill -9 -1 2>/dev/null; echo swept"
KILL_GIDS = (65533, 65530, 65529)
# Run as the tools' uid once the sweep found none of their processes: empty /tmp, /dev/shm and
# /dev/mqueue, the places outside the workspace a tool can write (what a call left there:
# dotfiles, .pth files, caches, POSIX shared memory, semaphores and queues); remove every SysV
# IPC object (message queues with their messages, shared memory, semaphores), then read the
# kernel's own list of them again; make the next call's HOME and TMPDIR ($1), then say which
# program copies ($2 $3, ... pairs of copy and original) the originals still equal. Prints
# `ready` at the end; `kept WHAT` for what could not be removed, and `no ipcrm` when the image
# lacks the program that removes SysV objects.
# The container has an IPC namespace of its own, where only tools and checks make objects, and
# checks run last: whatever is listed was made by the tools' uid, whose processes may remove
# it (the creator may, whoever it made the owner since), and no root exec of ours could (that
# needs CAP_SYS_ADMIN). The second reading uses the shell alone: a missing or lying `ipcrm`
# cannot make it say clean.
_RESET = (
    PLAIN
    + r"""
h=$1; shift
cd / || exit 4
for d in /tmp /dev/shm /dev/mqueue; do
  for f in "$d"/* "$d"/.[!.]* "$d"/..?*; do
    [ -e "$f" ] || [ -L "$f" ] || continue
    [ -d "$f" ] && [ ! -L "$f" ] && chmod -R u+rwx "$f" 2>/dev/null
    rm -rf "$f" 2>/dev/null
    { [ -e "$f" ] || [ -L "$f" ]; } && echo "kept $f"
  done
done
for k in msg:q shm:m sem:s; do
  t=${k%:*}; f=/proc/sysvipc/$t; a=
  [ -e "$f" ] || continue
  { read -r _; while read -r _ i _; do a="$a -${k#*:} $i"; done; } <"$f"
  if [ -n "$a" ]; then
    command -v ipcrm >/dev/null 2>&1 || echo "no ipcrm"
    ipcrm $a >/dev/null 2>&1
  fi
  { read -r _; while read -r _ i _; do echo "kept SysV $t $i"; done; } <"$f" || echo "kept $f"
done
mkdir -m 700 "$h" && mkdir -m 700 "$h/tmp" || exit 5
while [ $# -ge 2 ]; do
  [ -f "$2" ] && plain "$2" && cmp -s "$1" "$2" 2>/dev/null && echo "same $1"
  shift 2
done
echo ready
"""
)


def fresh_home() -> str:
    """A name for a call's HOME that no call can guess (and so cannot have made)."""
    return f"/tmp/.mm-batch-home-{secrets.token_hex(16)}"


def kill_gid(*taken: int) -> int:
    """A gid for the sweep's kill exec that none of `taken` (the tools' and the check's) is."""
    return next(gid for gid in KILL_GIDS if gid not in taken)


def sweep(engine: Engine, uid: int, gid: int) -> None:
    """SIGKILL every process of `uid` (see the module's text) until the uid's own `kill -9 -1`
    (run with `gid`, see `kill_gid`) ran to its end and a root scan after it finds none; raises
    EngineError when that does not happen within KILL_TRIES_S (the call then fails the task
    run).

    An exec that gets no pid (under a fork bomb the runtime may find none free and start
    nothing: Pid 0) or that a leftover kills before it acts is simply tried again.
    """
    give_up = time.monotonic() + KILL_TRIES_S
    # The root scan goes first: the uid's own exec is one more process of that uid, which a
    # leftover could stop while the runtime starts it (a stopped `runc init` hangs the engine's
    # requests on the container, its removal included). What the scan stopped and killed can
    # stop nothing; the kill(-1) after it reaches what the scan could not see.
    engine.run(["/bin/sh", "-c", _SWEEP, "sweep", str(uid)], ROOT)
    while True:
        struck = engine.run(["/bin/sh", "-c", _KILL_ALL], f"{uid}:{gid}")
        scan = engine.run(["/bin/sh", "-c", _SWEEP, "sweep", str(uid)], ROOT)
        said = scan.stdout.decode(errors="replace").strip()
        struck_all = struck.pid != 0 and struck.exit_code == 0 and struck.stdout.strip() == b"swept"
        if struck_all and scan.pid != 0 and scan.exit_code == 0 and said == "clean":
            return
        if time.monotonic() >= give_up:
            if scan.pid == 0:
                raise EngineError("the calls' processes could not be killed (no free pid)")
            if said == "clean":
                said = "no kill of the uid's own could run"
            raise EngineError(
                f"processes of uid {uid} are still alive after the sweep ({said[:200]})"
            )
        time.sleep(0.05)


class Sweeper:
    """Sweeps after each call of the tools (their uid, `user`) off the caller's path, and makes
    the next call's HOME (`home`); the next call (or check) waits for both, and fails if they
    failed."""

    def __init__(
        self, engine: Engine, user: str, uid: int, gid: int, image: str, copies: Copies
    ) -> None:
        """`gid`: the kill exec's (`kill_gid`)."""
        self._engine = engine
        self._user = user
        self._uid = uid
        self._gid = gid
        self._image = image
        self._copies = copies
        self._background: Background | None = None
        self._failure: str | None = None
        # Each call's HOME (and TMPDIR below it): made after the previous call's sweep.
        self.home = fresh_home()

    def later(self, reset: bool) -> None:
        """Sweep what the call left running and, when `reset`, make the next call's HOME."""
        if self._engine.container is None:
            return
        self._background = Background(lambda: self._sweep_and_reset(reset))

    def settle(self) -> None:
        """Wait for the previous call's sweep: no call may start while another's processes live."""
        background, self._background = self._background, None
        if background is not None:
            if not background.wait(2 * (ENGINE_TIMEOUT_S + KILL_TRIES_S)):
                self._failure = "the previous call's processes could not be stopped in time"
            elif background.failure is not None:
                self._failure = background.failure
        if self._failure is not None:
            raise SandboxError(
                f"what the previous call left could not be cleared away: {self._failure}"
            )

    def _sweep_and_reset(self, reset: bool) -> None:
        sweep(self._engine, self._uid, self._gid)
        if not reset:
            return
        pairs = self._copies.program_pairs()
        # The reset changes nothing twice (each try names a new HOME), so any try that does not
        # end `ready` is tried again while the sweep's own tries would be: a pid still held for
        # a moment after a fork bomb fails it in ways no message reliably names (a shell's
        # "can't fork", a silent exit 2 or an exec that never started).
        give_up = time.monotonic() + KILL_TRIES_S
        while True:
            home = fresh_home()
            done = self._engine.run(["/bin/sh", "-c", _RESET, "reset", home, *pairs], self._user)
            lines = done.stdout.decode(errors="replace").splitlines()
            if done.pid != 0 and done.exit_code == 0 and lines and lines[-1] == "ready":
                break
            if time.monotonic() >= give_up:
                detail = "; ".join(lines[:3]) or (
                    "it never started" if done.pid == 0 else f"exit {done.exit_code}"
                )
                raise EngineError(f"cannot make a fresh HOME for the next call ({detail})")
            time.sleep(0.05)
        kept = [line.removeprefix("kept ") for line in lines if line.startswith("kept ")]
        if kept:
            hint = (
                f"; image {self._image} has no ipcrm program, which removes them: add it "
                "(util-linux or busybox)"
                if "no ipcrm" in lines
                else ""
            )
            raise EngineError(
                f"what a call left in {', '.join(kept[:3])} could not be removed{hint}"
            )
        self._copies.same = {
            line.removeprefix("same ") for line in lines if line.startswith("same ")
        }
        self.home = home
