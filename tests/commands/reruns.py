"""A project of three tasks for the rerun tests: each calls `ok`, unless its prompt refuses."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mm_batch.testing.fake_openai import Script, first_user_message, text, tool_call, turn
from tests.helpers import OK_AGENT

TASKS = """\
agent: agent.yaml
jobs: 1
tasks:
  - id: alpha
    prompt: Do alpha.
    expect: {calls: [{tool: ok}]}
  - id: beta
    prompt: Do beta.
    expect: {calls: [{tool: ok}]}
  - id: gamma
    prompt: Do gamma.
    expect: {calls: [{tool: ok}]}
"""


def refusing_script(refusing: set[str]) -> Script:
    """Every task calls `ok` and then answers, except the prompts in `refusing`, which answer
    at once (their run fails)."""

    def script(request: dict[str, Any]) -> Any:
        if turn(request) > 0:
            return text("Done.")
        return (
            text("I will not.") if first_user_message(request) in refusing else tool_call("ok", {})
        )

    return script


def write_project(tmp_path: Path, tasks: str = TASKS) -> Path:
    """agent.yaml (the `ok` tool) and tasks.yaml in `tmp_path`; the tasks file's path."""
    (tmp_path / "agent.yaml").write_text(OK_AGENT)
    (tmp_path / "tasks.yaml").write_text(tasks)
    return tmp_path / "tasks.yaml"
