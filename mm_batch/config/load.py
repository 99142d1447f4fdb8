"""Load agent and tasks files into `AgentConfig` / `TasksFile`, reporting every problem at once."""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, cast

import yaml

from mm_batch.config.model import (
    KNOWN_BUILTINS,
    PARAM_TYPES,
    RESERVED_TOOL_NAMES,
    AgentConfig,
    AllowRule,
    CallExpectation,
    Expect,
    HooksSpec,
    McpServerSpec,
    ParamSpec,
    ParamType,
    SandboxSpec,
    Skill,
    TasksFile,
    TaskSpec,
    ToolSpec,
    Value,
    render_value,
)
from mm_batch.config.problems import ConfigError, Problem
from mm_batch.config.yamlnodes import At, Reader

TOOL_NAME_RE = re.compile(r"[A-Za-z][A-Za-z0-9_-]{0,63}")
PARAM_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}")
TASK_ID_RE = re.compile(r"[A-Za-z0-9_.-]+")
SERVER_NAME_RE = re.compile(r"[A-Za-z][A-Za-z0-9-]{0,31}")
PLACEHOLDER_RE = re.compile(r"\{\{(.*?)\}\}")
ENV_REF_RE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")

_AGENT_KEYS = {
    "model",
    "model_options",
    "system",
    "yolo",
    "allow",
    "builtins",
    "skills",
    "mcp",
    "hooks",
    "sandbox",
    "tools",
    "loop_limit",
}
_TOOL_KEYS = {"name", "description", "parameters", "command", "timeout", "workdir", "env"}
_PARAM_KEYS = {"type", "description", "required", "enum", "default", "allow_dash"}
_TASKS_KEYS = {"agent", "models", "repeat", "jobs", "min_pass_rate", "tasks"}
_TASK_KEYS = {"id", "prompt", "agent", "timeout", "max_turns", "expect"}
_EXPECT_KEYS = {"calls", "no_calls", "refused", "exit_code", "answer_contains", "check"}


def display_path(path: Path) -> str:
    """The path as a user reads it in a message: relative to the working directory when inside."""
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


def _sha256(path: Path) -> str:
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError:
        return ""


class _Expander:
    """Expands ${VAR} from mm-batch's own environment and remembers the values as secrets."""

    def __init__(self, reader: Reader, environ: Mapping[str, str]) -> None:
        self.reader = reader
        self.environ = environ
        self.secrets: list[str] = []

    def expand(self, at: At, text: str) -> str:
        def substitute(match: re.Match[str]) -> str:
            name = match.group(1)
            value = self.environ.get(name)
            if value is None:
                self.reader.problem(
                    at, f"environment variable {name} is not set (from ${{{name}}})"
                )
                return ""
            self.secrets.append(value)
            return value

        return ENV_REF_RE.sub(substitute, text)

    def expand_data(self, at: At, data: Any) -> Any:
        if isinstance(data, str):
            return self.expand(at, data)
        if isinstance(data, dict):
            return {k: self.expand_data(At(at.node, at.key(k)), v) for k, v in data.items()}
        if isinstance(data, list):
            return [self.expand_data(at, v) for v in data]
        return data


def typed_value(reader: Reader, at: At, type_: ParamType) -> Value | None:
    """Read a literal of a parameter's type (enum entries, defaults, expectations)."""
    if type_ == "string":
        return reader.string(at)
    if type_ == "integer":
        return reader.integer(at)
    if type_ == "number":
        return reader.number(at)
    return reader.boolean(at)


