"""Availability: hostile files, folders and values never hang or crash mm-batch (SPEC 1, 8).

Every path mm-batch reads as a file (tasks, agent, SKILL.md, hook and check programs) must be a
regular file: a FIFO (a read of it waits for a writer forever), a folder, a device or a link to
nothing is a configuration error, exit 2, naming the file. Each case runs the CLI as a process
of its own with a timeout, so that a hang fails the test instead of hanging pytest. Then the
`--out` folder that cannot be used, and the command line's values against the files' bounds.
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mm_batch.testing.fake_openai import text
from tests.helpers import Cli, Fake, model_args, write

HANG_S = 30  # far above a configuration error's second; a read of a FIFO never ends

AGENT = """
    yolo: true
    builtins: [read_skill]
    skills: [skills/]
    hooks:
      preToolCall: ["./hooks/audit.sh"]
    tools:
      - name: note
        description: Take a note.
        command: ["true"]
"""
TASKS = """
    agent: agent.yaml
    tasks:
      - id: t
        prompt: go
        expect:
          check: ["./checks/verify.sh"]
"""
SKILL = "---\nname: notes\ndescription: How to take notes.\n---\nTake notes.\n"
SCRIPT = "#!/bin/sh\nexit 0\n"

# Each path mm-batch reads as a file, relative to the folder the files are in.
PATHS = {
    "tasks": "tasks.yaml",
    "agent": "agent.yaml",
    "skill": "skills/notes/SKILL.md",
    "hook": "hooks/audit.sh",
    "check": "checks/verify.sh",
}


def _make(path: Path, kind: str) -> None:
    """Put a `kind` where `path` is."""
    path.unlink()
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "folder":
        path.mkdir()
    elif kind == "dangling link":
        path.symlink_to(path.parent / "gone")
    elif kind == "device":  # a character device that never ends: /dev/zero's own numbers
        try:
            os.mknod(path, stat.S_IFCHR | 0o600, os.makedev(1, 5))
        except PermissionError:  # without CAP_MKNOD: a link to it
            path.symlink_to("/dev/zero")
    else:
        raise AssertionError(kind)


def _project(tmp_path: Path) -> Path:
    write(tmp_path, "agent.yaml", AGENT)
    write(tmp_path, "tasks.yaml", TASKS)
    write(tmp_path, "skills/notes/SKILL.md", SKILL)
    for name in ("hooks/audit.sh", "checks/verify.sh"):
        write(tmp_path, name, SCRIPT).chmod(0o755)
    return tmp_path


def _mm_batch(cwd: Path, *args: str | Path) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(
            [sys.executable, "-m", "mm_batch", *map(str, args)],
            cwd=cwd,
            capture_output=True,
            check=False,
            text=True,
            timeout=HANG_S,
            stdin=subprocess.DEVNULL,
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"mm-batch {' '.join(map(str, args))} hung (no exit within {HANG_S} s)")


SAYS = {
    "fifo": "FIFO",
    "folder": ("folder", "directory"),
    "dangling link": ("not found", "does not exist", "link to nothing"),
    "device": "character device",
}


def _assert_refused(done: subprocess.CompletedProcess[str], name: str, kind: str) -> None:
    assert done.returncode == 2, (done.returncode, done.stdout, done.stderr)
    assert "Traceback" not in done.stderr
    assert name in done.stderr, done.stderr
    said = SAYS[kind]
    assert any(s in done.stderr for s in ((said,) if isinstance(said, str) else said)), done.stderr


def test_the_project_is_valid_as_written(tmp_path: Path) -> None:
    """The baseline: each case below changes one path and nothing else."""
    done = _mm_batch(_project(tmp_path), "validate", "tasks.yaml")
    assert done.returncode == 0, done.stderr


@pytest.mark.parametrize("kind", ["fifo", "folder", "dangling link", "device"])
@pytest.mark.parametrize("what", list(PATHS))
def test_validate_refuses_what_is_not_a_regular_file(tmp_path: Path, what: str, kind: str) -> None:
    project = _project(tmp_path)
    _make(project / PATHS[what], kind)
    done = _mm_batch(project, "validate", "tasks.yaml")
    _assert_refused(done, Path(PATHS[what]).name, kind)


@pytest.mark.parametrize("what", list(PATHS))
def test_run_refuses_a_fifo_and_runs_nothing(tmp_path: Path, fake_model: Fake, what: str) -> None:
    fake = fake_model(lambda _request: text("done"))
    project = _project(tmp_path)
    _make(project / PATHS[what], "fifo")
    done = _mm_batch(project, "run", "tasks.yaml", *model_args(fake), "--out", "out")
    _assert_refused(done, Path(PATHS[what]).name, "fifo")
    assert fake.requests == [] and not (project / "out").exists()


@pytest.mark.parametrize("command", ["validate", "tools"])
def test_an_agent_file_given_itself_as_a_fifo(tmp_path: Path, command: str) -> None:
    project = _project(tmp_path)
    _make(project / "agent.yaml", "fifo")
    _assert_refused(_mm_batch(project, command, "agent.yaml"), "agent.yaml", "fifo")


def test_a_skills_folder_that_is_a_fifo(tmp_path: Path) -> None:
    project = _project(tmp_path)
    (project / "skills" / "notes" / "SKILL.md").unlink()
    (project / "skills" / "notes").rmdir()
    (project / "skills").rmdir()
    os.mkfifo(project / "skills")
    done = _mm_batch(project, "validate", "tasks.yaml")
    assert done.returncode == 2 and "skills folder not a folder: skills/" in done.stderr


def test_a_program_outside_the_agent_folder_is_not_judged(tmp_path: Path) -> None:
    """A check may name a program of the container (`/usr/bin/test`): the host's is not it."""
    project = _project(tmp_path)
    write(project, "tasks.yaml", TASKS.replace("./checks/verify.sh", "/dev/null"))
    assert _mm_batch(project, "validate", "tasks.yaml").returncode == 0


