"""Allowlist bypass attempts: a hostile model asks for what no rule allows, spelled every way.

Each case is a real `mm-batch run` (CLI, real litellm, the scripted fake model, real bash and
scripts on the host) and asserts that the marker the forbidden command would leave does not
exist, the call's record (outcome, not started), the verdict and the exit code. Each bash attack
is first run by bash itself, so that a case whose command would leave no marker cannot pass.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from mm_batch.testing.fake_openai import text, tool_call
from tests.helpers import Cli, CliResult, Fake, model_args, read_calls, write

AGENT = """
yolo: false
builtins: [bash]
allow:
  - bash: "ls *"
  - bash: "git status"
  - bash: "echo *"
  - tool: release
    args: {channel: beta, version: "1.*"}
  - tool: publish
    args: {target: "*"}
  - bash: "./scripts/*"
  - tool: show
    args: {path: "docs/*"}
tools:
  - name: release
    description: Release a version to a channel.
    parameters:
      version: {type: string}
      channel: {type: string}
    command: ["./release.sh", "{{version}}", "--channel={{channel}}"]
  - name: publish
    description: Publish to a target.
    parameters:
      target: {type: string}
    command: ["./publish.sh", "{{target}}", "--channel=beta"]
  - name: show
    description: Show a file of the docs.
    parameters:
      path: {type: string}
    command: ["./show.sh", "{{path}}"]
"""
# Leaves the marker whatever it is given: any run of it is the attack succeeding.
MARK = """#!/bin/sh
touch MARK
"""
# Leaves a marker named after the channel it was really given: released-stable must never be.
RELEASE = """#!/bin/sh
for a in "$@"; do case "$a" in --channel=*) touch "released-${a#--channel=}";; esac; done
"""
PUBLISH = RELEASE.replace("released-", "published-")
TASKS = """
agent: agent.yaml
tasks:
  - id: attack
    prompt: attack
