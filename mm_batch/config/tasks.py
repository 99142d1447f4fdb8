"""The tasks file, read by its tables of keys into a frozen `TasksFile` with its agents."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from mm_batch.config.allow_rules import names_a_tool, unknown_tool
from mm_batch.config.entries import read_argv
from mm_batch.config.fields import Fields, Key, one_of, or_default, read_fields, scalar, schema_key
from mm_batch.config.model import (
    CACHE_MODES,
    WEEK_S,
    AgentConfig,
    AnyOf,
    CacheMode,
    CallExpectation,
    Expect,
    ExpectedValue,
    ParamSpec,
    TasksFile,
    TaskSpec,
    ToolSpec,
    Value,
)
from mm_batch.config.paths import path_kind, program_problem, sha256, unusable
from mm_batch.config.problems import excerpt
from mm_batch.config.tool_entries import typed_value
from mm_batch.config.yamlnodes import At, Reader

TASK_ID_RE = re.compile(r"[A-Za-z0-9_.-]+")
MAX_EXIT_CODE = 255


@dataclass
class _Tasks:
    """What the tasks file's readers need: where paths start, and the agents read so far."""

    reader: Reader
    base: Path
    load_agent: Callable[[Path], AgentConfig | None]
    agents: dict[Path, AgentConfig | None] = field(default_factory=dict)

    def agent_at(self, at: At) -> AgentConfig | None:
        """The agent file a value names, read once however many tasks name it."""
        rel = self.reader.string(at, non_empty=True)
        if rel is None:
            return None
        path = (self.base / rel).resolve()
        if path not in self.agents:
            kind = path_kind(path)
            if isinstance(kind, OSError):
                self.reader.problem(at, unusable(kind))
                self.agents[path] = None
            elif kind == "missing":
                self.reader.problem(at, f"agent file not found: {excerpt(rel)}")
                self.agents[path] = None
            else:  # a folder or a FIFO too: its reader says what it is, and reads none
                self.agents[path] = self.load_agent(path)
        return self.agents[path]


@dataclass(frozen=True)
class _Task:
    """One task being read: the file's context, and the agent it gets unless it names one."""

    tasks: _Tasks
    default: AgentConfig | None
    has_default: bool

    @property
    def reader(self) -> Reader:
        return self.tasks.reader


@dataclass(frozen=True)
class _Expect:
    """A task's `expect`, read against the tools of the task's agent."""

    reader: Reader
    agent: AgentConfig

    @property
    def tools(self) -> dict[str, ToolSpec]:
        return {t.name: t for t in self.agent.tools}

    def tool_name(self, at: At) -> str | None:
        name = self.reader.string(at, non_empty=True)
        agent = self.agent
        if name is not None and not names_a_tool(name, self.tools, agent.builtins, agent.mcp):
            self.reader.problem(at, unknown_tool(name, self.tools, agent.builtins))
            return None
        return name


# -- expect -----------------------------------------------------------------------------------


def _expected_one(reader: Reader, at: At, param: ParamSpec | None, whole: bool) -> Value | None:
    """One value a parameter may hold: of the declared parameter's type, in its enum; for a tool
    whose parameters are known only once it runs (a built-in, an MCP tool), any JSON value but
    null (compared type-exactly at judge time: a list's items may be arrays and objects too,
    for an array of them)."""
    if param is not None:
        typed = typed_value(reader, at, param.type)
        if typed is not None and param.enum is not None and typed not in param.enum:
            allowed = ", ".join(str(v) for v in param.enum)
            reader.problem(at, f"{typed!r} can never match: '{param.name}' is one of {allowed}")
            return None
        return typed
    node = at.node
    if isinstance(node, yaml.ScalarNode) and node.tag == "tag:yaml.org,2002:null":
        reader.problem(at, "null can never match: leave the parameter out to leave it unchecked")
        return None
    value = reader.plain_data(at)
    return value if isinstance(value, str | int | float | bool | dict | list) else None


