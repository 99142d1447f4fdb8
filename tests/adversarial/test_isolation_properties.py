"""Per-call isolation in the Docker sandbox, attacked by class (SPEC 3, "Calls are isolated").

Each class is a hostile call and what it leaves behind, followed by the calls and the check that
must not feel it: call x leftover behaviour (kill the sweeper, fork, read the next call's
environment, trace the check), call x what it plants (dotfiles, `.pth` files, /tmp, a full /tmp),
and program x how the kernel refuses it. Marker files say what really happened.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from mm_batch.config.model import Expect, SandboxSpec
from mm_batch.effects.docker import DockerSandbox
from mm_batch.effects.docker import sweep as docker_sweep
from mm_batch.effects.host import HostExecutor
from mm_batch.run.judge import CheckRun, judge
from mm_batch.run.ports import ExecResult, Executor, PinnedProgram
from mm_batch.testing.fake_openai import by_prompt, text, tool_call
from tests.docker_support import BASE_IMAGE, TEST_IMAGE, build_image_without, require_image
from tests.helpers import model_args, read_calls

pytestmark = pytest.mark.docker

SECRET = "n3xt-calls-s3cret-value"


def _box(client: Any, folder: Path, name: str, image: str = TEST_IMAGE) -> DockerSandbox:
    folder.chmod(0o777)
    spec = SandboxSpec(kind="docker", image=image, pids=128, memory="256m", workspace="mount")
    return DockerSandbox(client, spec, folder, f"isolation-{name}")


@pytest.fixture
def box(docker_client: Any, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Any]:
    sandbox = _box(docker_client, tmp_path, request.node.name[:40])
    yield sandbox
    sandbox.close()


@pytest.fixture
def base_box(docker_client: Any, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Any]:
    require_image(docker_client, BASE_IMAGE)
    sandbox = _box(docker_client, tmp_path, request.node.name[:40], BASE_IMAGE)
    yield sandbox
    sandbox.close()


def sh(box: Executor, folder: Path, script: str, env: dict[str, str] | None = None) -> ExecResult:
    return box.execute(["sh", "-c", script], folder, env or {}, 30)


# -- call x leftover behaviour --------------------------------------------------------------

# Each leftover steals what it can read of other processes' environments into `stolen` (in the
# workspace, which calls share as data) and misbehaves in its own way.
_STEAL = "cat /proc/[0-9]*/environ 2>/dev/null | tr '\\0' '\\n' | grep MM_SECRET >> stolen"
LEFTOVERS = {
    # The old sweep was `kill -9 -1` as the tools' uid: this kills it (and everyone) first.
    "kills-the-sweeper": f"while :; do {_STEAL}; kill -9 -1; done",
    "ignores-signals": f"trap '' TERM INT HUP QUIT USR1; while :; do {_STEAL}; done",
    "forks-without-end": f"while :; do ( {_STEAL}; sleep 5 ) & sleep 0.01; done",
    "leaves-its-session": f"setsid sh -c 'while :; do {_STEAL}; done'",
    "stops-itself-and-waits": f"sh -c 'kill -STOP $$; while :; do {_STEAL}; done'",
}


@pytest.mark.parametrize("behaviour", sorted(LEFTOVERS))
def test_no_leftover_of_a_call_sees_the_next_call(
    box: DockerSandbox, tmp_path: Path, behaviour: str
) -> None:
    script = f"({LEFTOVERS[behaviour]}) >/dev/null 2>&1 </dev/null & echo left"
    assert sh(box, tmp_path, script).stdout.data == b"left\n"
    time.sleep(0.3)  # the leftover is well under way before the next call
    victim = sh(box, tmp_path, "sleep 1; echo done", {"MM_SECRET": SECRET})
    assert victim.exit_code == 0 and victim.stdout.data == b"done\n"
    listed = only_the_listing_is_left(box, tmp_path, "cat stolen 2>/dev/null; :")
    assert SECRET not in listed
    assert SECRET not in (
        (tmp_path / "stolen").read_text() if (tmp_path / "stolen").exists() else ""
    )


def only_the_listing_is_left(box: DockerSandbox, folder: Path, then: str = ":") -> str:
    """Lists the container's processes from a call and asserts that nothing of the tools' uid
    is alive but that call itself (its shell and children); returns the listing."""
    seen = sh(box, folder, f'echo "me $$"; ps -o pid,ppid,user,args; {then}')
    listed = seen.stdout.data.decode()
    me = listed.split()[1]
    rows = [line.split(None, 3) for line in listed.splitlines()[2:]]
    tools = [row for row in rows if len(row) == 4 and row[2] == "sandbox"]
    assert tools and all(me in (pid, parent) for pid, parent, _, _ in tools), listed
    return listed


# A fork bomb's lineage is born faster than a scan of /proc reads it: before the sweep struck
# with the uid's own kill(-1), a scan said "clean" of a live bomb about once in five runs on a
# loaded machine, and the next call then failed (no pid free) or ran beside the bomb. Repeated,
# since one run proves little of a race.
@pytest.mark.parametrize("attempt", range(4))
def test_a_fork_bomb_left_running_is_swept_and_confirmed(
    box: DockerSandbox, tmp_path: Path, attempt: int
) -> None:
    bomb = "(b() { b | b & }; b) >/dev/null 2>&1 </dev/null & echo lit"
    assert sh(box, tmp_path, bomb).stdout.data == b"lit\n"
    after = sh(box, tmp_path, "echo calm", {"MM_SECRET": SECRET})
    assert after.exit_code == 0 and after.stdout.data == b"calm\n", after
    only_the_listing_is_left(box, tmp_path)


# Each part of the sweep failing as it would: a process of the uid outlived every pass of the
# root scan; or the uid's own kill(-1) never ran (a clean scan is not enough: only that kill
# reaches a lineage born after the scan). Tried for a moment, then the next call fails.
SWEEP_FAILURES = {
    "a-process-outlived-the-scan": (
        "_SWEEP",
        "echo 'left 4242'; exit 3",
        "still alive after the sweep (left 4242)",
    ),
    "the-uids-kill-never-ran": ("_KILL_ALL", "echo missed", "no kill of the uid's own could run"),
}


@pytest.mark.parametrize("failure", sorted(SWEEP_FAILURES))
def test_a_sweep_that_cannot_confirm_makes_the_next_call_a_sandbox_failure(
    box: DockerSandbox, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, failure: str
) -> None:
    script, replaced_by, said = SWEEP_FAILURES[failure]
    monkeypatch.setattr(docker_sweep, script, replaced_by)
    monkeypatch.setattr(docker_sweep, "KILL_TRIES_S", 0.5)
    assert sh(box, tmp_path, "true").exit_code == 0  # this call's sweep fails
    assert said in (box.settled() or "")  # what a run's end reads, with no call after
    result = sh(box, tmp_path, "touch ran-after")
    assert result.sandbox_failed and not result.started
    assert said in (result.error or "")
    assert not (tmp_path / "ran-after").exists()


# -- no tool can signal or trace what is not its own -----------------------------------------

_TRACE = """
import ctypes, os, signal, sys
libc = ctypes.CDLL(None, use_errno=True)
for pid in map(int, sys.argv[1:]):
    attach = libc.ptrace(16, pid, None, None)  # PTRACE_ATTACH
    traced = "attached" if attach == 0 else os.strerror(ctypes.get_errno())
    try:
        os.kill(pid, signal.SIGSTOP)
        signalled = "signalled"
    except OSError as exc:
        signalled = exc.strerror
    try:
        with open(f"/proc/{pid}/mem", "rb") as mem:
            mem.read(1)
        read = "read"
    except OSError as exc:
        read = exc.strerror
    print(pid, traced, signalled, read)
