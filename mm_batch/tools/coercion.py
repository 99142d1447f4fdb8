"""The model's arguments read as JSON, and each value coerced to its parameter's type.

Coercion accepts only what needs no guess: a number is exactly the number the model wrote, or
invalid, never a rounding of it; a boolean is `true`/`false` (or their text); a string is a
string. Every problem quotes the value masked, then cut.
"""

from __future__ import annotations

import decimal
import json
import math
import re
from dataclasses import dataclass
from decimal import Decimal

from mm_batch.config.model import ParamSpec, Value, render_value
from mm_batch.config.secrets import NO_SECRETS, Masked, Masker, head
from mm_batch.jsontypes import JsonObject, JsonValue
from mm_batch.tools.mcp_schema import types_of

MAX_VALUE_BYTES = 64 * 1024
MAX_INTEGER_DIGITS = 30
_DIGITS_LIMIT = 10**MAX_INTEGER_DIGITS  # a magnitude below this has at most 30 digits
# An integer parameter takes a JSON number only up to this magnitude: beyond it a number may have
# lost digits on its way (any JSON reader that holds numbers as doubles), so taking it would be
# a guess; its digits as a JSON string are exact.
MAX_EXACT_INTEGER = 2**53
MAX_NESTING = 64  # as for the files mm-batch reads: deeper JSON is refused, never recursed into
_INTEGER_TEXT = re.compile(r"-?[0-9]+")
_NUMBER_TEXT = re.compile(r"-?[0-9]+(\.[0-9]+)?")


@dataclass(frozen=True)
class Invalid:
    """Why what the model sent cannot be taken (a value quoted in it is masked)."""

    problem: str


@dataclass(frozen=True)
class Coerced:
    """A value coerced to its parameter's type."""

    value: Value


@dataclass(frozen=True)
class Parsed:
    """The model's arguments as a JSON object, bounded in digits and depth."""

    data: JsonObject


class _LongIntegerError(ValueError):
    """An integer literal of the model's JSON is over the digit limit: never made an int."""

    def __init__(self, digits: int) -> None:
        super().__init__(f"an integer of {digits} digits")
        self.digits = digits


def _parse_int(text: str) -> int:
    # Checked before int(): over 4300 digits int() raises, and str() of a huge int raises too.
    digits = len(text) - text.startswith("-")
    if digits > MAX_INTEGER_DIGITS:
        raise _LongIntegerError(digits)
    return int(text)


class _JsonFloat(float):
    """A JSON number written with a fraction or an exponent, with the text the model wrote:
    coercion reads the number that text denotes, not the double nearest to it. It never leaves
    this module: coerced values are plain floats."""

    __slots__ = ("text",)
    text: str

    def __new__(cls, text: str) -> _JsonFloat:
        number = super().__new__(cls, text)
        number.text = text
        return number


_ARGUMENTS_DECODER = json.JSONDecoder(parse_int=_parse_int, parse_float=_JsonFloat)


def _depth(data: JsonValue) -> int:
    """How deep the JSON value nests (a scalar is 0), walked without recursion."""
    deepest = 0
    stack: list[tuple[JsonValue, int]] = [(data, 0)]
    while stack:
        value, depth = stack.pop()
        items = list(value.values()) if isinstance(value, dict) else value
        if isinstance(items, list):
            deepest = max(deepest, depth + 1)
            stack.extend((item, depth + 1) for item in items)
    return deepest


def _decode(text: str) -> JsonValue | Invalid:
    """The JSON value `text` is, its integers bounded; or why it is none."""
    try:
        data: JsonValue = _ARGUMENTS_DECODER.decode(text)
    except _LongIntegerError as exc:
        return Invalid(
            f"the arguments hold an integer of {exc.digits} digits; "
            f"integers have at most {MAX_INTEGER_DIGITS}"
        )
    except (ValueError, RecursionError):
        return Invalid("the arguments are not valid JSON")
    return data


def _decoded(text: str) -> JsonValue:
    """The JSON value `text` is, within the arguments' bounds; None when it is none."""
    data = _decode(text)
    if isinstance(data, Invalid) or _depth(data) > MAX_NESTING:
        return None
    return _plain(data)


def parse_arguments(raw: str | None) -> Parsed | Invalid:
    """The model's raw argument string as a JSON object, or why it is not one.

    An object it returns holds no integer over 30 digits and nests at most 64 levels, so that
    anything downstream (str(), json.dumps, the loop detector's key) can handle it.
    """
    if raw is None or not raw.strip() or raw.strip() == "null":
        return Parsed({})
    data = _decode(raw)
    if isinstance(data, Invalid):
        return data
    if not isinstance(data, dict):
        return Invalid(f"the arguments must be a JSON object, got a JSON {_json_kind(data)}")
    if _depth(data) > MAX_NESTING:
        return Invalid(f"the arguments nest deeper than {MAX_NESTING} levels")
    return Parsed(data)


