"""A model's call of a declared tool, validated: its arguments parsed and coerced, its argv
rendered, or the answer that tells the model what was wrong.

The rules come from the design note: no shell, the program never comes from a parameter, a
value lands inside exactly one argv entry, invalid calls are answered in text (quoting what the
model sent) so that it can retry, and coercion accepts only what needs no guess. The jobs live
beside this module: `schema` (what the model is sent), `coercion` (JSON and values), `argv`
(rendering and the option rule).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import assert_never

from mm_batch.config.model import ParamSpec, ToolSpec, Value
from mm_batch.config.secrets import NO_SECRETS, Masked, Masker, head
from mm_batch.jsontypes import JsonObject
from mm_batch.tools.argv import dash_problems, render_argv
from mm_batch.tools.coercion import (
    Coerced,
    Invalid,
    Parsed,
    coerce,
    parse_arguments,
    shown,
    value_problem,
)
from mm_batch.tools.schema import CLOSING_SENTENCE, parameter_line

MAX_PROBLEMS = 20  # an invalid answer lists at most this many problems
QUOTE_LIMIT = 16 * 1024  # what an invalid answer quotes of the model's arguments, like output


@dataclass(frozen=True)
class ValidCall:
    arguments: dict[str, Value]
    argv: tuple[str, ...]


@dataclass(frozen=True)
class InvalidCall:
    """What was wrong, and the answer the model gets: both masked (they quote what it sent)."""

    problems: tuple[Masked, ...]
    answer: Masked


_TOKEN = re.compile(r"[^\W_]+|[^\w\s]|_")


def _words(text: str) -> str:
    """Text as its words and signs, case folded, one space between each and around all, so
    that a whole-word search is one substring search: linear, whatever the text holds."""
    return f" {' '.join(_TOKEN.findall(text.casefold()))} "


def _copied_examples(tool: ToolSpec, data: JsonObject, said: str) -> list[str]:
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


def _problem(param: ParamSpec, raw: Value, masker: Masker, coerced: dict[str, Value]) -> str | None:
    """Coerce one value the model sent into `coerced`, or say why it cannot run."""
    match coerce(param, raw, masker):
        case Invalid(problem):
            return problem
        case Coerced(value):
            why = value_problem(param, value, masker)
            if why is None:
                coerced[param.name] = value
            return why
        case unreachable:
            assert_never(unreachable)


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
    problems: list[str] = []
    coerced: dict[str, Value] = {}
    unknown: list[str] = []
    data: JsonObject | None = None
    match parse_arguments(raw_arguments):
        case Invalid(problem):
            problems.append(problem)
        case Parsed(data):
            known = {p.name for p in tool.params}
            unknown = [name for name in data if name not in known]
            problems.extend(f"unknown parameter {shown(name, masker)[1:-1]!r}" for name in unknown)
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
                why = _problem(param, raw, masker, coerced)
                if why is not None:
                    problems.append(f"{param.name}: {why}")
            if not problems:
                problems.extend(dash_problems(tool, coerced, masker))
            if not problems and said is not None:
                problems.extend(_copied_examples(tool, data, said))
        case unreachable:
            assert_never(unreachable)
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
    tool: ToolSpec, data: JsonObject | None, unknown: list[str], masker: Masker
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