def load_agent(
    path: Path, problems: list[Problem], environ: Mapping[str, str]
) -> AgentConfig | None:
    """Load one agent file; return None when it has problems (they are appended)."""
    reader = Reader(display_path(path), problems)
    before = len(problems)
    root = reader.load(path)
    if root is None:
        return None
    keys = reader.mapping(root, _AGENT_KEYS)
    if keys is None:
        return None
    expander = _Expander(reader, environ)
    directory = path.resolve().parent
    fields: dict[str, Any] = {}

    if "model" in keys:
        fields["model"] = reader.string(keys["model"], non_empty=True)
    if "model_options" in keys:
        fields["model_options"] = _model_options(reader, keys["model_options"], expander)
    if "system" in keys:
        fields["system"] = reader.string(keys["system"])
    if "yolo" in keys:
        fields["yolo"] = reader.boolean(keys["yolo"])
    if "loop_limit" in keys:
        fields["loop_limit"] = reader.integer(keys["loop_limit"], minimum=2)
    builtins: tuple[str, ...] = ()
    if "builtins" in keys:
        builtins = _builtins(reader, keys["builtins"])
        fields["builtins"] = builtins
    if "skills" in keys:
        fields["skills"] = _skills(reader, keys["skills"], directory)
    mcp: tuple[McpServerSpec, ...] = ()
    if "mcp" in keys:
        mcp = _mcp_servers(reader, keys["mcp"], expander)
        fields["mcp"] = mcp
    if "hooks" in keys:
        fields["hooks"] = _hooks(reader, keys["hooks"])
    if "sandbox" in keys:
        fields["sandbox"] = _sandbox(reader, keys["sandbox"])
    tools: tuple[ToolSpec, ...] = ()
    if "tools" in keys:
        tools = _tools(reader, keys["tools"], directory, expander)
    if "allow" in keys:
        fields["allow"] = _allow_rules(reader, keys["allow"], tools, builtins, mcp)

    if len(problems) > before:
        return None
    return AgentConfig(
        path=path.resolve(),
        sha256=_sha256(path),
        tools=tools,
        secrets=tuple(expander.secrets),
        **{k: v for k, v in fields.items() if v is not None},
    )


def _model_options(reader: Reader, at: At, expander: _Expander) -> dict[str, Any] | None:
    data = reader.plain_data(at)
    if not isinstance(data, dict):
        if data is not None:
            reader.problem(at, "expected a mapping")
        return None
    items = dict(reader.free_mapping(at) or [])
    if "max_parallel" in items:
        reader.integer(items["max_parallel"], minimum=1)
    if "recover_text_tool_calls" in items:
        reader.boolean(items["recover_text_tool_calls"])
    if "timeout" in items:
        reader.number(items["timeout"], positive=True)
    options = {k: expander.expand_data(items[k], v) for k, v in data.items()}
    return options


def _skills(reader: Reader, at: At, directory: Path) -> tuple[Skill, ...]:
    """Skills from <dir>/<name>/SKILL.md in each listed folder."""
    skills: list[Skill] = []
    seen: dict[str, Path] = {}
    for item, rel in zip(reader.sequence(at) or [], reader.string_list(at) or [], strict=False):
        folder = (directory / rel).resolve()
        if not folder.is_dir():
            reader.problem(item, f"skills folder not found: {rel}")
            continue
        for path in sorted(folder.glob("*/SKILL.md")):
            skill = _skill(path, reader.problems)
            if skill is None:
                continue
            if skill.name in seen:
                reader.problem(
                    item,
                    f"skill '{skill.name}' is defined twice: {seen[skill.name]} "
                    f"and {display_path(path)}",
                )
                continue
            seen[skill.name] = Path(display_path(path))
            skills.append(skill)
    return tuple(skills)


def _skill(path: Path, problems: list[Problem]) -> Skill | None:
    reader = Reader(display_path(path), problems)
    text = path.read_text(encoding="utf-8", errors="replace")
    lines = text.splitlines(keepends=True)
    if not lines or lines[0].strip() != "---":
        reader.problem(None, "a SKILL.md starts with front matter between --- lines")
        return None
    end = next((i for i, line in enumerate(lines[1:], start=1) if line.strip() == "---"), None)
    if end is None:
        reader.problem(None, "the front matter has no closing --- line")
        return None
    before = len(problems)
    # A leading newline keeps the node lines equal to the file's.
    root = reader.compose("\n" + "".join(lines[1:end]))
    keys = (
        reader.mapping(root, {"name", "description", "keywords"}, {"name", "description"})
        if root
        else None
    )
    if keys is None:
        return None
    name = reader.string(keys["name"], non_empty=True) if "name" in keys else None
    description = (
        reader.string(keys["description"], non_empty=True) if "description" in keys else None
    )
    keywords = reader.string_list(keys["keywords"]) if "keywords" in keys else []
    if name is not None and not TOOL_NAME_RE.fullmatch(name):
        reader.problem(keys["name"], f"invalid skill name '{name}'")
    if len(problems) > before or name is None or description is None:
        return None
    return Skill(name, description, tuple(keywords or ()), "".join(lines[end + 1 :]).strip(), path)


