"""`validate`, `tools` and `plan`: look at configuration without running anything."""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

import click

from mm_batch.config.load import load_agent_file, load_any, load_tasks
from mm_batch.config.model import TasksFile
from mm_batch.config.problems import ConfigError, Problem, ProgramProblem
from mm_batch.config.secrets import masker_of
from mm_batch.effects.providers import check_providers
from mm_batch.errors import ExitCode
from mm_batch.plan import Overrides, make_plan
from mm_batch.report.terminal import show_warnings
from mm_batch.run.toolbox import Toolbox


def _count(n: int, what: str) -> str:
    return f"{n} {what}" if n == 1 else f"{n} {what}s"


def _refused_programs(warnings: Iterable[Problem]) -> list[Problem]:
    """`validate` is stricter than `run` about tool programs: a run would start and answer each
    call "program not found"; a check before the run says it, as an error (SPEC 1 allows it)."""
    return [w.as_error() for w in warnings if isinstance(w, ProgramProblem) and w.refuses]


def validate(path: Path) -> int:
    """Check a tasks file with every agent it names, or one agent file; say which it took."""
    loaded = load_any(path)
    if isinstance(loaded, TasksFile):
        # Planned as a bare `run` would be: what only the plan finds (a JUnit classname two
        # models share, an unknown local model, a provider litellm cannot use) is an error
        # here too.
        check_providers(make_plan(loaded, Overrides()))
    refused = _refused_programs(loaded.warnings)
    show_warnings(w for w in loaded.warnings if not (isinstance(w, ProgramProblem) and w.refuses))
    if refused:
        raise ConfigError(refused)
    if isinstance(loaded, TasksFile):
        agents = _count(len(loaded.agents), "agent file")
        click.echo(f"{path}: tasks file, {_count(len(loaded.tasks), 'task')}, {agents}: fine")
    else:
        tools = _count(len(loaded.tools), "declared tool")
        click.echo(f"{path}: agent file, {tools}: fine")
    return ExitCode.PASSED


def tools(path: Path) -> int:
    """Print exactly the tool list the model is sent."""
    agent = load_agent_file(path)
    schemas = Toolbox(agent).schemas(masker_of([agent]))  # masked as `run` masks what it sends
    click.echo(json.dumps(schemas, indent=2, ensure_ascii=False))
    return ExitCode.PASSED


def plan(path: Path, overrides: Overrides, rerun_from: Path | None = None) -> int:
    """List the runs a `run` with the same options would do; run nothing."""
    tasks_file = load_tasks(path)
    the_plan = make_plan(tasks_file, overrides)
    check_providers(the_plan)
    show_warnings(tasks_file.warnings)
    if rerun_from is not None:
        from mm_batch.report.rerun import read_previous, rerun_plan

        the_plan = rerun_plan(the_plan, read_previous(rerun_from), masker_of(tasks_file.agents))
    for run in the_plan.runs:
        where = "host" if run.sandbox.kind == "host" else f"docker:{run.sandbox.image}"
        mode = "yolo" if run.yolo else "allowlist"
        click.echo(f"{run.run_id}\t{where}\t{mode}")
    click.echo(f"{len(the_plan.runs)} run(s), {the_plan.jobs} in parallel", err=True)
    return ExitCode.PASSED
