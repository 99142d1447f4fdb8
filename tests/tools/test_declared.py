"""Declared tools: the schema the model sees, coercion, argv rendering, invalid answers."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from mm_batch.config.model import ParamSpec, ToolSpec
from mm_batch.tools.argv import render_argv
from mm_batch.tools.declared import InvalidCall, ValidCall, validate_call
from mm_batch.tools.schema import CLOSING_SENTENCE, model_schema

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
    schema: dict[str, Any] = model_schema(RELEASE)  # JSON, read loosely
    function = schema["function"]
    assert function["name"] == "release"
    params = function["parameters"]
    assert set(params) == {"type", "properties"}
    for prop in params["properties"].values():
        assert set(prop) == {"type", "description"}
    assert params["properties"]["channel"]["description"] == "Required. One of: beta, stable."
    assert params["properties"]["dry_run"]["description"] == "Optional. Default: false."


def test_description_lists_parameters_then_closing_sentence() -> None:
    function = model_schema(RELEASE)["function"]
    assert isinstance(function, dict) and isinstance(function["description"], str)
    lines = function["description"].splitlines()
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


COUNTS = ToolSpec(
    "counts",
    "",
    (
        ParamSpec("n", "integer", "", True),
        ParamSpec("x", "number", "", False),
        ParamSpec("s", "string", "", False),
    ),
    ("prog", "--n={{n}}", "--x={{x}}", "--s={{s}}"),
    Path(),
)


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        ('{"n": ' + "9" * 5000 + "}", "the arguments hold an integer of 5000 digits"),
        ('{"n": -' + "9" * 31 + "}", "the arguments hold an integer of 31 digits"),
        ('{"n": "' + "9" * 4400 + '"}', "n: the value"),
        ('{"n": 1e300}', "n: the value 1e300 has over 30 digits"),  # quoted as written
        ('{"n": 1, "x": 1e400}', "x: expected a finite number, got 1e400"),
        ('{"n": 1, "x": NaN}', "x: expected a finite number, got NaN"),
        ('{"n": 1, "x": -Infinity}', "x: expected a finite number, got -Infinity"),
        ('{"n": 1, "x": 1e30}', "x: the value 1e30 has over 30 digits"),
        ('{"n": 1, "x": "' + "1" * 40 + '.5"}', "x: the value"),
        ('{"n": 1, "s": "a\\ud800b"}', "s: the value holds a character that cannot be encoded"),
        ('{"n": 1, "s": "\\udfff"}', "s: the value holds a character that cannot be encoded"),
        ('{"n": 1, "s": "a\\u0000"}', "s: the value contains a NUL byte"),
        ('{"n": 1, "s": "' + "é" * 40000 + '"}', "s: the value is over 64 KiB"),
        ('{"n": 1, "s": ' + "[" * 70 + "]" * 70 + "}", "the arguments nest deeper than 64"),
        ('{"n": 1, "s": ' + "[" * 5000 + "]" * 5000 + "}", "the arguments are not valid JSON"),
    ],
)
def test_hostile_values_are_invalid_with_the_reason_and_raise_nothing(
    raw: str, reason: str
) -> None:
    result = invalid(raw, COUNTS)
    assert result.problems[0].startswith(reason), result.problems
    assert "Invalid call of counts; it did not run." in result.answer


def test_thirty_digits_pass_and_thirty_one_do_not() -> None:
    # Digits in a string are exact at any size; a JSON number beyond 2^53 is not (SPEC §2).
    ok = validate_call(COUNTS, '{"n": "-' + "9" * 30 + '", "x": ' + "9" * 20 + "}")
    assert isinstance(ok, ValidCall)
    assert ok.argv[1:3] == ("--n=-" + "9" * 30, "--x=" + "9" * 20)  # no exponent
    assert invalid('{"n": "' + "9" * 31 + '"}', COUNTS).problems[0].endswith("over 30 digits")
    assert "beyond 2^53" in invalid('{"n": -' + "9" * 30 + "}", COUNTS).problems[0]


DASHED = ToolSpec(
    "git_log",
    "",
    (
        ParamSpec("ref", "string", "", True),
        ParamSpec("name", "string", "", False),
        ParamSpec("n", "integer", "", False),
        ParamSpec("flag", "string", "", False, allow_dash=True),
        ParamSpec("empty", "string", "", False, default=""),  # "" is a value, not left out
    ),
    ("git", "log", "{{ref}}..HEAD", "--out={{name}}.txt", "{{n}}", "{{flag}}", "{{empty}}{{name}}"),
    Path(),
)


@pytest.mark.parametrize(
    ("arguments", "param"),
    [
        ({"ref": "--output=/tmp/x"}, "ref"),  # prefix of its entry: {{ref}}..HEAD
        ({"ref": "-oFILE"}, "ref"),
        ({"ref": "main", "n": -3}, "n"),  # an integer alone in its entry
        ({"ref": "main", "n": "-3"}, "n"),
        ({"ref": "main", "name": "-x", "empty": ""}, "name"),  # only an empty value before it
    ],
)
def test_a_dash_that_begins_an_entry_is_option_injection(
    arguments: dict[str, object], param: str
) -> None:
    result = invalid(json.dumps(arguments), DASHED)
    assert len(result.problems) == 1
    assert result.problems[0].startswith(f"{param}: the value ")
    assert "begins with '-'" in result.problems[0]
    assert "read it as an option" in result.problems[0]


def test_a_dash_inside_an_entry_or_allowed_runs() -> None:
    call = validate_call(
        DASHED, json.dumps({"ref": "main", "name": "-x", "flag": "--stat", "empty": "e"})
    )
    assert isinstance(call, ValidCall), call
    assert call.argv == ("git", "log", "main..HEAD", "--out=-x.txt", "--stat", "e-x")


def test_invalid_answer_quotes_at_most_16_kib_and_20_problems() -> None:
    raw = json.dumps({f"k{i}": "v" * 1000 for i in range(40)})
    result = invalid(raw, COUNTS)
    assert len(result.problems) == 21 and result.problems[-1] == "... and 21 more problems"
    assert len(result.answer) < 20 * 1024
    assert "more characters cut ...]" in result.answer