def _builtins(reader: Reader, at: At) -> tuple[str, ...]:
    names = reader.string_list(at) or []
    for item, name in zip(reader.sequence(at) or [], names, strict=False):
        if name not in KNOWN_BUILTINS:
            reader.problem(item, f"unknown built-in '{name}' (known: {', '.join(KNOWN_BUILTINS)})")
    return tuple(n for n in names if n in KNOWN_BUILTINS)


def _mcp_servers(reader: Reader, at: At, expander: _Expander) -> tuple[McpServerSpec, ...]:
    servers: list[McpServerSpec] = []
    for item in reader.sequence(at) or []:
        keys = reader.mapping(item, {"name", "url"}, {"name", "url"})
        if keys is None or len(keys) < 2:
            continue
        name = reader.string(keys["name"], non_empty=True)
        url = reader.string(keys["url"], non_empty=True)
        if name is None or url is None:
            continue
        if not SERVER_NAME_RE.fullmatch(name):
            reader.problem(keys["name"], f"invalid server name '{name}' (letters, digits, '-')")
        elif any(s.name == name for s in servers):
            reader.problem(keys["name"], f"duplicate MCP server name '{name}'")
        servers.append(McpServerSpec(name, expander.expand(keys["url"], url)))
    return tuple(servers)


def _hooks(reader: Reader, at: At) -> HooksSpec | None:
    keys = reader.mapping(at, {"preToolCall", "postToolCall"})
    if keys is None:
        return None
    pre = reader.string_list(keys["preToolCall"], non_empty=True) if "preToolCall" in keys else None
    post = (
        reader.string_list(keys["postToolCall"], non_empty=True) if "postToolCall" in keys else None
    )
    return HooksSpec(
        pre_tool_call=tuple(pre) if pre else None, post_tool_call=tuple(post) if post else None
    )


def _sandbox(reader: Reader, at: At) -> SandboxSpec | None:
    keys = reader.mapping(at, {"kind", "image", "network", "limits", "user"})
    if keys is None:
        return None
    fields: dict[str, Any] = {}
    if "kind" in keys:
        fields["kind"] = _choice(reader, keys["kind"], ("host", "docker"))
    if "image" in keys:
        fields["image"] = reader.string(keys["image"], non_empty=True)
    if "network" in keys:
        fields["network"] = _choice(reader, keys["network"], ("none", "bridge"))
    if "limits" in keys:
        limits = reader.mapping(keys["limits"], {"pids", "memory", "cpus"}) or {}
        if "pids" in limits:
            fields["pids"] = reader.integer(limits["pids"], minimum=1)
        if "memory" in limits:
            memory = reader.string(limits["memory"], non_empty=True)
            if memory is not None and not re.fullmatch(r"[0-9]+[bkmg]?", memory.lower()):
                reader.problem(
                    limits["memory"], f"expected a size such as 512m or 1g, got '{memory}'"
                )
            else:
                fields["memory"] = memory
        if "cpus" in limits:
            fields["cpus"] = reader.number(limits["cpus"], positive=True)
    if "user" in keys:
        user = reader.string(keys["user"], non_empty=True)
        if user is not None:
            if not re.fullmatch(r"[0-9]+(:[0-9]+)?", user):
                reader.problem(keys["user"], f"expected UID or UID:GID in digits, got '{user}'")
            elif user.split(":")[0] == "0":
                reader.problem(keys["user"], "commands never run as root (uid 0) in the sandbox")
            else:
                fields["user"] = user
    return SandboxSpec(**{k: v for k, v in fields.items() if v is not None})


