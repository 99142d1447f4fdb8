"""Tool programs run as they were read at start (SPEC 3, "Within a run"), proven through the
whole loop: the agent file, Pristine, the call site and the host executor.

A tool rewriting `./deploy.sh` (or the script an interpreter is given) must change nothing that
a later call runs; a program the kernel refuses is an error that never started; and which argv
entry is a program is a property over generated interpreter command lines.
"""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mm_batch.run.argv_programs import HiddenProgramError, program_entries
from tests.run.scripted import answer, calls, run_tasks


def _agent(folder: Path, command: list[str], program: str, content: str) -> Path:
    (folder / program).write_text(content)
    (folder / program).chmod(0o755)
    rewrite = f"printf '#!/bin/sh\\necho pwned; touch pwned\\n' > {program}; chmod 755 {program}"
    agent = folder / "agent.yaml"
    agent.write_text(
        "yolo: true\ntools:\n"
        f"  - name: deploy\n    description: Deploy.\n    command: {[*command, '{{n}}']!r}\n"
        "    parameters: {n: {type: integer}}\n"
        "    env: {DEPLOY_TOKEN: tok3n-of-the-deploy}\n"
        f"  - name: rewrite\n    description: Rewrite.\n    command: ['sh', '-c', {rewrite!r}]\n"
    )
    tasks = folder / "tasks.yaml"
    tasks.write_text("agent: agent.yaml\ntasks:\n  - {id: t, prompt: go}\n")
    return tasks


FORMS = {
    "./deploy.sh": (["./deploy.sh"], "deploy.sh", "#!/bin/sh\necho pristine\n"),
    "sh deploy.sh": (["sh", "deploy.sh"], "deploy.sh", "echo pristine\n"),
    "bash -e x.sh": (["bash", "-e", "x.sh"], "x.sh", "echo pristine\n"),
    "python3 deploy.py": (["python3", "deploy.py"], "deploy.py", "print('pristine')\n"),
    # Behind a wrapper, or an interpreter's option with a value (found by the second attack).
    "env sh deploy.sh": (["env", "sh", "deploy.sh"], "deploy.sh", "echo pristine\n"),
    "timeout 5 sh deploy.sh": (["timeout", "5", "sh", "deploy.sh"], "deploy.sh", "echo pristine\n"),
    "nice sh deploy.sh": (["nice", "sh", "deploy.sh"], "deploy.sh", "echo pristine\n"),
    "/usr/bin/env python3 deploy.py": (
        ["/usr/bin/env", "python3", "deploy.py"],
        "deploy.py",
        "print('pristine')\n",
    ),
    "python3 --check-hash-based-pycs never deploy.py": (
        ["python3", "--check-hash-based-pycs", "never", "deploy.py"],
        "deploy.py",
        "print('pristine')\n",
    ),
    # Found by the third attack: a shell's `-`, a program named by an option, `find -exec`.
    "sh - deploy": (["sh", "-", "deploy"], "deploy", "echo pristine\n"),
    "awk -f prog": (["awk", "-f", "prog"], "prog", 'BEGIN { print "pristine" }\n'),
    "find -exec": (
        ["find", ".", "-maxdepth", "0", "-exec", "sh", "deploy", ";", "-o", "-name"],
        "deploy",
        "echo pristine\n",
    ),
    "setarch x86_64 ./deploy": (
        ["setarch", "x86_64", "./deploy"],
        "deploy",
        "#!/bin/sh\necho pristine\n",
    ),
}


def test_a_program_rewritten_by_an_earlier_call_runs_as_read_at_start(tmp_path: Path) -> None:
    for name, (command, program, content) in FORMS.items():
        folder = tmp_path / name.replace(" ", "_").replace("/", "")
        folder.mkdir()
        tasks = _agent(folder, command, program, content)
        steps = [
            calls(("deploy", '{"n": 1}')),
            calls(("rewrite", "{}")),
            calls(("deploy", '{"n": 2}')),
        ]
        out = run_tasks(tasks, [*steps, answer("done")])
        records = out.records.of("tool")
        assert [r["outcome"] for r in records] == ["ran"] * 3, (name, records)
        assert records[0]["stdout"] == records[2]["stdout"] == "pristine\n", name
        assert records[2]["argv"] == [*command, "2"]  # the record shows the call as declared
        assert not (folder / "pwned").exists(), name
        assert (folder / program).read_text().startswith("#!/bin/sh\necho pwned")  # data stays


