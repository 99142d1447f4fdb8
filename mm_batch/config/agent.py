"""The agent file, read by its tables of keys into a frozen `AgentConfig`."""

from __future__ import annotations

import fnmatch
import os
import re
import shutil
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import yaml

from mm_batch.config.env import ENV_NAME_RE, Expander
from mm_batch.config.fields import (
    SCHEMA_KEY,
    Fields,
    HasReader,
    Key,
    choice,
    one_of,
    read_fields,
    scalar,
    schema_key,
)
from mm_batch.config.model import (
    KNOWN_BUILTINS,
    PARAM_TYPES,
    RESERVED_TOOL_NAMES,
    SET_BY_MM_BATCH,
    AgentConfig,
    AllowRule,
    HooksSpec,
    McpServerSpec,
    ParamSpec,
    ParamType,
    SandboxSpec,
    Skill,
    ToolSpec,
    Value,
    WorkspaceMode,
    render_value,
)
from mm_batch.config.paths import path_kind, program_problem, sha256, unusable
from mm_batch.config.problems import Problem
from mm_batch.config.skills import read_skill_folders
from mm_batch.config.yamlnodes import At, Reader, excerpt, one_edit_apart

TOOL_NAME_RE = re.compile(r"[A-Za-z][A-Za-z0-9_-]{0,63}")
PARAM_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}")
SERVER_NAME_RE = re.compile(r"[A-Za-z][A-Za-z0-9-]{0,31}")
PLACEHOLDER_RE = re.compile(r"\{\{(.*?)\}\}")
SIZE_RE = re.compile(r"([0-9]{1,30})([bkmg]?)")
_INTEGER_RE = re.compile(r"[0-9]{1,30}")
_SIZE_UNITS = {"": 1, "b": 1, "k": 1024, "m": 1024**2, "g": 1024**3}
MAX_SIZE = 1024 * 1024**3  # 1024g: beyond it a size is a typo, not a machine
MIN_MEMORY = 6 * 1024**2  # Docker refuses a smaller memory limit
MAX_ID = 2**31 - 1  # uids and gids: 1 to 2147483647
WEEK_S = 7 * 24 * 3600.0  # no timeout is longer: beyond it threads cannot even wait that long
MAX_PARALLEL = 1024  # model_options.max_parallel: calls of one model at once
# Programs that run other programs through their options: a glob over them allows anything.
RUNS_PROGRAMS = (
    *("git", "find", "env", "xargs", "sudo", "sh", "bash"),
    *("python*", "perl", "ruby", "node", "awk"),
)
WORKSPACE_MODES: tuple[WorkspaceMode, ...] = ("copy", "mount", "readonly")


@dataclass(frozen=True)
class _Agent:
    """What the agent file's readers need besides the reader."""

    reader: Reader
    expander: Expander
    directory: Path
    # Tools whose entry has errors, by the name they give: a rule naming one is no error of
    # its own (the knock-on of a typo inside the tool would be printed before its cause).
    broken_tools: set[str] = field(default_factory=set)
    findings: list[Problem] = field(default_factory=list)  # about tool programs: see below


WARNING = "warning: "


@dataclass(frozen=True)
class ProgramProblem(Problem):
    """A tool's program as this machine has it (missing, not executable, not on the PATH).
    `run` says it as a warning, since each call would only be answered "program not found";
    `validate` refuses it where `refuses` is set (where the tool runs on this machine's
    files), and warns otherwise (a docker sandbox's image may hold what the host lacks)."""

    refuses: bool = True

    def as_error(self) -> Problem:
        return Problem(self.file, self.line, self.path, self.message.removeprefix(WARNING))


# -- model options ------------------------------------------------------------------------


def _own_options(reader: Reader, name: str, at: At) -> object:
    if name == "max_parallel":
        return reader.integer(at, minimum=1, maximum=MAX_PARALLEL)
    if name == "recover_text_tool_calls":
        return reader.boolean(at)
    return reader.number(at, positive=True, maximum=WEEK_S)


def _model_options(ctx: _Agent, at: At, _: Fields) -> dict[str, Any] | None:
    reader = ctx.reader
    entries = reader.free_mapping(at)
    if entries is None:
        return None
    options: dict[str, Any] = {}
    for name, value_at in entries:
        before = len(reader.problems)
        if name in SET_BY_MM_BATCH:
            reader.problem(value_at, f"mm-batch sets '{name}' itself: it is not a model option")
            continue
        if name in ("max_parallel", "recover_text_tool_calls", "timeout"):
            value = _own_options(reader, name, value_at)
        else:
            value = reader.plain_data(value_at)
        if len(reader.problems) == before:
            options[name] = ctx.expander.expand_data(value_at, value)
    return options


