"""Rescue of tool calls written as text, on shapes that Qwen2.5-Coder 0.5B really produced."""

from __future__ import annotations

import pytest

from mm_batch.tools.text_calls import TextCall, recover_tool_calls
from tests.helpers import RescueMeter

KNOWN = {"release", "pkgtest", "status"}

# Verbatim answers of qwen2.5-coder-0.5b (Q4_K_M, llama-server --jinja) to the release example.
BARE = '{"name": "release", "arguments": {"version": "1.4.2", "channel": "beta"}}'
FENCED = '```json\n{\n  "name": "pkgtest",\n  "arguments": {\n    "package": "greet"\n  }\n}\n```'
TAGGED = '<tool_call>\n{"name": "status", "arguments": {"service": "billing"}}\n</tool_call>'


@pytest.mark.parametrize(
    ("text", "call"),
    [
        (BARE, TextCall("release", '{"version": "1.4.2", "channel": "beta"}')),
        (FENCED, TextCall("pkgtest", '{"package": "greet"}')),
        (TAGGED, TextCall("status", '{"service": "billing"}')),
        (
            "Sure! " + BARE + " Done.",
            TextCall("release", '{"version": "1.4.2", "channel": "beta"}'),
        ),
        (
            '{"name": "status", "arguments": "{\\"service\\": \\"x\\"}"}',
            TextCall("status", '{"service": "x"}'),
        ),
    ],
)
def test_shapes_models_produce(text: str, call: TextCall) -> None:
    assert recover_tool_calls(text, KNOWN) == [call]


@pytest.mark.parametrize(
    "text",
    [
        '{"name": "drop_db", "arguments": {}}',  # not a tool of the agent
        'Use JSON like {"a": 1} to configure it.',  # prose mentioning JSON
        '{"name": "release", "arguments": {"version": "1.4.2"',  # cut off
        "The release tool takes a version and a channel.",
        '["release", {"version": "1"}]',
    ],
)
def test_text_that_must_stay_text(text: str) -> None:
    assert recover_tool_calls(text, KNOWN) == []


def test_several_calls_in_order() -> None:
    text = BARE + "\nthen\n" + TAGGED
    assert [c.name for c in recover_tool_calls(text, KNOWN)] == ["release", "status"]


@pytest.mark.parametrize(
    "text",
    [
        '{"name": "release", "owner": "ops"}',  # data naming a tool
        '{"name": "release"}',
        '{"name": "release", "arguments": {}, "owner": "ops"}',
        '{"name": "release", "arguments": [1, 2]}',
        '{"name": "release", "arguments": "not json"}',
        '{"name": "release", "arguments": "[1]"}',
        '{"name": "release", "arguments": 3}',
        '{"config": {"name": "release", "arguments": {}}}',  # nested inside other JSON
        '[{"name": "release", "arguments": {}}]',
        '{"name": ["release"], "arguments": {}}',
    ],
)
def test_only_exact_call_objects_at_the_top_are_calls(text: str) -> None:
    assert recover_tool_calls(text, KNOWN) == []


def test_parameters_is_arguments_and_broken_objects_do_not_hide_later_calls() -> None:
    text = (
        '{"name": "status", "parameters": {"service": "y"}}'
        ' and {"a": 1' + "9" * 5000 + "} " + '{"a": 1,} {"name": "pkgtest", "arguments": {}}'
    )
    assert recover_tool_calls(text, KNOWN) == [
        TextCall("status", '{"service": "y"}'),
        TextCall("pkgtest", "{}"),
    ]


def test_a_call_inside_malformed_json_is_data() -> None:
    # A quoted config with one trailing comma: the object inside it is data, not a call.
    quoted = '{"pipeline": {"steps": [{"name": "status", "arguments": {}},]}}'
    assert recover_tool_calls(quoted, KNOWN) == []


def test_after_an_object_that_never_closes_the_rest_stays_text() -> None:
    # Whatever follows may be inside it: taking it for a call could run what is only quoted.
    text = (
        '{"name": "status", "arguments": {"service": "x"\nthen {"name": "status", "arguments": {}}'
    )
    assert recover_tool_calls(text, KNOWN) == []


HOSTILE_TEXTS = {
    "braces": "{" * (10 << 20),
    "open strings": '{"' * (5 << 20),
    "deep nesting": '{"name": [' * (1 << 20),
    "long arrays": ('{"name": [' + "1," * 5000) * 1000,
    "valid objects": '{"b": 1}' * (1 << 20),
}


@pytest.mark.parametrize("name", list(HOSTILE_TEXTS))
def test_ten_mib_of_hostile_json_takes_bounded_time(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Bounded by construction, counted rather than timed: what the rescue decodes and walks
    stays within its budget, linear in the text (a quadratic rescue would stop the meter at
    once). `python benchmarks/hostile_inputs.py` times these texts."""
    meter = RescueMeter(monkeypatch)
    assert meter.recover_tool_calls(HOSTILE_TEXTS[name], KNOWN) == []
    assert meter.over is None and meter.texts == [len(HOSTILE_TEXTS[name])]