"""


def test_a_tool_can_neither_trace_nor_signal_a_check_or_root(
    base_box: DockerSandbox, tmp_path: Path
) -> None:
    base_box.start()
    # The SDK's client: these execs are none of the sandbox's own requests.
    client: Any = base_box.client
    container = base_box.container_id
    # A check's process and root's (the sweep's kind), running while a tool attacks them.
    for user in ("65532:65532", "0:0"):
        exec_id = client.api.exec_create(container, ["sleep", "60"], user=user)["Id"]
        client.api.exec_start(exec_id, detach=True)
    time.sleep(0.5)
    listing = base_box.engine.run(
        [
            "sh",
            "-c",
            "for d in /proc/[0-9]*; do echo ${d#/proc/} $(tr '\\0' ' ' <$d/cmdline); done",
        ],
        "0:0",
    ).stdout.decode()
    sleepers = [line.split()[0] for line in listing.splitlines() if line.endswith("sleep 60")]
    assert len(sleepers) == 2, listing
    result = base_box.execute(["python3", "-c", _TRACE, *sleepers], tmp_path, {}, 30)
    assert result.exit_code == 0, result
    lines = result.stdout.data.decode().splitlines()
    assert len(lines) == 2
    for line in lines:
        assert line.split(" ", 1)[1] == " ".join(["Operation not permitted"] * 2) + (
            " Permission denied"
        ), line


def test_a_tool_cannot_trace_the_sweeps_kill_exec(base_box: DockerSandbox, tmp_path: Path) -> None:
    """The sweep's `kill -9 -1` runs as the tools' uid (only that reaches all of their
    processes at once), so a tool could trace it and make its kill do nothing, were it not for
    its gid, which no tool has: ptrace needs both to match."""
    base_box.start()
    client: Any = base_box.client
    users = base_box.users
    user = f"{users.uid}:{docker_sweep.kill_gid(users.gid, users.check_gid)}"
    exec_id = client.api.exec_create(base_box.container_id, ["sleep", "61"], user=user)["Id"]
    client.api.exec_start(exec_id, detach=True)
    time.sleep(0.5)
    result = base_box.execute(
        ["sh", "-c", f"python3 -c '{_TRACE}' $(pgrep -f \"^sleep 61\")"], tmp_path, {}, 30
    )
    [line] = result.stdout.data.decode().splitlines()
    assert line.split(" ", 1)[1].startswith("Operation not permitted"), line


_THREAD_OUTLIVES_ITS_LEADER = """
import ctypes, threading, time
def write():
    while True:
        with open("outlived", "a") as marker:
            marker.write("alive\\n")
        time.sleep(0.1)