def _json_kind(value: JsonValue) -> str:
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    if value is None:
        return "null"
    return "object"


def clip(text: Masked, limit: int = 80) -> str:
    """A text cut short for a reason: only a masked one, so that no secret's prefix is left."""
    return text if len(text) <= limit else head(text, limit - 3) + "..."


def shown(value: JsonValue, masker: Masker) -> str:
    """A value as JSON, masked first, then cut short: for reasons, never for what runs."""
    if isinstance(value, str):
        return masker.text(json.dumps(clip(masker.text(value)), ensure_ascii=False))
    return masker.text(clip(masker.json_text(value)))


def _digit_count(text: str) -> int:
    return len(text.lstrip("-").split(".")[0])


def _too_many_digits(quoted: str) -> Invalid:
    return Invalid(f"the value {quoted} has over {MAX_INTEGER_DIGITS} digits")


def _exact(number: int | float) -> Decimal | None:
    """The number a JSON number denotes: its text as the model wrote it when known; None when
    no decimal can hold it (an exponent of 10^18 or more: `1e-99999999999999999999`)."""
    if not isinstance(number, _JsonFloat):
        return Decimal(number)
    try:
        return Decimal(number.text)
    except decimal.InvalidOperation:
        return None


def _whole(number: Decimal) -> bool:
    """Whether a finite decimal is a whole number, read from its digits (no context can round
    or overflow, whatever its exponent)."""
    _, digits, exponent = number.as_tuple()
    assert isinstance(exponent, int)  # finite: the caller checked
    return exponent >= 0 or not any(digits[exponent:])


def _as_double(number: float, exact: Decimal, quoted: str) -> Coerced | Invalid:
    """A number parameter's value as a double, when that double renders as the number written
    (render_value writes the shortest repr): more digits than a double keeps would be rounded."""
    if Decimal(repr(number)) != exact:
        return Invalid(
            f"the value {quoted} has more significant digits than a number keeps (17): it would "
            f"run as {render_value(float(number))}; send the number that should run"
        )
    return Coerced(float(number))


def _coerce_number(param: ParamSpec, value: JsonValue, quoted: str) -> Coerced | Invalid:
    """An integer or number parameter: exactly the number the model wrote, or invalid, never a
    rounding of it (SPEC §2: render_value of the result denotes the number sent)."""
    integer = param.type == "integer"
    wanted = f"expected {'an integer' if integer else 'a number'}, got {quoted}"
    if isinstance(value, str):
        if not (_INTEGER_TEXT if integer else _NUMBER_TEXT).fullmatch(value):
            return Invalid(wanted)
        if _digit_count(value) > MAX_INTEGER_DIGITS:
            return _too_many_digits(quoted)
        if "." not in value:
            return Coerced(int(value))  # decimal digits are exact at any magnitude
        return _as_double(float(value), Decimal(value), quoted)
    if isinstance(value, bool) or not isinstance(value, int | float):
        return Invalid(wanted)
    if isinstance(value, float) and not math.isfinite(value):
        return Invalid(f"expected a finite number, got {quoted}")
    exact = _exact(value)
    if exact is None:  # a finite double, so a tiny exponent: no whole number, no double keeps it
        return Invalid(f"{wanted}: its exponent is beyond any number that can run")
    if exact.copy_abs() >= _DIGITS_LIMIT:
        return _too_many_digits(quoted)
    if integer:
        if not _whole(exact):
            return Invalid(wanted)
        if exact.copy_abs() > MAX_EXACT_INTEGER:
            return Invalid(
                f"{wanted}: a JSON number beyond 2^53 may have lost digits on its way; send the "
                'integer as a JSON string of its digits ("12345678901234567890")'
            )
        return Coerced(int(exact))
    if isinstance(value, int):
        return Coerced(value)
    return _as_double(value, exact, quoted)


def _plain(value: JsonValue) -> JsonValue:
    """A JSON value with its numbers as plain floats (nesting is bounded by parse_arguments)."""
    if isinstance(value, _JsonFloat):
        return float(value)
    if isinstance(value, list):
        return [_plain(item) for item in value]
    if isinstance(value, dict):
        return {key: _plain(item) for key, item in value.items()}
    return value


