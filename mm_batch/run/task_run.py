"""One task run: open its tools, drive the loop, run its `check`, and judge what really ran."""

from __future__ import annotations

import time
import traceback
from typing import assert_never

from mm_batch.config.secrets import Masker
from mm_batch.plan import RunSpec
from mm_batch.run.calls import CallHandler
from mm_batch.run.context import RunContext
from mm_batch.run.in_flight import check_running
from mm_batch.run.judge import CheckRun, judge, verdict
from mm_batch.run.loop import INTERRUPTED, AgentLoop, Answered, Errored, Failed, LoopEnd
from mm_batch.run.output import captured_text, echo
from mm_batch.run.ports import McpError, SandboxError
from mm_batch.run.pristine import MissingAtStartError, replaced
from mm_batch.run.records import (
    Check,
    RunRecorder,
    RunResult,
    Status,
    TaskRecord,
    ToolRecord,
)
from mm_batch.run.toolbox import Toolbox

CHECK_TIMEOUT_S = 120.0
CHECK_OUTPUT_SHOWN = 500


class _SandboxFailedError(Exception):
    """The sandbox broke during the check: the run cannot be judged."""


def internal_error(exc: BaseException) -> str:
    return f"internal error: {type(exc).__name__}: {exc}"


def finish(
    spec: RunSpec,
    recorder: RunRecorder,
    status: Status,
    reason: str,
    duration_s: float,
    *,
    checks: tuple[Check, ...] = (),
    answer: str | None = None,
    trace: str | None = None,
) -> RunResult:
    """Write the run's task record (its last) and build what the reports need, masked. When
    another thread closed the run first (the supervisor gave up on it), that record stands."""
    masker = recorder.masker
    final = recorder.close_with(
        TaskRecord(
            status=status,
            reason=reason,
            checks=checks,
            duration_s=duration_s,
            answer=answer,
            prompt=spec.task.prompt,
            rerun=spec.rerun,
            traceback=trace,
        )
    )
    tools = recorder.tools()
    lines = [_call_line(r, masker) for r in tools]
    return RunResult(
        run_id=masker.text(spec.run_id),
        task=masker.text(spec.task.id),
        model=masker.text(spec.model),
        repeat=spec.repeat,
        status=final.status,
        reason=masker.text(final.reason),
        checks=tuple(c.masked(masker) for c in final.checks),
        duration_s=final.duration_s,
        answer=None if final.answer is None else masker.text(final.answer),
        calls=tuple(lines),
        failed_calls=tuple(line for r, line in zip(tools, lines, strict=True) if _shows_stderr(r)),
        line=spec.task.line,
        index=spec.index,
        rerun=spec.rerun,
    )


STDERR_TAIL = 2048  # characters of a failing call's stderr shown in the reports


def _shows_stderr(record: ToolRecord) -> bool:
    """A call that exited non-zero with something on stderr: the reports show its tail."""
    return record.exit_code not in (None, 0) and bool(record.stderr)


def _call_line(record: ToolRecord, masker: Masker) -> str:
    """A call as the reports list it; a non-zero exit shows the end of its stderr, masked first."""
    line = f"[{record.outcome}] {record.tool} {record.raw_arguments or ''}".rstrip()
    if record.argv is not None and record.started:
        line += f"\n    {echo(masker.argv(record.argv))}  -> exit {record.exit_code}"
    if record.reason:
        line += f"\n    {record.reason}"
    line = masker.text(line)
    if _shows_stderr(record):
        stderr = masker.text(record.stderr or "", cut=record.truncated).rstrip("\n")
        label = "stderr" if len(stderr) <= STDERR_TAIL else f"stderr, last {STDERR_TAIL} characters"
        tail = stderr[-STDERR_TAIL:]
        line += f"\n    {label}:" + "".join(f"\n      {part}" for part in tail.split("\n"))
    return line