threading.Thread(target=write).start()
time.sleep(0.3)
ctypes.CDLL(None).syscall(60, 0)  # exit: the first thread alone ends, showing Z
"""


def test_the_root_scan_alone_ends_a_process_whose_leader_thread_exited(
    base_box: DockerSandbox, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # As if a tool had made the uid's own kill do nothing: the root scan must not take a
    # process whose first thread is a zombie for a dead one while another thread runs.
    monkeypatch.setattr(docker_sweep, "_KILL_ALL", "echo swept")
    script = f"(setsid python3 -c '{_THREAD_OUTLIVES_ITS_LEADER}' &) ; sleep 0.6; echo left"
    assert base_box.execute(["sh", "-c", script], tmp_path, {}, 30).stdout.data == b"left\n"
    assert base_box.execute(["true"], tmp_path, {}, 30).exit_code == 0  # the sweep ran before
    written = (tmp_path / "outlived").read_text().count("alive")
    time.sleep(0.5)
    assert (tmp_path / "outlived").read_text().count("alive") == written


# -- call x what it plants ---------------------------------------------------------------------

_PLANT = """
import os, site, sys
marker = "/workspace/planted-code-ran"
line = f"import os; open({marker!r} + '-' + str(os.getuid()), 'w').close()\\n"
os.makedirs(site.getusersitepackages(), exist_ok=True)
with open(os.path.join(site.getusersitepackages(), "evil.pth"), "w") as f:
    f.write(line)
for folder in ("/tmp", os.environ["HOME"], os.environ.get("TMPDIR", "/tmp"), "/dev/shm"):
    with open(os.path.join(folder, "sitecustomize.py"), "w") as f:
        f.write(line.replace("import os; ", "import os\\n"))
for name in (".profile", ".bashrc", ".pythonrc"):
    with open(os.path.join(os.environ["HOME"], name), "w") as f:
        f.write("touch /workspace/planted-code-ran-rc\\n")
