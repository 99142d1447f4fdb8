"""What loads: which kind a file is, warnings that are not errors, normalised sandbox values."""

from __future__ import annotations

from pathlib import Path

import pytest

from mm_batch.config.load import load_tasks
from mm_batch.config.problems import MAX_QUOTED, ConfigError, excerpt
from mm_batch.config.yamlnodes import one_edit_apart
from mm_batch.testing.fake_openai import by_prompt, text
from tests.helpers import Cli, Fake, model_args, write

AGENT = """\
tools:
  - name: release
    description: Release a version.
    parameters:
      version: {type: string}
    command: ["./release.sh", "{{version}}"]
"""


def test_validate_says_which_kind_of_file_it_read(cli: Cli, tmp_path: Path) -> None:
    write(tmp_path, "release.sh", "#!/bin/sh\n").chmod(0o755)  # validate looks for it
    write(tmp_path, "agent.yaml", AGENT)
    write(tmp_path, "other.yaml", AGENT)
    write(
        tmp_path,
        "tasks.yaml",
        "agent: agent.yaml\ntasks: [{id: a, prompt: p}, {id: b, prompt: p, agent: other.yaml}]\n",
    )
    tasks = cli("validate", "tasks.yaml", cwd=tmp_path)
    assert (tasks.code, tasks.out, tasks.err) == (
        0,
        "tasks.yaml: tasks file, 2 tasks, 2 agent files: fine\n",
        "",
    )
    agent = cli("validate", "agent.yaml", cwd=tmp_path)
    assert (agent.code, agent.out) == (0, "agent.yaml: agent file, 1 declared tool: fine\n")
    tools = cli("tools", "tasks.yaml", cwd=tmp_path)
    assert (tools.code, tools.err.splitlines()[0]) == (
        2,
        "tasks.yaml:1: this is a tasks file, not an agent file: give the agent file it names",
    )


def test_bash_globs_over_programs_that_run_programs_warn_but_pass(
    cli: Cli, tmp_path: Path, fake_model: Fake
) -> None:
    write(
        tmp_path,
        "agent.yaml",
        """\
        builtins: [bash]
        allow:
          - bash: "git *"
          - bash: "git status"
          - bash: "ls *"
          - bash: "/usr/bin/find . -name *"
          - bash: "python3.11 *"
          - bash: "py* x"
        """.replace("        ", ""),
    )
    write(tmp_path, "tasks.yaml", "agent: agent.yaml\ntasks: [{id: a, prompt: p}]\n")
    tail = "which can run any other program through its options or arguments: prefer exact rules"
    warnings = [
        f"agent.yaml:3: allow[0].bash: warning: the glob 'git *' runs git, {tail}",
        "agent.yaml:6: allow[3].bash: warning: the glob '/usr/bin/find . -name *' runs find, "
        + tail,
        f"agent.yaml:7: allow[4].bash: warning: the glob 'python3.11 *' runs python3.11, {tail}",
        f"agent.yaml:8: allow[5].bash: warning: the glob 'py* x' runs any program, python among "
        f"them, {tail}",
    ]
    result = cli("validate", "tasks.yaml", cwd=tmp_path)
    assert (result.code, result.err.splitlines()) == (0, warnings)
    planned = cli("plan", "tasks.yaml", "--model", "hosted_vllm/x", cwd=tmp_path)
    assert (planned.code, planned.err.splitlines()[:-1]) == (0, warnings)
    fake = fake_model(by_prompt({"p": [text("done")]}))
    ran = cli("run", "tasks.yaml", *model_args(fake), "--out", tmp_path / "out", cwd=tmp_path)
    assert (ran.code, ran.err.splitlines()[: len(warnings)]) == (0, warnings)


@pytest.mark.parametrize(
    ("written", "user"),
    [
        ("05", "5:5"),
        ("1000", "1000:1000"),
        ("0100:0200", "100:200"),
        ("2147483647", "2147483647:2147483647"),
    ],
)
def test_sandbox_user_is_normalised_to_uid_gid(tmp_path: Path, written: str, user: str) -> None:
    write(tmp_path, "agent.yaml", f'sandbox: {{kind: docker, user: "{written}"}}\n')
    write(tmp_path, "tasks.yaml", "agent: agent.yaml\ntasks: [{id: a, prompt: p}]\n")
    assert load_tasks(tmp_path / "tasks.yaml").tasks[0].agent.sandbox.user == user


def test_workspace_modes_sizes_and_typed_dashes_load(tmp_path: Path) -> None:
    write(
        tmp_path,
        "copy.yaml",
        AGENT.replace("{type: string}", "{type: integer, allow_dash: true}")
        + "sandbox: {kind: docker, limits: {workspace: 2G, memory: 1073741824}}\n",
    )
    write(tmp_path, "ro.yaml", "sandbox: {kind: docker, workspace: readonly}\n")
    write(
        tmp_path,
        "tasks.yaml",
        """\
        tasks:
          - {id: a, prompt: p, agent: copy.yaml, expect: {exit_code: 255}}
          - {id: b, prompt: p, agent: ro.yaml, max_turns: 123456789012345678901234567890}
        """.replace("        ", ""),
    )
    with pytest.raises(ConfigError, match="max_turns: must be at most 10000"):
        load_tasks(tmp_path / "tasks.yaml")
    (tmp_path / "tasks.yaml").write_text(
        (tmp_path / "tasks.yaml").read_text().replace("123456789012345678901234567890", "30")
    )
    copy, ro = (t.agent for t in load_tasks(tmp_path / "tasks.yaml").tasks)
    assert (copy.sandbox.workspace, copy.sandbox.workspace_size, copy.sandbox.memory) == (
        "copy",
        "2g",
        "1073741824",
    )
    assert copy.tools[0].params[0].allow_dash is True
    assert (ro.sandbox.workspace, ro.sandbox.workspace_size) == ("readonly", "1g")


def test_a_30_digit_integer_is_read_a_31_digit_one_is_not(tmp_path: Path) -> None:
    enum = "123456789012345678901234567890"
    write(
        tmp_path,
        "agent.yaml",
        AGENT.replace("{type: string}", f"{{type: integer, enum: [{enum}]}}"),
    )
    write(tmp_path, "tasks.yaml", "agent: agent.yaml\ntasks: [{id: a, prompt: p}]\n")
    param = load_tasks(tmp_path / "tasks.yaml").tasks[0].agent.tools[0].params[0]
    assert param.enum == (int(enum),)


@pytest.mark.parametrize(
    ("typo", "key", "near"),
    [
        ("task", "tasks", True),
        ("taks", "tasks", True),
        ("tasky", "tasks", True),
        ("tsaks", "tasks", True),
        ("tools", "tasks", False),
        ("id", "i", True),
        ("model", "models", True),
        ("mdoels", "models", True),
        ("xyz", "models", False),
    ],
)
def test_one_edit_apart(typo: str, key: str, near: bool) -> None:
    assert one_edit_apart(typo, key) is near


def test_an_excerpt_quotes_at_most_120_characters_and_escapes_controls() -> None:
    assert excerpt("x" * 5000) == "x" * MAX_QUOTED + "... (5000 characters)"
    assert excerpt("a\x00b\x1b[31m\ud800") == "a\\x00b\\x1b[31m\\ud800"
