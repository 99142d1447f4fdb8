"""One tool call: validate, consent, hooks, run it where it runs, and record what happened."""

from __future__ import annotations

import decimal
import json
import time
from collections.abc import Mapping
from dataclasses import dataclass
from decimal import Decimal
from typing import assert_never

from mm_batch.config.model import AgentConfig, McpServerSpec, Value
from mm_batch.config.secrets import Masker, head
from mm_batch.jsontypes import JsonObject
from mm_batch.run.context import RunContext
from mm_batch.run.output import captured_text, decode, model_result
from mm_batch.run.ports import (
    ExecResult,
    McpAnswer,
    McpError,
    McpErrorAnswer,
    ToolCallRequest,
)
from mm_batch.run.pristine import MissingAtStartError
from mm_batch.run.records import HookRecord, Outcome, ToolRecord
from mm_batch.run.toolbox import PreparedCall, Toolbox, skill_answer
from mm_batch.tools.consent import Decision, decide
from mm_batch.tools.declared import InvalidCall

HOOK_TIMEOUT_S = 30.0
HOOK_OUTPUT_KEPT = 4096


_EXACT = decimal.Context(prec=64)  # exact for every coerced number (30 digits, 17 for doubles)


def _key_value(value: Value) -> tuple[str, str]:
    """A coerced value as a call key holds it: a number by the number it is (2 and 2.0, 0 and
    -0.0 are one number), anything else as canonical JSON (so a boolean is never a number)."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        number = Decimal(value) if isinstance(value, int) else Decimal(repr(value))
        return "number", "0" if number == 0 else str(number.normalize(_EXACT))
    text = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return "json", text


def call_key(tool: str, arguments: Mapping[str, Value]) -> str:
    """Canonical text of a tool and its coerced arguments: equal for calls with equal values."""
    values = {name: _key_value(value) for name, value in arguments.items()}
    return json.dumps([tool, values], sort_keys=True, separators=(",", ":"), ensure_ascii=True)


def _kept(text: str, masker: Masker) -> str:
    """The first bytes of a hook's output kept in its record, cut after masking."""
    return masker.text(text[:HOOK_OUTPUT_KEPT], cut=len(text) > HOOK_OUTPUT_KEPT)


@dataclass(frozen=True)
class Handled:
    """A call answered (whatever became of it): what the model is sent, and its record."""

    answer: str  # masked
    record: ToolRecord
    deadline_hit: bool = False  # the call ran into the task's deadline


@dataclass(frozen=True)
class SandboxFailed:
    """The sandbox broke during the call: the run cannot go on, nor be judged."""

    record: ToolRecord
    reason: str


CallResult = Handled | SandboxFailed


@dataclass(frozen=True)
class _HookPassed:
    record: HookRecord


@dataclass(frozen=True)
class _HookRefused:
    """A preToolCall hook that failed: the call is refused with `refusal`."""

    record: HookRecord
    refusal: str


_HookRun = _HookPassed | _HookRefused


@dataclass(frozen=True)
class _Ran:
    outcome: Outcome
    reason: str | None
    answer: str
    started: bool
    result: ExecResult | None = None


