"""Declared tools: the schema the model sees, coercion, argv rendering, invalid answers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mm_batch.config.model import ParamSpec, ToolSpec
from mm_batch.tools.declared import (
    CLOSING_SENTENCE,
    InvalidCall,
    ValidCall,
    model_schema,
    render_argv,
    validate_call,
)

RELEASE = ToolSpec(
    name="release",
    description="Release a version of the product to a channel.",
    params=(
        ParamSpec("version", "string", "The version to release, e.g. 1.4.2.", required=True),
        ParamSpec("channel", "string", "", required=True, enum=("beta", "stable")),
        ParamSpec("dry_run", "boolean", "", required=False, default=False),
        ParamSpec("count", "integer", "", required=False),
        ParamSpec("ratio", "number", "", required=False),
    ),
    command=(
        "./release.sh",
        "{{version}}",
        "--channel={{channel}}",
        "--dry-run={{dry_run}}",
        "--count={{count}}",
        "--ratio={{ratio}}",
    ),
    workdir=Path("."),
)


def valid(raw: str) -> ValidCall:
    result = validate_call(RELEASE, raw)
    assert isinstance(result, ValidCall), getattr(result, "answer", result)
    return result


def invalid(raw: str | None, tool: ToolSpec = RELEASE) -> InvalidCall:
    result = validate_call(tool, raw)
    assert isinstance(result, InvalidCall), result
    return result


def test_schema_carries_types_and_descriptions_only() -> None:
    schema = model_schema(RELEASE)
    function = schema["function"]
    assert function["name"] == "release"
    params = function["parameters"]
    assert set(params) == {"type", "properties"}
    for prop in params["properties"].values():
        assert set(prop) == {"type", "description"}
    assert params["properties"]["channel"]["description"] == "Required. One of: beta, stable."
    assert params["properties"]["dry_run"]["description"] == "Optional. Default: false."


def test_description_lists_parameters_then_closing_sentence() -> None:
    lines = model_schema(RELEASE)["function"]["description"].splitlines()
    assert lines[0] == "Release a version of the product to a channel."
    assert lines[1] == "- version (string, required): The version to release, e.g. 1.4.2."
    assert lines[2] == "- channel (string, required, one of: beta, stable)"
    assert lines[3] == "- dry_run (boolean, optional, default false)"
    assert lines[-1] == CLOSING_SENTENCE == "Give each parameter as its own field."


def test_packed_call_is_answered_with_the_call_quoted_back() -> None:
    raw = '{"version": "1.4.2 1.4.2, channel beta"}'
    result = invalid(raw)
    assert result.problems == ("channel: missing (required)",)
    assert f"You sent: {raw}" in result.answer
    assert "- channel (string, required, one of: beta, stable)" in result.answer
    assert "- version (string, required)" in result.answer
    assert result.answer.endswith("Call release again. Give each parameter as its own field.")


@pytest.mark.parametrize(
    ("field", "sent", "coerced"),
    [
        ("count", "3", 3),
        ("count", 3.0, 3),
        ("count", "-3", -3),
        ("dry_run", "true", True),
        ("dry_run", "TRUE", True),
        ("dry_run", "False", False),
        ("ratio", "2.5", 2.5),
        ("ratio", 2, 2),
    ],
)
def test_lenient_coercion(field: str, sent: object, coerced: object) -> None:
    call = valid(json.dumps({"version": "1", "channel": "beta", field: sent}))
    assert call.arguments[field] == coerced
    assert type(call.arguments[field]) is type(coerced)


@pytest.mark.parametrize(
    ("field", "sent", "reason"),
    [
        ("dry_run", "yes", 'dry_run: expected true or false, got "yes"'),
        ("count", "three", 'count: expected an integer, got "three"'),
        ("count", "3.5", 'count: expected an integer, got "3.5"'),
        ("count", 3.5, "count: expected an integer, got 3.5"),
        ("count", True, "count: expected an integer, got true"),
        ("ratio", "1e3", 'ratio: expected a number, got "1e3"'),
        ("version", 1.1, "version: expected a string, got the JSON number 1.1"),
        ("channel", "prod", "channel: 'prod' is not one of: beta, stable"),
    ],
)
def test_anything_needing_a_guess_is_invalid_with_the_reason(
    field: str, sent: object, reason: str
) -> None:
    args = {"version": "1", "channel": "beta", field: sent}
    result = invalid(json.dumps(args))
    assert len(result.problems) == 1
    assert result.problems[0].startswith(reason)
    assert reason in result.answer


def test_unknown_and_non_object_arguments_are_invalid() -> None:
    assert invalid('{"version": "1", "channel": "beta", "force": true}').problems == (
        "unknown parameter 'force'",
    )
    assert invalid("[1, 2]").problems == ("the arguments must be a JSON object, got a JSON array",)
    result = invalid("{not json")
    assert result.problems == ("the arguments are not valid JSON",)
    assert "You sent: {not json" in result.answer


def test_hostile_value_stays_one_argv_entry() -> None:
    call = valid('{"version": "1.4.2; rm -rf ~", "channel": "beta"}')
    assert call.argv == ("./release.sh", "1.4.2; rm -rf ~", "--channel=beta", "--dry-run=false")


def test_values_are_never_re_expanded() -> None:
    call = valid('{"version": "{{channel}}", "channel": "beta"}')
    assert call.argv[1] == "{{channel}}"


def test_absent_optional_parameter_without_default_drops_its_entry() -> None:
    call = valid('{"version": "1", "channel": "beta", "ratio": 0.00001}')
    assert call.argv == (
        "./release.sh",
        "1",
        "--channel=beta",
        "--dry-run=false",
        "--ratio=0.00001",
    )


def test_numbers_render_without_exponent() -> None:
    assert render_argv(
        RELEASE, {"version": "v", "channel": "c", "dry_run": True, "count": 10**20, "ratio": 1e21}
    )[3:] == (
        "--dry-run=true",
        "--count=100000000000000000000",
        "--ratio=1000000000000000000000",
    )


def test_option_injection_nul_and_size_are_invalid() -> None:
    assert "begins with '-'" in invalid('{"version": "--force", "channel": "beta"}').problems[0]
    # Inside a longer entry a leading dash cannot become an option.
    tool = ToolSpec("t", "", (ParamSpec("v", "string", "", True),), ("prog", "--v={{v}}"), Path())
    assert isinstance(validate_call(tool, '{"v": "-x"}'), ValidCall)
    dash_ok = ToolSpec(
        "t", "", (ParamSpec("v", "string", "", True, allow_dash=True),), ("prog", "{{v}}"), Path()
    )
    assert isinstance(validate_call(dash_ok, '{"v": "-x"}'), ValidCall)
    assert invalid('{"version": "a\\u0000b", "channel": "beta"}').problems == (
        "version: the value contains a NUL byte",
    )
    big = json.dumps({"version": "x" * (64 * 1024 + 1), "channel": "beta"})
    assert invalid(big).problems == ("version: the value is over 64 KiB",)


def test_null_and_empty_arguments_mean_none_given() -> None:
    tool = ToolSpec("ping", "", (), ("ping",), Path())
    for raw in ("", "null", None, "{}"):
        assert isinstance(validate_call(tool, raw), ValidCall)
    assert invalid('{"version": null, "channel": "beta"}').problems == (
        "version: missing (required)",
    )
