"""The agent file, read by its table of keys into a frozen `AgentConfig`.

Each entry has its own module: `entries` (built-ins, skills, MCP servers, hooks), `sandbox`,
`tool_entries` (declared tools) and `allow_rules`; this one reads the file's top level.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from mm_batch.config.allow_rules import ALLOW, glob_warnings
from mm_batch.config.entries import BUILTINS, HOOKS, MCP, SKILLS, AgentContext
from mm_batch.config.env import Expander
from mm_batch.config.fields import (
    SCHEMA_KEY,
    Fields,
    Key,
    or_default,
    read_fields,
    scalar,
    schema_key,
)
from mm_batch.config.model import MAX_PARALLEL, SET_BY_MM_BATCH, WEEK_S, AgentConfig
from mm_batch.config.paths import sha256
from mm_batch.config.sandbox import SANDBOX_KEY
from mm_batch.config.tool_entries import TOOLS
from mm_batch.config.yamlnodes import At, Reader
from mm_batch.jsontypes import JsonObject, JsonValue


def _own_option(reader: Reader, name: str, at: At) -> JsonValue:
    if name == "max_parallel":
        return reader.integer(at, minimum=1, maximum=MAX_PARALLEL)
    if name == "recover_text_tool_calls":
        return reader.boolean(at)
    return reader.number(at, positive=True, maximum=WEEK_S)


def _model_options(ctx: AgentContext, at: At, _: Fields) -> JsonObject | None:
    reader = ctx.reader
    entries = reader.free_mapping(at)
    if entries is None:
        return None
    options: JsonObject = {}
    for name, value_at in entries:
        before = len(reader.problems)
        if name in SET_BY_MM_BATCH:
            reader.problem(value_at, f"mm-batch sets '{name}' itself: it is not a model option")
            continue
        if name in ("max_parallel", "recover_text_tool_calls", "timeout"):
            value = _own_option(reader, name, value_at)
        else:
            value = reader.plain_data(value_at)
        if len(reader.problems) == before:
            options[name] = ctx.expander.expand_data(value_at, value)
    return options


MODEL = scalar("model", lambda r, at: r.string(at, non_empty=True))
MODEL_OPTIONS: Key[AgentContext, JsonObject] = Key("model_options", _model_options)
SYSTEM = scalar("system", Reader.string)
YOLO = scalar("yolo", Reader.boolean)
LOOP_LIMIT = scalar("loop_limit", lambda r, at: r.integer(at, minimum=2, maximum=1000))
AGENT: tuple[Key[AgentContext, object], ...] = (
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
    TOOLS,  # after the sandbox: where the tools run says where their programs must be
    ALLOW,  # last: its rules name tools, built-ins and MCP servers
    schema_key(),
)
AGENT_KEYS = frozenset(k.name for k in AGENT) - {SCHEMA_KEY}


def read_agent(
    path: Path, root: At, reader: Reader, environ: Mapping[str, str]
) -> AgentConfig | None:
    """An agent file's parsed root as an `AgentConfig`; None when it has problems."""
    before = len(reader.problems)
    ctx = AgentContext(reader, Expander(reader, environ), path.resolve().parent)
    fields = read_fields(ctx, root, AGENT)
    if fields is None:
        return None
    allow_at, rules = fields.given(ALLOW), fields[ALLOW] or ()
    warnings = glob_warnings(reader, allow_at, rules) if allow_at is not None else []
    warnings += ctx.findings
    if len(reader.problems) > before:
        return None
    # A key not given leaves its field's default (a dataclass field's default is its class's).
    return AgentConfig(
        path=path.resolve(),
        sha256=sha256(path),
        tools=fields[TOOLS] or (),
        model=fields[MODEL],
        model_options=or_default(fields[MODEL_OPTIONS], {}),
        system=fields[SYSTEM],
        yolo=or_default(fields[YOLO], AgentConfig.yolo),
        loop_limit=or_default(fields[LOOP_LIMIT], AgentConfig.loop_limit),
        builtins=fields[BUILTINS] or (),
        skills=fields[SKILLS] or (),
        mcp=fields[MCP] or (),
        hooks=or_default(fields[HOOKS], AgentConfig.hooks),
        sandbox=or_default(fields[SANDBOX_KEY], AgentConfig.sandbox),
        allow=rules,
        secrets=tuple(ctx.expander.secrets),
        warnings=tuple(warnings),
    )