def _structure(param: ParamSpec, value: Value, quoted: str) -> Coerced | Invalid:
    """An MCP parameter whose schema admits arrays or objects only: one of those, or a JSON
    string of one (small models write an array as the text of one, and the server would read
    it so: what is recorded and judged is what it runs). Any other value is answered."""
    kinds = set(types_of(param.schema or {})) - {"null"}
    if not kinds or not kinds <= {"array", "object"}:
        return Coerced(value)
    written = _decoded(value) if isinstance(value, str) else value
    if isinstance(written, list | dict) and _json_kind(written) in kinds:
        return Coerced(written)
    expected = " or ".join(f"a JSON {kind}" for kind in sorted(kinds))
    return Invalid(f"expected {expected}, got a JSON {_json_kind(value)} ({quoted})")


def coerce(param: ParamSpec, value: Value, masker: Masker = NO_SECRETS) -> Coerced | Invalid:
    """Coerce one JSON value (never null: a null is an absent value) leniently: only what needs
    no guess. A problem quotes the value masked."""
    # A number with a fraction or an exponent is quoted as the model wrote it, not as the double
    # it parsed to ("got 3.0" for 3.0000000000000001 would say nothing).
    text = value.text if isinstance(value, _JsonFloat) else None
    quoted = shown(value, masker) if text is None else shown(text, masker)[1:-1]
    if param.type == "json":
        plain = _plain(value)
        assert plain is not None  # only null is plain null
        return _structure(param, plain, quoted)
    if param.type == "string":
        if isinstance(value, str):
            return Coerced(value)
        if isinstance(value, int | float) and not isinstance(value, bool):
            return Invalid(
                f"expected a string, got the JSON number {quoted}: send it as a JSON string "
                "(in quotes), exactly as it should be written"
            )
        return Invalid(f"expected a string, got a JSON {_json_kind(value)} ({quoted})")
    if param.type in ("integer", "number"):
        return _coerce_number(param, value, quoted)
    if isinstance(value, bool):
        return Coerced(value)
    if isinstance(value, str) and value.lower() in ("true", "false"):
        return Coerced(value.lower() == "true")
    return Invalid(f"expected true or false, got {quoted}")


def _text_problem(text: str) -> str | None:
    """Why a string cannot be put into argv, a file or a request as it is; None when it can."""
    if "\x00" in text:
        return "the value contains a NUL byte"
    try:
        size = len(text.encode("utf-8"))
    except UnicodeEncodeError as exc:
        char = f"U+{ord(text[exc.start]):04X}"
        return f"the value holds a character that cannot be encoded ({char}, a lone surrogate)"
    if size > MAX_VALUE_BYTES:
        return f"the value is over {MAX_VALUE_BYTES // 1024} KiB"
    return None


def _json_problem(value: Value) -> str | None:
    """Why a free-form JSON value (an MCP argument) cannot be sent on as it is."""
    stack: list[JsonValue] = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            problem = _text_problem(item)
            if problem is not None:
                return problem
        elif isinstance(item, float) and not math.isfinite(item):
            return f"the value holds a non-finite number ({item})"
        elif isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    if len(json.dumps(value, ensure_ascii=False).encode("utf-8")) > MAX_VALUE_BYTES:
        return f"the value is over {MAX_VALUE_BYTES // 1024} KiB"
    return None


def _kind(value: object) -> str:
    """A value's JSON kind, told apart as Python's == does not (True == 1 == 1.0)."""
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "float"
    if isinstance(value, list | tuple):
        return "array"
    return "object" if isinstance(value, dict) else type(value).__name__


def same_value(a: object, b: object, numeric: bool = False) -> bool:
    """Equality of coerced or expected values without Python's conversions: a boolean is never a
    number and an integer never a float, through lists and objects too. `numeric`: integers and
    floats compare as numbers (a declared number parameter's 2 is its 2.0)."""
    kinds = {_kind(a), _kind(b)}
    if numeric and kinds <= {"integer", "float"}:
        return a == b
    if len(kinds) > 1:
        return False
    if isinstance(a, list | tuple) and isinstance(b, list | tuple):
        return len(a) == len(b) and all(same_value(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same_value(a[k], b[k]) for k in a)
    return a == b


def value_problem(param: ParamSpec, value: Value, masker: Masker) -> str | None:
    """Why a coerced value cannot run: text that cannot be put into argv, JSON that cannot be
    sent on, or a value outside the parameter's allowed ones."""
    if isinstance(value, str):
        problem = _text_problem(value)
        if problem is not None:
            return problem
    elif param.type == "json":
        problem = _json_problem(value)
        if problem is not None:
            return problem
    numeric = param.type == "number"
    if param.enum is not None and not any(same_value(value, v, numeric) for v in param.enum):
        allowed = ", ".join(render_value(v) for v in param.enum)
        return f"{clip(masker.text(render_value(value)))!r} is not one of: {allowed}"
    return None