def test_a_program_a_call_planted_is_never_run(tmp_path: Path) -> None:
    """A tool's program (argv[0], or the script an interpreter runs, behind wrappers too) that
    was no file of the agent's folder at start is not run when a call writes it later: an
    error, never started."""
    for name, (command, program, _content) in FORMS.items():
        folder = tmp_path / name.replace(" ", "_").replace("/", "")
        folder.mkdir()
        tasks = _agent(folder, command, program, "")
        (folder / program).unlink()  # not there at start: `rewrite` writes it during the run
        steps = [calls(("rewrite", "{}")), calls(("deploy", '{"n": 1}'))]
        out = run_tasks(tasks, [*steps, answer("done")])
        rewrite, deploy = out.records.of("tool")
        assert rewrite["outcome"] == "ran", (name, rewrite)
        assert deploy["outcome"] == "error" and deploy["started"] is False, (name, deploy)
        assert "was not a file of the agent's folder when the run started" in deploy["reason"]
        assert not (folder / "pwned").exists(), name


REFUSED = {
    "missing interpreter": "#!/nonexistent/interp\ntouch ran\n",
    "crlf shebang": "#!/bin/sh\r\ntouch ran\r\n",
    "empty file": "",
}


def test_a_program_the_kernel_refuses_is_an_error_never_started(tmp_path: Path) -> None:
    for name, content in REFUSED.items():
        folder = tmp_path / name.replace(" ", "_")
        folder.mkdir()
        tasks = _agent(folder, ["./deploy.sh"], "deploy.sh", content)
        out = run_tasks(tasks, [calls(("deploy", '{"n": 1}')), answer("done")])
        (record,) = out.records.of("tool")
        assert record["outcome"] == "error" and record["started"] is False, (name, record)
        assert not (folder / "ran").exists()


# -- which entry is a program: a property ------------------------------------------------------

INTERPRETERS = ["sh", "bash", "dash", "/bin/sh", "python3", "python3.11", "/usr/bin/python3"]
FLAGS = {"sh": ["-e", "-x", "-eu"], "python": ["-u", "-B", "-I", "-O"]}
VALUED = {"sh": [["-o", "pipefail"]], "python": [["-W", "ignore"], ["-X", "dev"]]}
CODE = {
    "sh": [["-c", "echo"], ["-ec", "echo"], ["-s", "arg"]],
    "python": [["-c", "pass"], ["-m", "pip"]],
}
names = st.from_regex(r"[a-z][a-z0-9_]{0,8}\.(sh|py)", fullmatch=True)


def _family(program: str) -> str:
    return "python" if "python" in program else "sh"


@st.composite
def interpreter_lines(draw: st.DrawFn) -> tuple[list[str], int | None]:
    """(argv, index of its script or None): options, valued options, then a script or code."""
    program = draw(st.sampled_from(INTERPRETERS))
    family = _family(program)
    argv = [program]
    for _ in range(draw(st.integers(0, 3))):
        if draw(st.booleans()):
            argv.append(draw(st.sampled_from(FLAGS[family])))
        else:
            argv.extend(draw(st.sampled_from(VALUED[family])))
    if draw(st.booleans()):
        argv.extend(draw(st.sampled_from(CODE[family])))
        script = None
    else:
        script = len(argv)
        argv.append(draw(names))
    argv.extend(draw(st.lists(st.sampled_from(["a", "-v", "--x=1", "b.sh"]), max_size=3)))
    return argv, script