print(os.environ["HOME"])
"""


def test_nothing_a_call_plants_outside_the_workspace_runs_later(
    base_box: DockerSandbox, tmp_path: Path
) -> None:
    first = base_box.execute(["python3", "-c", _PLANT], tmp_path, {}, 30)
    assert first.exit_code == 0, first
    home = first.stdout.data.decode().strip()
    later = base_box.execute(
        ["sh", "-c", 'python3 -c pass; bash -lic true; echo "$HOME"; ls -A "$HOME" /tmp /dev/shm'],
        tmp_path,
        {},
        30,
    )
    assert later.exit_code == 0, later
    lines = later.stdout.data.decode().splitlines()
    assert lines[0] != home  # a fresh HOME...
    assert home.rsplit("/", 1)[1] not in later.stdout.data.decode()  # ...and the old one gone
    check = base_box.execute_check(["python3", "-c", "pass"], tmp_path, 30, None)
    assert check.exit_code == 0
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("planted")) == []


def test_a_tool_filling_tmp_cannot_turn_a_failing_check_into_an_error(
    box: DockerSandbox, tmp_path: Path
) -> None:
    verify = tmp_path / "verify.sh"
    verify.write_text('#!/bin/sh\necho "checked as $(id -u)"; exit 1\n')
    verify.chmod(0o755)
    fill = "dd if=/dev/zero of=/tmp/fill bs=1M 2>/dev/null; dd if=/dev/zero of=/dev/shm/f bs=1M"
    sh(box, tmp_path, fill + " 2>/dev/null; df -k /tmp | tail -1")
    (copy,) = box.protect({verify: verify.read_bytes()}).values()
    check = box.execute_check([copy], tmp_path, 30, None)
    assert check.error is None and not check.sandbox_failed, check
    assert check.exit_code == 1
    assert check.stdout.data == b"checked as 65532\n"  # a uid no tool has
    # And the next call has its /tmp back.
    assert sh(box, tmp_path, "echo ok > /tmp/x && cat /tmp/x").stdout.data == b"ok\n"


# -- program files rewritten by an earlier call -------------------------------------------------


def _pinned(folder: Path, entry: str, index: int, content: bytes) -> PinnedProgram:
    path = folder / entry
    path.write_bytes(content)
    path.chmod(0o755)
    return PinnedProgram(index, entry, path.resolve(), content)


FORMS = {
    "argv0": (["./deploy.sh", "a"], "deploy.sh", 0),
    "sh-script": (["sh", "deploy.sh", "a"], "deploy.sh", 1),
    "sh-option-script": (["sh", "-e", "deploy.sh", "a"], "deploy.sh", 2),
    # Behind a wrapper: Pristine pins any entry of the command that named a file of code.
    "env-sh-script": (["env", "sh", "deploy.sh", "a"], "deploy.sh", 2),
    "timeout-sh-script": (["timeout", "20", "sh", "deploy.sh", "a"], "deploy.sh", 3),
}


@pytest.fixture(params=["host", "docker"])
def executor(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Executor]:
    if request.param == "host":
        host = HostExecutor()
        yield host
        host.close()
        return
    client = request.getfixturevalue("docker_client")
    sandbox = _box(client, tmp_path, f"programs-{request.node.name[-30:]}")
    yield sandbox
    sandbox.close()


@pytest.mark.parametrize("form", sorted(FORMS))
def test_a_program_rewritten_by_an_earlier_call_runs_as_read_at_start(
    executor: Executor, tmp_path: Path, form: str
) -> None:
    argv, entry, index = FORMS[form]
    # Run from its copy, `$0`'s folder is the copy's (where it cannot write): hence `|| :`.
    log = b'{ echo logged >> "$(dirname "$0")/log"; } 2>/dev/null || :\n'
    content = b'#!/bin/sh\necho "pristine $1"\n' + log
    program = _pinned(tmp_path, entry, index, content)
    clean = executor.execute(argv, tmp_path, {}, 30, programs=(program,))
    assert clean.stdout.data == b"pristine a\n", clean
    assert (tmp_path / "log").read_text() == "logged\n"  # unchanged: it ran in place
    rewrite = f"rm -f {entry}; printf '#!/bin/sh\\necho pwned; touch pwned-{form}\\n' > {entry}"
    assert sh(executor, tmp_path, rewrite).exit_code == 0
    later = executor.execute(argv, tmp_path, {"MM_SECRET": SECRET}, 30, programs=(program,))
    assert later.exit_code == 0, later
    assert later.stdout.data == b"pristine a\n"
    assert not (tmp_path / f"pwned-{form}").exists()


def test_an_unchanged_check_runs_in_place_with_its_own_files_at_hand(
    executor: Executor, tmp_path: Path
) -> None:
    """A check that reads a file beside it (`. "$(dirname "$0")/checklib.sh"`, a Python
    sibling import): run from a copy elsewhere, it failed and a right check was judged failed
    (second attack). Unchanged, it runs in place; changed by a tool, from the copy taken at
    start (see the tests above)."""
    (tmp_path / "checklib.sh").write_text("verdict=0\n")
    verify = tmp_path / "verify.sh"
    verify.write_text('. "$(dirname "$0")/checklib.sh" || exit 9\nexit "$verdict"\n')
    copies = executor.protect({verify: verify.read_bytes()})
    result = executor.execute_check(["sh", copies[verify]], tmp_path, 30, None)
    assert result.exit_code == 0, result


# -- program x how the kernel refuses it ------------------------------------------------------

REFUSED = {
    "missing-interpreter": b"#!/nonexistent/interp\necho ran > ran-marker\n",
    "crlf-shebang": b"#!/bin/sh\r\necho ran > ran-marker\r\n",
    "empty": b"",
    "garbage": bytes(range(1, 200)),
    "text-without-shebang": b"echo ran > ran-marker\n",
}


@pytest.mark.parametrize("kind", sorted(REFUSED))
def test_a_program_the_kernel_refuses_is_an_error_never_started_on_host_and_docker(
    executor: Executor, tmp_path: Path, kind: str
) -> None:
    program = _pinned(tmp_path, "tool.sh", 0, REFUSED[kind])
    result = executor.execute(["./tool.sh"], tmp_path, {}, 30, programs=(program,))
    assert result.error is not None and not result.started, result
    assert result.exit_code is None and not result.sandbox_failed
    assert not (tmp_path / "ran-marker").exists()


LIARS = {
    "format": "exec ./tool.sh: exec format error",
    "not-found": "exec ./tool.sh: no such file or directory",
    "oci": "OCI runtime exec failed: exec failed: no such file or directory",
}


@pytest.mark.parametrize("words", sorted(LIARS))
def test_a_program_printing_the_runtimes_words_still_counts_as_started(
    executor: Executor, tmp_path: Path, words: str
) -> None:
    content = f"#!/bin/sh\ntouch ran-marker\necho '{LIARS[words]}' >&2\nexit 1\n".encode()
    program = _pinned(tmp_path, "tool.sh", 0, content)
    result = executor.execute(["./tool.sh"], tmp_path, {}, 30, programs=(program,))
    assert (tmp_path / "ran-marker").exists()
    assert result.started, result
    # Unpinned (made during the run), it is still started: the words are anyone's to print.
    unpinned = executor.execute(["./tool.sh"], tmp_path, {}, 30)
    assert unpinned.started, unpinned


# -- call x the IPC objects it leaves (SysV and POSIX) ------------------------------------------

# Makes (`make KIND HOW`) or looks for (`look KIND`) an IPC object of KIND under one key/name;
# its content is MARK. HOW: `left` (its maker exits), `held` (a process left running holds it,
# for the sweep to kill), `chowned` (its owner set to the check's uid, which IPC_SET allows the
# creator). `look` prints how many the kernel lists and what it reads from one, if any.
_IPC = r"""
import ctypes, os, struct, sys, time
libc = ctypes.CDLL(None, use_errno=True)
libc.shmat.restype = ctypes.c_void_p
libc.shmat.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_int]
action, kind = sys.argv[1], sys.argv[2]
KEY, MARK, SIZE = 0x4D4D4242, b"LEFTOVER-OF-AN-EARLIER-CALL", 1 << 20
IPC_CREAT, IPC_SET, IPC_STAT, GETVAL, SETVAL, O_CREAT, O_RDWR = 0o1000, 1, 2, 12, 16, 0o100, 2