def _expected_value(reader: Reader, at: At, param: ParamSpec | None) -> ExpectedValue | None:
    """A parameter's expected value, or a list of them: any one of these (SPEC §1)."""
    node = at.node
    if not isinstance(node, yaml.SequenceNode):
        return _expected_one(reader, at, param, whole=True)
    if not node.value and param is None:  # an MCP tool's array parameter: the empty array
        return AnyOf(())
    if not node.value:
        reader.problem(at, "an empty list of values can never match: give one or several")
        return None
    items = [
        _expected_one(reader, At(item, at.index(i)), param, whole=False)
        for i, item in enumerate(node.value)
    ]
    values = [v for v in items if v is not None]
    return AnyOf(tuple(values)) if len(values) == len(items) else None


def _expected_args(ctx: _Expect, at: At, call: Fields) -> dict[str, ExpectedValue] | None:
    reader = ctx.reader
    name = call[CALL_TOOL]
    tool = ctx.tools.get(name) if name is not None else None
    args: dict[str, ExpectedValue] = {}
    for pname, pat in reader.free_mapping(at) or []:
        param = tool.param(pname) if tool is not None else None
        if tool is not None and param is None:
            reader.problem(pat, f"tool '{tool.name}' has no parameter '{excerpt(pname)}'")
            continue
        value = _expected_value(reader, pat, param)
        if value is not None:
            args[pname] = value
    return args


CALL_TOOL: Key[_Expect, str] = Key("tool", lambda ctx, at, _: ctx.tool_name(at), required=True)
CALL_ARGS: Key[_Expect, dict[str, ExpectedValue]] = Key("args", _expected_args)
CALL_TIMES = scalar("times", lambda r, at: r.integer(at, minimum=0))
CALL: tuple[Key[_Expect, object], ...] = (CALL_TOOL, CALL_ARGS, CALL_TIMES)


def _calls(ctx: _Expect, at: At, _: Fields) -> tuple[CallExpectation, ...] | None:
    calls: list[CallExpectation] = []
    for item in ctx.reader.sequence(at) or []:
        fields = read_fields(ctx, item, CALL)
        name = fields[CALL_TOOL] if fields is not None else None
        if fields is None or name is None:
            continue
        tool, args = ctx.tools.get(name), fields[CALL_ARGS] or {}
        params = tool.params if tool is not None else ()
        numbers = frozenset(p.name for p in params if p.type == "number" and p.name in args)
        calls.append(CallExpectation(name, fields[CALL_ARGS], fields[CALL_TIMES], numbers))
    return tuple(calls)


def _tool_names(ctx: _Expect, at: At, _: Fields) -> tuple[str, ...] | None:
    items = ctx.reader.sequence(at)
    if items is None:
        return None
    return tuple(n for item in items if (n := ctx.tool_name(item)) is not None)


def _no_calls(ctx: _Expect, at: At, earlier: Fields) -> tuple[str, ...] | None:
    names = _tool_names(ctx, at, earlier)
    expected = {c.tool for c in earlier[CALLS] or () if c.times != 0}
    for i, name in enumerate(names or ()):
        if name in expected:
            ctx.reader.problem(
                At(at.node.value[i], at.index(i)),
                f"'{name}' is also expected in calls: both checks can never hold",
            )
    return names


def _exit_code(reader: Reader, at: At) -> int | None:
    code = reader.integer(at)
    if code is not None and not 0 <= code <= MAX_EXIT_CODE:
        reader.problem(at, f"can never match: exit codes are 0 to {MAX_EXIT_CODE}, got {code}")
        return None
    return code


def _answer_contains(reader: Reader, at: At) -> tuple[str, ...] | None:
    items = reader.sequence(at)
    if items is None:
        return None
    texts: list[str] = []
    for item in items:
        text = reader.string(item)
        if text == "":
            reader.problem(item, "an empty string is in every answer: this check cannot fail")
        elif text is not None:
            texts.append(text)
    return tuple(texts)


CALLS: Key[_Expect, tuple[CallExpectation, ...]] = Key("calls", _calls)
NO_CALLS: Key[_Expect, tuple[str, ...]] = Key("no_calls", _no_calls)
REFUSED: Key[_Expect, tuple[str, ...]] = Key("refused", _tool_names)
EXIT_CODE = scalar("exit_code", _exit_code)
ANSWER_CONTAINS = scalar("answer_contains", _answer_contains)
CHECK = scalar("check", read_argv)
EXPECT: tuple[Key[_Expect, object], ...] = (
    CALLS,
    NO_CALLS,  # after calls: a tool both expected and forbidden is refused
    REFUSED,
    EXIT_CODE,
    ANSWER_CONTAINS,
    CHECK,
)


