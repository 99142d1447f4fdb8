"""Load agent and tasks files into `AgentConfig` / `TasksFile`, reporting every problem at once.

Which kind a file is comes from its top-level keys: a tasks file has `tasks` (or keys only a
tasks file has, when `tasks` itself is missing or misspelt); an agent file has agent keys only.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Literal

import yaml

from mm_batch.config.agent import AGENT_KEYS, read_agent
from mm_batch.config.model import AgentConfig, TasksFile
from mm_batch.config.paths import display_path
from mm_batch.config.problems import ConfigError, Problem
from mm_batch.config.tasks import TASKS_ONLY_KEYS, read_tasks
from mm_batch.config.tool_entries import PLACEHOLDER_RE
from mm_batch.config.yamlnodes import At, Reader, one_edit_apart

__all__ = [
    "PLACEHOLDER_RE",
    "display_path",
    "file_kind",
    "load_agent",
    "load_agent_file",
    "load_any",
    "load_tasks",
]

FileKind = Literal["tasks", "agent"]


def file_kind(root: At) -> FileKind:
    """A mapping with agent keys and nothing of a tasks file is an agent file; all else is tasks."""
    if not isinstance(root.node, yaml.MappingNode):
        return "tasks"
    names = {str(k.value) for k, _ in root.node.value if isinstance(k, yaml.ScalarNode)}
    tasks_like = names & TASKS_ONLY_KEYS or any(one_edit_apart(n, "tasks") for n in names)
    return "agent" if names & AGENT_KEYS and not tasks_like else "tasks"


def load_agent(
    path: Path, problems: list[Problem], environ: Mapping[str, str]
) -> AgentConfig | None:
    """Load one agent file; return None when it has problems (they are appended)."""
    reader = Reader(display_path(path), problems)
    before = len(problems)
    root = reader.load(path)
    if root is None:
        return None
    agent = read_agent(path, root, reader, environ)
    return agent if len(problems) == before else None


def load_agent_file(path: Path, environ: Mapping[str, str] | None = None) -> AgentConfig:
    """Load one agent file on its own (`mm-batch tools`); raise ConfigError with all problems."""
    env = os.environ if environ is None else environ
    problems: list[Problem] = []
    reader = Reader(display_path(path), problems)
    root = reader.load(path)
    agent: AgentConfig | None = None
    if root is not None and file_kind(root) == "tasks" and isinstance(root.node, yaml.MappingNode):
        reader.problem(
            root,
            "this is a tasks file, not an agent file: give the agent file it names",
        )
    elif root is not None:
        agent = read_agent(path, root, reader, env)
    if agent is None or problems:
        raise ConfigError(problems)
    return agent


def _read_tasks(
    path: Path, root: At, reader: Reader, environ: Mapping[str, str]
) -> TasksFile | None:
    return read_tasks(path, root, reader, lambda p: load_agent(p, reader.problems, environ))


def load_tasks(path: Path, environ: Mapping[str, str] | None = None) -> TasksFile:
    """Load a tasks file and every agent file it names; raise ConfigError with all problems."""
    env = os.environ if environ is None else environ
    problems: list[Problem] = []
    reader = Reader(display_path(path), problems)
    root = reader.load(path)
    if root is not None and file_kind(root) == "agent":
        reader.problem(
            root,
            "this is an agent file, not a tasks file (a tasks file has a top-level 'tasks' "
            "key): give the tasks file that names it",
        )
        root = None
    tasks = _read_tasks(path, root, reader, env) if root is not None else None
    if tasks is None or problems:
        raise ConfigError(problems)
    return tasks


def load_any(path: Path, environ: Mapping[str, str] | None = None) -> TasksFile | AgentConfig:
    """Load a tasks file (with its agents) or an agent file, whichever the file is."""
    env = os.environ if environ is None else environ
    problems: list[Problem] = []
    reader = Reader(display_path(path), problems)
    root = reader.load(path)
    loaded: TasksFile | AgentConfig | None = None
    if root is not None and file_kind(root) == "agent":
        loaded = read_agent(path, root, reader, env)
    elif root is not None:
        loaded = _read_tasks(path, root, reader, env)
    if loaded is None or problems:
        raise ConfigError(problems)
    return loaded