class Msg(ctypes.Structure):
    _fields_ = [("type", ctypes.c_long), ("text", ctypes.c_char * 64)]


def ok(value):
    if value == -1:
        raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))
    return value


if action == "look":
    if kind.startswith("posix"):
        folder = "/dev/mqueue" if kind == "posix-mq" else "/dev/shm"
        names = os.listdir(folder)
        print(len(names), open(f"{folder}/{names[0]}", "rb").read()[:64] if names else "none")
        sys.exit(0)
    listed = open(f"/proc/sysvipc/{kind}").read().splitlines()[1:]
    if kind == "msg":
        ident, message = libc.msgget(KEY, 0), Msg()
        got = ident != -1 and libc.msgrcv(ident, ctypes.byref(message), 64, 0, 0o4000) > 0
        seen = message.text if got else "none"
    elif kind == "shm":
        ident = libc.shmget(KEY, 0, 0)
        at = libc.shmat(ident, None, 0o10000) if ident != -1 else None  # SHM_RDONLY
        failed = at in (None, ctypes.c_void_p(-1).value)
        seen = "none" if failed else ctypes.string_at(at, len(MARK))
    else:
        ident = libc.semget(KEY, 0, 0)
        seen = libc.semctl(ident, 0, GETVAL) if ident != -1 else "none"
    print(len(listed), seen)
    sys.exit(0)

