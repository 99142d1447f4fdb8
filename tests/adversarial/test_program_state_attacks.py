"""Programs of the agent's folder are held to what was there at start where they run: on the
host and in the Docker sandbox's own copy of the folder (SPEC 3, "Within a run").

Found by the third attack round: in a `copy` workspace a tool's writes never reach the host, so
a script planted behind an interpreter or a wrapper was looked for on the host, not found, and
run in the container; a link there at start that a call replaced with a file ran the file; and
a check's data file (`grep -q done result.txt`) was read as it was at start, not as the tools
left it. Each case runs `mm-batch run` with the scripted fake model; a planted program would
print PWNED, which no record may hold.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from mm_batch.testing.fake_openai import by_prompt, text, tool_call
from tests.docker_support import TEST_IMAGE
from tests.helpers import Cli, Fake, model_args, read_calls, write

EXECUTORS = {
    "host": "",
    "docker": f"sandbox: {{kind: docker, image: {TEST_IMAGE}}}\n",
}
WHERE = [
    pytest.param("host", id="host"),
    pytest.param("docker", id="docker", marks=pytest.mark.docker),
]
# Replaces whatever is at the path it is given (a link included: never written through) with
# a script that prints PWNED.
PLANT = 'rm -f "$0"; printf "echo PWNED\\n" > "$0"; chmod 755 "$0"'
FINISH = 'echo "$0" > result.txt'  # writes its word into result.txt


def _agent(folder: Path, where: str, run: list[str], check: list[str] | None = None) -> Path:
    plant = json.dumps(["sh", "-c", PLANT, "{{path}}"])
    finish = json.dumps(["sh", "-c", FINISH, "{{word}}"])
    tools = (
        "tools:\n"
        f"  - name: plant\n    description: Plant.\n    command: {plant}\n"
        "    parameters: {path: {type: string}}\n"
        f"  - name: finish\n    description: Finish.\n    command: {finish}\n"
        "    parameters: {word: {type: string}}\n"
        f"  - name: run\n    description: Run.\n    command: {json.dumps(run)}\n"
    )
    write(folder, "agent.yaml", f"yolo: true\n{EXECUTORS[where]}{tools}")
    expect = f", expect: {{check: {json.dumps(check)}}}" if check is not None else ""
    return write(
        folder, "tasks.yaml", f"agent: agent.yaml\ntasks: [{{id: t, prompt: go{expect}}}]\n"
    )


def _run(cli: Cli, fake_model: Fake, tasks: Path, steps: list[Any]) -> list[dict[str, Any]]:
    fake = fake_model(by_prompt({"go": [*steps, text("done")]}))
    out = tasks.parent / "out"
    result = cli("run", tasks, *model_args(fake), "--out", out)
    assert result.code in (0, 1), result.err
    records = read_calls(out)
    assert not any("PWNED" in str(r.get("stdout")) for r in records), records
    return records


PLANTED_FORMS = {
    "sh p.sh": ["sh", "p.sh"],
    "sh - p.sh": ["sh", "-", "p.sh"],
    "env A=1 sh p.sh": ["env", "A=1", "sh", "p.sh"],
    "timeout 5 ./p.sh": ["timeout", "5", "./p.sh"],
    "nice sh p.sh": ["nice", "sh", "p.sh"],
}


@pytest.mark.parametrize("where", WHERE)
@pytest.mark.parametrize("form", PLANTED_FORMS)
def test_a_script_planted_behind_an_interpreter_or_a_wrapper_never_runs(
    cli: Cli, fake_model: Fake, tmp_path: Path, where: str, form: str
) -> None:
    tasks = _agent(tmp_path / "agent", where, PLANTED_FORMS[form])
    steps = [tool_call("plant", {"path": "p.sh"}), tool_call("run", {})]
    plant, run = [r for r in _run(cli, fake_model, tasks, steps) if r["kind"] == "tool"]
    assert plant["outcome"] == "ran" and plant["exit_code"] == 0, plant
    assert (run["outcome"], run["started"]) == ("error", False), run
    assert "p.sh was not a file of the agent's folder when the run started" in run["reason"]


@pytest.mark.parametrize("where", WHERE)
def test_a_check_script_planted_in_the_sandbox_never_decides_the_verdict(
    cli: Cli, fake_model: Fake, tmp_path: Path, where: str
) -> None:
    tasks = _agent(tmp_path / "agent", where, ["true"], check=["sh", "v.sh"])
    records = _run(cli, fake_model, tasks, [tool_call("plant", {"path": "v.sh"})])
    (task,) = [r for r in records if r["kind"] == "task"]
    assert task["status"] == "failed", task
    [check] = [c for c in task["checks"] if c["check"] == "check"]
    assert "v.sh was not a file of the agent's folder when the run started" in check["detail"]


@pytest.mark.parametrize("where", WHERE)
def test_a_link_there_at_start_that_a_call_replaced_never_runs(
    cli: Cli, fake_model: Fake, tmp_path: Path, where: str
) -> None:
    """A link out of the agent's folder is not copied at start; it runs (where its target is
    there) while it is the same link, never once a call put a file in its place."""
    agent = tmp_path / "agent"
    write(tmp_path, "outside.sh", "#!/bin/sh\necho outside\n").chmod(0o755)
    agent.mkdir()
    (agent / "x.sh").symlink_to("../outside.sh")
    tasks = _agent(agent, where, ["./x.sh"])
    steps = [tool_call("run", {}), tool_call("plant", {"path": "x.sh"}), tool_call("run", {})]
    first, plant, again = [r for r in _run(cli, fake_model, tasks, steps) if r["kind"] == "tool"]
    if where == "host":
        assert (first["outcome"], first["stdout"]) == ("ran", "outside\n"), first
    assert plant["outcome"] == "ran", plant
    assert (again["outcome"], again["started"]) == ("error", False), again
    assert "x.sh is no longer the link it was when the run started" in again["reason"]
    assert (agent / "x.sh").is_symlink() or where == "host"  # the host's link: a copy's only


@pytest.mark.parametrize("where", WHERE)
@pytest.mark.parametrize(
    ("at_start", "written", "status"),
    [("pending\n", "done", "passed"), ("done\n", "broken", "failed")],
    ids=["written-done", "broken-since-start"],
)
def test_a_check_reads_its_data_as_the_tools_left_it(
    cli: Cli,
    fake_model: Fake,
    tmp_path: Path,
    where: str,
    at_start: str,
    written: str,
    status: str,
) -> None:
    """Only a check's programs are held to the start; `result.txt` is what it checks."""
    agent = tmp_path / "agent"
    write(agent, "result.txt", at_start)
    tasks = _agent(agent, where, ["true"], check=["grep", "-q", "done", "result.txt"])
    records = _run(cli, fake_model, tasks, [tool_call("finish", {"word": written})])
    (task,) = [r for r in records if r["kind"] == "task"]
    assert task["status"] == status, task


