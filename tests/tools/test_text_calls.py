"""Rescue of tool calls written as text, on shapes that Qwen2.5-Coder 0.5B really produced."""

from __future__ import annotations

import pytest

from mm_batch.tools.text_calls import TextCall, recover_tool_calls

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
