"""The tools of one task run — declared tools, built-ins and MCP tools — behind one lookup.

Every kind is a `ToolSpec` for the model and for validation, so that coercion, invalid-call
answers and consent are one piece of code whatever runs the call.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from mm_batch.config.model import AgentConfig, ParamSpec, ParamType, ToolSpec, Value, render_value
from mm_batch.config.secrets import Masker
from mm_batch.jsontypes import JsonObject
from mm_batch.run.ports import McpTool
from mm_batch.tools.declared import InvalidCall, ValidCall, validate_call
from mm_batch.tools.mcp_schema import resolved, sent_schema
from mm_batch.tools.schema import model_schema

CallKind = Literal["command", "skill", "mcp"]
_SCHEMA_TYPES: dict[str, ParamType] = {
    "string": "string",
    "integer": "integer",
    "number": "number",
    "boolean": "boolean",
}


@dataclass(frozen=True)
class PreparedCall:
    """A valid call, ready for consent and whatever runs it."""

    tool: str
    kind: CallKind
    arguments: dict[str, Value]
    argv: tuple[str, ...]
    workdir: Path
    timeout: float | None
    env: Mapping[str, str] = field(default_factory=dict)
    bash_command: str | None = None
    mcp: McpTool | None = None

    @property
    def rendered_arguments(self) -> dict[str, str]:
        return {k: render_value(v) for k, v in self.arguments.items()}


def bash_tool(directory: Path) -> ToolSpec:
    """The built-in bash as a declared tool over `bash -c`: same validation, echo and limits."""
    command = ParamSpec(
        "command", "string", "The command line, run by bash -c.", required=True, allow_dash=True
    )
    return ToolSpec(
        name="bash",
        description="Run a shell command with bash and return its exit code and output.",
        params=(command,),
        command=("bash", "-c", "{{command}}"),
        workdir=directory,
    )


def read_skill_tool(agent: AgentConfig) -> ToolSpec:
    names = ", ".join(s.name for s in agent.skills) or "none"
    return ToolSpec(
        name="read_skill",
        description=(
            "Read a skill listed in the system prompt: its instructions say which command to run "
            "with bash for one kind of request. Call it before you act on a request, with the "
            "name of the skill that matches it."
        ),
        params=(
            ParamSpec(
                "name",
                "string",
                f"The skill's name: one of {names}.",
                required=True,
                allow_dash=True,
            ),
        ),
        command=("read_skill",),
        workdir=agent.directory,
    )


def mcp_tool_spec(tool: McpTool, directory: Path) -> ToolSpec:
    """An MCP tool as the model sees it: its schema's properties, required ones marked. A
    parameter behind a reference or `Optional[...]` is read as what it is (a pydantic enum is
    a string with allowed values); one that is no scalar is sent the schema
    `tools.mcp_schema` makes of its own."""
    properties = tool.input_schema.get("properties")
    defs = tool.input_schema.get("$defs")
    listed = tool.input_schema.get("required")
    required = {r for r in listed if isinstance(r, str)} if isinstance(listed, list) else set()
    params = []
    for name, raw in (properties if isinstance(properties, dict) else {}).items():
        prop = resolved(raw, defs)
        enum = prop.get("enum")
        # A null among the allowed values is no value a call can send (null is absent).
        allowed = [v for v in enum if v is not None] if isinstance(enum, list) else []
        kind = _SCHEMA_TYPES.get(str(prop.get("type")), "json")
        params.append(
            ParamSpec(
                name=name,
                type=kind,
                description=str(prop.get("description") or prop.get("title") or ""),
                required=name in required,
                enum=tuple(allowed) if allowed else None,
                default=prop.get("default"),
                allow_dash=True,  # no argv: an MCP value cannot become an option
                schema=sent_schema(prop, defs) if kind == "json" else None,
            )
        )
    return ToolSpec(
        name=tool.exposed_name,
        description=f"MCP tool from server {tool.server}: {tool.description}",
        params=tuple(params),
        command=("mcp",),
        workdir=directory,
    )


def read_skill_call(name: str) -> str:
    """The read_skill call that reads skill `name`, written as the tool call itself: small
    models copy a call they see more readily than they follow a description of one."""
    return f'{{"name": "read_skill", "arguments": {{"name": "{name}"}}}}'


def skill_answer(body: str, bash: bool) -> str:
    """What read_skill answers: the skill's body, then what to do with it for this request.
    Without the last line small models run a skill's example with its placeholders
    (`./release.sh VERSION`) or stop after reading."""
    then = (
        "call bash now with its command, the request's values in place of the words in capitals"
        if bash
        else "do now what it says, with the request's values"
    )
    return f"{body.rstrip()}\n\nFor this request: {then}."


def skills_catalogue(agent: AgentConfig) -> str:
    """What the system prompt lists when read_skill is on: each skill with the call that reads
    it, and when to make it. Small models call a skill's name as if it were a tool: the first
    line says it is not one."""
    then = (
        "it tells you which command to run with bash, with the request's values in place of "
        "the words in capitals"
        if "bash" in agent.builtins
        else "it tells you what to do"
    )
    lines = [
        "Skills are instructions, not tools: never call a skill's name. Before you act on a "
        f"request, read the skill that matches it with the read_skill tool; {then}.",
        "The skills, each with the call that reads it:",
    ]
    for skill in agent.skills:
        keywords = f" (keywords: {', '.join(skill.keywords)})" if skill.keywords else ""
        lines.append(
            f"- {skill.name}: {skill.description}{keywords} Read it: {read_skill_call(skill.name)}"
        )
    return "\n".join(lines)


class Toolbox:
    def __init__(self, agent: AgentConfig, mcp_tools: Sequence[McpTool] = ()) -> None:
        self.agent = agent
        kinds: dict[str, tuple[ToolSpec, CallKind, McpTool | None]] = {
            t.name: (t, "command", None) for t in agent.tools
        }
        if "bash" in agent.builtins:
            kinds["bash"] = (bash_tool(agent.directory), "command", None)
        if "read_skill" in agent.builtins:
            kinds["read_skill"] = (read_skill_tool(agent), "skill", None)
        shadowed: list[McpTool] = []
        for tool in mcp_tools:
            if tool.exposed_name in kinds:
                shadowed.append(tool)
                continue
            kinds[tool.exposed_name] = (mcp_tool_spec(tool, agent.directory), "mcp", tool)
        self._tools = kinds
        # The MCP tools left out: a declared tool (or a built-in) has their name, and wins.
        self.shadowed = tuple(shadowed)

    @property
    def names(self) -> list[str]:
        return sorted(self._tools)

    @property
    def text_call_names(self) -> list[str]:
        """The names a call written as text is taken for: the tools, and the skills' names when
        read_skill is on, so that a skill written as a call is answered with how to read it."""
        skills = [s.name for s in self.agent.skills] if "read_skill" in self._tools else []
        return sorted({*self._tools, *skills})

    def mcp_spec(self, name: str) -> ToolSpec | None:
        """The MCP tool of that name as the model sees it; None for any other name."""
        spec, kind, _ = self._tools.get(name, (None, "command", None))
        return spec if kind == "mcp" else None

    def unknown_tool_answer(self, name: str) -> str:
        """What a call of a tool that does not exist is answered with: what to do instead."""
        answer = (
            f"There is no tool named '{name}'. The tools are: {', '.join(self.names) or 'none'}."
        )
        skill = next((s for s in self.agent.skills if s.name.lower() == name.lower()), None)
        if skill is not None and "read_skill" in self._tools:
            then = "which command to run with bash" if "bash" in self._tools else "what to do"
            answer += (
                f" '{name}' is a skill, not a tool: read it with read_skill now, with exactly "
                f"this call: {read_skill_call(skill.name)}. It tells you {then}."
            )
        return answer

    def schemas(self, masker: Masker) -> list[JsonObject]:
        """What the model is sent: each tool's schema, its descriptions masked (a secret can
        stand in one, where a parameter's example is written); names and types are structure,
        never touched."""
        return [model_schema(s, masker) for s, _, _ in self._tools.values()]

    def prepare(
        self, name: str, raw_arguments: str | None, said: str | None = None, *, masker: Masker
    ) -> PreparedCall | InvalidCall | None:
        """Validate a call; None when no tool has that name. With `said`, a value copied from a
        parameter's example that nothing said holds is invalid (see `validate_call`). An
        invalid call's answer quotes what the model sent, masked by `masker`."""
        entry = self._tools.get(name)
        if entry is None:
            return None
        spec, kind, mcp = entry
        # read_skill's names are listed in its description as its allowed values, like an enum.
        result = validate_call(
            spec, raw_arguments, said if kind != "skill" else None, masker=masker
        )
        if not isinstance(result, ValidCall):
            return result
        command = result.arguments.get("command") if name == "bash" else None
        return PreparedCall(
            tool=name,
            kind=kind,
            arguments=result.arguments,
            argv=result.argv if kind == "command" else (),
            workdir=spec.workdir,
            timeout=spec.timeout,
            env=spec.env,
            bash_command=command if isinstance(command, str) else None,
            mcp=mcp,
        )
