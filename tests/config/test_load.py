"""Loading good files: defaults, relative paths, ${VAR} substitution, the release example."""

from __future__ import annotations

from pathlib import Path

import pytest

from mm_batch.config.load import load_tasks
from tests.helpers import EXAMPLE, write


def test_release_example_loads() -> None:
    tasks = load_tasks(EXAMPLE / "tasks.yaml")
    assert [t.id for t in tasks.tasks] == [
        "release-en",
        "release-fr",
        "pkgtest-en",
        "pkgtest-fr",
        "status-en",
        "status-fr",
    ]
    agent = tasks.tasks[0].agent
    assert [t.name for t in agent.tools] == ["release", "pkgtest", "status"]
    assert agent.tools[0].workdir == EXAMPLE.resolve()
    assert [r.label for r in agent.allow] == ["allow[0]", "allow[1]", "allow[2]"]
    assert agent.allow[0].args == {"channel": "beta"}


def test_defaults(tmp_path: Path) -> None:
    write(
        tmp_path,
        "agent.yaml",
        """
        tools:
          - name: t
            description: d
            parameters:
              flag: {type: boolean, default: false}
              n: {type: integer, required: false}
            command: ["prog", "{{flag}}"]
    """,
    )
    write(
        tmp_path,
        "tasks.yaml",
        """
        agent: agent.yaml
        tasks: [{id: a, prompt: p}]
    """,
    )
    tasks = load_tasks(tmp_path / "tasks.yaml")
    assert (tasks.repeat, tasks.jobs, tasks.min_pass_rate, tasks.models) == (1, 4, 1.0, None)
    task = tasks.tasks[0]
    assert (task.timeout, task.max_turns, task.expect) == (600.0, 20, None)
    agent = task.agent
    assert (agent.yolo, agent.loop_limit, agent.sandbox.kind, agent.sandbox.user) == (
        False,
        3,
        "host",
        "1000:1000",
    )
    flag, n = agent.tools[0].params
    assert (flag.required, flag.default, n.required, n.default) == (False, False, False, None)


def test_env_substitution_records_secrets(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MM_TEST_RELEASE_TOKEN", "s3cr3t-value")
    write(
        tmp_path,
        "sub/agent.yaml",
        """
        model_options: {api_key: "${MM_TEST_RELEASE_TOKEN}", temperature: 0.2}
        tools:
          - name: t
            description: d
            command: ["prog"]
            workdir: scripts
            env: {TOKEN: "Bearer ${MM_TEST_RELEASE_TOKEN}"}
    """,
    )
    write(tmp_path, "tasks.yaml", "agent: sub/agent.yaml\ntasks: [{id: a, prompt: p}]\n")
    agent = load_tasks(tmp_path / "tasks.yaml").tasks[0].agent
    assert agent.model_options == {"api_key": "s3cr3t-value", "temperature": 0.2}
    assert agent.tools[0].env == {"TOKEN": "Bearer s3cr3t-value"}
    assert agent.tools[0].workdir == (tmp_path / "sub" / "scripts").resolve()
    assert "s3cr3t-value" in agent.secrets
