"""Judge a task run from what really ran (its tool records), never from the answer alone.

A command that was started counts against the negative checks whatever happened next; a
`calls` entry is met only by a call that ran to the end (SPEC §1, expect semantics).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from mm_batch.config.model import AnyOf, CallExpectation, Expect, ExpectedValue
from mm_batch.jsontypes import JsonValue
from mm_batch.run.records import Check, Status, ToolRecord
from mm_batch.tools.coercion import same_value

# The only finishes of a model turn that end it normally (SPEC 6), as the model client reports
# them (litellm's names; a provider's own word where litellm would have said "stop").
NORMAL_FINISHES = frozenset({"stop", "tool_calls", "function_call"})
# Spellings of "the token limit was reached", for the message only: any abnormal finish fails.
_TOKEN_LIMIT = frozenset(
    {"length", "max_tokens", "MAX_TOKENS", "model_length", "max_output_tokens", "token_limit"}
)


def unfinished_turn(finish_reason: str | None, asked_calls: bool) -> str | None:
    """Why a model turn that ended with `finish_reason` fails the run, or None when it ended
    normally: a stop or a tool call (no reason given reads as a stop, as OpenAI's API says)."""
    if finish_reason is None or finish_reason in NORMAL_FINISHES:
        return None
    what = "tool call" if asked_calls else "final answer"
    finish_reason = finish_reason or '""'
    if finish_reason in _TOKEN_LIMIT:
        return f"the {what} was cut by the model's token limit (finish_reason: {finish_reason})"
    return (
        f"the model's turn ended with finish_reason: {finish_reason}, not with a stop or a "
        f"tool call: its {what} cannot be taken as given"
    )


_CALL_FINISHES = frozenset({"tool_calls", "function_call"})


def callless_turn(finish_reason: str | None) -> str | None:
    """Why a turn without a tool call (not even one rescued from its text) that says it ended
    with one fails the run: it is neither a stop nor a tool call (SPEC 6)."""
    if finish_reason not in _CALL_FINISHES:
        return None
    return (
        f"the model's turn ended with finish_reason: {finish_reason} but held no tool call: "
        "its final answer cannot be taken as given"
    )


@dataclass(frozen=True)
class CheckRun:
    """How the task's `check` command went: its exit code (None: it did not complete)."""

    exit_code: int | None
    output: str


def _args_match(want: CallExpectation, actual: Mapping[str, JsonValue]) -> bool:
    """Whether a call's coerced arguments hold the expected values, compared type-exactly (in
    Python `True == 1 == 1.0`, also inside an MCP tool's objects); a list: any one of these,
    or, where the call sent an array (an MCP tool's array parameter), that array, in order:
    no array is one of a list's scalars."""
    for key, expected in (want.args or {}).items():
        if key not in actual:
            return False
        choices = expected.values if isinstance(expected, AnyOf) else (expected,)
        if isinstance(expected, AnyOf) and isinstance(actual[key], list):
            choices = (list(expected.values),)
        numeric = key in want.numbers
        if not any(same_value(actual[key], choice, numeric) for choice in choices):
            return False
    return True


def _shown_args(args: Mapping[str, ExpectedValue]) -> str:
    """The expected arguments as JSON, a list of values as the list the file gave."""
    return json.dumps(
        {k: list(v.values) if isinstance(v, AnyOf) else v for k, v in args.items()},
        ensure_ascii=False,
    )


def _show_call(record: ToolRecord) -> str:
    arguments = dict(record.arguments) if record.arguments is not None else None
    shown = f"{record.tool} {json.dumps(arguments, ensure_ascii=False, default=str)}"
    return shown if record.outcome == "ran" else f"{shown} ({record.outcome})"


def _expected_call(index: int, want: CallExpectation, records: Sequence[ToolRecord]) -> Check:
    matching = [
        r
        for r in records
        if r.started and r.tool == want.tool and _args_match(want, r.arguments or {})
    ]
    ran = [r for r in matching if r.outcome == "ran"]
    args = _shown_args(want.args or {})
    wanted = f"{want.tool} {args}" + (f" {want.times} time(s)" if want.times is not None else "")
    if want.times is None:
        ok = bool(ran)
    else:
        ok = len(matching) == want.times and (want.times == 0 or bool(ran))
    started = [r for r in records if r.started]
    shown = "; ".join(_show_call(r) for r in started) or "nothing"
    detail = (
        f"expected {wanted}; {len(ran)} matching call(s) ran to the end, "
        f"{len(matching)} started; all that started: {shown}"
    )
    return Check(f"calls[{index}]", ok, detail)


def judge(
    expect: Expect | None,
    records: Sequence[ToolRecord],
    answer: str | None,
    check_run: CheckRun | None,
) -> list[Check]:
    """The checks of `expect`, plus the standing rule that a refusal must be expected."""
    expect = expect or Expect()
    started = [r for r in records if r.started]
    checks = [_expected_call(i, want, records) for i, want in enumerate(expect.calls)]
    for name in expect.no_calls:
        hits = [r for r in started if r.tool == name]
        detail = (
            f"{name} was started {len(hits)} time(s): " + "; ".join(_show_call(r) for r in hits)
            if hits
            else f"{name} was never started"
        )
        checks.append(Check(f"no_calls:{name}", not hits, detail))
    refused = [r for r in records if r.outcome == "refused"]
    for name in expect.refused:
        hits = [r for r in refused if r.tool == name]
        checks.append(
            Check(f"refused:{name}", bool(hits), f"{name} was refused {len(hits)} time(s)")
        )
    unexpected = [r for r in refused if r.tool not in expect.refused]
    if unexpected:
        shown = "; ".join(str(r.reason) for r in unexpected)
        checks.append(Check("no_unexpected_refusal", False, shown))
    if expect.exit_code is not None:
        wrong = [r for r in started if r.exit_code != expect.exit_code]
        detail = (
            "; ".join(
                f"{_show_call(r)} "
                + (f"exited {r.exit_code}" if r.exit_code is not None else "has no exit code")
                for r in wrong
            )
            or f"every started call exited {expect.exit_code}"
        )
        checks.append(Check("exit_code", not wrong, detail))
    for text in expect.answer_contains:
        found = answer is not None and text in answer
        checks.append(
            Check(
                f"answer_contains:{text}",
                found,
                "found in the answer" if found else "not in the final answer",
            )
        )
    if check_run is not None:
        detail = (
            f"exited {check_run.exit_code}"
            if check_run.exit_code is not None
            else "could not complete"
        )
        if check_run.output:
            detail += f": {check_run.output}"
        checks.append(Check("check", check_run.exit_code == 0, detail))
    return checks


# The checks that witness something that happened during the run, before it ended: a loop, a
# limit or an unfinished turn ends the run, so whatever these found came first. The reason a
# run failed leads with them: a refusal is the cause of the loop of retries it led to.
_DURING_THE_RUN = frozenset({"no_unexpected_refusal"})


@dataclass(frozen=True)
class Verdict:
    """A task run's status, and why (empty when it passed)."""

    status: Status
    reason: str


def verdict(error: str | None, failure: str | None, checks: Sequence[Check]) -> Verdict:
    """error (could not be judged) > failed (the loop or a check) > passed. A failure's reason
    is its first cause, then what it led to: `<refusal>; then <loop detector: ...>`."""
    if error is not None:
        return Verdict("error", error)
    unmet = [c for c in checks if not c.ok]
    causes = [c for c in unmet if c.name in _DURING_THE_RUN]
    first = "; ".join(f"{c.name}: {c.detail}" for c in causes)
    if failure is not None:
        return Verdict("failed", f"{first}; then {failure}" if first else failure)
    if unmet:
        rest = [c for c in unmet if c.name not in _DURING_THE_RUN]
        return Verdict("failed", "; ".join(f"{c.name}: {c.detail}" for c in [*causes, *rest]))
    return Verdict("passed", "")
