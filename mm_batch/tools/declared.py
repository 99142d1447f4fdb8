"""Declared tools: the schema the model is sent, lenient coercion, one-pass argv rendering.

The rules come from the design note: no shell, the program never comes from a parameter, a
value lands inside exactly one argv entry, invalid calls are answered in text (quoting what the
model sent) so that it can retry, and coercion accepts only what needs no guess.
"""

from __future__ import annotations

import decimal
import json
import math
import re
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from mm_batch.config.load import PLACEHOLDER_RE
from mm_batch.config.model import ParamSpec, ToolSpec, Value, render_value
from mm_batch.config.secrets import NO_SECRETS, Masked, Masker, head

MAX_VALUE_BYTES = 64 * 1024
MAX_INTEGER_DIGITS = 30
_DIGITS_LIMIT = 10**MAX_INTEGER_DIGITS  # a magnitude below this has at most 30 digits
# An integer parameter takes a JSON number only up to this magnitude: beyond it a number may have
# lost digits on its way (any JSON reader that holds numbers as doubles), so taking it would be
# a guess; its digits as a JSON string are exact.
MAX_EXACT_INTEGER = 2**53
MAX_NESTING = 64  # as for the files mm-batch reads: deeper JSON is refused, never recursed into
MAX_PROBLEMS = 20  # an invalid answer lists at most this many problems
QUOTE_LIMIT = 16 * 1024  # what an invalid answer quotes of the model's arguments, like output
CLOSING_SENTENCE = "Give each parameter as its own field."
_INTEGER_TEXT = re.compile(r"-?[0-9]+")
_NUMBER_TEXT = re.compile(r"-?[0-9]+(\.[0-9]+)?")


@dataclass(frozen=True)
class ValidCall:
    arguments: dict[str, Value]
    argv: tuple[str, ...]


@dataclass(frozen=True)
class InvalidCall:
    """What was wrong, and the answer the model gets: both masked (they quote what it sent)."""

    problems: tuple[Masked, ...]
    answer: Masked


def _param_facts(param: ParamSpec) -> list[str]:
    facts = [param.type, "required" if param.required else "optional"]
    if param.enum is not None:
        facts.append("one of: " + ", ".join(render_value(v) for v in param.enum))
    if param.default is not None:
        facts.append(f"default {render_value(param.default)}")
    return facts


def parameter_line(param: ParamSpec) -> str:
    """One line per parameter, for the tool description and for invalid-call answers."""
    text = f"- {param.name} ({', '.join(_param_facts(param))})"
    return f"{text}: {param.description}" if param.description else text


def _property_description(param: ParamSpec) -> str:
    parts = [param.description.rstrip()] if param.description else []
    parts.append("Required." if param.required else "Optional.")
    if param.enum is not None:
        parts.append("One of: " + ", ".join(render_value(v) for v in param.enum) + ".")
    if param.default is not None:
        parts.append(f"Default: {render_value(param.default)}.")
    return " ".join(parts)


def tool_description(tool: ToolSpec) -> str:
    lines = [tool.description.rstrip()] if tool.description else []
    lines.extend(parameter_line(p) for p in tool.params)
    lines.append(CLOSING_SENTENCE)
    return "\n".join(lines)


def model_schema(tool: ToolSpec) -> dict[str, Any]:
    """The OpenAI tool entry: types and descriptions only, never `required` or `enum` keywords."""
    properties = {
        p.name: {"type": p.type, "description": _property_description(p)} for p in tool.params
    }
    return {
        "type": "function",
        "function": {
            "name": tool.name,
            "description": tool_description(tool),
            "parameters": {"type": "object", "properties": properties},
        },
    }


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


def _depth(data: Any) -> int:
    """How deep the JSON value nests (a scalar is 0), walked without recursion."""
    deepest = 0
    stack: list[tuple[Any, int]] = [(data, 0)]
    while stack:
        value, depth = stack.pop()
        if isinstance(value, dict):
            value = list(value.values())
        if isinstance(value, list):
            deepest = max(deepest, depth + 1)
            stack.extend((item, depth + 1) for item in value)
    return deepest


