"""Argv edges closed as classes (SPEC §2): the dash rule whatever the template's shape, the empty
string of an optional parameter, coercion that returns the number sent or answers invalid, and
type-exact equality. Each rule is a property over generated templates, values or numbers."""

from __future__ import annotations

import json
from decimal import Context, Decimal, InvalidOperation, localcontext
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mm_batch.config.model import ParamSpec, ParamType, ToolSpec, render_value
from mm_batch.tools.coercion import MAX_EXACT_INTEGER, same_value
from mm_batch.tools.declared import InvalidCall, ValidCall, validate_call

THUMB = ToolSpec(
    "thumb",
    "",
    (ParamSpec("name", "string", "", required=True),),
    ("convert", "in.png", "{{name}}-thumb.png"),
    Path(),
)


def test_an_empty_value_that_leaves_a_literal_dash_first_is_option_injection() -> None:
    result = validate_call(THUMB, '{"name": ""}')
    assert isinstance(result, InvalidCall), result
    assert result.problems == (
        'name: the empty value would leave the argv entry "{{name}}-thumb.png" beginning '
        "with '-' (\"-thumb.png\"), where the program would read it as an option",
    )
    assert isinstance(validate_call(THUMB, '{"name": "cat"}'), ValidCall)


def test_an_empty_value_before_a_dash_runs_with_allow_dash() -> None:
    param = ParamSpec("name", "string", "", required=True, allow_dash=True)
    tool = ToolSpec("thumb", "", (param,), THUMB.command, Path())
    result = validate_call(tool, '{"name": ""}')
    assert isinstance(result, ValidCall) and result.argv == ("convert", "in.png", "-thumb.png")


def test_an_empty_string_leaves_out_an_optional_parameter_without_default() -> None:
    tool = ToolSpec(
        "convert",
        "",
        (
            ParamSpec("name", "string", "", required=False),
            ParamSpec("size", "integer", "", required=False),
            ParamSpec("mode", "string", "", required=False, default="fast"),
        ),
        ("convert", "{{name}}-thumb.png", "--size={{size}}", "--mode={{mode}}"),
        Path(),
    )
    result = validate_call(tool, '{"name": "", "size": "", "mode": ""}')
    assert isinstance(result, ValidCall), result
    assert result.arguments == {"mode": ""}  # a default makes "" a value like any other
    assert result.argv == ("convert", "--mode=")


# -- the dash rule as a property over template shapes ----------------------------------------

NAMES = ("p0", "p1", "p2")
LITERALS = st.sampled_from(["", "-", "--", "a", "=", "-x", ".", "x-", "..", " "])
PLACEHOLDERS = st.sampled_from([f"{{{{{n}}}}}" for n in NAMES])
TEMPLATES = st.lists(st.one_of(LITERALS, PLACEHOLDERS), min_size=1, max_size=5).map("".join)
DASHY = st.sampled_from(["", "-", "-x", "--y", "x", "x-", "=", " ", "-1"])


def _literal_start(template: str) -> str:
    return template.split("{{", 1)[0]


def _tool(templates: list[str], allow_dash: bool) -> ToolSpec:
    params = tuple(ParamSpec(n, "string", "", True, allow_dash=allow_dash) for n in NAMES)
    return ToolSpec("t", "", params, ("prog", *templates), Path())


def _bare(template: str, values: dict[str, str]) -> bool:
    """An option entry (`-o{{out}}`, no `=`) whose values are all empty: a bare option."""
    names = [n for n in NAMES if f"{{{{{n}}}}}" in template]
    return (
        template.startswith("-")
        and "=" not in template
        and bool(names)
        and not any(values[n] for n in names)
    )


def _rendered(template: str, values: dict[str, str]) -> str:
    for name, value in values.items():
        template = template.replace(f"{{{{{name}}}}}", value)
    return template


@settings(max_examples=300, deadline=None)
@given(
    templates=st.lists(TEMPLATES, min_size=1, max_size=3),
    values=st.fixed_dictionaries({n: DASHY for n in NAMES}),
)
def test_an_entry_begins_with_a_dash_only_where_its_template_does(
    templates: list[str], values: dict[str, str]
) -> None:
    """Without allow_dash: valid exactly when no entry begins with '-' unless its template
    begins with a literal '-'; what runs is then the one-pass rendering."""
    result = validate_call(_tool(templates, allow_dash=False), json.dumps(values))
    injected = [
        t
        for t in templates
        if _rendered(t, values).startswith("-") and not _literal_start(t).startswith("-")
    ]
    bare = [t for t in templates if _bare(t, values)]
    if injected or bare:
        assert isinstance(result, InvalidCall), (templates, values)
        assert all(
            "read it as an option" in p or "the bare option" in p for p in result.problems
        ), result.problems
        return
    assert isinstance(result, ValidCall), (templates, values, result)
    assert result.argv == ("prog", *(_rendered(t, values) for t in templates))
    for entry, template in zip(result.argv[1:], templates, strict=True):
        assert not entry.startswith("-") or _literal_start(template).startswith("-")