# -- --out that cannot be used: exit 2, nothing ran ------------------------------------------


@pytest.mark.parametrize("report", ["calls.jsonl", "junit.xml", "summary.json", "report.html"])
def test_out_holding_a_folder_where_a_report_goes(
    cli: Cli, fake_model: Fake, tmp_path: Path, report: str
) -> None:
    fake = fake_model(lambda _request: text("done"))
    project = _project(tmp_path)
    (project / "out" / report).mkdir(parents=True)
    result = cli("run", project / "tasks.yaml", *model_args(fake), "--out", project / "out")
    assert result.code == 2, result.err
    assert report in result.err and "Traceback" not in result.err
    assert fake.requests == []


@pytest.mark.parametrize("where", ["out", "out/deeper"])
def test_out_through_a_link_to_nothing(
    cli: Cli, fake_model: Fake, tmp_path: Path, where: str
) -> None:
    fake = fake_model(lambda _request: text("done"))
    project = _project(tmp_path)
    (project / "out").symlink_to(project / "gone")
    result = cli("run", project / "tasks.yaml", *model_args(fake), "--out", project / where)
    assert result.code == 2, result.err
    assert "link to nothing" in result.err and "Traceback" not in result.err
    assert fake.requests == [] and not (project / "gone").exists()


def test_merge_into_a_folder_holding_a_report_folder(
    cli: Cli, fake_model: Fake, tmp_path: Path
) -> None:
    fake = fake_model(lambda _request: text("done"))
    project = _project(tmp_path)
    assert cli("run", project / "tasks.yaml", *model_args(fake), "--out", project / "a").code == 0
    (project / "merged" / "junit.xml").mkdir(parents=True)
    result = cli("merge", project / "a", "--out", project / "merged")
    assert result.code == 2, result.err
    assert "junit.xml" in result.err and "Traceback" not in result.err


# -- the command line's values have the files' bounds ----------------------------------------


def _tasks_with(project: Path, key: str, value: int) -> Path:
    text = f"agent: agent.yaml\n{key}: {value}\ntasks:\n  - id: t\n    prompt: go\n"
    return write(project, "bounded.yaml", text)


@settings(max_examples=60, deadline=None)
@given(
    key=st.sampled_from(["repeat", "jobs"]),
    value=st.one_of(st.integers(-5, 1030), st.integers(), st.sampled_from([3_000_000])),
)
def test_repeat_and_jobs_take_what_the_file_takes(
    tmp_path_factory: pytest.TempPathFactory, key: str, value: int
) -> None:
    from mm_batch.cli import main

    project = _project(tmp_path_factory.mktemp("bounds"))
    by_file = main(["validate", str(_tasks_with(project, key, value))])
    by_cli = main(["plan", str(project / "tasks.yaml"), f"--{key}", str(value)])
    assert by_file in (0, 2) and by_cli == by_file, (key, value, by_file, by_cli)


