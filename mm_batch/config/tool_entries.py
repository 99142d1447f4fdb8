"""The agent file's declared tools: each an argv command with typed parameters."""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

import yaml

from mm_batch.config.entries import AgentContext
from mm_batch.config.env import ENV_NAME_RE
from mm_batch.config.fields import Fields, HasReader, Key, choice, read_fields, scalar
from mm_batch.config.model import (
    PARAM_TYPES,
    RESERVED_TOOL_NAMES,
    WEEK_S,
    ParamSpec,
    ParamType,
    ToolSpec,
    Value,
)
from mm_batch.config.paths import path_kind, unusable
from mm_batch.config.problems import WARNING, Problem, ProgramProblem, excerpt
from mm_batch.config.sandbox import SANDBOX_KEY
from mm_batch.config.yamlnodes import At, Reader, one_edit_apart

TOOL_NAME_RE = re.compile(r"[A-Za-z][A-Za-z0-9_-]{0,63}")
PARAM_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}")
PLACEHOLDER_RE = re.compile(r"\{\{(.*?)\}\}")


def typed_value(reader: Reader, at: At, type_: ParamType) -> Value | None:
    """A literal of a parameter's type (enum entries, defaults, expectations)."""
    if type_ == "string":
        return reader.string(at)
    if type_ == "integer":
        return reader.integer(at)
    if type_ == "number":
        return reader.number(at)
    return reader.boolean(at)


TYPE: Key[HasReader, ParamType] = choice("type", PARAM_TYPES, required=True)


def _enum(ctx: HasReader, at: At, earlier: Fields) -> tuple[Value, ...] | None:
    type_ = earlier[TYPE]
    items = ctx.reader.sequence(at)
    if type_ is None or items is None:
        return None
    if not items:
        ctx.reader.problem(at, "must list at least one value")
    values = [typed_value(ctx.reader, item, type_) for item in items]
    return tuple(v for v in values if v is not None)


def _default(ctx: HasReader, at: At, earlier: Fields) -> Value | None:
    type_ = earlier[TYPE]
    if type_ is None:
        return None
    value = typed_value(ctx.reader, at, type_)
    enum = earlier[ENUM]
    if value is not None and enum is not None and value not in enum:
        ctx.reader.problem(at, f"default {value!r} is not one of the enum values")
    return value


def _required(ctx: HasReader, at: At, earlier: Fields) -> bool | None:
    flag = ctx.reader.boolean(at)
    if flag and earlier.given(DEFAULT) is not None:
        ctx.reader.problem(at, "a parameter with a default is optional")
        return None
    return flag


DESCRIPTION = scalar("description", Reader.string)
ENUM: Key[HasReader, tuple[Value, ...]] = Key("enum", _enum)
DEFAULT: Key[HasReader, Value] = Key("default", _default)
REQUIRED: Key[HasReader, bool] = Key("required", _required)
ALLOW_DASH = scalar("allow_dash", Reader.boolean)
PARAMETER: tuple[Key[HasReader, object], ...] = (
    TYPE,
    DESCRIPTION,
    ENUM,
    DEFAULT,
    REQUIRED,
    ALLOW_DASH,
)


def _param(ctx: AgentContext, at: At, name: str) -> ParamSpec | None:
    if not PARAM_NAME_RE.fullmatch(name):
        ctx.reader.problem(
            at, f"invalid parameter name '{excerpt(name)}' (letters, digits and '_')"
        )
        return None
    fields = read_fields(ctx, at, PARAMETER)
    type_ = fields[TYPE] if fields is not None else None
    if fields is None or type_ is None:
        return None
    default = fields[DEFAULT]
    required = fields[REQUIRED]
    allow_dash = fields[ALLOW_DASH]
    return ParamSpec(
        name=name,
        type=type_,
        description=fields[DESCRIPTION] or "",
        required=(default is None) if required is None else required,
        enum=fields[ENUM] if fields.given(ENUM) is not None else None,
        default=default,
        # A value of any type that begins its argv entry with '-' is an option: `-5` too.
        allow_dash=allow_dash is True,
    )


def _parameters(ctx: AgentContext, at: At, _: Fields) -> tuple[ParamSpec, ...] | None:
    params = [_param(ctx, value_at, name) for name, value_at in ctx.reader.free_mapping(at) or []]
    return tuple(p for p in params if p is not None)