def _choice(reader: Reader, at: At, allowed: tuple[str, ...]) -> str | None:
    value = reader.string(at)
    if value is not None and value not in allowed:
        reader.problem(at, f"expected one of {', '.join(allowed)}, got '{value}'")
        return None
    return value


def _tools(reader: Reader, at: At, directory: Path, expander: _Expander) -> tuple[ToolSpec, ...]:
    tools: list[ToolSpec] = []
    seen: dict[str, int] = {}
    for item in reader.sequence(at) or []:
        tool = _tool(reader, item, directory, expander)
        if tool is None:
            continue
        if tool.name in seen:
            reader.problem(
                item,
                f"duplicate tool name '{tool.name}' (first at line {seen[tool.name]})",
                path=item.key("name"),
            )
            continue
        seen[tool.name] = item.line
        tools.append(tool)
    return tuple(tools)


def _tool(reader: Reader, at: At, directory: Path, expander: _Expander) -> ToolSpec | None:
    keys = reader.mapping(at, _TOOL_KEYS, {"name", "description", "command"})
    if keys is None:
        return None
    before = len(reader.problems)
    name = reader.string(keys["name"], non_empty=True) if "name" in keys else None
    if name is not None:
        if not TOOL_NAME_RE.fullmatch(name):
            reader.problem(
                keys["name"],
                f"invalid tool name '{name}': a letter, then letters, digits, '_' or '-' "
                "(64 at most)",
            )
        elif name in RESERVED_TOOL_NAMES:
            reader.problem(keys["name"], f"'{name}' is reserved for a built-in tool")
    description = reader.string(keys["description"]) if "description" in keys else None
    params: list[ParamSpec] = []
    if "parameters" in keys:
        for pname, pat in reader.free_mapping(keys["parameters"]) or []:
            param = _param(reader, pat, pname)
            if param is not None:
                params.append(param)
    command = _command(reader, keys["command"], params) if "command" in keys else None
    timeout = reader.number(keys["timeout"], positive=True) if "timeout" in keys else None
    workdir = directory
    if "workdir" in keys:
        rel = reader.string(keys["workdir"], non_empty=True)
        if rel is not None:
            workdir = (directory / rel).resolve()
    env: dict[str, str] = {}
    for var, vat in (reader.free_mapping(keys["env"]) or []) if "env" in keys else []:
        value = reader.string(vat)
        if value is not None:
            env[var] = expander.expand(vat, value)
    if len(reader.problems) > before or name is None or command is None:
        return None
    return ToolSpec(
        name=name,
        description=description or "",
        params=tuple(params),
        command=tuple(command),
        workdir=workdir,
        timeout=timeout,
        env=env,
    )


def _param(reader: Reader, at: At, name: str) -> ParamSpec | None:
    if not PARAM_NAME_RE.fullmatch(name):
        reader.problem(at, f"invalid parameter name '{name}' (letters, digits and '_')")
        return None
    keys = reader.mapping(at, _PARAM_KEYS, {"type"})
    if keys is None or "type" not in keys:
        return None
    type_name = _choice(reader, keys["type"], PARAM_TYPES)
    if type_name is None:
        return None
    type_ = cast(ParamType, type_name)
    description = reader.string(keys["description"]) if "description" in keys else ""
    enum: tuple[Value, ...] | None = None
    if "enum" in keys:
        items = reader.sequence(keys["enum"]) or []
        values = [typed_value(reader, i, type_) for i in items]
        if not items:
            reader.problem(keys["enum"], "must list at least one value")
        enum = tuple(v for v in values if v is not None)
    default: Value | None = None
    if "default" in keys:
        default = typed_value(reader, keys["default"], type_)
        if default is not None and enum is not None and default not in enum:
            reader.problem(keys["default"], f"default {default!r} is not one of the enum values")
    required = default is None
    if "required" in keys:
        flag = reader.boolean(keys["required"])
        if flag and "default" in keys:
            reader.problem(keys["required"], "a parameter with a default is optional")
        elif flag is not None:
            required = flag
    allow_dash = reader.boolean(keys["allow_dash"]) if "allow_dash" in keys else False
    if allow_dash and type_ != "string":
        reader.problem(keys["allow_dash"], "allow_dash only applies to string parameters")
    return ParamSpec(
        name=name,
        type=type_,
        description=description or "",
        required=required,
        enum=enum,
        default=default,
        allow_dash=bool(allow_dash),
    )