# Wrappers that run the command after their own options and operands, as their manuals say.
WRAPPERS: dict[str, list[list[str]]] = {
    "env": [[], ["-i"], ["-"], ["-u", "HOME"], ["--unset=HOME"], ["A=1"], ["-i", "B=x=y"]],
    "/usr/bin/env": [[], ["A=1", "C=2"]],
    "timeout": [["5"], ["-s", "KILL", "5"], ["-k5", "10s"], ["--signal", "TERM", "1m"]],
    "nice": [[], ["-n", "5"], ["-10"], ["--adjustment=3"]],
    "nohup": [[]],
    "setsid": [[], ["-w"]],
    "stdbuf": [["-oL"], ["-o", "0", "-eL"]],
    "xargs": [[], ["-n", "1"], ["-I{}"], ["-P", "2", "-0"]],
    "flock": [["/tmp/lock"], ["-w", "3", "/tmp/lock"]],
    "busybox": [[]],
    "setarch": [["x86_64"], ["x86_64", "-R"]],
    "prlimit": [[], ["--nofile=64"]],
    "sudo": [[], ["-u", "nobody"]],
}
# Wrappers whose command comes from a string: nothing after them is taken for a program.
OPAQUE = [["env", "-S", "sh x.sh"], ["flock", "-c", "sh x.sh", "/tmp/l"]]
# Options that move where a relative program is looked up, or hide the program file in their
# own word: the line's program cannot be told, and it never runs.
HIDING = [
    ["env", "-C", "sub"],
    ["env", "--chdir=sub"],
    ["make", "--file=x.mk"],
    ["make", "-C", "d"],
]


@st.composite
def wrapped_lines(draw: st.DrawFn) -> tuple[list[str], list[int]]:
    """(argv, indexes of its programs): wrappers nested 0-3 deep around an interpreter line,
    or around a command given as a path; the programs are the paths each wrapper runs, and
    the script."""
    argv: list[str] = []
    programs: list[int] = []
    for _ in range(draw(st.integers(0, 3))):
        wrapper = draw(st.sampled_from(sorted(WRAPPERS)))
        if "/" in wrapper:
            programs.append(len(argv))
        argv += [wrapper, *draw(st.sampled_from(WRAPPERS[wrapper]))]
    if draw(st.booleans()):
        line, script = draw(interpreter_lines())
        if "/" in line[0]:
            programs.append(len(argv))
        if script is not None:
            programs.append(len(argv) + script)
        return argv + line, programs
    programs.append(len(argv))
    return [*argv, draw(st.sampled_from(["./deploy", "bin/x", "/usr/bin/make"])), "a"], programs


@settings(max_examples=300, deadline=None)
@given(interpreter_lines())
def test_the_script_an_interpreter_is_given_is_found_and_nothing_else(
    line: tuple[list[str], int | None],
) -> None:
    argv, script = line
    found = program_entries(argv)
    expected = ([0] if "/" in argv[0] else []) + ([script] if script is not None else [])
    assert list(found) == expected, shlex.join(argv)


@settings(max_examples=400, deadline=None)
@given(wrapped_lines())
def test_behind_any_chain_of_wrappers_the_programs_are_found_and_nothing_else(
    line: tuple[list[str], list[int]],
) -> None:
    argv, programs = line
    assert list(program_entries(argv)) == programs, shlex.join(argv)


@settings(max_examples=200, deadline=None)
@given(st.sampled_from(OPAQUE), interpreter_lines())
def test_after_a_wrapper_that_hides_its_command_nothing_is_a_program(
    opaque: list[str], line: tuple[list[str], int | None]
) -> None:
    argv = [*opaque, *line[0]]
    assert program_entries(argv) == (), shlex.join(argv)


@settings(max_examples=100, deadline=None)
@given(st.sampled_from(HIDING), interpreter_lines())
def test_a_line_whose_program_is_hidden_is_refused(
    hiding: list[str], line: tuple[list[str], int | None]
) -> None:
    with pytest.raises(HiddenProgramError):
        program_entries([*hiding, *line[0]])


@settings(max_examples=200, deadline=None)
@given(st.lists(st.text(max_size=12), min_size=1, max_size=6))
def test_a_program_entry_is_never_an_option(argv: list[str]) -> None:
    try:
        entries = program_entries(argv)
    except HiddenProgramError:
        return
    for i in entries:
        assert i == 0 or not argv[i].startswith(("-", "+")) or argv[i - 1] in ("--", "-")
