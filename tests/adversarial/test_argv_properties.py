"""Argv and option injection as properties, through the real host executor.

Generated tools put placeholders at every position of an entry (alone, prefix, suffix, middle,
`{{ref}}..HEAD`); generated values are hostile (leading dashes, shell metacharacters, NUL, lone
surrogates, huge and non-finite numbers, long strings). Either the call is invalid with the
right reason for each bad value, or the program received exactly the expected argv: each value
inside exactly its entry, nothing split, expanded or added.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mm_batch.config.model import ParamSpec, ParamType, ToolSpec
from mm_batch.effects.host import HostExecutor
from mm_batch.run.loop import canonical_arguments
from mm_batch.tools.declared import InvalidCall, ValidCall, validate_call
from mm_batch.tools.text_calls import recover_tool_calls

# How an entry holds its placeholder, and whether the value then decides how the entry begins
# (an empty one before a literal '-' leaves that dash first: `{{name}}-thumb.png`).
POSITIONS = {
    "alone": ("{{%s}}", True),
    "prefix": ("{{%s}}.txt", True),
    "range": ("{{%s}}..HEAD", True),
    "thumb": ("{{%s}}-thumb.png", True),
    "suffix": ("--opt={{%s}}", False),
    "middle": ("a{{%s}}b", False),
}
HOSTILE_TEXT = st.sampled_from(
    [
        "-",
        "--",
        "-oFILE",
        "--output=/tmp/x",
        "; touch MARK",
        "$(touch MARK)",
        "`id`",
        "a b\tc\nd",
        "*",
        "~",
        "'\"\\",
        "{{other}}",
        "\x00",
        "a\x00b",
        "\ud800",
        "x\udfff",
        "é漢🙂",
        "x" * (64 * 1024 + 1),
        "é" * (32 * 1024 + 1),
        "x" * (64 * 1024),
    ]
)
STRINGS = st.one_of(
    HOSTILE_TEXT,
    st.text(max_size=40),  # any code point, surrogates and NUL included
    st.tuples(st.sampled_from(["", "-", "--"]), st.text(max_size=20)).map("".join),
)
HUGE = "9" * 5000  # json refuses it with ValueError; str(int) of it would raise too
INTEGERS = st.one_of(
    st.integers(min_value=-(10**35), max_value=10**35),
    st.sampled_from([-1, 0, 10**30 - 1, -(10**30), HUGE, "-" + HUGE]),
    st.integers(min_value=-999, max_value=999).map(str),  # "3", "-3" coerce to integers
)
NUMBERS = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([1e400, -1e400, -0.0, 1e29, 1e30, 2.5, -2.5, "1e400"]),
)
BOOLEANS = st.sampled_from([True, False, "TRUE", "false"])
VALUES = {"string": STRINGS, "integer": INTEGERS, "number": NUMBERS, "boolean": BOOLEANS}


@dataclass(frozen=True)
class Param:
    name: str
    type: ParamType
    position: str
    allow_dash: bool
    value: object


@st.composite
def calls(draw: st.DrawFn) -> list[Param]:
    params = []
    for i in range(draw(st.integers(min_value=1, max_value=4))):
        type_: ParamType = draw(st.sampled_from(["string", "integer", "number", "boolean"]))
        params.append(
            Param(
                f"p{i}",
                type_,
                draw(st.sampled_from(list(POSITIONS))),
                draw(st.booleans()),
                draw(VALUES[type_]),
            )
        )
    return params


def raw_json(value: object) -> str:
    """The JSON text a model would send for the value (huge integers written out as digits)."""
    if value == "1e400":
        return "1e400"
    if isinstance(value, str) and value.lstrip("-") == HUGE:
        return value
    return json.dumps(value)  # a lone surrogate becomes its escape, decoded back as one


def long_literal(value: object) -> bool:
    """An integer the JSON writes out with over 30 digits: the arguments as a whole are refused."""
    if isinstance(value, str):
        return value.lstrip("-") == HUGE
    return isinstance(value, int) and not isinstance(value, bool) and abs(value) >= 10**30


def expected_problem(param: Param) -> tuple[str | None, str | None]:
    """(the reason a value is invalid, or None; its rendered text when valid)."""
    value = param.value
    if param.type == "string":
        assert isinstance(value, str)
        if "\x00" in value:
            return "NUL byte", None
        if any(0xD800 <= ord(c) <= 0xDFFF for c in value):
            return "cannot be encoded", None
        if len(value.encode()) > 64 * 1024:
            return "over 64 KiB", None
        return None, value
    if param.type == "integer":
        assert isinstance(value, int | str)
        number = int(value) if isinstance(value, str) else value  # "3", "-3": never huge here
        if abs(number) >= 10**30:
            return "digits", None
        if isinstance(value, int) and abs(value) > 2**53:  # a JSON number may have lost digits
            return "beyond 2^53", None
        return None, str(number)
    if param.type == "number":
        if value == "1e400" or not math.isfinite(float(value)):  # type: ignore[arg-type]
            return "finite", None
        assert isinstance(value, float)
        if abs(value) >= 1e30:
            return "digits", None
        rendered = format(Decimal(repr(value)), "f")
        assert "e" not in rendered.lower()  # numbers render without exponent
        return None, rendered
    assert isinstance(value, bool | str)
    return None, "true" if str(value).lower() == "true" else "false"


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(params=calls())
def test_each_value_is_invalid_with_its_reason_or_lands_inside_exactly_its_entry(
    argv_printer: Path, params: list[Param]
) -> None:
    entries = [POSITIONS[p.position][0] % p.name for p in params]
    tool = ToolSpec(
        name="show",
        description="",
        params=tuple(
            ParamSpec(p.name, p.type, "", required=True, allow_dash=p.allow_dash) for p in params
        ),
        command=(str(argv_printer), *entries),
        workdir=argv_printer.parent,
    )
    raw = "{" + ", ".join(f'"{p.name}": {raw_json(p.value)}' for p in params) + "}"
    result = validate_call(tool, raw)
    canonical_arguments(raw)  # the loop detector's key: never raises either
    if any(long_literal(p.value) for p in params):
        assert isinstance(result, InvalidCall)
        [problem] = result.problems
        assert problem.startswith("the arguments hold an integer of "), problem
        assert problem.endswith(" digits; integers have at most 30")
        return
    problems = {p.name: expected_problem(p) for p in params}
    bad = {name: why for name, (why, _) in problems.items() if why is not None}
    if bad:
        assert isinstance(result, InvalidCall), (raw[:200], bad)
        for name, why in bad.items():
            assert any(q.startswith(f"{name}: ") and why in q for q in result.problems), (
                name,
                why,
                result.problems,
            )
        return
    rendered = {name: text or "" for name, (_, text) in problems.items()}
    expected = [POSITIONS[p.position][0].replace("{{%s}}", rendered[p.name]) for p in params]
    dashed = [
        p.name
        for p, entry in zip(params, expected, strict=True)
        if POSITIONS[p.position][1] and entry.startswith("-") and not p.allow_dash
    ]
    if dashed:
        assert isinstance(result, InvalidCall), (raw[:200], dashed)
        assert sorted(q.split(":")[0] for q in result.problems) == sorted(dashed)
        assert all("'-'" in q and "read it as an option" in q for q in result.problems)
        return
    assert isinstance(result, ValidCall), getattr(result, "problems", result)
    ran = HostExecutor().execute(result.argv, tool.workdir, {}, 30)
    assert ran.exit_code == 0, ran.stderr.data[-500:]
    assert json.loads(ran.stdout.data) == expected


JSONISH = st.recursive(
    st.none()
    | st.booleans()
    | st.floats()
    | st.integers(min_value=-(10**40), max_value=10**40)
    | st.text(max_size=20),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=20,
)
RAW = st.one_of(
    JSONISH.map(json.dumps),
    st.text(max_size=200),
    st.sampled_from(
        ["[" * 5000, '{"a": ' * 3000, "9" * 5000, "-" + "1" * 4400, "1e400", "NaN", "\ud800"]
    ),
)


@settings(max_examples=200, deadline=None)
@given(raw=RAW, type_=st.sampled_from(["string", "integer", "number", "boolean", "json"]))
def test_nothing_a_model_sends_raises_anywhere_on_the_path(raw: str, type_: ParamType) -> None:
    """Validation, the invalid answer, the loop detector's key and text rescue take anything."""
    tool = ToolSpec(
        "t", "", (ParamSpec("a", type_, "", required=False),), ("prog", "{{a}}"), Path()
    )
    for arguments in (raw, json.dumps({"a": raw}), '{"a": ' + raw + "}"):
        result = validate_call(tool, arguments)
        assert isinstance(result, ValidCall | InvalidCall)
        if isinstance(result, ValidCall):
            for entry in result.argv:
                assert "\x00" not in entry
                entry.encode("utf-8")  # no lone surrogate reaches argv
        canonical_arguments(arguments)
        recover_tool_calls(f'{{"name": "t", "arguments": {arguments}}}', {"t"})
