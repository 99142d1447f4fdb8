"""The agent file's small entries (built-ins, skills, MCP servers, hooks), and the context
every entry of an agent file is read with."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from mm_batch.config.env import Expander
from mm_batch.config.fields import Fields, HasReader, Key, read_fields, scalar
from mm_batch.config.model import KNOWN_BUILTINS, HooksSpec, McpServerSpec, Skill
from mm_batch.config.paths import program_problem
from mm_batch.config.problems import Problem, excerpt
from mm_batch.config.skills import read_skill_folders
from mm_batch.config.yamlnodes import At, Reader

SERVER_NAME_RE = re.compile(r"[A-Za-z][A-Za-z0-9-]{0,31}")


@dataclass(frozen=True)
class AgentContext:
    """What the agent file's readers need besides the reader."""

    reader: Reader
    expander: Expander
    directory: Path
    # Tools whose entry has errors, by the name they give: a rule naming one is no error of
    # its own (the knock-on of a typo inside the tool would be printed before its cause).
    broken_tools: set[str] = field(default_factory=set)
    # What this machine says of the tools' programs: warnings, or errors for `validate`.
    findings: list[Problem] = field(default_factory=list)


def _builtins(ctx: AgentContext, at: At, _: Fields) -> tuple[str, ...] | None:
    reader = ctx.reader
    names: list[str] = []
    for item in reader.sequence(at) or []:
        name = reader.string(item)
        if name is not None and name not in KNOWN_BUILTINS:
            reader.problem(
                item, f"unknown built-in '{excerpt(name)}' (known: {', '.join(KNOWN_BUILTINS)})"
            )
        elif name is not None:
            names.append(name)
    return tuple(names)


def _skills(ctx: AgentContext, at: At, _: Fields) -> tuple[Skill, ...] | None:
    return read_skill_folders(ctx.reader, at, ctx.directory)


SERVER_NAME: Key[HasReader, str] = scalar(
    "name", lambda r, at: r.string(at, non_empty=True), required=True
)
SERVER_URL: Key[HasReader, str] = scalar(
    "url", lambda r, at: r.string(at, non_empty=True), required=True
)


def _mcp_servers(ctx: AgentContext, at: At, _: Fields) -> tuple[McpServerSpec, ...] | None:
    reader = ctx.reader
    servers: list[McpServerSpec] = []
    for item in reader.sequence(at) or []:
        fields = read_fields(ctx, item, (SERVER_NAME, SERVER_URL))
        if fields is None:
            continue
        name, url = fields[SERVER_NAME], fields[SERVER_URL]
        name_at, url_at = fields.given(SERVER_NAME), fields.given(SERVER_URL)
        if name is None or url is None or name_at is None or url_at is None:
            continue
        if not SERVER_NAME_RE.fullmatch(name):
            reader.problem(name_at, f"invalid server name '{excerpt(name)}' (letters, digits, '-')")
        elif any(s.name == name for s in servers):
            reader.problem(name_at, f"duplicate MCP server name '{name}'")
        servers.append(McpServerSpec(name, ctx.expander.expand(url_at, url)))
    return tuple(servers)


def read_argv(reader: Reader, at: At) -> tuple[str, ...] | None:
    """An argv list run as it is written (hooks, `check`): a program, then its arguments."""
    items = reader.sequence(at)
    if items is None:
        return None
    if not items:
        reader.problem(at, "must not be an empty list")
        return None
    argv = [reader.string(item) for item in items]
    if argv[0] == "":
        reader.problem(items[0], "the program must not be empty")
        return None
    given = tuple(entry for entry in argv if entry is not None)
    return given if len(given) == len(argv) else None


PRE_TOOL_CALL = scalar("preToolCall", read_argv)
POST_TOOL_CALL = scalar("postToolCall", read_argv)


def _hooks(ctx: AgentContext, at: At, _: Fields) -> HooksSpec | None:
    fields = read_fields(ctx, at, (PRE_TOOL_CALL, POST_TOOL_CALL))
    if fields is None:
        return None
    for key in (PRE_TOOL_CALL, POST_TOOL_CALL):
        argv, given = fields[key], fields.given(key)
        problem = program_problem(ctx.directory, argv[0]) if argv else None
        if problem is not None and given is not None:
            ctx.reader.problem(given, problem)
    return HooksSpec(pre_tool_call=fields[PRE_TOOL_CALL], post_tool_call=fields[POST_TOOL_CALL])


BUILTINS: Key[AgentContext, tuple[str, ...]] = Key("builtins", _builtins)
SKILLS: Key[AgentContext, tuple[Skill, ...]] = Key("skills", _skills)
MCP: Key[AgentContext, tuple[McpServerSpec, ...]] = Key("mcp", _mcp_servers)
HOOKS: Key[AgentContext, HooksSpec] = Key("hooks", _hooks)
