"""`validate`, `tools` and `plan`: look at configuration without running anything."""

from __future__ import annotations

import json
import os
from pathlib import Path

import click
import yaml

from mm_batch.config.load import load_agent, load_tasks
from mm_batch.config.model import AgentConfig
from mm_batch.config.problems import ConfigError, Problem
from mm_batch.plan import Overrides, make_plan
from mm_batch.errors import ExitCode
from mm_batch.run.toolbox import Toolbox


def _is_tasks_file(path: Path) -> bool:
    """A tasks file has a top-level `tasks` key; anything else is read as an agent file."""
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return True  # let the tasks loader report what is wrong with it
    return not isinstance(data, dict) or "tasks" in data


def agent_or_fail(path: Path) -> AgentConfig:
    problems: list[Problem] = []
    agent = load_agent(path, problems, os.environ)
    if agent is None:
        raise ConfigError(problems)
    return agent


def validate(path: Path) -> int:
    """Check a tasks file with every agent it names, or one agent file."""
    if _is_tasks_file(path):
        tasks = load_tasks(path)
        click.echo(f"{path}: ok ({len(tasks.tasks)} task(s), {len(tasks.agents)} agent file(s))")
    else:
        agent = agent_or_fail(path)
        click.echo(f"{path}: ok ({len(agent.tools)} declared tool(s))")
    return ExitCode.PASSED


def tools(path: Path) -> int:
    """Print exactly the tool list the model is sent."""
    click.echo(json.dumps(Toolbox(agent_or_fail(path)).schemas(), indent=2, ensure_ascii=False))
    return ExitCode.PASSED


def plan(path: Path, overrides: Overrides) -> int:
    """List the runs a `run` with the same options would do; run nothing."""
    the_plan = make_plan(load_tasks(path), overrides)
    for run in the_plan.runs:
        where = "host" if run.sandbox.kind == "host" else f"docker:{run.sandbox.image}"
        mode = "yolo" if run.yolo else "allowlist"
        click.echo(f"{run.run_id}\t{where}\t{mode}")
    click.echo(f"{len(the_plan.runs)} run(s), {the_plan.jobs} in parallel", err=True)
    return ExitCode.PASSED