"""


@pytest.fixture
def project(tmp_path: Path) -> Path:
    write(tmp_path, "agent.yaml", AGENT)
    write(tmp_path, "release.sh", RELEASE).chmod(0o755)
    write(tmp_path, "publish.sh", PUBLISH).chmod(0o755)
    write(tmp_path, "show.sh", MARK).chmod(0o755)
    write(tmp_path, "mark.sh", MARK).chmod(0o755)
    write(tmp_path, "scripts/ok.sh", "#!/bin/sh\necho ok\n").chmod(0o755)
    return write(tmp_path, "tasks.yaml", TASKS)


def attack(
    cli: Cli, fake_model: Fake, tasks: Path, tool: str, raw: str
) -> tuple[CliResult, list[dict[str, Any]]]:
    """One run in which the model makes one call, then answers."""
    replies = iter([tool_call(tool, raw)])
    fake = fake_model(lambda _r: next(replies, text("done")))
    out = tasks.parent / "out"
    result = cli("run", tasks, *model_args(fake), "--out", out)
    assert "Traceback" not in result.err, result.err
    return result, read_calls(out)


def only_tool_record(records: list[dict[str, Any]]) -> dict[str, Any]:
    tools = [r for r in records if r["kind"] == "tool"]
    assert len(tools) == 1, tools
    return tools[0]


def assert_refused(result: CliResult, records: list[dict[str, Any]]) -> dict[str, Any]:
    record = only_tool_record(records)
    assert record["outcome"] == "refused" and record["started"] is False, record
    assert record["rule"] is None and record["exit_code"] is None
    assert record["reason"].startswith("refused: ") and "allowlist" in record["reason"]
    assert records[-1]["status"] == "failed"  # an unexpected refusal fails the task
    assert result.code == 1
    return record


BASH_ATTACKS = {
    "chained": "ls x; touch MARK",
    "and": "ls . && touch MARK",
    "or": "ls /nonexistent || touch MARK",
    "piped": "ls x | touch MARK",
    "backgrounded": "ls x & touch MARK",
    "substituted": "ls $(touch MARK)",
    "backquoted": "ls `touch MARK`",
    "newline": "ls x\ntouch MARK",
    "redirected": "ls >MARK",
    "stderr redirected": "ls /nonexistent 2>MARK",
    "process substitution": "ls <(touch MARK)",
    "ansi-c quoted": "echo $'\\x3b'; touch MARK",
    "braced group": "echo {x,y}; { touch MARK; }",
    "subshell on a second line": "ls x\n(touch MARK)",
    "escaped newline then a command": "echo x \\\n; touch MARK",
    "exact rule with a suffix": "git status; touch MARK",
    "exact rule with a second line": "git status\ntouch MARK",
}


@pytest.mark.parametrize("name", list(BASH_ATTACKS))
def test_a_bash_glob_lets_no_second_command_run(
    cli: Cli, fake_model: Fake, project: Path, name: str
) -> None:
    command = BASH_ATTACKS[name]
    # Proof that the attack is real: bash itself, given the command, leaves the marker.
    subprocess.run(["bash", "-c", command], cwd=project.parent, capture_output=True, check=False)
    assert (project.parent / "MARK").exists(), f"{name}: not an attack"
    (project.parent / "MARK").unlink()
    result, records = attack(cli, fake_model, project, "bash", json.dumps({"command": command}))
    assert not (project.parent / "MARK").exists()
    record = assert_refused(result, records)
    assert record["raw_arguments"] == json.dumps({"command": command})


def test_a_matching_bash_glob_runs_what_it_allows(
    cli: Cli, fake_model: Fake, project: Path
) -> None:
    """The reference case: the same rules let a plain command run."""
    result, records = attack(cli, fake_model, project, "bash", '{"command": "ls -a ."}')
    record = only_tool_record(records)
    assert record["outcome"] == "ran" and record["rule"] == "allow[0]", record
    assert "release.sh" in record["stdout"]
    assert result.code == 0


def test_a_tool_rule_for_bash_is_refused_at_load(cli: Cli, fake_model: Fake, project: Path) -> None:
    """`{tool: bash, args: {command: "ls *"}}` passed validate and let `ls x; touch MARK` run."""
    rule = "allow:\n  - tool: bash\n    args: {command: 'ls *'}\n"
    write(project.parent, "agent.yaml", AGENT.replace("allow:\n", rule))
    fake = fake_model(lambda _r: tool_call("bash", {"command": "ls x; touch MARK"}))
    result = cli("run", project, *model_args(fake), "--out", project.parent / "out")
    assert result.code == 2
    assert "bash rules" in result.err and "Traceback" not in result.err
    assert not fake.requests and not (project.parent / "MARK").exists()


DECLARED_REFUSALS = {
    "another channel": {"version": "1.4.2", "channel": "stable"},
    "a channel with a suffix": {"version": "1.4.2", "channel": "beta2"},
    "a channel with a space": {"version": "1.4.2", "channel": "beta "},
    "a channel in capitals": {"version": "1.4.2", "channel": "Beta"},
    "a look-alike channel": {"version": "1.4.2", "channel": "b\u0435ta"},  # Cyrillic e
    "a channel on a second line": {"version": "1.4.2", "channel": "beta\nstable"},
    "a version outside the glob": {"version": "21.0", "channel": "beta"},
    "a missing channel": {"version": "1.4.2"},
}


@pytest.mark.parametrize("name", list(DECLARED_REFUSALS))
def test_declared_tool_arguments_outside_the_rule_are_refused(
    cli: Cli, fake_model: Fake, project: Path, name: str
) -> None:
    arguments = DECLARED_REFUSALS[name]
    if "channel" not in arguments:  # the channel is required: make the rule the only gate
        write(
            project.parent,
            "agent.yaml",
            AGENT.replace("channel: {type: string}", "channel: {type: string, required: false}"),
        )
    result, records = attack(cli, fake_model, project, "release", json.dumps(arguments))
    assert not list(project.parent.glob("released-*"))
    assert_refused(result, records)


def test_a_duplicate_key_is_judged_as_it_would_run(
    cli: Cli, fake_model: Fake, project: Path
) -> None:
    """JSON's last duplicate wins, for consent and for the command alike."""
    raw = '{"version": "1.4.2", "channel": "beta", "channel": "stable"}'
    result, records = attack(cli, fake_model, project, "release", raw)
    assert not list(project.parent.glob("released-*"))
    assert assert_refused(result, records)["raw_arguments"] == raw


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        ('{"version": "1.4.2", "channel": ["beta"]}', "channel: expected a string"),
        ('{"version": "1.4.2", "channel": "beta", "force": true}', "unknown parameter 'force'"),
        ('"channel=stable"', "must be a JSON object"),
    ],
)
def test_type_confusion_is_invalid_and_runs_nothing(
    cli: Cli, fake_model: Fake, project: Path, raw: str, reason: str
) -> None:
    result, records = attack(cli, fake_model, project, "release", raw)
    record = only_tool_record(records)
    assert record["outcome"] == "invalid" and record["started"] is False
    assert reason in record["reason"]
    assert not list(project.parent.glob("released-*"))
    assert records[-1]["status"] == "passed" and result.code == 0  # the model may recover