@pytest.mark.parametrize(
    ("run", "reason"),
    [
        (["python3", "pkg"], "pkg was no file mm-batch could read when the run started"),
        (["env", "-C", "sub", "./x.sh"], "set the tool's workdir instead"),
    ],
    ids=["a-folder", "env-chdir"],
)
def test_a_program_that_cannot_be_held_to_the_start_is_refused(
    cli: Cli, fake_model: Fake, tmp_path: Path, run: list[str], reason: str
) -> None:
    agent = tmp_path / "agent"
    write(agent, "pkg/__main__.py", "print('pristine')\n")
    write(agent, "sub/x.sh", "#!/bin/sh\necho pristine\n").chmod(0o755)
    tasks = _agent(agent, "host", run)
    (record,) = [
        r for r in _run(cli, fake_model, tasks, [tool_call("run", {})]) if r["kind"] == "tool"
    ]
    assert (record["outcome"], record["started"]) == ("error", False), record
    assert reason in record["reason"]


# Rewrites every copy of a program it can find: mm-batch's open memory files (sealed, so each
# write fails) and the private folders it once kept its copies in.
TAMPER = """
for f in /proc/$PPID/fd/* /tmp/mm-batch-hooks-*/* /tmp/mm-batch-pristine-*/program-*/*; do
  case "$(readlink "$f" 2>/dev/null) $f" in
    memfd:*|*" /tmp/mm-batch-"*) printf '#!/bin/sh\\necho PWNED\\n' 2>/dev/null > "$f" ;;
  esac
done
true
"""