# -- built-ins, skills, MCP, hooks ------------------------------------------------------------


def _builtins(ctx: _Agent, at: At, _: Fields) -> tuple[str, ...] | None:
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


def _skills(ctx: _Agent, at: At, _: Fields) -> tuple[Skill, ...] | None:
    return read_skill_folders(ctx.reader, at, ctx.directory)


SERVER_NAME: Key[HasReader, str] = scalar(
    "name", lambda r, at: r.string(at, non_empty=True), required=True
)
SERVER_URL: Key[HasReader, str] = scalar(
    "url", lambda r, at: r.string(at, non_empty=True), required=True
)


def _mcp_servers(ctx: _Agent, at: At, _: Fields) -> tuple[McpServerSpec, ...] | None:
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
    if any(entry is None for entry in argv):
        return None
    return tuple(cast(list[str], argv))


PRE_TOOL_CALL = scalar("preToolCall", read_argv)
POST_TOOL_CALL = scalar("postToolCall", read_argv)


def _hooks(ctx: _Agent, at: At, _: Fields) -> HooksSpec | None:
    fields = read_fields(ctx, at, (PRE_TOOL_CALL, POST_TOOL_CALL))
    if fields is None:
        return None
    for key in (PRE_TOOL_CALL, POST_TOOL_CALL):
        argv, given = fields[key], fields.given(key)
        problem = program_problem(ctx.directory, argv[0]) if argv else None
        if problem is not None and given is not None:
            ctx.reader.problem(given, problem)
    return HooksSpec(pre_tool_call=fields[PRE_TOOL_CALL], post_tool_call=fields[POST_TOOL_CALL])


# -- the sandbox ------------------------------------------------------------------------------


def size_bytes(reader: Reader, at: At, *, minimum: int = 1) -> str | None:
    """A size such as 512m or 1g, normalised to lower case; zero and absurd sizes refused."""
    node = at.node
    plain_number = isinstance(node, yaml.ScalarNode) and node.style is None
    if plain_number and _INTEGER_RE.fullmatch(str(node.value)):
        text: str | None = str(node.value)  # bytes, as Docker reads a bare number
    else:
        text = reader.string(at, non_empty=True)
    if text is None:
        return None
    match = SIZE_RE.fullmatch(text.lower())
    if match is None:
        reader.problem(at, f"expected a size such as 512m or 1g, got '{excerpt(text)}'")
        return None
    size = int(match[1]) * _SIZE_UNITS[match[2]]
    if size < minimum:
        smallest = f"{minimum // 1024**2}m" if minimum >= 1024**2 else "1 byte"
        reader.problem(at, f"must be at least {smallest}, got '{text}'")
        return None
    if size > MAX_SIZE:
        reader.problem(at, f"must be at most 1024g, got '{text}'")
        return None
    return text.lower()


def _user(reader: Reader, at: At) -> str | None:
    """UID or UID:GID, each 1 to 2147483647 however written ("00" is 0), as "UID:GID"."""
    text = reader.string(at, non_empty=True)
    if text is None:
        return None
    if not re.fullmatch(r"[0-9]{1,30}(:[0-9]{1,30})?", text):
        reader.problem(at, f"expected UID or UID:GID in digits, got '{excerpt(text)}'")
        return None
    uid_text, _, gid_text = text.partition(":")
    uid = int(uid_text)
    gid = int(gid_text) if gid_text else uid
    if uid == 0:
        reader.problem(at, "commands never run as root (uid 0) in the sandbox")
        return None
    if gid == 0:
        reader.problem(at, "commands never run in the root group (gid 0) in the sandbox")
        return None
    if uid > MAX_ID or gid > MAX_ID:
        reader.problem(at, f"UID and GID are 1 to {MAX_ID}, got '{text}'")
        return None
    return f"{uid}:{gid}"


PIDS = scalar("pids", lambda r, at: r.integer(at, minimum=1, maximum=4_194_304))
MEMORY = scalar("memory", lambda r, at: size_bytes(r, at, minimum=MIN_MEMORY))
CPUS = scalar("cpus", lambda r, at: r.number(at, positive=True, maximum=1024))
WORKSPACE_SIZE = scalar("workspace", size_bytes)
LIMITS: tuple[Key[HasReader, Any], ...] = (PIDS, MEMORY, CPUS, WORKSPACE_SIZE)