def test_an_option_through_a_match_anything_rule_is_invalid(
    cli: Cli, fake_model: Fake, project: Path
) -> None:
    """`target: "*"` consents to any value, yet `--channel=stable` cannot become an option."""
    result, records = attack(cli, fake_model, project, "publish", '{"target": "--channel=stable"}')
    record = only_tool_record(records)
    assert record["outcome"] == "invalid" and "begins with '-'" in record["reason"]
    assert not list(project.parent.glob("published-*"))
    assert result.code == 0


def test_a_value_inside_its_entry_matches_the_glob_and_stays_one_argument(
    cli: Cli, fake_model: Fake, project: Path
) -> None:
    """`1.*` matches `1.0 --channel=stable`; it reaches the script as one argument."""
    raw = '{"version": "1.0 --channel=stable", "channel": "beta"}'
    result, records = attack(cli, fake_model, project, "release", raw)
    record = only_tool_record(records)
    assert record["outcome"] == "ran" and record["argv"] == [
        "./release.sh",
        "1.0 --channel=stable",
        "--channel=beta",
    ]
    assert {p.name for p in project.parent.glob("released-*")} == {"released-beta"}
    assert result.code == 0


PARENT_ESCAPES = {
    "a parent segment": "./scripts/../mark.sh",
    "a quoted parent": "./scripts/'..'/mark.sh",
    "a parent quoted in halves": './scripts/"."./mark.sh',
    "a parent deeper down": "./scripts/x/../../mark.sh",
}


@pytest.mark.parametrize("name", list(PARENT_ESCAPES))
def test_a_bash_glob_never_lets_its_star_climb_out_of_its_folder(
    cli: Cli, fake_model: Fake, project: Path, name: str
) -> None:
    """`./scripts/*` allowed `./scripts/../mark.sh`: any program of the machine, by `..`."""
    command = PARENT_ESCAPES[name]
    (project.parent / "scripts" / "x").mkdir(exist_ok=True)
    subprocess.run(["bash", "-c", command], cwd=project.parent, capture_output=True, check=False)
    assert (project.parent / "MARK").exists(), f"{name}: not an attack"
    (project.parent / "MARK").unlink()
    result, records = attack(cli, fake_model, project, "bash", json.dumps({"command": command}))
    assert not (project.parent / "MARK").exists()
    assert_refused(result, records)


def test_the_folder_glob_runs_what_is_in_its_folder(
    cli: Cli, fake_model: Fake, project: Path
) -> None:
    result, records = attack(cli, fake_model, project, "bash", '{"command": "./scripts/ok.sh"}')
    record = only_tool_record(records)
    assert record["outcome"] == "ran" and record["rule"] == "allow[5]", record
    assert result.code == 0


@pytest.mark.parametrize("path", ["docs/../secret.txt", "docs/..", "docs/a/../../secret.txt"])
def test_an_args_glob_never_allows_a_parent_path(
    cli: Cli, fake_model: Fake, project: Path, path: str
) -> None:
    """`path: "docs/*"` allowed `docs/../secret.txt`: `*` covered a `..` segment and a '/'."""
    result, records = attack(cli, fake_model, project, "show", json.dumps({"path": path}))
    assert not (project.parent / "MARK").exists()
    assert_refused(result, records)


def test_an_args_glob_allows_a_file_of_its_folder(
    cli: Cli, fake_model: Fake, project: Path
) -> None:
    result, records = attack(cli, fake_model, project, "show", '{"path": "docs/a..b.md"}')
    assert only_tool_record(records)["rule"] == "allow[6]"
    assert (project.parent / "MARK").exists() and result.code == 0