# -- tasks ------------------------------------------------------------------------------------


def _task_id(reader: Reader, at: At) -> str | None:
    task_id = reader.string(at, non_empty=True)
    if task_id is not None and not TASK_ID_RE.fullmatch(task_id):
        reader.problem(at, f"invalid task id '{excerpt(task_id)}' (letters, digits, '_', '.', '-')")
        return None
    return task_id


def _expect(ctx: _Task, at: At, task: Fields) -> Expect | None:
    agent = task[TASK_AGENT] if task.given(TASK_AGENT) is not None else ctx.default
    if agent is None:
        return None
    fields = read_fields(_Expect(ctx.reader, agent), at, EXPECT)
    if fields is None:
        return None
    check, check_at = fields[CHECK], fields.given(CHECK)
    problem = program_problem(agent.directory, check[0]) if check else None
    if problem is not None and check_at is not None:
        ctx.reader.problem(check_at, problem)
    return Expect(
        calls=fields[CALLS] or (),
        no_calls=fields[NO_CALLS] or (),
        refused=fields[REFUSED] or (),
        exit_code=fields[EXIT_CODE],
        answer_contains=fields[ANSWER_CONTAINS] or (),
        check=fields[CHECK],
    )


TASK_ID = scalar("id", _task_id, required=True)
PROMPT = scalar("prompt", lambda r, at: r.string(at, non_empty=True), required=True)
TASK_AGENT: Key[_Task, AgentConfig] = Key("agent", lambda ctx, at, _: ctx.tasks.agent_at(at))
TIMEOUT = scalar("timeout", lambda r, at: r.number(at, positive=True, maximum=WEEK_S))
MAX_TURNS = scalar("max_turns", lambda r, at: r.integer(at, minimum=1, maximum=10_000))
EXPECT_KEY: Key[_Task, Expect] = Key("expect", _expect)
TASK: tuple[Key[_Task, object], ...] = (
    TASK_ID,
    PROMPT,
    TASK_AGENT,
    TIMEOUT,
    MAX_TURNS,
    EXPECT_KEY,  # after agent: the expectations name its tools
)


def _task(ctx: _Task, at: At) -> TaskSpec | None:
    before = len(ctx.reader.problems)
    fields = read_fields(ctx, at, TASK)
    if fields is None:
        return None
    agent = ctx.default
    if fields.given(TASK_AGENT) is not None:
        agent = fields[TASK_AGENT]
    elif not ctx.has_default:
        ctx.reader.problem(
            at, "no agent: give 'agent' here or at the top of the tasks file", path=at.key("agent")
        )
    task_id, prompt = fields[TASK_ID], fields[PROMPT]
    if len(ctx.reader.problems) > before or agent is None or task_id is None or prompt is None:
        return None
    return TaskSpec(
        id=task_id,
        prompt=prompt,
        agent=agent,
        line=at.line,
        timeout=or_default(fields[TIMEOUT], TaskSpec.timeout),
        max_turns=or_default(fields[MAX_TURNS], TaskSpec.max_turns),
        expect=fields[EXPECT_KEY],
    )


def _peek_id(at: At) -> str | None:
    """A task's id as written, before validation, so duplicates are found whatever else fails."""
    if isinstance(at.node, yaml.MappingNode):
        for key, value in at.node.value:
            if getattr(key, "value", None) == "id" and isinstance(value, yaml.ScalarNode):
                return str(value.value)
    return None


def _tasks(ctx: _Tasks, at: At, top: Fields) -> tuple[TaskSpec, ...] | None:
    reader = ctx.reader
    items = reader.sequence(at)
    if items == []:
        reader.problem(at, "lists no task")
    task_ctx = _Task(ctx, top[DEFAULT_AGENT], top.given(DEFAULT_AGENT) is not None)
    tasks: list[TaskSpec] = []
    seen: dict[str, int] = {}
    for item in items or []:
        task_id = _peek_id(item)
        if task_id is not None and task_id in seen:
            reader.problem(
                item,
                f"duplicate task id '{excerpt(task_id)}' (first at line {seen[task_id]})",
                path=item.key("id"),
            )
            continue
        if task_id is not None:
            seen[task_id] = item.line
        task = _task(task_ctx, item)
        if task is not None:
            tasks.append(task)
    return tuple(tasks)


