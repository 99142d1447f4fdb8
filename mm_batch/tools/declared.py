"""Declared tools: the schema the model is sent, lenient coercion, one-pass argv rendering.

The rules come from the design note: no shell, the program never comes from a parameter, a
value lands inside exactly one argv entry, invalid calls are answered in text (quoting what the
model sent) so that it can retry, and coercion accepts only what needs no guess.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from typing import Any

from mm_batch.config.load import PLACEHOLDER_RE
from mm_batch.config.model import ParamSpec, ToolSpec, Value, render_value

MAX_VALUE_BYTES = 64 * 1024
CLOSING_SENTENCE = "Give each parameter as its own field."
_INTEGER_TEXT = re.compile(r"-?[0-9]+")
_NUMBER_TEXT = re.compile(r"-?[0-9]+(\.[0-9]+)?")


@dataclass(frozen=True)
class ValidCall:
    arguments: dict[str, Value]
    argv: tuple[str, ...]


@dataclass(frozen=True)
class InvalidCall:
    problems: tuple[str, ...]
    answer: str


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


def parse_arguments(raw: str | None) -> tuple[dict[str, Any] | None, str | None]:
    """The model's raw argument string as a JSON object, or why it is not one."""
    if raw is None or not raw.strip() or raw.strip() == "null":
        return {}, None
    try:
        data = json.loads(raw)
    except (ValueError, RecursionError):
        return None, "the arguments are not valid JSON"
    if not isinstance(data, dict):
        return None, f"the arguments must be a JSON object, got a JSON {_json_kind(data)}"
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


def coerce(param: ParamSpec, value: Any) -> tuple[Value | None, str | None]:
    """Coerce one JSON value leniently: only what needs no guess. Returns (value, problem)."""
    shown = json.dumps(value, ensure_ascii=False)
    if len(shown) > 80:
        shown = shown[:77] + "..."
    if param.type == "json":
        return value, None
    if param.type == "string":
        if isinstance(value, str):
            return value, None
        if isinstance(value, int | float) and not isinstance(value, bool):
            return None, (
                f"expected a string, got the JSON number {shown}: send it as a JSON string "
                "(in quotes), exactly as it should be written"
            )
        return None, f"expected a string, got a JSON {_json_kind(value)} ({shown})"
    if param.type == "integer":
        if isinstance(value, int) and not isinstance(value, bool):
            return value, None
        if isinstance(value, float) and math.isfinite(value) and value.is_integer():
            return int(value), None
        if isinstance(value, str) and _INTEGER_TEXT.fullmatch(value):
            return int(value), None
        return None, f"expected an integer, got {shown}"
    if param.type == "number":
        if isinstance(value, int | float) and not isinstance(value, bool):
            if math.isfinite(value):
                return value, None
            return None, f"expected a finite number, got {shown}"
        if isinstance(value, str) and _NUMBER_TEXT.fullmatch(value):
            return (float(value) if "." in value else int(value)), None
        return None, f"expected a number, got {shown}"
    if isinstance(value, bool):
        return value, None
    if isinstance(value, str) and value.lower() in ("true", "false"):
        return value.lower() == "true", None
    return None, f"expected true or false, got {shown}"


def _stands_alone(tool: ToolSpec, name: str) -> bool:
    """Whether the parameter's value would be a whole argv entry (where `-x` is an option)."""
    for entry in tool.command[1:]:
        match = PLACEHOLDER_RE.fullmatch(entry)
        if match is not None and match.group(1).strip() == name:
            return True
    return False


def _value_problem(tool: ToolSpec, param: ParamSpec, value: Value) -> str | None:
    if param.enum is not None and value not in param.enum:
        allowed = ", ".join(render_value(v) for v in param.enum)
        return f"{render_value(value)!r} is not one of: {allowed}"
    if isinstance(value, str):
        if "\x00" in value:
            return "the value contains a NUL byte"
        if len(value.encode("utf-8", "surrogatepass")) > MAX_VALUE_BYTES:
            return f"the value is over {MAX_VALUE_BYTES // 1024} KiB"
        if value.startswith("-") and not param.allow_dash and _stands_alone(tool, param.name):
            return (
                f"the value {value[:40]!r} begins with '-' and would be read as an option of "
                "the command"
            )
    return None


def validate_call(tool: ToolSpec, raw_arguments: str | None) -> ValidCall | InvalidCall:
    """Validate and coerce a model's call of a declared tool, then render its argv."""
    data, problem = parse_arguments(raw_arguments)
    problems: list[str] = []
    coerced: dict[str, Value] = {}
    if data is None:
        problems.append(problem or "the arguments are not a JSON object")
    else:
        known = {p.name for p in tool.params}
        problems.extend(f"unknown parameter '{name}'" for name in data if name not in known)
        for param in tool.params:
            raw = data.get(param.name)
            if raw is None:
                if param.required:
                    problems.append(f"{param.name}: missing (required)")
                elif param.default is not None:
                    coerced[param.name] = param.default
                continue
            value, why = coerce(param, raw)
            if value is not None:
                why = _value_problem(tool, param, value)
            if why is not None or value is None:
                problems.append(f"{param.name}: {why}")
                continue
            coerced[param.name] = value
    if problems:
        return InvalidCall(
            tuple(problems),
            invalid_answer(
                tool.name, problems, raw_arguments, [parameter_line(p) for p in tool.params]
            ),
        )
    return ValidCall(coerced, render_argv(tool, coerced))


def invalid_answer(
    tool_name: str, problems: list[str], raw_arguments: str | None, parameter_lines: list[str]
) -> str:
    """What an invalid call is answered with: what was wrong, the call quoted, each parameter."""
    lines = [f"Invalid call of {tool_name}; it did not run."]
    lines.extend(f"- {p}" for p in problems)
    lines.append(f"You sent: {raw_arguments if raw_arguments is not None else '(no arguments)'}")
    if parameter_lines:
        lines.append(f"Parameters of {tool_name}:")
        lines.extend(parameter_lines)
    else:
        lines.append(f"{tool_name} takes no parameters.")
    lines.append(f"Call {tool_name} again. {CLOSING_SENTENCE}")
    return "\n".join(lines)


def render_argv(tool: ToolSpec, values: dict[str, Value]) -> tuple[str, ...]:
    """Put each value inside its argv entry in one pass: never re-expanded, split or globbed."""
    argv: list[str] = []
    for entry in tool.command:
        names = [m.strip() for m in PLACEHOLDER_RE.findall(entry)]
        if any(name not in values for name in names):
            continue  # an absent optional parameter without default drops its entry
        argv.append(PLACEHOLDER_RE.sub(lambda m: render_value(values[m.group(1).strip()]), entry))
    return tuple(argv)