how = sys.argv[3]
if kind == "posix-mq":
    libc.mq_open.argtypes = [ctypes.c_char_p, ctypes.c_int, ctypes.c_int, ctypes.c_void_p]
    queue = ok(libc.mq_open(b"/mm-batch-left", O_CREAT | O_RDWR, 0o666, None))
    ok(libc.mq_send(queue, MARK, len(MARK), 0))
elif kind == "posix-shm":
    with open("/dev/shm/mm-batch-left", "wb") as f:
        os.chmod(f.name, 0o666)
        f.write(MARK)
elif kind == "msg":
    ident = ok(libc.msgget(KEY, IPC_CREAT | 0o666))
    ok(libc.msgsnd(ident, ctypes.byref(Msg(1, MARK)), 64, 0))
    control = libc.msgctl
elif kind == "shm":
    ident = ok(libc.shmget(KEY, SIZE, IPC_CREAT | 0o666))
    at = libc.shmat(ident, None, 0)
    ctypes.memmove(at, MARK, len(MARK))
    control = libc.shmctl
else:
    ident = ok(libc.semget(KEY, 1, IPC_CREAT | 0o666))
    ok(libc.semctl(ident, 0, SETVAL, 4242))
    control = lambda ident, command, buf: libc.semctl(ident, 0, command, buf)
if how == "chowned" and not kind.startswith("posix"):
    buf = ctypes.create_string_buffer(512)
    ok(control(ident, IPC_STAT, buf))
    struct.pack_into("II", buf, 4, 65532, 65532)  # ipc_perm: key, then uid and gid
    ok(control(ident, IPC_SET, buf))
if kind == "shm" and how != "held":
    ok(libc.shmdt(ctypes.c_void_p(at)))
