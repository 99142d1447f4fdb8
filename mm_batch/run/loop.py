"""The agent loop: model turns and their tool calls, until an answer, a limit or a failure."""

from __future__ import annotations

import dataclasses
import json
import time
from dataclasses import dataclass

from mm_batch.config.secrets import Masker
from mm_batch.jsontypes import JsonObject
from mm_batch.run.calls import CallHandler, SandboxFailed
from mm_batch.run.context import RunContext
from mm_batch.run.in_flight import WAITING_FOR_THE_MODEL, timeout_reason, tool_running
from mm_batch.run.judge import callless_turn, unfinished_turn
from mm_batch.run.ports import (
    ModelDeadlineError,
    ModelError,
    ModelRateLimitError,
    ModelReply,
    ToolCallRequest,
)
from mm_batch.run.records import CallAsked, ModelRecord, Record, ToolRecord
from mm_batch.run.toolbox import Toolbox, skills_catalogue
from mm_batch.tools.coercion import Parsed, parse_arguments
from mm_batch.tools.text_calls import recover_tool_calls

INTERRUPTED = "interrupted before the run finished"
REPEAT_REASON = "repeat of the call that ran just before it with exit code 0: not run again"
# After a rescued call that ran, the model is told plainly to answer: the 0.5B, given the
# softer "if that settles the request", mostly wrote the same call again (benchmarks/).
ANSWER_NOW = "Now answer my request in one plain sentence. Do not call a tool."
SETTLES = "If that settles the request, answer in plain text, without calling a tool."


@dataclass(frozen=True)
class Answered:
    """The model gave its final answer."""

    answer: str


@dataclass(frozen=True)
class Failed:
    """The run failed (a limit, the loop detector, a turn that ended abnormally). `answer`: the
    text of a turn that ended abnormally, judged (`answer_contains`) but not taken as given."""

    reason: str
    answer: str | None = None


@dataclass(frozen=True)
class Errored:
    """The run cannot be judged: interrupted, the model unreachable, the sandbox broken."""

    reason: str


LoopEnd = Answered | Failed | Errored


def canonical_arguments(raw: str | None) -> str:
    """The loop detector's key: canonical JSON of the raw arguments, or the raw text itself."""
    parsed = parse_arguments(raw)
    if not isinstance(parsed, Parsed):
        return raw or ""
    # parse_arguments bounds digits and depth, so every value it returns can be printed.
    return json.dumps(parsed.data, sort_keys=True, separators=(",", ":"), ensure_ascii=True)


@dataclass(frozen=True)
class _Done:
    """The last call that ran to the end with exit code 0: its tool and coerced arguments
    (`CallHandler.same_call_key`), record and answer."""

    key: str
    record: ToolRecord
    answer: str


def _history_arguments(raw: str | None) -> str:
    """Arguments as kept in the history: as sent when valid JSON; servers reject invalid JSON."""
    valid = isinstance(parse_arguments(raw), Parsed)
    return raw if valid and raw and raw.strip() else "{}"


