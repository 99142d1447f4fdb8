"""An invalid call whose only fault is unknown parameters is answered with the call to make
instead: the model's own call without them, written out, because small models send the same
call again when told only "unknown parameter". Nothing is run in its place, and no value the
model did not send appears in it."""

from __future__ import annotations

import json
from pathlib import Path

from mm_batch.config.model import ParamSpec, ToolSpec
from mm_batch.tools.declared import InvalidCall, validate_call
from mm_batch.tools.schema import CLOSING_SENTENCE

INCIDENT = ToolSpec(
    name="incident",
    description="Open an incident.",
    params=(
        ParamSpec("service", "string", "The service, e.g. inventory.", required=True),
        ParamSpec("severity", "integer", "From 1 to 4.", required=True),
        ParamSpec("note", "string", "", required=False),
    ),
    command=("./incident.sh", "{{service}}", "--severity={{severity}}", "--note={{note}}"),
    workdir=Path("."),
)
PREFIX = "Call incident again without the unknown parameters: "


def answer(arguments: dict[str, object]) -> str:
    result = validate_call(INCIDENT, json.dumps(arguments))
    assert isinstance(result, InvalidCall), result
    return result.answer


def retry_line(text: str) -> str | None:
    return next((line for line in text.splitlines() if line.startswith(PREFIX)), None)


def test_only_unknown_parameters_is_answered_with_the_call_without_them() -> None:
    text = answer({"service": "billing", "severity": "3", "description": "wrong totals"})
    line = retry_line(text)
    assert line is not None
    # The model's own values, as it sent them ("3" stays "3"): nothing guessed, nothing added.
    assert json.loads(line.removeprefix(PREFIX)) == {
        "name": "incident",
        "arguments": {"service": "billing", "severity": "3"},
    }
    assert "- unknown parameter 'description'" in text
    assert text.endswith(f"Call incident again. {CLOSING_SENTENCE}")


def test_no_call_is_offered_when_the_rest_would_still_be_invalid() -> None:
    # A required parameter missing: offering a call would mean guessing its value.
    assert retry_line(answer({"service": "billing", "sev": 3})) is None
    # A mistyped value beside the unknown one.
    assert retry_line(answer({"service": "billing", "severity": "high", "x": 1})) is None
    # A value that would become an option: dropping the unknown parameter does not make it valid.
    assert retry_line(answer({"service": "--all", "severity": 1, "x": 1})) is None


def test_no_call_is_offered_for_arguments_that_are_not_an_object() -> None:
    result = validate_call(INCIDENT, '["billing", 3]')
    assert isinstance(result, InvalidCall)
    assert retry_line(result.answer) is None