@pytest.mark.parametrize(
    "args",
    [
        ["--repeat", "3000000"],
        ["--repeat", "1001"],
        ["--jobs", "1025"],
        ["--shard", " 1/2"],
        ["--shard", "1_0/20"],
        ["--shard", "\u0661/2"],
        ["--shard", "1/" + "9" * 5000],
        ["--model", ""],
        ["--image", ""],
        ["--model-option", "temperature=NaN"],
        ["--model-option", "temperature=1e999"],
        ["--model-option", "temperature=-Infinity"],
        ["--model-option", "seed=" + "9" * 31],
        ["--model-option", "seed=" + "9" * 5000],
        ["--model-option", "extra=" + "[" * 63 + "]" * 63],
        ["--model-option", "extra=" + "[" * 5000 + "]" * 5000],
        ["--model-option", 'extra={"a": "\\ud800"}'],
        ["--model-option", "timeout=1e9"],
        ["--model-option", "timeout=0"],
        ["--model-option", "max_parallel=1025"],
    ],
)
def test_a_value_out_of_the_files_bounds_is_a_usage_error(
    cli: Cli, tmp_path: Path, args: list[str]
) -> None:
    project = _project(tmp_path)
    result = cli("plan", project / "tasks.yaml", *args, cwd=project)
    assert result.code == 2, (args, result.out, result.err)
    assert "Traceback" not in result.err and result.out == ""


@pytest.mark.parametrize(
    "args",
    [
        ["--repeat", "1000"],
        ["--jobs", "1024"],
        ["--shard", "2/3"],
        ["--model-option", "temperature=0.2"],
        ["--model-option", "seed=" + "9" * 30],
        ["--model-option", "extra=" + "[" * 62 + "]" * 62],
        ["--model-option", "timeout=604800"],
        ["--model-option", "max_parallel=1024"],
        ["--model-option", "api_base=http://127.0.0.1:1/v1"],
    ],
)
def test_a_value_within_the_bounds_plans(cli: Cli, tmp_path: Path, args: list[str]) -> None:
    project = _project(tmp_path)
    result = cli("plan", project / "tasks.yaml", *args, cwd=project)
    assert result.code == 0, (args, result.err)


def test_a_fifo_swapped_in_after_the_look_is_refused_at_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The files read at start (hooks, checks, tool programs): a name that was a file when
    looked at and is a FIFO when read is refused, never waited on."""
    from mm_batch.run import pristine

    fifo = tmp_path / "verify.sh"
    os.mkfifo(fifo)
    monkeypatch.setattr(pristine, "_under", lambda *_args: fifo)  # it looked like a file
    read: list[Path | None] = []
    reader = threading.Thread(
        target=lambda: read.append(pristine.Pristine()._read(tmp_path, "./verify.sh")),
        daemon=True,
    )
    reader.start()
    reader.join(timeout=5)
    if reader.is_alive():  # let the stuck reader go before failing
        with open(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK), "wb"):
            pass
        pytest.fail("reading the files of the run's start waited on a FIFO")
    assert read == [None]


def test_a_results_file_that_became_a_fifo_is_refused(tmp_path: Path) -> None:
    """merge, compare and --rerun-failed read results folders from anywhere: a file of one
    that is a FIFO when it is read (whatever it was when looked at) is refused, unread."""
    from mm_batch.report.readback import ResultsError, read_text

    fifo = tmp_path / "summary.json"
    os.mkfifo(fifo)
    outcome: list[str] = []

    def read() -> None:
        try:
            read_text(fifo)
        except ResultsError as exc:
            outcome.append(str(exc))

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    reader.join(timeout=5)
    if reader.is_alive():  # let the stuck reader go before failing
        with open(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK), "wb"):
            pass
        pytest.fail("reading a results file waited on a FIFO")
    assert outcome == [
        f"{fifo}: a FIFO (named pipe), not a regular file: mm-batch reads only regular files"
    ]
