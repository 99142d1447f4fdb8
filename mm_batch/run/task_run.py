"""One task run: the agent loop over the model, the tools and the executor, then the verdict."""

from __future__ import annotations

import dataclasses
import json
import threading
import time
import traceback
from dataclasses import dataclass
from typing import Any

from mm_batch.config.secrets import Masker
from mm_batch.plan import RunSpec
from mm_batch.run.ports import ExecResult, Executor, HookRunner, McpClient
from mm_batch.run.judge import Check, judge
from mm_batch.run.ports import McpError
from mm_batch.run.ports import ModelClient, ModelError, ModelReply, ToolCallRequest
from mm_batch.run.output import decode, echo, model_result
from mm_batch.run.records import Outcome, RunRecorder, Status
from mm_batch.run.toolbox import PreparedCall, Toolbox, skills_catalogue
from mm_batch.tools.consent import Decision, decide
from mm_batch.tools.declared import InvalidCall, parse_arguments
from mm_batch.tools.text_calls import recover_tool_calls

CHECK_TIMEOUT_S = 120.0
HOOK_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class RunResult:
    """What the reports need of a finished task run."""

    run_id: str
    task: str
    model: str
    repeat: int
    status: Status
    reason: str
    checks: tuple[Check, ...]
    duration_s: float
    answer: str | None
    calls: tuple[str, ...]


INTERRUPTED = "interrupted before the run finished"


def error_result(spec: RunSpec, reason: str, duration_s: float) -> RunResult:
    """The result of a run that could not be judged (its sandbox failed, it was interrupted)."""
    return RunResult(
        spec.run_id,
        spec.task.id,
        spec.model,
        spec.repeat,
        "error",
        reason,
        (),
        duration_s,
        None,
        (),
    )


class _SandboxFailedError(Exception):
    """The sandbox broke during a call: the run cannot be judged."""


def canonical_arguments(raw: str | None) -> str:
    """The loop detector's key: canonical JSON of the raw arguments, or the raw text itself."""
    data, _ = parse_arguments(raw)
    if data is None:
        return raw or ""
    return json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def _history_arguments(raw: str | None) -> str:
    """Arguments as kept in the history: as sent when valid JSON; servers reject invalid JSON."""
    data, _ = parse_arguments(raw)
    return raw if data is not None and raw and raw.strip() else "{}"


