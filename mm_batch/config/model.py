"""The validated configuration: frozen data that nothing downstream re-checks."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Literal

from mm_batch.config.problems import Problem
from mm_batch.jsontypes import JsonObject, JsonValue

# "json" (any JSON value, no coercion) only comes from MCP tool schemas, never from a file.
ParamType = Literal["string", "integer", "number", "boolean", "json"]
Value = str | int | float | bool | list[JsonValue] | JsonObject
SandboxKind = Literal["host", "docker"]
NetworkMode = Literal["none", "bridge"]
WorkspaceMode = Literal["copy", "mount", "readonly"]
SANDBOX_KINDS: tuple[SandboxKind, ...] = ("host", "docker")
NETWORK_MODES: tuple[NetworkMode, ...] = ("none", "bridge")
WORKSPACE_MODES: tuple[WorkspaceMode, ...] = ("copy", "mount", "readonly")
# The model response cache: read = use hits, store nothing new; write = never read, store;
# readwrite = both (the default once a cache is given).
CacheMode = Literal["read", "write", "readwrite"]
CACHE_MODES: tuple[CacheMode, ...] = ("read", "write", "readwrite")

PARAM_TYPES: tuple[ParamType, ...] = ("string", "integer", "number", "boolean")  # in files
RESERVED_TOOL_NAMES = frozenset(
    {
        "bash",
        "read_skill",
        "read_file",
        "write_file",
        "edit_file",
        "list_files",
        "glob",
        "grep",
        "web_fetch",
    }
)
KNOWN_BUILTINS = ("bash", "read_skill")
DEFAULT_MODEL = "local/qwen2.5-coder-1.5b"
DEFAULT_IMAGE = "mm-batch/sandbox:base"
WEEK_S = 7 * 24 * 3600.0  # no timeout is longer: beyond it threads cannot even wait that long
MAX_PARALLEL = 1024  # model_options.max_parallel: calls of one model at once
# Keys of model_options that mm-batch reads itself and never passes on to litellm.
OWN_MODEL_OPTIONS = frozenset({"max_parallel", "recover_text_tool_calls", "timeout"})
# Read by mm-batch's own local server client only: never passed on to a hosted provider.
LOCAL_MODEL_OPTIONS = frozenset({"call_grammar"})
# Keyword arguments mm-batch gives litellm itself (the response cache's included): as model
# options they would clash.
SET_BY_MM_BATCH = frozenset(
    {"model", "messages", "tools", "num_retries", "stream", "caching", "cache", "cache_key"}
)


@dataclass(frozen=True)
class ParamSpec:
    name: str
    type: ParamType
    description: str
    required: bool
    enum: tuple[Value, ...] | None = None
    default: Value | None = None
    allow_dash: bool = False
    # For a parameter of type "json" (an MCP tool's array, object or union): the JSON Schema of
    # its values as the server gave it, less what is said in text (description, enum,
    # default); the model is sent it as the parameter's type.
    schema: JsonObject | None = None


@dataclass(frozen=True)
class ToolSpec:
    """A declared tool: one argv command made into a typed tool."""

    name: str
    description: str
    params: tuple[ParamSpec, ...]
    command: tuple[str, ...]
    workdir: Path
    timeout: float | None = None
    env: Mapping[str, str] = field(default_factory=dict)
    # true: the same call right after it ran with exit 0 runs again (polling); false: answered
    # with the earlier result, never run twice (a second release is a hazard)
    repeatable: bool = False

    def param(self, name: str) -> ParamSpec | None:
        return next((p for p in self.params if p.name == name), None)


@dataclass(frozen=True)
class AllowRule:
    """One preapproved entry: a tool with optional argument patterns, or a bash command."""

    index: int
    tool: str | None = None
    args: Mapping[str, str] | None = None
    bash: str | None = None

    @property
    def label(self) -> str:
        return f"allow[{self.index}]"


@dataclass(frozen=True)
class SandboxSpec:
    kind: SandboxKind = "host"
    image: str = DEFAULT_IMAGE
    network: NetworkMode = "none"
    pids: int = 256
    memory: str = "1g"
    cpus: float = 1.0
    user: str = "1000:1000"  # always "UID:GID" once loaded ("UID" alone gets GID = UID)
    workspace: WorkspaceMode = "copy"
    workspace_size: str = "1g"  # limits.workspace: the copy's tmpfs size (copy only)


@dataclass(frozen=True)
class McpServerSpec:
    name: str
    url: str


@dataclass(frozen=True)
class HooksSpec:
    pre_tool_call: tuple[str, ...] | None = None
    post_tool_call: tuple[str, ...] | None = None


@dataclass(frozen=True)
class Skill:
    """A skill: know-how the model reads with read_skill, listed in the system prompt."""

    name: str
    description: str
    keywords: tuple[str, ...]
    body: str
    path: Path


@dataclass(frozen=True)
class AgentConfig:
    path: Path
    sha256: str
    tools: tuple[ToolSpec, ...]
    model: str | None = None
    model_options: Mapping[str, JsonValue] = field(default_factory=dict)
    system: str | None = None
    yolo: bool = False
    allow: tuple[AllowRule, ...] = ()
    builtins: tuple[str, ...] = ()
    skills: tuple[Skill, ...] = ()
    mcp: tuple[McpServerSpec, ...] = ()
    hooks: HooksSpec = HooksSpec()
    sandbox: SandboxSpec = SandboxSpec()
    loop_limit: int = 3
    # Values that came from ${VAR} substitutions: masked in everything mm-batch writes or sends.
    secrets: tuple[str, ...] = ()
    # What is allowed but risky (a bash glob over git): said on stderr, never an error.
    warnings: tuple[Problem, ...] = ()

    @property
    def directory(self) -> Path:
        return self.path.parent

    def tool(self, name: str) -> ToolSpec | None:
        return next((t for t in self.tools if t.name == name), None)

    def callable_names(self) -> set[str]:
        """Names a task may expect: declared tools and enabled built-ins."""
        return {t.name for t in self.tools} | set(self.builtins)


@dataclass(frozen=True)
class AnyOf:
    """A list in place of an expected value: any one of these values matches."""

    values: tuple[Value, ...]


ExpectedValue = Value | AnyOf


@dataclass(frozen=True)
class CallExpectation:
    tool: str
    args: Mapping[str, ExpectedValue] | None = None
    times: int | None = None
    # The declared number parameters among args: their 2 and 2.0 are one number. Everywhere
    # else values compare type-exactly (a boolean is never a number, an integer never a float).
    numbers: frozenset[str] = frozenset()


@dataclass(frozen=True)
class Expect:
    calls: tuple[CallExpectation, ...] = ()
    no_calls: tuple[str, ...] = ()
    refused: tuple[str, ...] = ()
    exit_code: int | None = None
    answer_contains: tuple[str, ...] = ()
    check: tuple[str, ...] | None = None


@dataclass(frozen=True)
class TaskSpec:
    id: str
    prompt: str
    agent: AgentConfig
    line: int = 0  # 1-based line of the task's item in the tasks file, for the reports
    timeout: float = 600.0
    max_turns: int = 20
    expect: Expect | None = None


@dataclass(frozen=True)
class CacheSettings:
    """Where model responses are cached (an absolute folder, resolved once), and how."""

    folder: Path
    mode: CacheMode = "readwrite"


@dataclass(frozen=True)
class TasksFile:
    path: Path
    sha256: str
    tasks: tuple[TaskSpec, ...]
    models: tuple[str, ...] | None = None
    repeat: int = 1
    jobs: int = 4
    min_pass_rate: float = 1.0
    cache: Path | None = None  # `cache:`, absolute (given relative to the tasks file)
    cache_mode: CacheMode | None = None  # `cache_mode:`, only beside `cache:`

    @property
    def agents(self) -> tuple[AgentConfig, ...]:
        unique = {t.agent.path: t.agent for t in self.tasks}
        return tuple(unique.values())

    @property
    def warnings(self) -> tuple[Problem, ...]:
        """The warnings of every agent file the tasks use, each once."""
        return tuple(w for agent in self.agents for w in agent.warnings)


def render_value(value: Value) -> str:
    """A value as it lands in argv: true/false, decimal integers, numbers without exponent."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return format(Decimal(repr(value)), "f")
    if isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False, sort_keys=True)