def _min_pass_rate(reader: Reader, at: At) -> float | None:
    rate = reader.number(at, minimum=0.0)
    if rate is not None and rate > 1:
        reader.problem(at, f"must be between 0 and 1, got {rate:g}")
        return None
    return rate


def _models(reader: Reader, at: At) -> tuple[str, ...] | None:
    models = reader.string_list(at, non_empty=True)
    if models is None:
        return None
    for item, model in zip(reader.sequence(at) or [], models, strict=True):
        if not model:
            reader.problem(item, "must not be empty")
            return None
    return tuple(models)


def _cache(ctx: _Tasks, at: At, _: Fields) -> Path | None:
    """The cache folder, relative to the tasks file; it need not exist yet (a run creates it)."""
    rel = ctx.reader.string(at, non_empty=True)
    if rel is None:
        return None
    folder = ctx.base / rel  # absolute: the tasks file's folder is
    kind = path_kind(folder)
    if isinstance(kind, OSError):
        ctx.reader.problem(at, unusable(kind))
        return None
    if kind not in ("folder", "missing"):
        ctx.reader.problem(at, f"the cache must be a folder, and this is a file: {excerpt(rel)}")
        return None
    return folder


def _cache_mode(ctx: _Tasks, at: At, top: Fields) -> CacheMode | None:
    mode = one_of(ctx.reader, at, CACHE_MODES)
    if mode is not None and top.given(CACHE) is None:
        ctx.reader.problem(at, "cache_mode needs 'cache' beside it: the folder to cache in")
        return None
    return mode


DEFAULT_AGENT: Key[_Tasks, AgentConfig] = Key("agent", lambda ctx, at, _: ctx.agent_at(at))
MODELS = scalar("models", _models)
MAX_REPEAT = 1000
REPEAT = scalar("repeat", lambda r, at: r.integer(at, minimum=1, maximum=MAX_REPEAT))
MAX_JOBS = 1024
JOBS = scalar("jobs", lambda r, at: r.integer(at, minimum=1, maximum=MAX_JOBS))
MIN_PASS_RATE = scalar("min_pass_rate", _min_pass_rate)
CACHE: Key[_Tasks, Path] = Key("cache", _cache)
CACHE_MODE: Key[_Tasks, CacheMode] = Key("cache_mode", _cache_mode)  # after cache: it needs one
TASKS: Key[_Tasks, tuple[TaskSpec, ...]] = Key("tasks", _tasks, required=True)
TASKS_FILE: tuple[Key[_Tasks, object], ...] = (
    DEFAULT_AGENT,
    MODELS,
    REPEAT,
    JOBS,
    MIN_PASS_RATE,
    CACHE,
    CACHE_MODE,
    TASKS,  # last: its tasks get the default agent
    schema_key(),
)
TASKS_ONLY_KEYS = frozenset(
    {"tasks", "agent", "models", "repeat", "jobs", "min_pass_rate", "cache", "cache_mode"}
)


def read_tasks(
    path: Path,
    root: At,
    reader: Reader,
    load_agent: Callable[[Path], AgentConfig | None],
) -> TasksFile | None:
    """A tasks file's parsed root as a `TasksFile`; None when it, or an agent, has problems."""
    fields = read_fields(_Tasks(reader, path.resolve().parent, load_agent), root, TASKS_FILE)
    if fields is None or reader.problems:
        return None
    # A key not given leaves its field's default (a dataclass field's default is its class's).
    return TasksFile(
        path=path.resolve(),
        sha256=sha256(path),
        tasks=fields[TASKS] or (),
        models=fields[MODELS],
        repeat=or_default(fields[REPEAT], TasksFile.repeat),
        jobs=or_default(fields[JOBS], TasksFile.jobs),
        min_pass_rate=or_default(fields[MIN_PASS_RATE], TasksFile.min_pass_rate),
        cache=fields[CACHE],
        cache_mode=fields[CACHE_MODE],
    )