def _command(reader: Reader, at: At, params: list[ParamSpec]) -> list[str] | None:
    items = reader.sequence(at)
    if items is None:
        return None
    if not items:
        reader.problem(at, "must not be empty: give the program and its arguments as a list")
        return None
    names = {p.name for p in params}
    argv: list[str] = []
    for i, item in enumerate(items):
        entry = reader.string(item)
        if entry is None:
            continue
        refs = PLACEHOLDER_RE.findall(entry)
        if i == 0 and refs:
            reader.problem(
                item, f"the program cannot come from a parameter ({{{{{refs[0].strip()}}}}})"
            )
        for ref in refs:
            if ref.strip() not in names:
                reader.problem(item, f"placeholder {{{{{ref}}}}} names no declared parameter")
        if "{{" in PLACEHOLDER_RE.sub("", entry) or "}}" in PLACEHOLDER_RE.sub("", entry):
            reader.problem(item, f"unbalanced placeholder braces in '{entry}'")
        if i == 0 and not entry:
            reader.problem(item, "the program must not be empty")
        argv.append(entry)
    return argv if len(argv) == len(items) else None


def _allow_rules(
    reader: Reader,
    at: At,
    tools: tuple[ToolSpec, ...],
    builtins: tuple[str, ...],
    mcp: tuple[McpServerSpec, ...],
) -> tuple[AllowRule, ...]:
    rules: list[AllowRule] = []
    by_name = {t.name: t for t in tools}
    for index, item in enumerate(reader.sequence(at) or []):
        keys = reader.mapping(item, {"tool", "args", "bash"})
        if keys is None:
            continue
        if ("tool" in keys) == ("bash" in keys):
            reader.problem(item, "a rule names either a tool or a bash command")
            continue
        if "bash" in keys:
            if "args" in keys:
                reader.problem(keys["args"], "a bash rule takes no args: the command is the rule")
            command = reader.string(keys["bash"], non_empty=True)
            if command is not None:
                rules.append(AllowRule(index, bash=command))
            continue
        name = reader.string(keys["tool"], non_empty=True)
        if name is None:
            continue
        if not _names_a_tool(name, by_name, builtins, mcp):
            reader.problem(keys["tool"], _unknown_tool(name, by_name, builtins))
            continue
        patterns: dict[str, str] | None = None
        if "args" in keys:
            patterns = _arg_patterns(reader, keys["args"], by_name.get(name))
        rules.append(AllowRule(index, tool=name, args=patterns))
    return tuple(rules)


def _arg_patterns(reader: Reader, at: At, tool: ToolSpec | None) -> dict[str, str]:
    patterns: dict[str, str] = {}
    for pname, pat in reader.free_mapping(at) or []:
        param = tool.param(pname) if tool is not None else None
        if tool is not None and param is None:
            reader.problem(pat, f"tool '{tool.name}' has no parameter '{pname}'")
            continue
        node_text = reader.string(pat) if param is None or param.type == "string" else None
        if param is not None and param.type != "string":
            # A glob over a typed value is written as a string; an exact one may be a literal.
            value: Value | None
            if getattr(pat.node, "style", None) is not None and "*" in str(pat.node.value):
                value = str(pat.node.value)
            else:
                value = typed_value(reader, pat, param.type)
            node_text = None if value is None else render_value(value)
        if node_text is not None:
            patterns[pname] = node_text
    return patterns