KIND = choice("kind", ("host", "docker"))
IMAGE = scalar("image", lambda r, at: r.string(at, non_empty=True))
NETWORK = choice("network", ("none", "bridge"))
LIMITS_KEY: Key[HasReader, Fields] = Key("limits", lambda ctx, at, _: read_fields(ctx, at, LIMITS))
USER = scalar("user", _user)
WORKSPACE = choice("workspace", WORKSPACE_MODES)
SANDBOX: tuple[Key[HasReader, Any], ...] = (KIND, IMAGE, NETWORK, WORKSPACE, LIMITS_KEY, USER)


def _sandbox(ctx: _Agent, at: At, _: Fields) -> SandboxSpec | None:
    fields = read_fields(ctx, at, SANDBOX)
    if fields is None:
        return None
    limits = fields[LIMITS_KEY]
    given: dict[str, Any] = {
        "kind": fields[KIND],
        "image": fields[IMAGE],
        "network": fields[NETWORK],
        "user": fields[USER],
        "workspace": fields[WORKSPACE],
    }
    if limits is not None:
        given |= {
            "pids": limits[PIDS],
            "memory": limits[MEMORY],
            "cpus": limits[CPUS],
            "workspace_size": limits[WORKSPACE_SIZE],
        }
        size_at = limits.given(WORKSPACE_SIZE)
        mode = fields[WORKSPACE] or "copy"
        if size_at is not None and mode != "copy":
            ctx.reader.problem(
                size_at,
                f"sizes the copied workspace, so it applies to workspace: copy alone "
                f"(this sandbox has workspace: {mode})",
            )
    return SandboxSpec(**{k: v for k, v in given.items() if v is not None})


# -- declared tools ---------------------------------------------------------------------------


def typed_value(reader: Reader, at: At, type_: ParamType) -> Value | None:
    """A literal of a parameter's type (enum entries, defaults, expectations)."""
    if type_ == "string":
        return reader.string(at)
    if type_ == "integer":
        return reader.integer(at)
    if type_ == "number":
        return reader.number(at)
    return reader.boolean(at)


def _param_type(ctx: HasReader, at: At, _: Fields) -> ParamType | None:
    return cast("ParamType | None", one_of(ctx.reader, at, PARAM_TYPES))


TYPE: Key[HasReader, ParamType] = Key("type", _param_type, required=True)


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
PARAMETER: tuple[Key[HasReader, Any], ...] = (
    TYPE,
    DESCRIPTION,
    ENUM,
    DEFAULT,
    REQUIRED,
    ALLOW_DASH,
)


def _param(ctx: _Agent, at: At, name: str) -> ParamSpec | None:
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


def _parameters(ctx: _Agent, at: At, _: Fields) -> tuple[ParamSpec, ...] | None:
    params = [_param(ctx, value_at, name) for name, value_at in ctx.reader.free_mapping(at) or []]
    return tuple(p for p in params if p is not None)


def _command(ctx: _Agent, at: At, earlier: Fields) -> tuple[str, ...] | None:
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


def _workdir(ctx: _Agent, at: At, _: Fields) -> Path | None:
    rel = ctx.reader.string(at, non_empty=True)
    if rel is None:
        return None
    workdir = (ctx.directory / rel).resolve()
    kind = path_kind(workdir)
    if isinstance(kind, OSError):  # a folder made later is fine; a name no folder can have is not
        ctx.reader.problem(at, unusable(kind))
        return None
    return workdir


