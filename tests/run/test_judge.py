"""The judge over typed records: one test per rule of the verdict (SPEC §1)."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mm_batch.config.model import AnyOf, CallExpectation, Expect
from mm_batch.run.judge import CheckRun, Verdict, judge, verdict
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
    assert verdict("engine down", "loop detector", bad) == Verdict("error", "engine down")
    assert verdict(None, "loop detector", bad) == Verdict("failed", "loop detector")
    assert verdict(None, None, bad) == Verdict("failed", "calls[0]: nothing ran")
    assert verdict(None, None, [Check("calls[0]", True, "")]) == Verdict("passed", "")


# -- argument matching: type-exact, and a list means any one of these ------------------------

SCALARS = st.one_of(
    st.booleans(),
    st.integers(-2, 2),
    st.sampled_from([0.0, 1.0, 2.5]),
    st.sampled_from(["", "1", "true"]),
)
JSON_VALUES = st.recursive(
    SCALARS,
    lambda children: (
        st.lists(children, max_size=3)
        | st.dictionaries(st.sampled_from("ab"), children, max_size=2)
    ),
    max_leaves=8,
)


def _typed(value: Any) -> str:
    """A value with the JSON kind of every part written into it, as canonical text."""

    def walk(v: Any) -> Any:
        if isinstance(v, list):
            return ["array", [walk(x) for x in v]]
        if isinstance(v, dict):
            return ["object", {k: walk(x) for k, x in v.items()}]
        return [type(v).__name__, v]

    return json.dumps(walk(value), sort_keys=True)


@settings(max_examples=300, deadline=None)
@given(want=JSON_VALUES, got=JSON_VALUES)
def test_an_argument_matches_only_a_value_of_the_same_kind(want: Any, got: Any) -> None:
    """In Python True == 1 == 1.0, also inside objects: an MCP tool's `{"on": 1}` met an
    expectation of `{"on": true}`."""
    expect = Expect(calls=(CallExpectation("srv_set", {"v": want}),))
    met = ok_of(judge(expect, [tool("srv_set", v=got)], None, None), "calls[0]")
    assert met == (_typed(want) == _typed(got))


def test_true_never_meets_one_inside_an_object() -> None:
    expect = Expect(calls=(CallExpectation("srv_set", {"config": {"debug": True}}),))
    assert not ok_of(judge(expect, [tool("srv_set", config={"debug": 1})], None, None), "calls[0]")
    assert ok_of(judge(expect, [tool("srv_set", config={"debug": True})], None, None), "calls[0]")


@settings(max_examples=200, deadline=None)
@given(choices=st.lists(SCALARS, min_size=1, max_size=4), got=SCALARS)
def test_a_list_of_values_is_met_by_any_one_of_them(choices: list[Any], got: Any) -> None:
    expect = Expect(calls=(CallExpectation("status", {"service": AnyOf(tuple(choices))}),))
    met = ok_of(judge(expect, [tool("status", service=got)], None, None), "calls[0]")
    assert met == any(_typed(c) == _typed(got) for c in choices)


def test_a_declared_number_parameter_compares_as_a_number() -> None:
    expect = Expect(calls=(CallExpectation("scale", {"ratio": 2.0}, numbers=frozenset({"ratio"})),))
    assert ok_of(judge(expect, [tool("scale", ratio=2)], None, None), "calls[0]")
    assert not ok_of(judge(expect, [tool("scale", ratio=True)], None, None), "calls[0]")
    strict = Expect(calls=(CallExpectation("scale", {"ratio": 2.0}),))
    assert not ok_of(judge(strict, [tool("scale", ratio=2)], None, None), "calls[0]")


def test_a_list_of_values_is_shown_as_written() -> None:
    expect = Expect(calls=(CallExpectation("status", {"service": AnyOf(("billing", "Billing"))}),))
    [check] = judge(expect, [], None, None)
    assert check.detail.startswith('expected status {"service": ["billing", "Billing"]}; ')


# -- the headline reason: the first cause, then what it led to --------------------------------

REFUSED = "refused: deploy with env=prod is not on this run's allowlist"
ENDINGS = st.sampled_from(
    [
        "loop detector: deploy asked for 3 times in a row with the same arguments",
        "task timeout (30 s) reached",
        "max_turns (20) reached without a final answer",
        "the final answer was cut by the model's token limit (finish_reason: length)",
    ]
)


@settings(max_examples=100, deadline=None)
@given(
    ending=st.one_of(st.none(), ENDINGS),
    refusals=st.integers(1, 3),
    others=st.lists(st.sampled_from(["calls[0]", "exit_code", "answer_contains:x"]), max_size=3),
)
def test_a_refusal_leads_the_reason_before_what_it_led_to(
    ending: str | None, refusals: int, others: list[str]
) -> None:
    """A refusal happens during the run; a loop, a timeout or a check is judged at its end: the
    refusal is the first cause, whatever came after it, and what came after still shows."""
    records = [replace(tool("deploy", "refused"), reason=REFUSED) for _ in range(refusals)]
    checks = [Check(name, False, "unmet") for name in others]
    checks += judge(None, records, None, None)
    result = verdict(None, ending, checks)
    assert result.status == "failed"
    reason = result.reason
    assert reason.startswith(f"no_unexpected_refusal: {REFUSED}")
    if ending is not None:
        assert reason.endswith(f"; then {ending}")
    else:
        for name in others:
            assert f"{name}: unmet" in reason