def _command(ctx: AgentContext, at: At, earlier: Fields) -> tuple[str, ...] | None:
    reader = ctx.reader
    items = reader.sequence(at)
    if items is None:
        return None
    if not items:
        reader.problem(at, "must not be empty: give the program and its arguments as a list")
        return None
    names = {p.name for p in earlier[PARAMETERS] or ()}
    argv: list[str] = []
    for i, item in enumerate(items):
        entry = reader.string(item)
        if entry is None:
            continue
        refs = PLACEHOLDER_RE.findall(entry)
        if i == 0 and refs:
            reader.problem(
                item,
                f"the program cannot come from a parameter ({{{{{excerpt(refs[0].strip())}}}}})",
            )
        for ref in refs:
            if ref.strip() not in names:
                reader.problem(
                    item, f"placeholder {{{{{excerpt(ref)}}}}} names no declared parameter"
                )
        rest = PLACEHOLDER_RE.sub("", entry)
        if "{{" in rest or "}}" in rest:
            reader.problem(item, f"unbalanced placeholder braces in '{excerpt(entry)}'")
        if i == 0 and not entry:
            reader.problem(item, "the program must not be empty")
        if argv:
            _after_an_option(reader, item, argv[-1], entry, earlier[PARAMETERS] or ())
        argv.append(entry)
    return tuple(argv) if len(argv) == len(items) else None


def _after_an_option(
    reader: Reader, at: At, before: str, entry: str, params: tuple[ParamSpec, ...]
) -> None:
    """An entry left out when its optional parameter is not given cannot follow an option
    that takes a value (an entry that begins with '-' and holds no '='): `["--out", "{{out}}",
    "{{input}}"]` without out would run `--out data.txt` (SPEC §2). `--` and `-` take none."""
    if not before.startswith("-") or "=" in before or before in ("-", "--"):
        return
    droppable = {p.name for p in params if not p.required and p.default is None}
    name = next((r.strip() for r in PLACEHOLDER_RE.findall(entry) if r.strip() in droppable), None)
    if name is None:
        return
    fix = f"{before}={entry}" if before.startswith("--") else f"{before}{entry}"
    reader.problem(
        at,
        f"'{excerpt(entry)}' is left out when {name} is not given (optional, no default), and "
        f"'{excerpt(before)}' before it would then take the next entry as its value: write "
        f"'{excerpt(fix)}' as one entry, or give {name} a default",
    )


def _workdir(ctx: AgentContext, at: At, _: Fields) -> Path | None:
    rel = ctx.reader.string(at, non_empty=True)
    if rel is None:
        return None
    workdir = (ctx.directory / rel).resolve()
    kind = path_kind(workdir)
    if isinstance(kind, OSError):  # a folder made later is fine; a name no folder can have is not
        ctx.reader.problem(at, unusable(kind))
        return None
    return workdir


def _env(ctx: AgentContext, at: At, _: Fields) -> dict[str, str] | None:
    reader = ctx.reader
    env: dict[str, str] = {}
    for name, value_at in reader.free_mapping(at) or []:
        if not ENV_NAME_RE.fullmatch(name):
            reader.problem(
                value_at,
                f"invalid environment variable name '{excerpt(name)}' (letters, digits and "
                "'_', not starting with a digit)",
            )
            continue
        value = reader.string(value_at)
        if value is not None:
            env[name] = ctx.expander.expand(value_at, value)
    return env


def _tool_name(ctx: HasReader, at: At, _: Fields) -> str | None:
    name = ctx.reader.string(at, non_empty=True)
    if name is None:
        return None
    if not TOOL_NAME_RE.fullmatch(name):
        ctx.reader.problem(
            at,
            f"invalid tool name '{excerpt(name)}': a letter, then letters, digits, '_' or '-' "
            "(64 at most)",
        )
        return None
    if name in RESERVED_TOOL_NAMES:
        ctx.reader.problem(at, f"'{name}' is reserved for a built-in tool")
        return None
    return name


TOOL_NAME: Key[HasReader, str] = Key("name", _tool_name, required=True)
TOOL_DESCRIPTION = scalar("description", Reader.string, required=True)
PARAMETERS: Key[AgentContext, tuple[ParamSpec, ...]] = Key("parameters", _parameters)
COMMAND: Key[AgentContext, tuple[str, ...]] = Key("command", _command, required=True)
TIMEOUT = scalar("timeout", lambda r, at: r.number(at, positive=True, maximum=WEEK_S))
WORKDIR: Key[AgentContext, Path] = Key("workdir", _workdir)
ENV: Key[AgentContext, dict[str, str]] = Key("env", _env)
REPEATABLE = scalar("repeatable", Reader.boolean)
TOOL: tuple[Key[AgentContext, object], ...] = (
    TOOL_NAME,
    TOOL_DESCRIPTION,
    PARAMETERS,  # before the command, whose placeholders name them
    COMMAND,
    TIMEOUT,
    WORKDIR,
    ENV,
    REPEATABLE,
)