def parse_arguments(raw: str | None) -> tuple[dict[str, Any] | None, str | None]:
    """The model's raw argument string as a JSON object, or why it is not one.

    An object it returns holds no integer over 30 digits and nests at most 64 levels, so that
    anything downstream (str(), json.dumps, the loop detector's key) can handle it.
    """
    if raw is None or not raw.strip() or raw.strip() == "null":
        return {}, None
    try:
        data = _ARGUMENTS_DECODER.decode(raw)
    except _LongIntegerError as exc:
        return None, (
            f"the arguments hold an integer of {exc.digits} digits; "
            f"integers have at most {MAX_INTEGER_DIGITS}"
        )
    except (ValueError, RecursionError):
        return None, "the arguments are not valid JSON"
    if not isinstance(data, dict):
        return None, f"the arguments must be a JSON object, got a JSON {_json_kind(data)}"
    if _depth(data) > MAX_NESTING:
        return None, f"the arguments nest deeper than {MAX_NESTING} levels"
    return data, None


def _json_kind(value: Any) -> str:
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


def _clip(text: Masked, limit: int = 80) -> str:
    """A text cut short for a reason: only a masked one, so that no secret's prefix is left."""
    return text if len(text) <= limit else head(text, limit - 3) + "..."


def _shown(value: Any, masker: Masker) -> str:
    """A value as JSON, masked first, then cut short: for reasons, never for what runs."""
    if isinstance(value, str):
        return masker.text(json.dumps(_clip(masker.text(value)), ensure_ascii=False))
    return masker.text(_clip(masker.json_text(value)))


def _digit_count(text: str) -> int:
    return len(text.lstrip("-").split(".")[0])


def _too_many_digits(shown: str) -> str:
    return f"the value {shown} has over {MAX_INTEGER_DIGITS} digits"


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


def _as_double(number: float, exact: Decimal, shown: str) -> tuple[Value | None, str | None]:
    """A number parameter's value as a double, when that double renders as the number written
    (render_value writes the shortest repr): more digits than a double keeps would be rounded."""
    if Decimal(repr(number)) != exact:
        return None, (
            f"the value {shown} has more significant digits than a number keeps (17): it would "
            f"run as {render_value(float(number))}; send the number that should run"
        )
    return float(number), None


def _coerce_number(param: ParamSpec, value: Any, shown: str) -> tuple[Value | None, str | None]:
    """An integer or number parameter: exactly the number the model wrote, or invalid, never a
    rounding of it (SPEC §2: render_value of the result denotes the number sent)."""
    integer = param.type == "integer"
    wanted = f"expected {'an integer' if integer else 'a number'}, got {shown}"
    if isinstance(value, str):
        if not (_INTEGER_TEXT if integer else _NUMBER_TEXT).fullmatch(value):
            return None, wanted
        if _digit_count(value) > MAX_INTEGER_DIGITS:
            return None, _too_many_digits(shown)
        if "." not in value:
            return int(value), None  # decimal digits are exact at any magnitude
        return _as_double(float(value), Decimal(value), shown)
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None, wanted
    if isinstance(value, float) and not math.isfinite(value):
        return None, f"expected a finite number, got {shown}"
    exact = _exact(value)
    if exact is None:  # a finite double, so a tiny exponent: no whole number, no double keeps it
        return None, f"{wanted}: its exponent is beyond any number that can run"
    if exact.copy_abs() >= _DIGITS_LIMIT:
        return None, _too_many_digits(shown)
    if integer:
        if not _whole(exact):
            return None, wanted
        if exact.copy_abs() > MAX_EXACT_INTEGER:
            return None, (
                f"{wanted}: a JSON number beyond 2^53 may have lost digits on its way; send the "
                'integer as a JSON string of its digits ("12345678901234567890")'
            )
        return int(exact), None
    if isinstance(value, int):
        return value, None
    return _as_double(value, exact, shown)


