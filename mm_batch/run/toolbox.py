"""The tools of one task run: declared tools and enabled built-ins, behind one lookup."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mm_batch.config.model import AgentConfig, ParamSpec, ToolSpec, Value, render_value
from mm_batch.tools.declared import InvalidCall, ValidCall, model_schema, validate_call


@dataclass(frozen=True)
class PreparedCall:
    """A valid call, ready for consent and the executor."""

    tool: str
    arguments: dict[str, Value]
    argv: tuple[str, ...]
    workdir: Path
    timeout: float | None
    env: Mapping[str, str] = field(default_factory=dict)
    bash_command: str | None = None

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


class Toolbox:
    def __init__(self, agent: AgentConfig) -> None:
        tools = list(agent.tools)
        if "bash" in agent.builtins:
            tools.append(bash_tool(agent.directory))
        self._tools = {t.name: t for t in tools}

    @property
    def names(self) -> list[str]:
        return sorted(self._tools)

    def schemas(self) -> list[dict[str, Any]]:
        return [model_schema(t) for t in self._tools.values()]

    def prepare(self, name: str, raw_arguments: str | None) -> PreparedCall | InvalidCall | None:
        """Validate a call; None when no tool has that name."""
        tool = self._tools.get(name)
        if tool is None:
            return None
        result = validate_call(tool, raw_arguments)
        if not isinstance(result, ValidCall):
            return result
        command = result.arguments.get("command") if name == "bash" else None
        return PreparedCall(
            tool=name,
            arguments=result.arguments,
            argv=result.argv,
            workdir=tool.workdir,
            timeout=tool.timeout,
            env=tool.env,
            bash_command=command if isinstance(command, str) else None,
        )
