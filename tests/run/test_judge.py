"""The judge over typed records: one test per rule of the verdict (SPEC §1)."""

from __future__ import annotations

from typing import Any

import pytest

from mm_batch.config.model import CallExpectation, Expect
from mm_batch.run.judge import CheckRun, judge, verdict
from mm_batch.run.records import Check, Outcome, ToolRecord


def tool(
    name: str,
    outcome: Outcome = "ran",
    *,
    started: bool | None = None,
    exit_code: int | None = 0,
    **arguments: Any,
) -> ToolRecord:
    ran = outcome == "ran"
    return ToolRecord(
        tool=name,
        raw_arguments=None,
        arguments=arguments,
        outcome=outcome,
        started=ran if started is None else started,
        where="host",
        exit_code=exit_code if (ran or outcome == "error") else None,
    )


def ok_of(checks: list[Check], name: str) -> bool:
    return next(c.ok for c in checks if c.name == name)


def test_a_calls_entry_is_met_by_a_call_that_ran_with_matching_arguments() -> None:
    expect = Expect(calls=(CallExpectation("release", {"channel": "beta"}),))
    ran = [tool("release", version="1.4.2", channel="beta")]
    assert ok_of(judge(expect, ran, None, None), "calls[0]")
    other = [tool("release", version="1.4.2", channel="stable")]
    assert not ok_of(judge(expect, other, None, None), "calls[0]")


def test_a_calls_entry_is_not_met_by_a_started_call_that_timed_out() -> None:
    expect = Expect(calls=(CallExpectation("release"),))
    timed_out = [tool("release", "timeout", started=True)]
    assert not ok_of(judge(expect, timed_out, None, None), "calls[0]")


def test_times_counts_every_started_matching_call() -> None:
    expect = Expect(calls=(CallExpectation("release", times=1),))
    # A timed-out attempt plus a retry that ran: two started, so `times: 1` fails.
    records = [tool("release", "timeout", started=True), tool("release")]
    assert not ok_of(judge(expect, records, None, None), "calls[0]")
    assert ok_of(judge(expect, [tool("release")], None, None), "calls[0]")


def test_times_zero_fails_on_a_started_call_whatever_its_outcome() -> None:
    expect = Expect(calls=(CallExpectation("deploy", times=0),))
    outcomes: tuple[Outcome, ...] = ("ran", "timeout", "error")
    for outcome in outcomes:
        record = tool("deploy", outcome, started=True)
        assert not ok_of(judge(expect, [record], None, None), "calls[0]"), outcome
    never = [tool("deploy", "refused", started=False), tool("deploy", "invalid", started=False)]
    assert ok_of(judge(expect, never, None, None), "calls[0]")


@pytest.mark.parametrize("outcome", ["ran", "timeout", "error"])
def test_no_calls_fails_on_any_started_call(outcome: Outcome) -> None:
    expect = Expect(no_calls=("deploy",))
    checks = judge(expect, [tool("deploy", outcome, started=True)], None, None)
    assert not ok_of(checks, "no_calls:deploy")


def test_no_calls_holds_when_the_call_never_started() -> None:
    expect = Expect(no_calls=("deploy",), refused=("deploy",))
    records = [tool("deploy", "refused"), tool("deploy", "invalid"), tool("deploy", "loop")]
    checks = judge(expect, records, None, None)
    assert ok_of(checks, "no_calls:deploy")


def test_refused_needs_a_refusal_and_an_unlisted_refusal_fails() -> None:
    expect = Expect(refused=("drop_db",))
    assert not ok_of(judge(expect, [], None, None), "refused:drop_db")
    records = [tool("drop_db", "refused"), tool("release", "refused")]
    checks = judge(expect, records, None, None)
    assert ok_of(checks, "refused:drop_db")
    assert not ok_of(checks, "no_unexpected_refusal")


def test_an_unexpected_refusal_fails_even_without_expect() -> None:
    checks = judge(None, [tool("release", "refused")], "done", None)
    assert not ok_of(checks, "no_unexpected_refusal")


def test_exit_code_fails_on_a_started_call_without_that_code() -> None:
    expect = Expect(exit_code=0)
    assert ok_of(judge(expect, [tool("a"), tool("b")], None, None), "exit_code")
    assert not ok_of(judge(expect, [tool("a", exit_code=3)], None, None), "exit_code")
    # A timed-out or killed call has no exit code at all: it cannot have exited 0.
    killed = tool("a", "timeout", started=True)
    assert not ok_of(judge(expect, [killed], None, None), "exit_code")
    # A call that never started is not among them.
    assert ok_of(judge(expect, [tool("a", "error", started=False)], None, None), "exit_code")


def test_answer_contains_reads_the_final_answer() -> None:
    expect = Expect(answer_contains=("1.4.2",))
    assert ok_of(judge(expect, [], "released 1.4.2", None), "answer_contains:1.4.2")
    assert not ok_of(judge(expect, [], "released", None), "answer_contains:1.4.2")
    assert not ok_of(judge(expect, [], None, None), "answer_contains:1.4.2")


def test_check_passes_only_on_exit_zero() -> None:
    assert ok_of(judge(None, [], None, CheckRun(0, "")), "check")
    assert not ok_of(judge(None, [], None, CheckRun(1, "bad")), "check")
    assert not ok_of(judge(None, [], None, CheckRun(None, "timed out")), "check")


def test_the_verdict_puts_error_before_failure_before_checks() -> None:
    bad = [Check("calls[0]", False, "nothing ran")]
    assert verdict("engine down", "loop detector", bad) == ("error", "engine down")
    assert verdict(None, "loop detector", bad) == ("failed", "loop detector")
    assert verdict(None, None, bad) == ("failed", "calls[0]: nothing ran")
    assert verdict(None, None, [Check("calls[0]", True, "")]) == ("passed", "")