class TaskRun:
    def __init__(self, context: RunContext) -> None:
        self.context = context
        self.spec = context.spec
        self.masker: Masker = context.masker

    def run(self) -> RunResult:
        context = self.context
        started = time.monotonic()
        task = self.spec.task
        deadline = started + task.timeout
        trace: str | None = None
        end: LoopEnd
        try:
            toolbox = self._open_toolbox()
            end = AgentLoop(context, toolbox, CallHandler(context, toolbox)).run(deadline)
        except McpError as exc:
            end = Errored(str(exc))
        except Exception as exc:
            end = Errored(internal_error(exc))
            trace = traceback.format_exc()
        answer: str | None = None
        failure: str | None = None
        error: str | None = None
        match end:
            case Answered(answer=answer):
                pass
            case Failed(reason=failure, answer=answer):
                pass
            case Errored(reason=error):
                pass
            case unreachable:
                assert_never(unreachable)
        if error is None:
            # The last call's sweep runs off its path: a leftover it could not end makes the
            # run an error, whether or not a check would have waited for it.
            error = context.executor.settled()
        check_run = None
        if error is None and task.expect is not None and task.expect.check is not None:
            try:
                with context.in_flight.doing(check_running(task.expect.check[0])):
                    check_run = self._run_check(task.expect.check)
            except _SandboxFailedError as exc:
                error = str(exc)
            if context.cancel.is_set():
                error = INTERRUPTED
        checks = judge(task.expect, context.recorder.tools(), answer, check_run)
        judged = verdict(error, failure, checks)
        return finish(
            self.spec,
            context.recorder,
            judged.status,
            judged.reason,
            time.monotonic() - started,
            checks=tuple(checks),
            answer=answer,
            trace=trace,
        )

    def _open_toolbox(self) -> Toolbox:
        """List the MCP servers' tools; an expected MCP tool no server offers, or an argument
        its server does not list (a typo would leave a `times: 0` check unfailable), is an
        error."""
        agent = self.spec.task.agent
        tools = [t for server in agent.mcp for t in self.context.mcp.list_tools(server)]
        toolbox = Toolbox(agent, tools)
        for tool in toolbox.shadowed:
            self.context.notices.warn(
                f"mm-batch: warning: MCP tool {tool.exposed_name} of server {tool.server} has "
                "the name of a declared tool; the declared tool wins"
            )
        expect = self.spec.task.expect
        if expect is not None:
            named = {c.tool for c in expect.calls} | set(expect.no_calls) | set(expect.refused)
            prefixes = tuple(f"{s.name}_" for s in agent.mcp)
            missing = sorted(n for n in named if n.startswith(prefixes) and n not in toolbox.names)
            if missing:
                raise McpError(f"expect names {', '.join(missing)}, which no MCP server offers")
            for call in expect.calls:
                spec = toolbox.mcp_spec(call.tool)
                if spec is None:
                    continue
                listed = {p.name for p in spec.params}
                unlisted = sorted(set(call.args or {}) - listed)
                if unlisted:
                    raise McpError(
                        f"expect gives {call.tool} {', '.join(unlisted)}, which its server "
                        f"does not list (it lists: {', '.join(sorted(listed)) or 'nothing'})"
                    )
        return toolbox

    def _run_check(self, argv: tuple[str, ...]) -> CheckRun:
        """Run `check` where the tools run, from copies of its files read at start."""
        agent = self.spec.task.agent
        executor = self.context.executor
        try:
            files, unread = self.context.pristine.check_files(agent.directory, argv)
            moved = executor.changed(agent.directory, unread, check=True) if unread else None
            if moved is not None:
                raise MissingAtStartError(moved.refusal())
        except MissingAtStartError as exc:
            return CheckRun(None, str(exc))
        if files:
            try:
                copies = executor.protect(dict(files.values()))
            except SandboxError as exc:
                raise _SandboxFailedError(f"the sandbox failed during check: {exc}") from exc
            argv = replaced(argv, {i: copies[path] for i, (path, _) in files.items()})
        result = executor.execute_check(argv, agent.directory, CHECK_TIMEOUT_S, self.context.cancel)
        if result.sandbox_failed:
            raise _SandboxFailedError(f"the sandbox failed during check: {result.error}")
        if result.error is not None:
            return CheckRun(None, self.masker.text(result.error))
        output = (
            captured_text(result.stdout, self.masker) + captured_text(result.stderr, self.masker)
        ).strip()
        if result.timed_out:
            return CheckRun(None, f"timed out after {CHECK_TIMEOUT_S:g} s")
        return CheckRun(result.exit_code, output[-CHECK_OUTPUT_SHOWN:])