@settings(max_examples=150, deadline=None)
@given(
    templates=st.lists(TEMPLATES, min_size=1, max_size=3),
    values=st.fixed_dictionaries({n: DASHY for n in NAMES}),
)
def test_allow_dash_lets_any_value_begin_its_entry(
    templates: list[str], values: dict[str, str]
) -> None:
    result = validate_call(_tool(templates, allow_dash=True), json.dumps(values))
    if any(_bare(t, values) for t in templates):  # not a dash a value makes: the option's own
        assert isinstance(result, InvalidCall), result
        assert all("the bare option" in p for p in result.problems), result.problems
        return
    assert isinstance(result, ValidCall), result
    assert result.argv == ("prog", *(_rendered(t, values) for t in templates))


@pytest.mark.parametrize(
    ("template", "bare"), [("-o{{out}}", "-o"), ("--out{{out}}", "--out"), ("--{{out}}", "--")]
)
def test_an_empty_value_that_leaves_an_option_bare_is_invalid(template: str, bare: str) -> None:
    """`-o{{out}}` with "" would be `-o`, and `-o` would take the next entry as its value."""
    tool = ToolSpec(
        "w",
        "",
        (ParamSpec("out", "string", "", True), ParamSpec("input", "string", "", True)),
        ("write", template, "{{input}}"),
        Path(),
    )
    result = validate_call(tool, '{"out": "", "input": "data.txt"}')
    assert isinstance(result, InvalidCall), result
    assert result.problems == (
        f'out: the empty value would leave the argv entry "{template}" as the bare option '
        f'"{bare}", and the program would read the next argv entry as its value',
    )
    assert isinstance(validate_call(tool, '{"out": "x.txt", "input": "data.txt"}'), ValidCall)


# -- coercion: the number sent, or invalid ---------------------------------------------------

DIGITS = st.text(alphabet="0123456789", min_size=1, max_size=24)
JSON_NUMBERS = st.builds(
    lambda sign, whole, fraction, exponent: sign + whole + fraction + exponent,
    st.sampled_from(["", "-"]),
    st.one_of(st.just("0"), st.builds(lambda a, b: a + b, st.sampled_from("123456789"), DIGITS)),
    st.one_of(st.just(""), DIGITS.map(lambda d: "." + d)),
    st.one_of(
        st.just(""),
        st.builds(
            lambda e, s, d: e + s + d,
            st.sampled_from("eE"),
            st.sampled_from(["", "+", "-"]),
            st.one_of(st.integers(0, 40).map(str), st.just("99999999999999999999")),
        ),
    ),
) | st.sampled_from(
    [
        "12345678901234567890.0",
        "1e29",
        "9007199254740992",
        "9007199254740993",
        "9007199254740992.0",
        "-9007199254740993.0",
        "3.0000000000000001",
        "0.1",
        "1e-400",
        "2.5",
        "-0.0",
        "100000000000000000000000000000",
    ]
)


def _one(type_: ParamType) -> ToolSpec:
    return ToolSpec(
        "t", "", (ParamSpec("n", type_, "", True, allow_dash=True),), ("p", "{{n}}"), Path()
    )


@settings(max_examples=300, deadline=None)
@given(text=JSON_NUMBERS, type_=st.sampled_from(["integer", "number"]))
def test_a_json_number_runs_as_the_number_it_denotes_or_is_invalid(
    text: str, type_: ParamType
) -> None:
    result = validate_call(_one(type_), '{"n": ' + text + "}")
    try:
        sent = Decimal(text)
    except InvalidOperation:  # an exponent no decimal holds: nothing exact can run
        assert isinstance(result, InvalidCall), text
        return
    if isinstance(result, ValidCall):
        assert Decimal(result.argv[1]) == sent, (text, result.argv)
        if type_ == "integer":
            assert type(result.arguments["n"]) is int
        return
    # Invalid only where taking it would need a guess.
    is_int_literal = all(c not in text for c in ".eE")
    if sent.copy_abs() >= 10**30:
        return
    if type_ == "integer":
        with localcontext(Context(prec=200)):
            whole = sent == sent.to_integral_value()
        assert not whole or sent.copy_abs() > MAX_EXACT_INTEGER, text
    else:
        assert not is_int_literal and Decimal(repr(float(text))) != sent, text


@settings(max_examples=200, deadline=None)
@given(text=JSON_NUMBERS, type_=st.sampled_from(["integer", "number", "string"]))
def test_a_number_in_a_string_is_taken_as_written_or_is_invalid(
    text: str, type_: ParamType
) -> None:
    result = validate_call(_one(type_), json.dumps({"n": text}))
    if type_ == "string":
        assert isinstance(result, ValidCall) and result.argv[1] == text
        return
    if isinstance(result, ValidCall):
        assert Decimal(result.argv[1]) == Decimal(text), (text, result.argv)
    elif type_ == "integer" and all(c in "-0123456789" for c in text):
        assert len(text.lstrip("-")) > 30, text


