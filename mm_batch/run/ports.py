"""The small protocols a task run talks through, and the plain data that crosses them.

The effect adapters (`mm_batch.effects`: host processes, Docker, litellm, MCP) implement these;
the run stage imports only this module, so the loop is tested with scripted fakes, not mocks.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from mm_batch.config.model import McpServerSpec
from mm_batch.jsontypes import JsonObject, JsonValue

# -- commands --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Captured:
    """The first bytes a stream carried (at most the limit), and how many it carried in all."""

    data: bytes
    total: int

    @property
    def cut(self) -> int:
        return self.total - len(self.data)


EMPTY = Captured(b"", 0)


@dataclass(frozen=True)
class ExecResult:
    """How one argv command went. `started` is true once the program was really started."""

    exit_code: int | None
    stdout: Captured
    stderr: Captured
    duration_s: float
    timed_out: bool = False
    interrupted: bool = False
    error: str | None = None  # the command could not start, or the sandbox failed
    sandbox_failed: bool = False  # the run cannot go on: its task run ends as an error
    # Conservative by default: a command is taken as started unless the executor knows better,
    # so that a negative check (`no_calls`, `times: 0`) can never pass by mistake.
    started: bool = True


@dataclass(frozen=True)
class PinnedProgram:
    """A program of a tool's argv (argv[0], or an interpreter's script) that named a file of the
    agent's folder at start: what the executor runs is `content`, read then."""

    index: int  # in the argv
    entry: str  # as written, relative to the call's workdir
    path: Path  # the file it named at start
    content: bytes


@dataclass(frozen=True)
class UnreadProgram:
    """A program of a call's argv (or a check's) that names a path in the agent's folder where
    mm-batch read no file at start: what was there then, which must still be there when the
    call runs: the same link (`link`, its target: a link out of the folder) or nothing (None:
    a program a command may have written since is never run)."""

    entry: str  # as written, relative to the call's workdir
    link: str | None

    def refusal(self) -> str:
        if self.link is None:
            return f"{self.entry} was not a file of the agent's folder when the run started"
        return f"{self.entry} is no longer the link it was when the run started"


class SandboxError(Exception):
    """The sandbox cannot be used: engine down, image missing, container gone."""


class Executor(Protocol):
    """Runs argv commands somewhere (the host, a container) with one interface."""

    @property
    def where(self) -> str: ...

    def execute(
        self,
        argv: Sequence[str],
        workdir: Path,
        env: Mapping[str, str],
        timeout: float,
        cancel: threading.Event | None = None,
        *,
        programs: Sequence[PinnedProgram] = (),
    ) -> ExecResult:
        """Run a tool's argv; each of `programs` runs as it was read at start: in place while
        its file still holds that, else from a copy no command of the run can change."""
        ...

    def changed(
        self, workdir: Path, unread: Sequence[UnreadProgram], *, check: bool = False
    ) -> UnreadProgram | None:
        """The first of `unread` that is no longer what it was at start where this executor
        runs commands, as a tool (or, with `check`, a check) sees it; None when none is."""
        ...

    def protect(self, files: Mapping[Path, bytes]) -> dict[Path, str]:
        """Place pristine copies of files read at start (a `check` program) where no command of
        the run can change them; return, for each, the path to run: the original in place when
        it still holds the bytes read at start (its own folder at hand), else the copy."""
        ...

    def execute_check(
        self, argv: Sequence[str], workdir: Path, timeout: float, cancel: threading.Event | None
    ) -> ExecResult:
        """Run a task's `check` where its tools ran, out of their reach (in docker: as a uid no
        tool has, with scratch space no tool can write or fill)."""
        ...

    def settled(self) -> str | None:
        """Wait until what the calls left running is cleared away (in docker, the sweep after
        the last call); why it could not be, if it could not (the task run is then an error)."""
        ...

    def close(self) -> None: ...


class HookRunner(Protocol):
    """Runs a hook on the host with the call as JSON on its stdin."""

    def execute(
        self,
        argv: Sequence[str],
        workdir: Path,
        env: Mapping[str, str],
        timeout: float,
        cancel: threading.Event | None = None,
        *,
        stdin: bytes | None = None,
    ) -> ExecResult: ...


# -- models ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class ToolCallRequest:
    id: str
    name: str
    raw_arguments: str | None
    recovered_from_text: bool = False
    # The provider's own parts of this call, as they came (a Gemini thought signature): the
    # history sends them back unchanged (SPEC 6).
    provider_fields: Mapping[str, JsonValue] = field(default_factory=dict, hash=False)


@dataclass(frozen=True)
class ModelReply:
    text: str | None
    tool_calls: tuple[ToolCallRequest, ...]
    finish_reason: str | None
    prompt_tokens: int | None
    completion_tokens: int | None
    latency_s: float
    attempts: int = 1
    cost_usd: float | None = None  # by litellm's bundled price map; None where it knows none
    cached: bool = False  # answered from the response cache: no model was asked
    # The assistant turn's provider-specific parts, as they came (Anthropic thinking blocks with
    # their signatures, Bedrock reasoning, Gemini thought signatures): the history sends them
    # back unchanged, or a reasoning model's next turn is refused (SPEC 6).
    provider_parts: Mapping[str, JsonValue] = field(default_factory=dict, hash=False)


class ModelError(Exception):
    """The model could not give an answer (unreachable after retries, or a refused request)."""


class ModelDeadlineError(ModelError):
    """The task's deadline came before the model answered (a call, a retry or its backoff)."""


class ModelRateLimitError(ModelDeadlineError):
    """The provider answered 429 and asked for a wait that would pass the task's deadline: the
    run fails with this reason (SPEC 6). `attempts`: the requests sent for the turn (0 when it
    waited on another run's 429 and sent none); `latency_s`: how long the turn took."""

    def __init__(self, reason: str, *, attempts: int, latency_s: float) -> None:
        super().__init__(reason)
        self.attempts = attempts
        self.latency_s = latency_s


class ModelClient(Protocol):
    def complete(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]], timeout: float
    ) -> ModelReply:
        """One model turn; `timeout` is what is left of the task: no retry may outlive it."""
        ...


# -- MCP -------------------------------------------------------------------------------------


class McpError(Exception):
    """An MCP server could not be reached or did not answer."""


@dataclass(frozen=True)
class McpTool:
    server: str
    name: str
    description: str
    input_schema: JsonObject

    @property
    def exposed_name(self) -> str:
        return f"{self.server}_{self.name}"


@dataclass(frozen=True)
class McpAnswer:
    """What an MCP tool answered: the text of its result."""

    text: str


@dataclass(frozen=True)
class McpErrorAnswer:
    """What an MCP tool answered, flagged by the tool as an error (`isError`): its text."""

    text: str


McpResult = McpAnswer | McpErrorAnswer


class McpClient(Protocol):
    def list_tools(self, server: McpServerSpec, timeout: float = 30.0) -> list[McpTool]: ...

    def call_tool(
        self, server: McpServerSpec, name: str, arguments: JsonObject, timeout: float
    ) -> McpResult:
        """Call a tool; a server that cannot be reached or does not answer raises McpError."""
        ...