def _plain(value: Any) -> Any:
    """A JSON value with its numbers as plain floats (nesting is bounded by parse_arguments)."""
    if isinstance(value, _JsonFloat):
        return float(value)
    if isinstance(value, list):
        return [_plain(item) for item in value]
    if isinstance(value, dict):
        return {key: _plain(item) for key, item in value.items()}
    return value


def coerce(
    param: ParamSpec, value: Any, masker: Masker = NO_SECRETS
) -> tuple[Value | None, str | None]:
    """Coerce one JSON value leniently: only what needs no guess. Returns (value, problem),
    the problem quoting the value masked."""
    # A number with a fraction or an exponent is quoted as the model wrote it, not as the double
    # it parsed to ("got 3.0" for 3.0000000000000001 would say nothing).
    text = value.text if isinstance(value, _JsonFloat) else None
    shown = _shown(value, masker) if text is None else _shown(text, masker)[1:-1]
    if param.type == "json":
        return _plain(value), None
    if param.type == "string":
        if isinstance(value, str):
            return value, None
        if isinstance(value, int | float) and not isinstance(value, bool):
            return None, (
                f"expected a string, got the JSON number {shown}: send it as a JSON string "
                "(in quotes), exactly as it should be written"
            )
        return None, f"expected a string, got a JSON {_json_kind(value)} ({shown})"
    if param.type in ("integer", "number"):
        return _coerce_number(param, value, shown)
    if isinstance(value, bool):
        return value, None
    if isinstance(value, str) and value.lower() in ("true", "false"):
        return value.lower() == "true", None
    return None, f"expected true or false, got {shown}"


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


def _json_problem(value: Any) -> str | None:
    """Why a free-form JSON value (an MCP argument) cannot be sent on as it is."""
    stack = [value]
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


def _value_problem(param: ParamSpec, value: Value, masker: Masker) -> str | None:
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
        return f"{_clip(masker.text(render_value(value)))!r} is not one of: {allowed}"
    return None


def _dash_problems(tool: ToolSpec, values: dict[str, Value], masker: Masker) -> list[str]:
    """Values that make an argv entry begin with '-' when its template does not: the program
    would read an option (SPEC §2). A value that begins the entry with '-' (`{{name}}`,
    `{{ref}}..HEAD`), and empty values that leave a later literal '-' at its start
    (`{{name}}-thumb.png`), whatever the template's shape; `allow_dash` lets a parameter do so."""
    problems: list[str] = []
    for entry in tool.command:
        rendered = _render_entry(entry, values)
        if rendered is None or not rendered.text.startswith("-"):
            continue
        bare = _bare_option(entry, values)
        if bare:
            problems.append(
                f"{', '.join(bare)}: the empty value would leave the argv entry "
                f"{_shown(entry, masker)} as the bare option {_shown(rendered.text, masker)}, "
                "and the program would read the next argv entry as its value"
            )
        for name in rendered.openers:
            param = tool.param(name)
            if param is None or param.allow_dash:
                continue
            value = render_value(values[name])
            if value:
                problem = (
                    f"{name}: the value {_shown(value, masker)} begins with '-' and would begin "
                    f"the argv entry {_shown(entry, masker)}, where the program would read it "
                    "as an option"
                )
            else:
                problem = (
                    f"{name}: the empty value would leave the argv entry {_shown(entry, masker)} "
                    f"beginning with '-' ({_shown(rendered.text, masker)}), where the program "
                    "would read it as an option"
                )
            if problem not in problems:
                problems.append(problem)
    return problems


_TOKEN = re.compile(r"[^\W_]+|[^\w\s]|_")


def _words(text: str) -> str:
    """Text as its words and signs, case folded, one space between each and around all, so
    that a whole-word search is one substring search: linear, whatever the text holds."""
    return f" {' '.join(_TOKEN.findall(text.casefold()))} "