class CallHandler:
    """Handles the calls of one task run, one at a time."""

    def __init__(self, context: RunContext, toolbox: Toolbox) -> None:
        self.context = context
        self.agent: AgentConfig = context.spec.task.agent
        self.toolbox = toolbox
        self.masker: Masker = context.masker

    def _record(
        self,
        call: ToolCallRequest,
        outcome: Outcome,
        prepared: PreparedCall | None = None,
        *,
        started: bool = False,
        reason: str | None = None,
        rule: str | None = None,
        result: ExecResult | None = None,
        answer: str | None = None,
        hooks: dict[str, HookRecord] | None = None,
    ) -> ToolRecord:
        exit_code = result.exit_code if result is not None else None
        if result is None and outcome == "ran":
            exit_code = 0  # a skill read or an MCP result: nothing exited, nothing failed
        return ToolRecord(
            tool=call.name,
            raw_arguments=call.raw_arguments,
            arguments=prepared.arguments if prepared is not None else None,
            outcome=outcome,
            started=started,
            where=self._where(prepared),
            recovered_from_text=call.recovered_from_text,
            reason=reason,
            rule=rule,
            argv=prepared.argv if prepared is not None and prepared.kind == "command" else None,
            exit_code=exit_code,
            duration_s=result.duration_s if result is not None else None,
            stdout=decode(result.stdout.data, result.stdout.cut) if result is not None else answer,
            stderr=decode(result.stderr.data, result.stderr.cut) if result is not None else None,
            stdout_bytes=result.stdout.total if result is not None else None,
            stderr_bytes=result.stderr.total if result is not None else None,
            truncated=bool(result is not None and (result.stdout.cut or result.stderr.cut)),
            hooks=hooks or {},
        )

    def _where(self, prepared: PreparedCall | None) -> str:
        if prepared is not None and prepared.kind == "mcp" and prepared.mcp is not None:
            return f"mcp:{prepared.mcp.server}"
        if prepared is not None and prepared.kind == "skill":
            return "skill"
        return self.context.executor.where

    def handle(self, call: ToolCallRequest, deadline: float, said: str | None = None) -> CallResult:
        """Handle one call; `said`: what the model was told so far, to answer a copied example."""
        prepared = self.toolbox.prepare(call.name, call.raw_arguments, said, masker=self.masker)
        if prepared is None:
            answer = self.toolbox.unknown_tool_answer(call.name)
            reason = f"no tool named '{call.name}'"
            return Handled(self.masker.text(answer), self._record(call, "invalid", reason=reason))
        if isinstance(prepared, InvalidCall):
            reason = "; ".join(prepared.problems)
            record = self._record(call, "invalid", reason=reason)
            return Handled(self.masker.text(prepared.answer), record)
        decision = self._consent(prepared)
        if not decision.allowed:
            reason = decision.reason or "refused"
            record = self._record(call, "refused", prepared, reason=reason)
            return Handled(self.masker.text(reason), record)
        hooks: dict[str, HookRecord] = {}
        arguments: JsonObject = dict(prepared.arguments)
        described: JsonObject = {
            "tool": call.name,
            "arguments": arguments,
            "argv": [*prepared.argv],
        }
        pre = self.agent.hooks.pre_tool_call
        if pre is not None:
            hook = self._hook(pre, described)
            hooks["preToolCall"] = hook.record
            if isinstance(hook, _HookRefused):
                record = self._record(call, "refused", prepared, reason=hook.refusal, hooks=hooks)
                return Handled(self.masker.text(hook.refusal), record)
        remaining = deadline - time.monotonic()
        timeout = max(min(prepared.timeout or remaining, remaining), 0.001)
        if prepared.kind == "skill":
            ran = self._read_skill(prepared)
        elif prepared.kind == "mcp":
            ran = self._call_mcp(prepared, timeout)
        else:
            ran = self._run_command(prepared, timeout)
        post = self.agent.hooks.post_tool_call
        if post is not None and ran.outcome != "invalid":
            result = ran.result
            payload: JsonObject = {
                **described,
                "outcome": ran.outcome,
                "exit_code": result.exit_code if result is not None else None,
                "stdout": captured_text(result.stdout, self.masker) if result else ran.answer,
                "stderr": captured_text(result.stderr, self.masker) if result else "",
            }
            hooks["postToolCall"] = self._hook(post, payload).record
        record = self._record(
            call,
            ran.outcome,
            prepared,
            started=ran.started,
            reason=ran.reason,
            rule=decision.rule,
            result=ran.result,
            answer=ran.answer,
            hooks=hooks,
        )
        result = ran.result
        if result is not None and result.sandbox_failed:
            return SandboxFailed(record, f"the sandbox failed: {result.error}")
        hit = bool(result and result.timed_out and time.monotonic() >= deadline - 0.01)
        return Handled(ran.answer, record, deadline_hit=hit)

    def same_call_key(self, call: ToolCallRequest) -> str | None:
        """What makes two calls the same call for the rules that answer a call without running
        it (SPEC §2): the tool and its coerced arguments, so that `{"n": 1}` and `{"n": "1"}`
        are one call. None when the call is not valid: it cannot be a call that ran."""
        prepared = self.toolbox.prepare(call.name, call.raw_arguments, masker=self.masker)
        if not isinstance(prepared, PreparedCall):
            return None
        return call_key(prepared.tool, prepared.arguments)

    def repeatable(self, name: str) -> bool:
        """Whether the same call right after it ran runs again (`repeatable: true`: polling)."""
        tool = self.agent.tool(name)
        return tool is not None and tool.repeatable

    def _consent(self, prepared: PreparedCall) -> Decision:
        if prepared.kind == "skill":
            # read_skill runs nothing: it reads the agent's own skills, so it needs no consent.
            return Decision(True, "read_skill")
        return decide(
            self.context.spec.yolo,
            self.agent.allow,
            prepared.tool,
            prepared.rendered_arguments,
            prepared.bash_command,
            self.masker,
        )

    def _run_command(self, prepared: PreparedCall, timeout: float) -> _Ran:
        # Programs of the agent's folder run as they were read at start (SPEC 3).
        context = self.context
        try:
            programs, unread = context.pristine.programs(
                prepared.workdir, prepared.argv, self.agent.directory
            )
            moved = context.executor.changed(prepared.workdir, unread) if unread else None
            if moved is not None:
                raise MissingAtStartError(moved.refusal())
        except MissingAtStartError as exc:
            refusal = f"not run: {exc} (a command may have written it since)"
            return _Ran("error", refusal, refusal, started=False)
        result = context.executor.execute(
            prepared.argv,
            prepared.workdir,
            prepared.env,
            timeout,
            context.cancel,
            programs=programs,
        )
        outcome: Outcome = "ran"
        reason = None
        if result.error is not None:
            outcome, reason = "error", result.error
        elif result.timed_out:
            outcome, reason = "timeout", f"stopped after {timeout:g} s"
        elif result.interrupted:
            outcome, reason = "error", "interrupted"
        answer = model_result(prepared.argv, result, timeout, self.masker)
        return _Ran(outcome, reason, answer, result.started, result)

    def _read_skill(self, prepared: PreparedCall) -> _Ran:
        name = prepared.arguments.get("name")
        skill = next((s for s in self.agent.skills if s.name == name), None)
        if skill is None:
            known = ", ".join(s.name for s in self.agent.skills) or "none"
            answer = f"There is no skill named {name!r}. The skills: {known}."
            return _Ran("invalid", f"no skill named {name!r}", self.masker.text(answer), False)
        # Served from what was read at start: a skill file changed during the run changes nothing.
        answer = skill_answer(skill.body, "bash" in self.agent.builtins)
        return _Ran("ran", None, self.masker.text(answer), True)

    def _call_mcp(self, prepared: PreparedCall, timeout: float) -> _Ran:
        assert prepared.mcp is not None
        server: McpServerSpec = next(s for s in self.agent.mcp if s.name == prepared.mcp.server)
        arguments: JsonObject = dict(prepared.arguments)
        try:
            answered = self.context.mcp.call_tool(server, prepared.mcp.name, arguments, timeout)
        except McpError as exc:
            # Whether the server acted before it failed is unknowable: count it as started.
            answer = self.masker.text(f"The tool could not be called: {exc}")
            return _Ran("error", str(exc), answer, True)
        match answered:
            case McpErrorAnswer(text):
                masked = self.masker.text(text)  # before the cut: a straddling secret leaks nothing
                reason = f"the MCP tool answered an error: {head(masked, 500)}"
                return _Ran("error", reason, masked, True)
            case McpAnswer(text):
                return _Ran("ran", None, self.masker.text(text), True)
            case unreachable:
                assert_never(unreachable)

    def _hook(self, argv: tuple[str, ...], payload: JsonObject) -> _HookRun:
        """Run a hook with the call as JSON on stdin: its record, and the refusal when it
        failed (a post-call hook's refusal refuses nothing: the call has run)."""
        context = self.context
        sent = self.masker.data(payload, keys=False)
        data = json.dumps(sent, ensure_ascii=True, default=str).encode()
        try:
            program = context.pristine.hook_argv(self.agent.directory, argv)
        except MissingAtStartError as exc:
            record = HookRecord(argv, None, "", "", timed_out=False, error=str(exc))
            return _HookRefused(record, f"refused by the preToolCall hook: it could not run: {exc}")
        result = context.hooks.execute(
            program, self.agent.directory, {}, HOOK_TIMEOUT_S, context.cancel, stdin=data
        )
        # Masked before the cut: a secret straddling it leaks no prefix.
        stdout = captured_text(result.stdout, self.masker).strip()
        record = HookRecord(
            argv=argv,
            exit_code=result.exit_code,
            stdout=_kept(stdout, self.masker),
            stderr=_kept(captured_text(result.stderr, self.masker).strip(), self.masker),
            timed_out=result.timed_out,
            error=result.error,
        )
        if result.error is not None:
            return _HookRefused(
                record, f"refused by the preToolCall hook: it could not run: {result.error}"
            )
        if result.timed_out:
            return _HookRefused(
                record, f"refused by the preToolCall hook: it timed out after {HOOK_TIMEOUT_S:g} s"
            )
        if result.exit_code != 0:
            return _HookRefused(
                record, stdout or f"refused by the preToolCall hook (exit {result.exit_code})"
            )
        return _HookPassed(record)