def _given_name(item: At) -> list[str]:
    """The name a tool entry gives, read as written (the entry has errors): `name`, or a key
    one edit away from it."""
    if not isinstance(item.node, yaml.MappingNode):
        return []
    return [
        str(value.value)
        for key, value in item.node.value
        if isinstance(key, yaml.ScalarNode)
        and isinstance(value, yaml.ScalarNode)
        and (key.value == "name" or one_edit_apart(str(key.value), "name"))
    ]


def _program_findings(
    ctx: AgentContext, command_at: At | None, tool: ToolSpec, kind: str
) -> list[Problem]:
    """What this machine says of a tool's program (argv[0]): under the agent's folder, it must
    be there and executable wherever the tools run (the docker workspace is a copy of the
    folder); a name on the PATH or an absolute path is looked for here when the tools run on
    the host, and only warned about for docker, whose image may hold it."""
    if command_at is None or not isinstance(command_at.node, yaml.SequenceNode):
        return []
    at = At(command_at.node.value[0], command_at.index(0))
    program = tool.command[0]
    shown = excerpt(program)
    if "\x00" in program:
        return []
    if "/" in program:
        path = Path(os.path.normpath(tool.workdir / program))
        inside = path == ctx.directory or ctx.directory in path.parents
        if not inside and kind == "docker":
            if os.path.lexists(path):
                return []
            message = f"the program {shown} is not on this machine: the sandbox image must have it"
            return [_finding(ctx, at, message, refuses=False)]
        if not os.path.lexists(path):
            return [_finding(ctx, at, f"the program {shown} is not there ({path})")]
        if path.is_file() and not os.access(path, os.X_OK):
            fix = f"chmod +x {excerpt(str(path))}"
            return [_finding(ctx, at, f"the program {shown} is not executable: {fix}")]
        return []
    search = tool.env.get("PATH", os.environ.get("PATH", ""))
    if shutil.which(program, path=search) is not None:
        return []
    if kind == "docker":
        message = (
            f"the program {shown} is not on this machine's PATH: the sandbox image must have it"
        )
        return [_finding(ctx, at, message, refuses=False)]
    message = (
        f"the program {shown} is not on this machine's PATH, where the tools run (sandbox: host)"
    )
    return [_finding(ctx, at, message)]


def _finding(ctx: AgentContext, at: At, message: str, *, refuses: bool = True) -> ProgramProblem:
    return ProgramProblem(ctx.reader.file, at.line, at.path, WARNING + message, refuses)


def _tools(ctx: AgentContext, at: At, agent: Fields) -> tuple[ToolSpec, ...] | None:
    reader = ctx.reader
    tools: list[ToolSpec] = []
    seen: dict[str, int] = {}
    sandbox = agent[SANDBOX_KEY]
    kind = sandbox.kind if sandbox is not None else "host"
    for item in reader.sequence(at) or []:
        before = len(reader.problems)
        fields = read_fields(ctx, item, TOOL)
        if fields is None or len(reader.problems) > before:
            ctx.broken_tools.update(_given_name(item))
            continue
        name, command = fields[TOOL_NAME], fields[COMMAND]
        if name is None or command is None:
            continue
        if name in seen:
            reader.problem(
                item,
                f"duplicate tool name '{name}' (first at line {seen[name]})",
                path=item.key("name"),
            )
            continue
        seen[name] = item.line
        env = fields[ENV]
        tool = ToolSpec(
            name=name,
            description=fields[TOOL_DESCRIPTION] or "",
            params=fields[PARAMETERS] or (),
            command=command,
            workdir=fields[WORKDIR] or ctx.directory,
            timeout=fields[TIMEOUT],
            env=env or {},
            repeatable=fields[REPEATABLE] is True,
        )
        ctx.findings.extend(_program_findings(ctx, fields.given(COMMAND), tool, kind))
        tools.append(tool)
    return tuple(tools)


TOOLS: Key[AgentContext, tuple[ToolSpec, ...]] = Key("tools", _tools)