def _copied_examples(tool: ToolSpec, data: dict[str, Any], said: str) -> list[str]:
    """The string values the model sent that stand in their parameter's own description (its
    example: "The service name, e.g. inventory.") and nowhere in what was said to it (the
    system prompt, the request, the output of the calls that ran): small models copy a
    description's example instead of the value the request gives, or instead of leaving an
    optional parameter out. Enum parameters are left alone: their allowed values are in their
    descriptions too. The value is not quoted in the problem: the answer quotes the call whole,
    masked before any cut."""
    problems = []
    said_words: str | None = None  # what was said, read only when a value is an example
    for param in tool.params:
        value = data.get(param.name)
        if param.type != "string" or param.enum is not None or not isinstance(value, str):
            continue
        word = _words(value)
        if not word.strip() or word not in _words(param.description):
            continue
        if said_words is None:
            said_words = _words(said)
        if word not in said_words:
            instead = (
                "give the value the request gives"
                if param.required
                else f"leave {param.name} out, or give the value the request gives"
            )
            problems.append(
                f"{param.name}: the value sent is the example in its description, and the "
                f"request does not say it: {instead}"
            )
    return problems


def validate_call(
    tool: ToolSpec,
    raw_arguments: str | None,
    said: str | None = None,
    *,
    masker: Masker = NO_SECRETS,
) -> ValidCall | InvalidCall:
    """Validate and coerce a model's call of a declared tool, then render its argv. With `said`
    (what the model was told so far), a value copied from a description's example is invalid.
    An invalid call's problems and answer quote what the model sent masked by `masker` before
    any cut (a run's masker: the secrets it knows)."""
    data, problem = parse_arguments(raw_arguments)
    problems: list[str] = []
    coerced: dict[str, Value] = {}
    unknown: list[str] = []
    if data is None:
        problems.append(problem or "the arguments are not a JSON object")
    else:
        known = {p.name for p in tool.params}
        unknown = [name for name in data if name not in known]
        problems.extend(f"unknown parameter {_shown(name, masker)[1:-1]!r}" for name in unknown)
        for param in tool.params:
            raw = data.get(param.name)
            if raw == "" and not param.required and param.default is None:
                raw = None  # SPEC §2: for an optional parameter without default, "" is left out
            if raw is None:
                if param.required:
                    problems.append(f"{param.name}: missing (required)")
                elif param.default is not None:
                    coerced[param.name] = param.default
                continue
            value, why = coerce(param, raw, masker)
            if value is not None:
                why = _value_problem(param, value, masker)
            if why is not None or value is None:
                problems.append(f"{param.name}: {why}")
                continue
            coerced[param.name] = value
        if not problems:
            problems.extend(_dash_problems(tool, coerced, masker))
        if not problems and said is not None:
            problems.extend(_copied_examples(tool, data, said))
    if problems:
        if len(problems) > MAX_PROBLEMS:
            more = len(problems) - MAX_PROBLEMS
            problems = [*problems[:MAX_PROBLEMS], f"... and {more} more problems"]
        lines = [parameter_line(p) for p in tool.params]
        retry = _retry_call(tool, data, unknown, masker) if len(unknown) == len(problems) else None
        return InvalidCall(
            tuple(masker.text(p) for p in problems),
            invalid_answer(tool.name, problems, raw_arguments, lines, retry, masker=masker),
        )
    return ValidCall(coerced, render_argv(tool, coerced))


def _retry_call(
    tool: ToolSpec, data: dict[str, Any] | None, unknown: list[str], masker: Masker
) -> str | None:
    """The model's own call without its unknown parameters, written out, when that call is
    valid: told only "unknown parameter", the 0.5B sends the same call again; it copies a call
    it is shown. Every value in it is one the model sent, masked before JSON escapes it."""
    if data is None:
        return None
    kept = {name: value for name, value in data.items() if name not in unknown}
    try:
        arguments = json.dumps(kept, ensure_ascii=False)
    except (ValueError, RecursionError):
        return None
    if not isinstance(validate_call(tool, arguments), ValidCall):
        return None
    return masker.json_text({"name": tool.name, "arguments": kept})