print("made")
sys.stdout.flush()
if how == "held" and os.fork() == 0:
    os.setsid()
    null = os.open("/dev/null", os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    time.sleep(100000)
"""
IPC_KINDS = ("msg", "shm", "sem", "posix-mq", "posix-shm")
IPC_HOWS = ("left", "held", "chowned")


def _make_ipc(box: DockerSandbox, folder: Path, kind: str, how: str) -> None:
    made = box.execute(["python3", "-c", _IPC, "make", kind, how], folder, {}, 30)
    assert made.exit_code == 0 and made.stdout.data == b"made\n", made


@pytest.mark.parametrize("how", IPC_HOWS)
@pytest.mark.parametrize("kind", IPC_KINDS)
def test_no_ipc_object_of_a_call_reaches_the_next_call(
    base_box: DockerSandbox, tmp_path: Path, kind: str, how: str
) -> None:
    _make_ipc(base_box, tmp_path, kind, how)
    later = base_box.execute(["python3", "-c", _IPC, "look", kind], tmp_path, {}, 30)
    assert later.exit_code == 0, later
    assert later.stdout.data == b"0 none\n", later  # nothing listed, nothing to read


@pytest.mark.parametrize("how", IPC_HOWS)
@pytest.mark.parametrize("kind", IPC_KINDS)
def test_no_ipc_object_of_a_call_reaches_the_check(
    base_box: DockerSandbox, tmp_path: Path, kind: str, how: str
) -> None:
    _make_ipc(base_box, tmp_path, kind, how)
    check = base_box.execute_check(["python3", "-c", _IPC, "look", kind], tmp_path, 30, None)
    assert check.exit_code == 0 and check.error is None, check
    assert check.stdout.data == b"0 none\n", check


@pytest.fixture(scope="module")
def image_without_ipcrm(docker_client: Any) -> Iterator[str]:
    require_image(docker_client, BASE_IMAGE)
    tag = build_image_without(docker_client, "ipcrm", base=BASE_IMAGE)
    yield tag
    with contextlib.suppress(Exception):
        docker_client.images.remove(tag, force=True)


@pytest.mark.parametrize("kind", ("msg", "sem"))
def test_an_ipc_object_the_reset_cannot_remove_makes_the_next_call_a_sandbox_error(
    docker_client: Any, tmp_path: Path, image_without_ipcrm: str, kind: str
) -> None:
    box = _box(docker_client, tmp_path, f"no-ipcrm-{kind}", image_without_ipcrm)
    try:
        _make_ipc(box, tmp_path, kind, "left")
        later = sh(box, tmp_path, "touch ran-after")
        assert later.sandbox_failed and not later.started, later
        assert f"SysV {kind} 0" in (later.error or "") and "ipcrm" in (later.error or "")
        assert not (tmp_path / "ran-after").exists()
        check = box.execute_check(["touch", "check-ran"], tmp_path, 30, None)
        assert check.sandbox_failed and not (tmp_path / "check-ran").exists()
    finally:
        box.close()


def test_shared_memory_dies_with_its_last_user_even_where_no_ipcrm_is(
    docker_client: Any, tmp_path: Path, image_without_ipcrm: str
) -> None:
    # kernel.shm_rmid_forced in the container: a segment no process holds is gone at once.
    box = _box(docker_client, tmp_path, "no-ipcrm-shm", image_without_ipcrm)
    try:
        for how in ("left", "held"):
            _make_ipc(box, tmp_path, "shm", how)
            later = box.execute(["python3", "-c", _IPC, "look", "shm"], tmp_path, {}, 30)
            assert later.exit_code == 0 and later.stdout.data == b"0 none\n", later
    finally:
        box.close()


@pytest.mark.parametrize("how", IPC_HOWS)
def test_the_reset_removes_shared_memory_where_the_kernel_would_keep_it(
    docker_client: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    # The same container without kernel.shm_rmid_forced: the reset alone must remove it.
    from docker.models.containers import ContainerCollection

    require_image(docker_client, BASE_IMAGE)
    create = ContainerCollection.create
    dropped: list[str] = []

    def without_the_sysctl(self: Any, *args: Any, **kwargs: Any) -> Any:
        dropped.extend(kwargs.pop("sysctls"))
        return create(self, *args, **kwargs)

    monkeypatch.setattr(ContainerCollection, "create", without_the_sysctl)
    box = _box(docker_client, tmp_path, f"shm-kept-{how}", BASE_IMAGE)
    try:
        _make_ipc(box, tmp_path, "shm", how)
        assert dropped == ["kernel.shm_rmid_forced"]
        later = box.execute(["python3", "-c", _IPC, "look", "shm"], tmp_path, {}, 30)
        assert later.exit_code == 0 and later.stdout.data == b"0 none\n", later
    finally:
        box.close()


# -- a check's own processes killed -------------------------------------------------------------


@pytest.mark.parametrize("signal", ("KILL", "TERM", "SEGV", "ABRT"))
def test_a_check_killed_by_a_signal_never_passes(
    box: DockerSandbox, tmp_path: Path, signal: str
) -> None:
    check = box.execute_check(["sh", "-c", f"kill -{signal} $$; exit 0"], tmp_path, 30, None)
    assert check.exit_code is not None and check.exit_code > 128, check
    (judged,) = judge(Expect(), [], None, CheckRun(check.exit_code, ""))
    assert judged.name == "check" and not judged.ok


def test_a_check_whose_process_is_killed_out_of_memory_is_not_a_pass(
    base_box: DockerSandbox, tmp_path: Path
) -> None:
    # The check's scan is killed, and the shell around it goes on to exit 0: the kill shows.
    scan = "python3 -c 'x = bytearray(1 << 30)' 2>/dev/null; echo scanned $?; exit 0"
    check = base_box.execute_check(["sh", "-c", scan], tmp_path, 60, None)
    assert check.stdout.data == b"scanned 137\n", check  # SIGKILL, by the OOM killer
    assert check.exit_code == 0
    assert (
        check.error
        == "a process of the check was killed: out of memory (the sandbox limit is 256m)"
    )
    assert not check.sandbox_failed


# -- end to end: leftovers that would starve the check -------------------------------------------

_SHM_HOG = """#!/bin/sh
# Leaves ~480 MiB of SysV shared memory behind (no process, nothing in /tmp), after the
# forbidden change the check must find.
touch bad.txt
python3 -c '
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
libc.shmat.restype = ctypes.c_void_p
libc.shmat.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_int]
for i in range(6):
    ident = libc.shmget(0x5000 + i, 80 << 20, 0o1666)
    at = libc.shmat(ident, None, 0)
    ctypes.memset(at, 0x41, 80 << 20)
    libc.shmdt(ctypes.c_void_p(at))