class AgentLoop:
    """Drives one task run's conversation; every record goes to the run's recorder."""

    def __init__(self, context: RunContext, toolbox: Toolbox, calls: CallHandler) -> None:
        self.context = context
        self.spec = context.spec
        self.masker: Masker = context.masker
        self.in_flight = context.in_flight
        self.toolbox = toolbox
        self.calls = calls

    def emit(self, record: Record) -> None:
        self.context.recorder.emit(record)

    def _first_messages(self) -> list[JsonObject]:
        task = self.spec.task
        agent = task.agent
        system = [agent.system] if agent.system else []
        if "read_skill" in agent.builtins and agent.skills:
            system.append(skills_catalogue(agent))
        messages: list[JsonObject] = []
        if system:
            messages.append({"role": "system", "content": self.masker.text("\n\n".join(system))})
        messages.append({"role": "user", "content": self.masker.text(task.prompt)})
        return messages

    def run(self, deadline: float) -> LoopEnd:
        task = self.spec.task
        timed_out = timeout_reason(task.timeout, None)
        messages = self._first_messages()
        schemas = self.toolbox.schemas(self.masker)
        last_key: tuple[str, str] | None = None
        in_a_row = 0
        done: _Done | None = None  # the call just before, when it ran to the end with exit 0
        # What the model was told that a value can come from: the system prompt, the request,
        # and the output of each call that started; never mm-batch's own answers, which quote
        # what the model sent.
        told = [str(m["content"]) for m in messages]
        answered_invalid: set[str] = set()  # same-call keys, read by the model: it may insist
        for _turn in range(task.max_turns):
            if self.context.cancel.is_set():
                return Errored(INTERRUPTED)
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return Failed(timed_out)
            with self.in_flight.doing(WAITING_FOR_THE_MODEL):
                try:
                    reply = self.context.client.complete(messages, schemas, remaining)
                except ModelRateLimitError as exc:  # a 429 whose wait passes the deadline
                    if exc.attempts:
                        self._record_unanswered(exc.attempts, exc.latency_s)
                    return Failed(str(exc))
                except ModelDeadlineError:
                    return Failed(timeout_reason(task.timeout, self.in_flight.now()))
                except ModelError as exc:
                    if time.monotonic() >= deadline:
                        return Failed(timeout_reason(task.timeout, self.in_flight.now()))
                    return Errored(str(exc))
            reply = self._masked(reply)
            self._record_model(reply)
            messages.append(self._assistant_message(reply))
            # Only a stop or a tool call ends a turn normally: a cut or filtered turn's calls
            # never run, and its text is no final answer (SPEC 6).
            unfinished = unfinished_turn(reply.finish_reason, bool(reply.tool_calls))
            if unfinished is not None:
                return Failed(unfinished, answer=reply.text or "")
            if not reply.tool_calls and reply.text and self.spec.settings.recover_text_tool_calls:
                reply = self._with_text_calls(reply)
            if not reply.tool_calls:
                callless = callless_turn(reply.finish_reason)
                if callless is not None:
                    return Failed(callless, answer=reply.text or "")
                return Answered(reply.text or "")
            invalid_now: set[str] = set()  # read by the model from its next turn
            for call in reply.tool_calls:
                key = (call.name, canonical_arguments(call.raw_arguments))
                in_a_row = in_a_row + 1 if key == last_key else 1
                last_key = key
                if in_a_row >= task.agent.loop_limit:
                    reason = (
                        f"loop detector: {call.name} asked for {in_a_row} times in a row with "
                        "the same arguments"
                    )
                    self.emit(self._loop_record(call, reason))
                    return Failed(reason)
                # Both rules below compare coerced arguments: {"n": 1} and {"n": "1"} are one
                # call (None: the call is invalid, and no earlier call can be the same).
                same = self.calls.same_call_key(call)
                if same is not None and done is not None and done.key == same:
                    # The same call again right after it succeeded: a second release is a
                    # hazard, so it is not run; the model gets the result it already had.
                    self.emit(self._repeat_record(call, done.record))
                    messages.append(self._repeat_message(call, done.answer))
                    continue
                # A call sent again after it was answered invalid is not held to the examples
                # again: the model insists that the value is meant, and one turn was the price.
                said = None if same in answered_invalid else "\n".join(told)
                with self.in_flight.doing(tool_running(call.name)):
                    result = self.calls.handle(call, deadline, said)
                    ran_for = self.in_flight.now()  # what the deadline found running, if it came
                self.emit(result.record)
                if isinstance(result, SandboxFailed):
                    return Errored(result.reason)
                record = result.record
                if record.outcome == "invalid" and same is not None:
                    invalid_now.add(same)
                elif record.started or record.outcome == "ran":
                    told.append(result.answer)
                succeeded = record.outcome == "ran" and record.exit_code == 0
                done = None
                if succeeded and same is not None and not self.calls.repeatable(call.name):
                    done = _Done(same, record, result.answer)
                messages.append(self._result_message(call, result.answer, record.outcome))
                if self.context.cancel.is_set():
                    return Errored(INTERRUPTED)
                if result.deadline_hit or time.monotonic() >= deadline:
                    return Failed(timeout_reason(task.timeout, ran_for))
            answered_invalid |= invalid_now
        return Failed(f"max_turns ({task.max_turns}) reached without a final answer")

    def _loop_record(self, call: ToolCallRequest, reason: str) -> ToolRecord:
        return ToolRecord(
            tool=call.name,
            raw_arguments=call.raw_arguments,
            arguments=None,
            outcome="loop",
            started=False,
            where=self.context.executor.where,
            recovered_from_text=call.recovered_from_text,
            reason=reason,
        )

    def _repeat_record(self, call: ToolCallRequest, earlier: ToolRecord) -> ToolRecord:
        return ToolRecord(
            tool=call.name,
            raw_arguments=call.raw_arguments,
            arguments=earlier.arguments,
            outcome="invalid",
            started=False,
            where=earlier.where,
            recovered_from_text=call.recovered_from_text,
            reason=REPEAT_REASON,
        )

    def _repeat_message(self, call: ToolCallRequest, earlier: str) -> JsonObject:
        content = (
            f"This exact {call.name} call already ran just now, and it was not run again. "
            f"Its result:\n{earlier}"
        )
        if call.recovered_from_text:
            return {"role": "user", "content": f"{content}\n\n{ANSWER_NOW}"}
        return {"role": "tool", "tool_call_id": call.id, "content": f"{content}\n\n{SETTLES}"}

    def _with_text_calls(self, reply: ModelReply) -> ModelReply:
        # A skill's name written as a call is taken too, to be answered with how to read it.
        found = recover_tool_calls(reply.text or "", self.toolbox.text_call_names)
        calls = tuple(
            ToolCallRequest(f"text_call_{i}", c.name, c.raw_arguments, recovered_from_text=True)
            for i, c in enumerate(found)
        )
        return dataclasses.replace(reply, tool_calls=calls)

    def _result_message(self, call: ToolCallRequest, content: str, outcome: str) -> JsonObject:
        if call.recovered_from_text:
            # The model's turn held no real tool call to answer: the history stays as it was,
            # and the result comes back as the next user message. A call that ran asks for
            # the answer; any other outcome leaves the model free to call again, corrected.
            answered = f"The {call.name} call was answered:\n{content}"
            if outcome != "ran" or call.name == "read_skill":
                # Nothing done yet (a call to correct, a skill to follow): no line to stop on.
                return {"role": "user", "content": answered}
            return {"role": "user", "content": f"{answered}\n\n{ANSWER_NOW}"}
        return {"role": "tool", "tool_call_id": call.id, "content": content}

    def _masked(self, reply: ModelReply) -> ModelReply:
        """The provider's words that mm-batch keeps as they came, masked where they enter: the
        finish reason and each call's id and name (a record and the history hold them). The text
        and the arguments are masked wherever they are written or sent, the arguments after the
        call ran with them."""
        calls = tuple(
            dataclasses.replace(
                call, id=self.masker.text(call.id), name=self.masker.text(call.name)
            )
            for call in reply.tool_calls
        )
        finish = None if reply.finish_reason is None else self.masker.text(reply.finish_reason)
        return dataclasses.replace(reply, tool_calls=calls, finish_reason=finish)

    def _assistant_message(self, reply: ModelReply) -> JsonObject:
        text = None if reply.text is None else self.masker.text(reply.text)
        # The provider's own parts go back as they came (signed thinking blocks: SPEC 6).
        parts: JsonObject = self.masker.data(dict(reply.provider_parts), keys=False)
        message: JsonObject = {**parts, "role": "assistant", "content": text}
        if reply.tool_calls:
            message["tool_calls"] = [self._call_message(c) for c in reply.tool_calls]
        return message

    def _call_message(self, call: ToolCallRequest) -> JsonObject:
        """A tool call as the history holds it, with the provider's own parts of it."""
        fields: JsonObject = self.masker.data(dict(call.provider_fields), keys=False)
        function = fields.get("function")
        inner: JsonObject = function if isinstance(function, dict) else {}
        return {
            **fields,
            "id": call.id,
            "type": "function",
            "function": {
                **inner,
                "name": call.name,
                "arguments": self.masker.text(_history_arguments(call.raw_arguments)),
            },
        }

    def _record_unanswered(self, attempts: int, latency_s: float) -> None:
        """The record of a turn whose requests got no answer (SPEC 7: its `attempts`); a
        refused request is not billed, so it cost nothing."""
        self.emit(ModelRecord(latency_s, None, None, None, (), None, attempts, cost_usd=0.0))

    def _record_model(self, reply: ModelReply) -> None:
        self.emit(
            ModelRecord(
                latency_s=reply.latency_s,
                prompt_tokens=reply.prompt_tokens,
                completion_tokens=reply.completion_tokens,
                finish_reason=reply.finish_reason,
                tool_calls=tuple(CallAsked(c.name, c.raw_arguments) for c in reply.tool_calls),
                content=reply.text,
                attempts=reply.attempts,
                cost_usd=reply.cost_usd,
                cached=reply.cached,
            )
        )