@pytest.mark.parametrize(
    ("raw", "problem"),
    [
        ('{"n": 12345678901234567890.0}', "n: expected an integer, got 12345678901234567890.0: a"),
        ('{"n": 1e29}', "n: expected an integer, got 1e29: a JSON number beyond 2^53"),
        ('{"n": 9007199254740993}', "n: expected an integer, got 9007199254740993: a JSON"),
        ('{"n": 3.0000000000000001}', "n: expected an integer, got 3.0000000000000001"),
    ],
)
def test_an_integer_that_would_be_a_guess_is_invalid(raw: str, problem: str) -> None:
    result = validate_call(_one("integer"), raw)
    assert isinstance(result, InvalidCall), result
    assert result.problems[0].startswith(problem), result.problems


@pytest.mark.parametrize(
    ("raw", "argv"),
    [
        ('{"n": 9007199254740992}', "9007199254740992"),
        ('{"n": -9007199254740992.0}', "-9007199254740992"),
        ('{"n": "12345678901234567890"}', "12345678901234567890"),
        ('{"n": "-3"}', "-3"),
        ('{"n": 3.0}', "3"),
        ('{"n": 1e2}', "100"),
    ],
)
def test_an_exact_integer_runs(raw: str, argv: str) -> None:
    result = validate_call(_one("integer"), raw)
    assert isinstance(result, ValidCall), result
    assert result.argv[1] == argv


@pytest.mark.parametrize("type_", ["integer", "number"])
@pytest.mark.parametrize(
    "text",
    [
        "1e-99999999999999999999",
        "-0.1e-99999999999999999999999999999999999999",
        "1e99999999999999999999",
        "1" + "0" * 5000 + "e-5000",
        "0." + "0" * 100_000 + "1",
    ],
)
def test_a_hostile_exponent_or_length_is_answered_never_raised(type_: ParamType, text: str) -> None:
    result = validate_call(_one(type_), '{"n": ' + text + "}")
    if text.startswith("1" + "0" * 5000):  # exactly 1
        assert isinstance(result, ValidCall) and result.argv[1] in ("1", "1.0"), result
    else:
        assert isinstance(result, InvalidCall), result


def test_a_number_with_more_digits_than_a_double_keeps_is_invalid() -> None:
    result = validate_call(_one("number"), '{"n": 0.10000000000000000001}')
    assert isinstance(result, InvalidCall)
    assert "it would run as 0.1" in result.problems[0]
    result = validate_call(_one("number"), '{"n": "2.50"}')
    assert isinstance(result, ValidCall) and result.argv[1] == "2.5"


def test_a_json_number_for_a_string_is_invalid() -> None:
    result = validate_call(_one("string"), '{"n": 1.10}')
    assert isinstance(result, InvalidCall)
    assert result.problems[0].startswith("n: expected a string, got the JSON number 1.1")


# -- type-exact equality ---------------------------------------------------------------------

SCALARS = st.one_of(
    st.booleans(),
    st.integers(-3, 3),
    st.sampled_from([0.0, 1.0, -1.0, 2.5]),
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


def _typed(value: object) -> object:
    """A value with its JSON kind written into it: equal only when equal and of one kind."""
    if isinstance(value, list):
        return ["array", [_typed(v) for v in value]]
    if isinstance(value, dict):
        return ["object", {k: _typed(v) for k, v in value.items()}]
    return [type(value).__name__, value]


@settings(max_examples=300, deadline=None)
@given(a=JSON_VALUES, b=JSON_VALUES)
def test_same_value_never_takes_a_boolean_for_a_number_or_an_integer_for_a_float(
    a: object, b: object
) -> None:
    typed = json.dumps(_typed(a), sort_keys=True) == json.dumps(_typed(b), sort_keys=True)
    assert same_value(a, b) == typed


def test_an_mcp_enum_is_matched_type_exactly() -> None:
    param = ParamSpec("level", "json", "", True, enum=(0, 1), allow_dash=True)
    tool = ToolSpec("srv_set", "", (param,), ("mcp",), Path())
    for raw in ('{"level": false}', '{"level": true}', '{"level": 1.0}'):
        result = validate_call(tool, raw)
        assert isinstance(result, InvalidCall), raw
        assert "is not one of: 0, 1" in result.problems[0]
    assert isinstance(validate_call(tool, '{"level": 1}'), ValidCall)


def test_render_value_of_a_coerced_float_is_a_plain_float() -> None:
    """The JSON text kept for coercion never leaves it: arguments hold plain floats."""
    result = validate_call(_one("number"), '{"n": 2.5}')
    assert isinstance(result, ValidCall)
    assert type(result.arguments["n"]) is float and render_value(result.arguments["n"]) == "2.5"
    mcp = ToolSpec("s_t", "", (ParamSpec("o", "json", "", True),), ("mcp",), Path())
    result = validate_call(mcp, '{"o": {"x": [2.5]}}')
    assert isinstance(result, ValidCall)
    assert type(result.arguments["o"]["x"][0]) is float  # type: ignore[index,call-overload]