def invalid_answer(
    tool_name: str,
    problems: list[str],
    raw_arguments: str | None,
    parameter_lines: list[str],
    retry: str | None = None,
    *,
    masker: Masker = NO_SECRETS,
) -> Masked:
    """What an invalid call is answered with: what was wrong, the call quoted (masked, then cut
    at QUOTE_LIMIT characters), each parameter, and the call to make instead when dropping the
    unknown parameters makes it valid."""
    lines = [f"Invalid call of {tool_name}; it did not run."]
    lines.extend(f"- {p}" for p in problems)
    sent = "(no arguments)" if raw_arguments is None else _quoted(masker.text(raw_arguments))
    lines.append(f"You sent: {sent}")
    if parameter_lines:
        lines.append(f"Parameters of {tool_name}:")
        lines.extend(parameter_lines)
    else:
        lines.append(f"{tool_name} takes no parameters.")
    if retry is not None:
        lines.append(f"Call {tool_name} again without the unknown parameters: {retry}")
    lines.append(f"Call {tool_name} again. {CLOSING_SENTENCE}")
    return masker.text("\n".join(lines))


def _quoted(sent: Masked) -> str:
    """What the model sent, as an invalid answer quotes it: cut at QUOTE_LIMIT characters, a
    masked text only (a secret straddling the cut leaks no prefix)."""
    if len(sent) <= QUOTE_LIMIT:
        return sent
    return f"{head(sent, QUOTE_LIMIT)} [... {len(sent) - QUOTE_LIMIT} more characters cut ...]"


def _bare_option(entry: str, values: dict[str, Value]) -> list[str]:
    """The parameters whose empty values leave an option entry with no value of its own
    (`-o{{out}}` as `-o`, `--{{name}}` as `--`): the program would read the next entry as its
    value, or as no option at all."""
    if not entry.startswith("-") or "=" in entry:
        return []
    names = [m.group(1).strip() for m in PLACEHOLDER_RE.finditer(entry)]
    if not names or any(render_value(values[n]) for n in names):
        return []
    return names


@dataclass(frozen=True)
class _Rendered:
    """An argv entry with its values put in, and the parameters whose values decide how it
    begins: none when the template begins with a literal; the one whose non-empty value comes
    first; or the empty ones before the literal that comes first."""

    text: str
    openers: tuple[str, ...]


def _render_entry(entry: str, values: dict[str, Value]) -> _Rendered | None:
    """One argv entry rendered in one pass; None when an absent parameter drops it."""
    pieces: list[str] = []
    openers: tuple[str, ...] | None = None  # None until something non-empty begins the entry
    empties: list[str] = []
    position = 0
    for match in PLACEHOLDER_RE.finditer(entry):
        name = match.group(1).strip()
        if name not in values:
            return None
        literal = entry[position : match.start()]
        value = render_value(values[name])
        if openers is None and literal:
            openers = tuple(empties)  # () when the template itself begins with the literal
        if openers is None and value:
            openers = (name,)
        if openers is None:
            empties.append(name)
        pieces.extend((literal, value))
        position = match.end()
    tail = entry[position:]
    if openers is None and tail:
        openers = tuple(empties)
    pieces.append(tail)
    return _Rendered("".join(pieces), openers or ())


def render_argv(tool: ToolSpec, values: dict[str, Value]) -> tuple[str, ...]:
    """Put each value inside its argv entry in one pass: never re-expanded, split or globbed."""
    argv: list[str] = []
    for entry in tool.command:
        rendered = _render_entry(entry, values)
        if rendered is not None:  # an absent optional parameter without default drops its entry
            argv.append(rendered.text)
    return tuple(argv)