class TaskRun:
    def __init__(
        self,
        spec: RunSpec,
        client: ModelClient,
        executor: Executor,
        recorder: RunRecorder,
        masker: Masker,
        cancel: threading.Event,
        hooks: HookRunner,
        mcp: McpClient,
    ) -> None:
        self.spec = spec
        self.client = client
        self.executor = executor
        self.recorder = recorder
        self.masker = masker
        self.cancel = cancel
        self.toolbox = Toolbox(spec.task.agent)
        self.hooks = hooks  # hooks run on the host, wherever the tools run
        self.mcp = mcp
        self.tool_records: list[dict[str, Any]] = []
        self.call_lines: list[str] = []

    # -- the loop ------------------------------------------------------------------------

    def run(self) -> RunResult:
        started = time.monotonic()
        task = self.spec.task
        deadline = started + task.timeout
        answer: str | None = None
        ended: str | None = None  # why the loop stopped short: a failure
        error: str | None = None  # why the run cannot be judged
        try:
            self.toolbox = self._open_toolbox()
            answer, ended, error = self._loop(deadline)
        except (_SandboxFailedError, McpError) as exc:
            error = str(exc)
        except Exception as exc:
            error = f"internal error: {type(exc).__name__}: {exc}"
            traceback.print_exc()
        check_exit = None
        if error is None and task.expect is not None and task.expect.check is not None:
            try:
                check_exit = self._run_check(task.expect.check)
            except _SandboxFailedError as exc:
                error = str(exc)
            if self.cancel.is_set():
                error = INTERRUPTED
        checks = judge(task.expect, self.tool_records, answer, check_exit)
        status: Status
        if error is not None:
            status, reason = "error", error
        elif ended is not None:
            status, reason = "failed", ended
        elif not all(c.ok for c in checks):
            status = "failed"
            reason = "; ".join(f"{c.name}: {c.detail}" for c in checks if not c.ok)
        else:
            status, reason = "passed", ""
        duration = time.monotonic() - started
        self.recorder.emit(
            "task",
            {
                "status": status,
                "checks": [c.as_record() for c in checks],
                "duration_s": round(duration, 6),
                "reason": reason,
                "answer": answer,
            },
        )
        return RunResult(
            self.spec.run_id,
            task.id,
            self.spec.model,
            self.spec.repeat,
            status,
            self.masker.text(reason),
            tuple(Check(c.name, c.ok, self.masker.text(c.detail)) for c in checks),
            duration,
            None if answer is None else self.masker.text(answer),
            tuple(self.call_lines),
        )

    def _open_toolbox(self) -> Toolbox:
        """List the MCP servers' tools; an expected MCP tool no server offers is an error."""
        agent = self.spec.task.agent
        tools = [t for server in agent.mcp for t in self.mcp.list_tools(server)]
        toolbox = Toolbox(agent, tools)
        expect = self.spec.task.expect
        if expect is not None:
            named = {c.tool for c in expect.calls} | set(expect.no_calls) | set(expect.refused)
            prefixes = tuple(f"{s.name}_" for s in agent.mcp)
            missing = sorted(n for n in named if n.startswith(prefixes) and n not in toolbox.names)
            if missing:
                raise McpError(f"expect names {', '.join(missing)}, which no MCP server offers")
        return toolbox

    def _loop(self, deadline: float) -> tuple[str | None, str | None, str | None]:
        """Returns (answer, failure reason, error reason)."""
        task = self.spec.task
        agent = task.agent
        messages: list[dict[str, Any]] = []
        system = [agent.system] if agent.system else []
        if "read_skill" in agent.builtins and agent.skills:
            system.append(skills_catalogue(agent))
        if system:
            messages.append({"role": "system", "content": "\n\n".join(system)})
        messages.append({"role": "user", "content": task.prompt})
        schemas = self.toolbox.schemas()
        last_key: tuple[str, str] | None = None
        in_a_row = 0
        for _turn in range(task.max_turns):
            if self.cancel.is_set():
                return None, None, INTERRUPTED
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return None, f"task timeout ({task.timeout:g} s) reached", None
            try:
                reply = self.client.complete(self.masker.data(messages), schemas, remaining)
            except ModelError as exc:
                return None, None, str(exc)
            self._record_model(reply)
            messages.append(self._assistant_message(reply))
            if not reply.tool_calls and reply.text and self._recover_text_calls():
                reply = self._with_text_calls(reply)
            if not reply.tool_calls:
                return reply.text or "", None, None
            for call in reply.tool_calls:
                key = (call.name, canonical_arguments(call.raw_arguments))
                in_a_row = in_a_row + 1 if key == last_key else 1
                last_key = key
                if in_a_row >= agent.loop_limit:
                    reason = (
                        f"loop detector: {call.name} asked for {in_a_row} times in a row with "
                        "the same arguments"
                    )
                    self._record_tool(call, "loop", reason=reason)
                    return None, reason, None
                content, hit_deadline = self._handle(call, deadline)
                messages.append(self._result_message(call, self.masker.text(content)))
                if self.cancel.is_set():
                    return None, None, INTERRUPTED
                if hit_deadline:
                    return None, f"task timeout ({task.timeout:g} s) reached", None
        return None, f"max_turns ({task.max_turns}) reached without a final answer", None

    def _recover_text_calls(self) -> bool:
        """On by default for local models, `model_options.recover_text_tool_calls` for others."""
        return self.spec.settings.recover_text_tool_calls

    def _with_text_calls(self, reply: ModelReply) -> ModelReply:
        found = recover_tool_calls(reply.text or "", self.toolbox.names)
        calls = tuple(
            ToolCallRequest(f"text_call_{i}", c.name, c.raw_arguments, recovered_from_text=True)
            for i, c in enumerate(found)
        )
        return dataclasses.replace(reply, tool_calls=calls)

    @staticmethod
    def _result_message(call: ToolCallRequest, content: str) -> dict[str, Any]:
        if call.recovered_from_text:
            # The model's turn held no real tool call to answer: the history stays as it was,
            # and the result comes back as the next user message.
            return {
                "role": "user",
                "content": f"The {call.name} call was answered:\n{content}\n\n"
                "If that settles the request, answer in plain text, without calling a tool.",
            }
        return {"role": "tool", "tool_call_id": call.id, "content": content}

    @staticmethod
    def _assistant_message(reply: ModelReply) -> dict[str, Any]:
        message: dict[str, Any] = {"role": "assistant", "content": reply.text}
        if reply.tool_calls:
            message["tool_calls"] = [
                {
                    "id": c.id,
                    "type": "function",
                    "function": {"name": c.name, "arguments": _history_arguments(c.raw_arguments)},
                }
                for c in reply.tool_calls
            ]
        return message

    # -- one tool call -------------------------------------------------------------------

    def _handle(self, call: ToolCallRequest, deadline: float) -> tuple[str, bool]:
        """Validate, consent, execute and record one call. Returns (answer, task deadline hit)."""
        prepared = self.toolbox.prepare(call.name, call.raw_arguments)
        if prepared is None:
            known = ", ".join(self.toolbox.names) or "none"
            answer = f"There is no tool named '{call.name}'. The tools are: {known}."
            self._record_tool(call, "invalid", reason=f"no tool named '{call.name}'")
            return answer, False
        if isinstance(prepared, InvalidCall):
            self._record_tool(call, "invalid", reason="; ".join(prepared.problems))
            return prepared.answer, False
        if prepared.kind == "skill":
            # read_skill runs nothing: it reads the agent's own skills, so it needs no consent.
            decision = Decision(True, "read_skill")
        else:
            decision = decide(
                self.spec.yolo,
                self.spec.task.agent.allow,
                prepared.tool,
                prepared.rendered_arguments,
                prepared.bash_command,
            )
        if not decision.allowed:
            self._record_tool(call, "refused", prepared, reason=decision.reason)
            return decision.reason or "refused", False
        hooks: dict[str, Any] = {}
        # What both hooks are told of the call; postToolCall also gets how it went.
        described: dict[str, Any] = {
            "tool": call.name,
            "arguments": prepared.arguments,
            "argv": list(prepared.argv),
        }
        pre = self.spec.task.agent.hooks.pre_tool_call
        if pre is not None:
            hooks["preToolCall"], refusal = self._hook(pre, described)
            if refusal is not None:
                self._record_tool(call, "refused", prepared, reason=refusal, hooks=hooks)
                return refusal, False
        remaining = deadline - time.monotonic()
        timeout = max(min(prepared.timeout or remaining, remaining), 0.001)
        if prepared.kind == "skill":
            outcome, reason, answer, result = self._read_skill(prepared)
        elif prepared.kind == "mcp":
            outcome, reason, answer, result = self._call_mcp(prepared, timeout)
        else:
            outcome, reason, answer, result = self._run_command(prepared, timeout)
        post = self.spec.task.agent.hooks.post_tool_call
        if post is not None and outcome != "invalid":
            payload = {
                **described,
                "outcome": outcome,
                "exit_code": result.exit_code if result else None,
                "stdout": decode(result.stdout.data) if result else answer,
                "stderr": decode(result.stderr.data) if result else "",
            }
            hooks["postToolCall"], _ = self._hook(post, payload)
        self._record_tool(
            call,
            outcome,
            prepared,
            reason=reason,
            rule=decision.rule,
            result=result,
            hooks=hooks or None,
            answer=answer,
        )
        if result is not None and result.sandbox_failed:
            raise _SandboxFailedError(f"the sandbox failed: {result.error}")
        hit_deadline = bool(result and result.timed_out and time.monotonic() >= deadline - 0.01)
        return answer, hit_deadline

    def _run_command(
        self, prepared: PreparedCall, timeout: float
    ) -> tuple[Outcome, str | None, str, ExecResult]:
        result = self.executor.execute(
            prepared.argv, prepared.workdir, prepared.env, timeout, self.cancel
        )
        outcome: Outcome = "ran"
        reason = None
        if result.error is not None:
            outcome, reason = "error", result.error
        elif result.timed_out:
            outcome, reason = "timeout", f"stopped after {timeout:g} s"
        elif result.interrupted:
            outcome, reason = "error", "interrupted"
        return outcome, reason, model_result(prepared.argv, result, timeout), result

    def _read_skill(self, prepared: PreparedCall) -> tuple[Outcome, str | None, str, None]:
        name = prepared.arguments.get("name")
        skill = next((s for s in self.spec.task.agent.skills if s.name == name), None)
        if skill is None:
            known = ", ".join(s.name for s in self.spec.task.agent.skills) or "none"
            reason = f"no skill named {name!r}"
            return (
                "invalid",
                reason,
                f"There is no skill named {name!r}. The skills: {known}.",
                None,
            )
        return "ran", None, skill.body, None

    def _call_mcp(
        self, prepared: PreparedCall, timeout: float
    ) -> tuple[Outcome, str | None, str, None]:
        assert prepared.mcp is not None
        server = next(s for s in self.spec.task.agent.mcp if s.name == prepared.mcp.server)
        try:
            is_error, text = self.mcp.call_tool(
                server, prepared.mcp.name, dict(prepared.arguments), timeout
            )
        except McpError as exc:
            return "error", str(exc), f"The tool could not be called: {exc}", None
        if is_error:
            return "error", f"the MCP tool answered an error: {text[:500]}", text, None
        return "ran", None, text, None

    def _hook(
        self, argv: tuple[str, ...], payload: dict[str, Any]
    ) -> tuple[dict[str, Any], str | None]:
        """Run a hook with the call as JSON on stdin: (its record, the refusal when it failed)."""
        data = json.dumps(payload, ensure_ascii=False, default=str).encode()
        result = self.hooks.execute(
            argv, self.spec.task.agent.directory, {}, HOOK_TIMEOUT_S, self.cancel, stdin=data
        )
        stdout = decode(result.stdout.data).strip()
        record = {
            "argv": list(argv),
            "exit_code": result.exit_code,
            "stdout": stdout[:4096],
            "stderr": decode(result.stderr.data).strip()[:4096],
            "timed_out": result.timed_out,
            "error": result.error,
        }
        if result.error is not None:
            return record, f"refused by the preToolCall hook: it could not run: {result.error}"
        if result.timed_out:
            return (
                record,
                f"refused by the preToolCall hook: it timed out after {HOOK_TIMEOUT_S:g} s",
            )
        if result.exit_code != 0:
            return record, stdout or f"refused by the preToolCall hook (exit {result.exit_code})"
        return record, None

    def _record_model(self, reply: ModelReply) -> None:
        self.recorder.emit(
            "model",
            {
                "latency_s": round(reply.latency_s, 6),
                "prompt_tokens": reply.prompt_tokens,
                "completion_tokens": reply.completion_tokens,
                "finish_reason": reply.finish_reason,
                "tool_calls": [
                    {"name": c.name, "arguments": c.raw_arguments} for c in reply.tool_calls
                ],
                "content": reply.text,
                "attempts": reply.attempts,
            },
        )

    def _record_tool(
        self,
        call: ToolCallRequest,
        outcome: Outcome,
        prepared: PreparedCall | None = None,
        *,
        reason: str | None = None,
        rule: str | None = None,
        result: ExecResult | None = None,
        hooks: dict[str, Any] | None = None,
        answer: str | None = None,
    ) -> None:
        record: dict[str, Any] = {
            "tool": call.name,
            "raw_arguments": call.raw_arguments,
            "arguments": prepared.arguments if prepared else None,
            "outcome": outcome,
            "reason": reason,
            "rule": rule,
            "argv": list(prepared.argv) if prepared else None,
            "where": self._where(prepared),
            "started": result.started if result else outcome == "ran",
            "exit_code": result.exit_code if result else (0 if outcome == "ran" else None),
            "duration_s": round(result.duration_s, 6) if result else None,
            "stdout": decode(result.stdout.data) if result else answer,
            "stderr": decode(result.stderr.data) if result else None,
            "stdout_bytes": result.stdout.total if result else None,
            "stderr_bytes": result.stderr.total if result else None,
            "truncated": bool(result and (result.stdout.cut or result.stderr.cut)),
            "recovered_from_text": call.recovered_from_text,
            "hooks": hooks,
        }
        self.recorder.emit("tool", record)
        self.tool_records.append(record)
        line = f"[{outcome}] {call.name} {call.raw_arguments or ''}".rstrip()
        if prepared is not None and result is not None:
            line += f"\n    {echo(prepared.argv)}  -> exit {result.exit_code}"
        if reason:
            line += f"\n    {reason}"
        self.call_lines.append(self.masker.text(line))

    def _where(self, prepared: PreparedCall | None) -> str:
        if prepared is not None and prepared.kind == "mcp" and prepared.mcp is not None:
            return f"mcp:{prepared.mcp.server}"
        if prepared is not None and prepared.kind == "skill":
            return "skill"
        return self.executor.where

    def _run_check(self, argv: tuple[str, ...]) -> tuple[int | None, str]:
        agent = self.spec.task.agent
        result = self.executor.execute(argv, agent.directory, {}, CHECK_TIMEOUT_S, self.cancel)
        if result.sandbox_failed:
            raise _SandboxFailedError(f"the sandbox failed during check: {result.error}")
        if result.error is not None:
            return None, result.error
        output = (decode(result.stdout.data) + decode(result.stderr.data)).strip()
        if result.timed_out:
            return None, f"timed out after {CHECK_TIMEOUT_S:g} s"
        return result.exit_code, output[-500:]