def test_a_host_command_cannot_change_the_copies_hooks_and_programs_run_from(
    cli: Cli, fake_model: Fake, tmp_path: Path
) -> None:
    """On the host every command runs as the user mm-batch runs as: a copy in a private
    folder would be theirs to rewrite. The copies are sealed memory files instead."""
    agent = tmp_path / "agent"
    write(agent, "gate.sh", "#!/bin/sh\necho gate-pristine\n").chmod(0o755)
    write(agent, "deploy.sh", "#!/bin/sh\necho deploy-pristine\n").chmod(0o755)
    rewrite = json.dumps(["sh", "-c", "printf 'echo rewritten\\n' > deploy.sh"])
    tools = (
        "tools:\n"
        f"  - {{name: rewrite, description: Rewrite., command: {rewrite}}}\n"
        "  - name: deploy\n    description: Deploy.\n    command: ['./deploy.sh', '{{n}}']\n"
        "    parameters: {n: {type: integer}}\n"
        f"  - {{name: tamper, description: Tamper., command: {json.dumps(['sh', '-c', TAMPER])}}}\n"
    )
    hooks = 'hooks: {preToolCall: ["./gate.sh"]}\n'
    write(agent, "agent.yaml", f"yolo: true\n{hooks}{tools}")
    tasks = write(agent, "tasks.yaml", "agent: agent.yaml\ntasks: [{id: t, prompt: go}]\n")
    steps = [
        tool_call("rewrite", {}),
        tool_call("deploy", {"n": 1}),  # runs from its copy: the file was rewritten
        tool_call("tamper", {}),
        tool_call("deploy", {"n": 2}),
    ]
    records = _run(cli, fake_model, tasks, steps)
    tools_run = [r for r in records if r["kind"] == "tool"]
    assert [r["outcome"] for r in tools_run] == ["ran"] * 4, tools_run
    assert [r["stdout"] for r in tools_run if r["tool"] == "deploy"] == ["deploy-pristine\n"] * 2
    assert all("gate-pristine" in json.dumps(r["hooks"]) for r in tools_run), tools_run


def _script(folder: Path, name: str, text: str) -> None:
    write(folder, name, f"#!/bin/sh\n{text}\n").chmod(0o755)


def _tools(folder: Path, where: str, tools: dict[str, list[str]], check: str = "") -> Path:
    lines = "".join(
        f"  - {{name: {name}, description: {name}., command: {json.dumps(argv)}}}\n"
        for name, argv in tools.items()
    )
    write(folder, "agent.yaml", f"yolo: true\n{EXECUTORS[where]}tools:\n{lines}")
    expect = f", expect: {{check: {check}}}" if check else ""
    return write(
        folder, "tasks.yaml", f"agent: agent.yaml\ntasks: [{{id: t, prompt: go{expect}}}]\n"
    )


def _outputs(records: list[dict[str, Any]]) -> list[tuple[str, str]]:
    return [
        (r["outcome"], r["stdout"] or r["reason"] or "") for r in records if r["kind"] == "tool"
    ]


@pytest.mark.parametrize("where", WHERE)
def test_a_link_to_proc_self_cwd_leads_the_look_and_the_run_to_one_file(
    cli: Cli, fake_model: Fake, tmp_path: Path, where: str
) -> None:
    """A tool turns `deploy.sh` into a link through `/proc/self/cwd`: whatever compares it
    with what was read at start resolves it from its own working directory, the command from
    the tool's. Where both differ, the copy runs, never the file the tool planted."""
    agent, own = tmp_path / "agent", tmp_path / "own-cwd"
    _script(agent, "deploy.sh", "echo pristine")
    # What mm-batch's own working directory (and the container's `/`) holds under that name.
    copy = ".mm-batch-programs/0/deploy.sh"
    _script(own, copy, "echo pristine")
    trick = (
        f"mkdir -p {copy.rsplit('/', 1)[0]}; printf '#!/bin/sh\\necho PWNED\\n' > {copy}; "
        f"chmod 755 {copy}; rm deploy.sh; ln -s /proc/self/cwd/{copy} deploy.sh"
    )
    tasks = _tools(
        agent,
        where,
        {"deploy": ["./deploy.sh"], "trick": ["sh", "-c", trick]},
        check='["./deploy.sh"]',
    )
    steps = [tool_call("deploy", {}), tool_call("trick", {}), tool_call("deploy", {})]
    fake = fake_model(by_prompt({"go": [*steps, text("done")]}))
    result = cli("run", tasks, *model_args(fake), "--out", agent / "out", cwd=own)
    assert result.code in (0, 1), result.err
    records = read_calls(agent / "out")
    assert not any("PWNED" in str(r.get("stdout")) for r in records), records
    assert _outputs(records) == [("ran", "pristine\n"), ("ran", ""), ("ran", "pristine\n")]
    assert [r["status"] for r in records if r["kind"] == "task"] == ["passed"]


