"""Rescue tool calls that small models write as JSON text instead of real tool calls.

Qwen2.5-Coder and its kin answer `{"name": "release", "arguments": {...}}` — bare, fenced in
```json, or in <tool_call> tags. Only an object whose keys are exactly `name` plus `arguments`
or `parameters` (an object, or a JSON string of one) naming a tool of the agent is a call; data
that merely mentions a tool (`{"name": "deploy", "owner": "ops"}`), and any object nested
inside other JSON, stays text.

Time is linear in the text: a decoded value is skipped whole, and decoding that fails is paid
from a budget proportional to the text; once it is spent, the rest stays text.
"""

from __future__ import annotations

import json
import re
from collections.abc import Collection
from dataclasses import dataclass

from mm_batch.jsontypes import JsonValue

# Where a JSON object or array may begin: `{` before a key or `}`, `[` before a value. Code and
# prose braces (`{ return x; }`, `{{name}}`) are passed over without an attempt.
_OPENER = re.compile(r'\{(?=\s*["}])|\[(?=\s*[\[{"0-9tfn\]-])')
_DECODER = json.JSONDecoder()
_CALL_KEYS = ({"name", "arguments"}, {"name", "parameters"})
# A value is decoded from a window of the text, never from the whole of it (json's error would
# count the lines from the start: quadratic): first a small one, larger while the value might
# go on past its end, up to what no call written as text exceeds.
FIRST_WINDOW = 128
CALL_LIMIT = 1024 * 1024
# What decoding may cost in all, in characters: BUDGET_PER_CHAR per character of the text plus a
# floor, each attempt at least MIN_COST (a text of a million `{` stops early, as text).
BUDGET_PER_CHAR = 1
BUDGET_FLOOR = 1024 * 1024
MIN_COST = 512


@dataclass(frozen=True)
class TextCall:
    name: str
    raw_arguments: str


@dataclass(frozen=True)
class _Decoded:
    """The JSON value at an index of the text, where it ends, and what decoding it cost."""

    value: JsonValue
    end: int
    cost: int


@dataclass(frozen=True)
class _Undecodable:
    """No JSON value begins at the index: what finding that out cost."""

    cost: int


def _as_call(data: JsonValue, known: Collection[str]) -> TextCall | None:
    if not isinstance(data, dict) or set(data) not in _CALL_KEYS:
        return None
    name = data["name"]
    if not isinstance(name, str) or name not in known:
        return None
    arguments = data.get("arguments", data.get("parameters"))
    if isinstance(arguments, str):
        try:
            parsed = json.loads(arguments)
        except (ValueError, RecursionError):
            return None
        return TextCall(name, arguments) if isinstance(parsed, dict) else None
    if not isinstance(arguments, dict):
        return None
    try:
        return TextCall(name, json.dumps(arguments, ensure_ascii=False))
    except (ValueError, RecursionError):
        return None


def _decode(text: str, index: int) -> _Decoded | _Undecodable:
    """The JSON value at `index`, or the cost of failing to find one."""
    window = FIRST_WINDOW
    cost = 0
    while True:
        piece = text[index : index + window]
        cost += len(piece)
        try:
            data, end = _DECODER.raw_decode(piece)
        except json.JSONDecodeError as exc:
            cut = index + len(piece) < len(text)
            # The window may have ended inside the value: in a string, a number, a literal.
            inside = exc.pos >= len(piece) - 16 or exc.msg.startswith("Unterminated string")
            if not (cut and inside) or window >= CALL_LIMIT:
                return _Undecodable(cost)
            window = min(window * 8, CALL_LIMIT)
            continue
        except RecursionError:  # nesting past the stack: hostile, and costly to find out again
            return _Undecodable(max(cost, CALL_LIMIT))
        except ValueError:  # an integer of over 4300 digits
            return _Undecodable(cost)
        return _Decoded(data, index + end, cost)


def _span_end(text: str, index: int) -> int:
    """Where the bracketed value that begins at `index` ends, read as JSON's brackets and strings
    would be (the end of the text when it never closes): malformed JSON is skipped whole, so an
    object nested in it is never taken for a call."""
    depth = 0
    in_string = escaped = False
    for position in range(index, len(text)):
        char = text[position]
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
        elif char == '"':
            in_string = True
        elif char in "{[":
            depth += 1
        elif char in "}]":
            depth -= 1
            if depth == 0:
                return position + 1
    return len(text)


def recover_tool_calls(text: str, known: Collection[str]) -> list[TextCall]:
    """The calls of known tools written as JSON objects in the text, in order."""
    calls: list[TextCall] = []
    budget = BUDGET_PER_CHAR * len(text) + BUDGET_FLOOR
    match = _OPENER.search(text)
    while match is not None and budget > 0:
        index = match.start()
        decoded = _decode(text, index)
        budget -= max(MIN_COST, decoded.cost)
        if isinstance(decoded, _Undecodable):
            match = _OPENER.search(text, _span_end(text, index))
            continue
        call = _as_call(decoded.value, known)
        if call is not None:
            calls.append(call)
        # A decoded value is skipped whole: an object nested in other JSON is data, not a call.
        match = _OPENER.search(text, decoded.end)
    return calls
