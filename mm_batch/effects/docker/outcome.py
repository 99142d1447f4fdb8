"""How a call in the sandbox ended, when the engine's account is not the program's own: the
runtime never started it, the kernel refused it, or the container died under it.

When the kernel refuses a program the runtime found (a missing `#!` interpreter, `#!/bin/sh\\r`,
an empty or garbage file) the exec has a pid, exits 1 and the runtime writes
`exec PROGRAM: REASON` on stderr: words any program could print, so they count only for a
program whose content mm-batch read at start and knows the kernel refuses; any other program
that printed them ran, as far as anyone can tell.
"""

from __future__ import annotations

import functools
import os
import posixpath
import time
from collections.abc import Sequence
from dataclasses import dataclass

from mm_batch.effects.docker.engine import ROOT, Engine
from mm_batch.effects.docker.stream import EngineError
from mm_batch.effects.docker.workspace import WRITABLE
from mm_batch.run.ports import EMPTY, Captured, ExecResult

# As root: whether a `#!` interpreter the kernel did not find is really missing. It prints the
# real path of the deepest folder on its way that exists (root must be able to enter it); the
# caller believes the absence only when that folder lies outside every place a tool can write:
# there, nothing can have been made and removed since the exec.
_INTERPRETER_MISSING = r"""
i=$1
{ [ -e "$i" ] || [ -L "$i" ]; } && exit 0
d=$i
while :; do
  d=${d%/*}; [ -n "$d" ] || d=/
  [ -d "$d" ] && break
  { [ -e "$d" ] || [ -L "$d" ]; } && exit 0
done
cd "$d" 2>/dev/null && pwd -P
"""


def kernel_refusal(content: bytes) -> str | None:
    """Why the kernel refuses to execute a file holding `content`, in the runtime's words (the
    errno's text), or None when it may run it. For `#!` lines the interpreter is returned as
    `interpreter:PATH`: whether it exists is for the image to say."""
    if content.startswith(b"\x7fELF"):
        return None  # whether this machine runs it is not for us to guess
    if content.startswith(b"#!"):
        line = content[2:].split(b"\n", 1)[0].strip(b" \t")
        interpreter = line.split(b" ", 1)[0].split(b"\t", 1)[0]
        if not interpreter or not interpreter.startswith(b"/") or b"\0" in interpreter:
            return None
        return "interpreter:" + interpreter.decode("utf-8", "surrogateescape")
    if _binfmt_handlers():
        return None  # the kernel may hand it to a registered handler (qemu, a JVM, ...)
    return "exec format error"  # no `#!` and no ELF header: ENOEXEC (an empty file too)


@functools.cache
def _binfmt_handlers() -> bool:
    """Whether this kernel has binfmt_misc handlers, which run files that are neither ELF nor
    `#!` (containers share the host's kernel)."""
    try:
        names = os.listdir("/proc/sys/fs/binfmt_misc")
    except OSError:
        return False
    return any(name not in ("register", "status") for name in names)


@dataclass(frozen=True)
class Call:
    """One exec of a tool or a check: its argv as the model's call has it, what was executed
    (program copies swapped in), where, as which uid, and what the kernel would say of argv[0]
    when its content was read at start (`kernel_refusal`)."""

    argv: Sequence[str]
    command: Sequence[str]
    workdir: str
    uid: int
    refusal: str | None


@dataclass(frozen=True)
class Refusal:
    """The runtime said the kernel refused the program: `verified` when mm-batch knows that of
    the program's content, else the words may be the program's own."""

    reason: str
    verified: bool

    def result(
        self,
        argv: Sequence[str],
        workdir: str,
        where: str,
        stdout: Captured,
        stderr: Captured,
        duration: float,
    ) -> ExecResult:
        if self.verified:
            reason = not_started_reason(self.reason, argv, workdir, where)
            return ExecResult(None, EMPTY, EMPTY, duration, error=reason, started=False)
        # An error, never `ran`: `expect.calls` cannot pass on it; and started, so that no
        # negative check can pass on a program that printed the runtime's words.
        reason = (
            f"the runtime says it could not execute {argv[0]} ({self.reason}); that cannot be "
            "verified, so the call counts as started"
        )
        return ExecResult(None, stdout, stderr, duration, error=reason, started=True)


def not_started_reason(message: str, argv: Sequence[str], workdir: str, where: str) -> str:
    """The host executor's wording, from the runtime's own message (Pid 0: it never started)."""
    lowered = message.lower()
    if "chdir" in lowered or "cwd" in lowered:
        return f"working directory not found: {workdir} (in {where})"
    if "permission denied" in lowered or "exec format error" in lowered:
        return f"program is not executable: {argv[0]}"
    if "no such file" in lowered or "not found" in lowered:
        return f"program not found: {argv[0]} (in {where})"
    detail = message.strip().splitlines()[0][:300] if message.strip() else "no reason given"
    return f"cannot start {argv[0]} (in {where}): {detail}"


def kernel_refused(
    engine: Engine, call: Call, exit_code: int, stdout: Captured, stderr: Captured
) -> Refusal | None:
    """Whether the runtime says the kernel refused the program (exit 1, nothing on stdout,
    `exec PROGRAM: REASON` alone on stderr), and whether that can be believed."""
    prefix = f"exec {call.command[0]}: ".encode(errors="surrogateescape")
    said = stderr.data
    if exit_code != 1 or stdout.total or not said.startswith(prefix):
        return None
    if not said.endswith(b"\n") or said.count(b"\n") != 1 or stderr.cut:
        return None
    reason = said[len(prefix) : -1].decode(errors="replace")
    expected = call.refusal
    if expected is not None and expected.startswith("interpreter:"):
        interpreter = expected.removeprefix("interpreter:")
        expected = "no such file or directory" if _missing(engine, interpreter) else None
    # Believed only for a program whose bytes mm-batch read at start and knows the kernel
    # refuses: any program can print these words.
    return Refusal(reason, verified=expected is not None and reason == expected)


def _missing(engine: Engine, interpreter: str) -> bool:
    """Whether a `#!` interpreter is missing in a way no call could have arranged: a path
    outside every writable mount that exists nowhere, with no link on its way (root's look,
    which no tool process can touch)."""
    if posixpath.normpath(interpreter) != interpreter or any(
        interpreter == top or interpreter.startswith(top + "/") for top in WRITABLE
    ):
        return False  # `..`, `//`, a writable place: it may have been there at the exec
    try:
        done = engine.run(["/bin/sh", "-c", _INTERPRETER_MISSING, "look", interpreter], ROOT)
    except EngineError:
        return False
    folder = done.stdout.decode(errors="replace").strip()
    if done.pid == 0 or done.exit_code != 0 or not folder.startswith("/"):
        return False
    return not any(folder == top or folder.startswith(top + "/") for top in WRITABLE)


def dead_after_signal(engine: Engine) -> str | None:
    """Whether the signal that ended a call was the container's own death.

    The engine may still call the container running for a moment after it was killed, but
    its pid namespace dies with its init at once: a fresh exec cannot start there then.
    """
    try:
        if engine.run(["/bin/sh", "-c", ":"], ROOT).pid != 0:
            return None
    except EngineError:
        pass
    for _ in range(20):  # the engine's account of it, once the engine has caught up
        dead = engine.container_dead()
        if dead is not None:
            return dead
        time.sleep(0.1)
    return None  # running all along: the exec found no free pid, which a call can cause