def _names_a_tool(
    name: str,
    by_name: Mapping[str, ToolSpec],
    builtins: tuple[str, ...],
    mcp: tuple[McpServerSpec, ...],
) -> bool:
    if name in by_name or name in builtins:
        return True
    # MCP tools are only known once the server answered: accept its prefix here.
    return any(name.startswith(f"{s.name}_") and len(name) > len(s.name) + 1 for s in mcp)


def _unknown_tool(name: str, by_name: Mapping[str, ToolSpec], builtins: tuple[str, ...]) -> str:
    if name in KNOWN_BUILTINS:
        return f"built-in '{name}' is not enabled (add it to builtins)"
    known = sorted(set(by_name) | set(builtins))
    return f"no tool named '{name}' (declared: {', '.join(known) or 'none'})"


# -- tasks files ---------------------------------------------------------------------------


def load_tasks(path: Path, environ: Mapping[str, str] | None = None) -> TasksFile:
    """Load a tasks file and every agent file it names; raise ConfigError with all problems."""
    env = os.environ if environ is None else environ
    problems: list[Problem] = []
    reader = Reader(display_path(path), problems)
    root = reader.load(path)
    if root is None:
        raise ConfigError(problems)
    keys = reader.mapping(root, _TASKS_KEYS, {"tasks"})
    if keys is None:
        raise ConfigError(problems)
    base = path.resolve().parent
    agents: dict[Path, AgentConfig | None] = {}

    def agent_at(at: At) -> AgentConfig | None:
        rel = reader.string(at, non_empty=True)
        if rel is None:
            return None
        agent_path = (base / rel).resolve()
        if agent_path not in agents:
            if not agent_path.is_file():
                reader.problem(at, f"agent file not found: {rel}")
                agents[agent_path] = None
            else:
                agents[agent_path] = load_agent(agent_path, problems, env)
        return agents[agent_path]

    default_agent = agent_at(keys["agent"]) if "agent" in keys else None
    fields: dict[str, Any] = {}
    if "models" in keys:
        models = reader.string_list(keys["models"], non_empty=True)
        fields["models"] = tuple(models) if models else None
    if "repeat" in keys:
        fields["repeat"] = reader.integer(keys["repeat"], minimum=1)
    if "jobs" in keys:
        fields["jobs"] = reader.integer(keys["jobs"], minimum=1)
    if "min_pass_rate" in keys:
        rate = reader.number(keys["min_pass_rate"], minimum=0.0)
        if rate is not None and rate > 1:
            reader.problem(keys["min_pass_rate"], f"must be between 0 and 1, got {rate:g}")
        else:
            fields["min_pass_rate"] = rate

    tasks: list[TaskSpec] = []
    seen: dict[str, int] = {}
    items = reader.sequence(keys["tasks"])
    if items == []:
        reader.problem(keys["tasks"], "lists no task")
    for item in items or []:
        task_id = _peek_id(item)
        if task_id is not None and task_id in seen:
            reader.problem(
                item,
                f"duplicate task id '{task_id}' (first at line {seen[task_id]})",
                path=item.key("id"),
            )
            continue
        if task_id is not None:
            seen[task_id] = item.line
        task = _task(reader, item, default_agent, "agent" in keys, agent_at)
        if task is not None:
            tasks.append(task)
    if problems:
        raise ConfigError(problems)
    return TasksFile(
        path=path.resolve(),
        sha256=_sha256(path),
        tasks=tuple(tasks),
        **{k: v for k, v in fields.items() if v is not None},
    )


def _peek_id(at: At) -> str | None:
    """A task's id as written, before validation, so duplicates are found whatever else fails."""
    if isinstance(at.node, yaml.MappingNode):
        for key, value in at.node.value:
            if getattr(key, "value", None) == "id" and isinstance(value, yaml.ScalarNode):
                return str(value.value)
    return None