@pytest.mark.parametrize("where", WHERE)
def test_each_way_to_a_program_is_compared_on_its_own(
    cli: Cli, fake_model: Fake, tmp_path: Path, where: str
) -> None:
    """`./current/deploy.sh` and `v2/deploy.sh` are one file at start (`current -> v2`). A
    tool points `current` at an honest copy and rewrites `v2/deploy.sh`: neither may run it."""
    agent = tmp_path / "agent"
    _script(agent, "v2/deploy.sh", "echo pristine")
    (agent / "current").symlink_to("v2")
    swap = (
        "mkdir v3; cp v2/deploy.sh v3/; rm current; ln -s v3 current; "
        "printf '#!/bin/sh\\necho PWNED\\n' > v2/deploy.sh"
    )
    tools = {"current": ["./current/deploy.sh"], "v2": ["v2/deploy.sh"], "swap": ["sh", "-c", swap]}
    tasks = _tools(agent, where, tools)
    steps = [tool_call("current", {}), tool_call("swap", {}), tool_call("v2", {})]
    records = _run(cli, fake_model, tasks, steps)
    assert _outputs(records) == [("ran", "pristine\n"), ("ran", ""), ("ran", "pristine\n")]


@pytest.mark.parametrize("where", WHERE)
@pytest.mark.parametrize("chain", ["dangling-into-the-folder", "link-to-a-link"])
def test_every_link_on_the_way_to_a_program_stays_what_it_was(
    cli: Cli, fake_model: Fake, tmp_path: Path, where: str, chain: str
) -> None:
    """A link not read at start (its end is outside the folder, or not there yet) runs only
    while every link on its way inside the folder, and where it ends there, is as at start."""
    agent = tmp_path / "agent"
    agent.mkdir()
    _script(tmp_path, "outside.sh", "echo outside")
    if chain == "dangling-into-the-folder":
        (agent / "run.sh").symlink_to("gen/out.sh")  # made by no tool yet
        plant = (
            "mkdir -p gen; printf '#!/bin/sh\\necho PWNED\\n' > gen/out.sh; chmod 755 gen/out.sh"
        )
    else:
        (agent / "b").symlink_to("../outside.sh")
        (agent / "run.sh").symlink_to("b")
        plant = "printf '#!/bin/sh\\necho PWNED\\n' > p.sh; chmod 755 p.sh; rm b; ln -s p.sh b"
    tasks = _tools(agent, where, {"run": ["sh", "./run.sh"], "plant": ["sh", "-c", plant]})
    records = _run(cli, fake_model, tasks, [tool_call("plant", {}), tool_call("run", {})])
    plant_record, run = [r for r in records if r["kind"] == "tool"]
    assert plant_record["outcome"] == "ran", plant_record
    assert (run["outcome"], run["started"]) == ("error", False), run


@pytest.mark.docker
def test_a_program_named_by_its_path_in_the_container_is_refused(
    cli: Cli, fake_model: Fake, tmp_path: Path
) -> None:
    """Read at start by its path in the agent's folder, a program is held to that only when
    named so: `/workspace/deploy.sh` is refused, for a tool and for a check."""
    agent = tmp_path / "agent"
    _script(agent, "deploy.sh", "echo pristine")
    _script(agent, "verify.sh", "exit 1")
    plant = (
        "printf '#!/bin/sh\\necho PWNED\\n' > deploy.sh; printf '#!/bin/sh\\nexit 0\\n' > verify.sh"
    )
    tools = {"deploy": ["/workspace/deploy.sh"], "plant": ["sh", "-c", plant]}
    tasks = _tools(agent, "docker", tools, check='["/workspace/verify.sh"]')
    records = _run(cli, fake_model, tasks, [tool_call("plant", {}), tool_call("deploy", {})])
    _, deploy = [r for r in records if r["kind"] == "tool"]
    assert (deploy["outcome"], deploy["started"]) == ("error", False), deploy
    assert "relative to the tool's workdir" in deploy["reason"]
    assert [r["status"] for r in records if r["kind"] == "task"] == ["failed"]