def _env(ctx: _Agent, at: At, _: Fields) -> dict[str, str] | None:
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
PARAMETERS: Key[_Agent, tuple[ParamSpec, ...]] = Key("parameters", _parameters)
COMMAND: Key[_Agent, tuple[str, ...]] = Key("command", _command, required=True)
TIMEOUT = scalar("timeout", lambda r, at: r.number(at, positive=True, maximum=WEEK_S))
WORKDIR: Key[_Agent, Path] = Key("workdir", _workdir)
ENV: Key[_Agent, dict[str, str]] = Key("env", _env)
REPEATABLE = scalar("repeatable", Reader.boolean)
TOOL: tuple[Key[_Agent, Any], ...] = (
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
    ctx: _Agent, command_at: At | None, tool: ToolSpec, kind: str
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


def _finding(ctx: _Agent, at: At, message: str, *, refuses: bool = True) -> ProgramProblem:
    return ProgramProblem(ctx.reader.file, at.line, at.path, WARNING + message, refuses)


def _tools(ctx: _Agent, at: At, agent: Fields) -> tuple[ToolSpec, ...] | None:
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


# -- consent ----------------------------------------------------------------------------------


def names_a_tool(
    name: str,
    tools: Mapping[str, ToolSpec],
    builtins: tuple[str, ...],
    mcp: tuple[McpServerSpec, ...],
) -> bool:
    if name in tools or name in builtins:
        return True
    # MCP tools are only known once the server answered: accept its prefix here.
    return any(name.startswith(f"{s.name}_") and len(name) > len(s.name) + 1 for s in mcp)


def unknown_tool(name: str, tools: Mapping[str, ToolSpec], builtins: tuple[str, ...]) -> str:
    if name in KNOWN_BUILTINS:
        return f"built-in '{name}' is not enabled (add it to builtins)"
    known = sorted(set(tools) | set(builtins))
    return f"no tool named '{excerpt(name)}' (declared: {', '.join(known) or 'none'})"


def _arg_patterns(reader: Reader, at: At, tool: ToolSpec | None) -> dict[str, str]:
    patterns: dict[str, str] = {}
    for pname, pat in reader.free_mapping(at) or []:
        param = tool.param(pname) if tool is not None else None
        if tool is not None and param is None:
            reader.problem(pat, f"tool '{tool.name}' has no parameter '{excerpt(pname)}'")
            continue
        if param is None or param.type == "string":
            text = reader.string(pat)
        elif getattr(pat.node, "style", None) is not None and "*" in str(pat.node.value):
            text = str(pat.node.value)  # a glob over a typed value is written as a string
        else:
            value = typed_value(reader, pat, param.type)
            text = None if value is None else render_value(value)
        if text is not None and param is not None and param.enum is not None:
            allowed = [render_value(v) for v in param.enum]
            # `*` is the only wildcard, and never covers a `/` (SPEC 4).
            pattern = re.compile("[^/]*".join(re.escape(part) for part in text.split("*")))
            if not any(pattern.fullmatch(v) for v in allowed):
                reader.problem(
                    pat,
                    f"'{excerpt(text)}' can never match: '{param.name}' is one of "
                    f"{', '.join(allowed)}",
                )
                continue
        if text is not None:
            patterns[pname] = text
    return patterns


RULE_TOOL = scalar("tool", lambda r, at: r.string(at, non_empty=True))
RULE_BASH = scalar("bash", lambda r, at: r.string(at, non_empty=True))
RULE_ARGS: Key[HasReader, At] = Key("args", lambda ctx, at, _: at)  # read once the tool is known
RULE: tuple[Key[HasReader, Any], ...] = (RULE_TOOL, RULE_BASH, RULE_ARGS)


def _allow_rules(ctx: _Agent, at: At, agent: Fields) -> tuple[AllowRule, ...] | None:
    reader = ctx.reader
    tools = {t.name: t for t in agent[TOOLS] or ()}
    builtins, mcp = agent[BUILTINS] or (), agent[MCP] or ()
    rules: list[AllowRule] = []
    for index, item in enumerate(reader.sequence(at) or []):
        fields = read_fields(ctx, item, RULE)
        if fields is None:
            continue
        tool_at, bash_at, args_at = (fields.given(k) for k in RULE)
        if (tool_at is None) == (bash_at is None):
            reader.problem(item, "a rule names either a tool or a bash command")
            continue
        if bash_at is not None:
            if args_at is not None:
                reader.problem(args_at, "a bash rule takes no args: the command is the rule")
            command = fields[RULE_BASH]
            if command is not None:
                rules.append(AllowRule(index, bash=command))
            continue
        name = fields[RULE_TOOL]
        if name is None or tool_at is None:
            continue
        if name == "bash":
            reader.problem(
                tool_at,
                "the built-in bash is consented only through bash rules: write "
                '`bash: "<command>"` (an exact command, or a glob)',
            )
            continue
        if not names_a_tool(name, tools, builtins, mcp):
            if name not in ctx.broken_tools:  # else its cause is reported, in the tool
                reader.problem(tool_at, unknown_tool(name, tools, builtins))
            continue
        patterns = _arg_patterns(reader, args_at, tools.get(name)) if args_at else None
        rules.append(AllowRule(index, tool=name, args=patterns))
    return tuple(rules)


def glob_warnings(reader: Reader, allow_at: At, rules: tuple[AllowRule, ...]) -> list[Problem]:
    """Warnings about `bash:` globs over programs that run other programs through options."""
    items = allow_at.node.value
    warnings: list[Problem] = []
    for rule in rules:
        if rule.bash is None or "*" not in rule.bash:
            continue
        program = (rule.bash.split() or [""])[0].rsplit("/", 1)[-1]
        risky = [p for p in RUNS_PROGRAMS if fnmatch.fnmatchcase(program, p)]
        if "*" in program:
            examples = [p.rstrip("*") for p in RUNS_PROGRAMS]
            risky = [p for p in examples if fnmatch.fnmatchcase(p, program)]
        if not risky:
            continue
        at = At(items[rule.index], f"{allow_at.path}[{rule.index}]")
        runs = program if "*" not in program else f"any program, {', '.join(risky)} among them"
        warnings.append(
            Problem(
                reader.file,
                at.line,
                at.key("bash"),
                f"warning: the glob '{excerpt(rule.bash)}' runs {runs}, which can run any other "
                "program through its options or arguments: prefer exact rules",
            )
        )
    return warnings


# -- the file ---------------------------------------------------------------------------------

MODEL = scalar("model", lambda r, at: r.string(at, non_empty=True))
MODEL_OPTIONS: Key[_Agent, dict[str, Any]] = Key("model_options", _model_options)
SYSTEM = scalar("system", Reader.string)
YOLO = scalar("yolo", Reader.boolean)
LOOP_LIMIT = scalar("loop_limit", lambda r, at: r.integer(at, minimum=2, maximum=1000))
BUILTINS: Key[_Agent, tuple[str, ...]] = Key("builtins", _builtins)
SKILLS: Key[_Agent, tuple[Skill, ...]] = Key("skills", _skills)
MCP: Key[_Agent, tuple[McpServerSpec, ...]] = Key("mcp", _mcp_servers)
HOOKS: Key[_Agent, HooksSpec] = Key("hooks", _hooks)
SANDBOX_KEY: Key[_Agent, SandboxSpec] = Key("sandbox", _sandbox)
TOOLS: Key[_Agent, tuple[ToolSpec, ...]] = Key("tools", _tools)
ALLOW: Key[_Agent, tuple[AllowRule, ...]] = Key("allow", _allow_rules)
AGENT: tuple[Key[_Agent, Any], ...] = (
    MODEL,
    MODEL_OPTIONS,
    SYSTEM,
    YOLO,
    LOOP_LIMIT,
    BUILTINS,
    SKILLS,
    MCP,
    HOOKS,
    SANDBOX_KEY,
    TOOLS,
    ALLOW,  # last: its rules name tools, built-ins and MCP servers
    schema_key(),
)
AGENT_KEYS = frozenset(k.name for k in AGENT) - {SCHEMA_KEY}


def read_agent(
    path: Path, root: At, reader: Reader, environ: Mapping[str, str]
) -> AgentConfig | None:
    """An agent file's parsed root as an `AgentConfig`; None when it has problems."""
    before = len(reader.problems)
    ctx = _Agent(reader, Expander(reader, environ), path.resolve().parent)
    fields = read_fields(ctx, root, AGENT)
    if fields is None:
        return None
    allow_at, rules = fields.given(ALLOW), fields[ALLOW] or ()
    warnings = glob_warnings(reader, allow_at, rules) if allow_at is not None else []
    warnings += ctx.findings
    if len(reader.problems) > before:
        return None
    given: dict[str, Any] = {
        "model": fields[MODEL],
        "model_options": fields[MODEL_OPTIONS],
        "system": fields[SYSTEM],
        "yolo": fields[YOLO],
        "loop_limit": fields[LOOP_LIMIT],
        "builtins": fields[BUILTINS],
        "skills": fields[SKILLS],
        "mcp": fields[MCP],
        "hooks": fields[HOOKS],
        "sandbox": fields[SANDBOX_KEY],
        "allow": fields[ALLOW],
    }
    return AgentConfig(
        path=path.resolve(),
        sha256=sha256(path),
        tools=fields[TOOLS] or (),
        secrets=tuple(ctx.expander.secrets),
        warnings=tuple(warnings),
        **{k: v for k, v in given.items() if v is not None},
    )