def _task(
    reader: Reader,
    at: At,
    default_agent: AgentConfig | None,
    has_default: bool,
    agent_at: Any,
) -> TaskSpec | None:
    keys = reader.mapping(at, _TASK_KEYS, {"id", "prompt"})
    if keys is None:
        return None
    before = len(reader.problems)
    task_id = reader.string(keys["id"], non_empty=True) if "id" in keys else None
    if task_id is not None and not TASK_ID_RE.fullmatch(task_id):
        reader.problem(keys["id"], f"invalid task id '{task_id}' (letters, digits, '_', '.', '-')")
    prompt = reader.string(keys["prompt"], non_empty=True) if "prompt" in keys else None
    agent = default_agent
    if "agent" in keys:
        agent = agent_at(keys["agent"])
    elif not has_default:
        reader.problem(
            at, "no agent: give 'agent' here or at the top of the tasks file", path=at.key("agent")
        )
    fields: dict[str, Any] = {}
    if "timeout" in keys:
        fields["timeout"] = reader.number(keys["timeout"], positive=True)
    if "max_turns" in keys:
        fields["max_turns"] = reader.integer(keys["max_turns"], minimum=1)
    if "expect" in keys and agent is not None:
        fields["expect"] = _expect(reader, keys["expect"], agent)
    if len(reader.problems) > before or agent is None or task_id is None or prompt is None:
        return None
    return TaskSpec(
        id=task_id,
        prompt=prompt,
        agent=agent,
        **{k: v for k, v in fields.items() if v is not None},
    )


def _expect(reader: Reader, at: At, agent: AgentConfig) -> Expect | None:
    keys = reader.mapping(at, _EXPECT_KEYS)
    if keys is None:
        return None
    by_name = {t.name: t for t in agent.tools}

    def tool_name(nat: At) -> str | None:
        name = reader.string(nat, non_empty=True)
        if name is not None and not _names_a_tool(name, by_name, agent.builtins, agent.mcp):
            reader.problem(nat, _unknown_tool(name, by_name, agent.builtins))
            return None
        return name

    calls: list[CallExpectation] = []
    for item in reader.sequence(keys["calls"]) or [] if "calls" in keys else []:
        ckeys = reader.mapping(item, {"tool", "args", "times"}, {"tool"})
        if ckeys is None or "tool" not in ckeys:
            continue
        name = tool_name(ckeys["tool"])
        if name is None:
            continue
        args = _expected_args(reader, ckeys["args"], by_name.get(name)) if "args" in ckeys else None
        times = reader.integer(ckeys["times"], minimum=0) if "times" in ckeys else None
        calls.append(CallExpectation(name, args, times))

    def names(key: str) -> tuple[str, ...]:
        if key not in keys:
            return ()
        return tuple(n for i in reader.sequence(keys[key]) or [] if (n := tool_name(i)))

    check = reader.string_list(keys["check"], non_empty=True) if "check" in keys else None
    return Expect(
        calls=tuple(calls),
        no_calls=names("no_calls"),
        refused=names("refused"),
        exit_code=reader.integer(keys["exit_code"]) if "exit_code" in keys else None,
        answer_contains=tuple(reader.string_list(keys["answer_contains"]) or [])
        if "answer_contains" in keys
        else (),
        check=tuple(check) if check else None,
    )


def _expected_args(reader: Reader, at: At, tool: ToolSpec | None) -> dict[str, Value]:
    args: dict[str, Value] = {}
    for pname, pat in reader.free_mapping(at) or []:
        if tool is None:
            value = reader.plain_data(pat)
            if isinstance(value, str | int | float | bool):
                args[pname] = value
            continue
        param = tool.param(pname)
        if param is None:
            reader.problem(pat, f"tool '{tool.name}' has no parameter '{pname}'")
            continue
        typed = typed_value(reader, pat, param.type)
        if typed is None:
            continue
        if param.enum is not None and typed not in param.enum:
            allowed = ", ".join(str(v) for v in param.enum)
            reader.problem(pat, f"{typed!r} can never match: '{pname}' is one of {allowed}")
            continue
        args[pname] = typed
    return args