'
echo left
"""
_SCAN_CHECK = """#!/bin/sh
# Needs ~200 MiB to scan; fails when it finds the forbidden change.
if python3 -c '
import os
x = bytearray(200 << 20)
print("FOUND" if os.path.exists("bad.txt") else "clean")
' | grep -q FOUND; then echo "forbidden change found"; exit 1; fi
echo "no forbidden change"; exit 0
"""


@pytest.mark.parametrize("hog", (True, False))
def test_a_tool_leaving_shared_memory_cannot_starve_a_failing_check_into_a_pass(
    docker_client: Any, cli: Any, fake_model: Any, tmp_path: Path, hog: bool
) -> None:
    require_image(docker_client, BASE_IMAGE)
    agent = tmp_path / "agent"
    agent.mkdir()
    tool = agent / "t.sh"
    tool.write_text(_SHM_HOG if hog else "#!/bin/sh\ntouch bad.txt\necho left\n")
    (agent / "check.sh").write_text(_SCAN_CHECK)
    for program in (tool, agent / "check.sh"):
        program.chmod(0o755)
    (agent / "agent.yaml").write_text(
        "yolo: true\n"
        f"sandbox: {{kind: docker, image: {BASE_IMAGE},"
        " limits: {memory: 256m, workspace: 64m}}\n"
        'tools: [{name: act, description: Act., command: ["./t.sh"]}]\n'
    )
    tasks = agent / "tasks.yaml"
    tasks.write_text(
        'agent: agent.yaml\ntasks: [{id: t1, prompt: p1, expect: {check: ["./check.sh"]}}]\n'
    )
    fake = fake_model(by_prompt({"p1": [tool_call("act", {}), text("done")]}))
    out = tmp_path / "out"
    result = cli("run", tasks, *model_args(fake), "--out", out)
    assert (out / "calls.jsonl").exists(), result.err
    (final,) = [r for r in read_calls(out) if r["kind"] == "task"]
    assert final["status"] == "failed", (final, result.err)
    assert "forbidden change found" in str(final["checks"])
    assert result.code == 1
