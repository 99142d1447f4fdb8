"""A declared tool's argv: each value put inside its entry in one pass, and the values that
would make an entry read as an option (SPEC §2).

No shell: a value lands inside exactly one argv entry, never re-expanded, split or globbed, and
the program never comes from a parameter.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from mm_batch.config.load import PLACEHOLDER_RE
from mm_batch.config.model import ToolSpec, Value, render_value
from mm_batch.config.secrets import Masker
from mm_batch.tools.coercion import shown


@dataclass(frozen=True)
class _Rendered:
    """An argv entry with its values put in, and the parameters whose values decide how it
    begins: none when the template begins with a literal; the one whose non-empty value comes
    first; or the empty ones before the literal that comes first."""

    text: str
    openers: tuple[str, ...]


def _render_entry(entry: str, values: Mapping[str, Value]) -> _Rendered | None:
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


def render_argv(tool: ToolSpec, values: Mapping[str, Value]) -> tuple[str, ...]:
    """Put each value inside its argv entry in one pass: never re-expanded, split or globbed."""
    argv: list[str] = []
    for entry in tool.command:
        rendered = _render_entry(entry, values)
        if rendered is not None:  # an absent optional parameter without default drops its entry
            argv.append(rendered.text)
    return tuple(argv)


def _bare_option(entry: str, values: Mapping[str, Value]) -> list[str]:
    """The parameters whose empty values leave an option entry with no value of its own
    (`-o{{out}}` as `-o`, `--{{name}}` as `--`): the program would read the next entry as its
    value, or as no option at all."""
    if not entry.startswith("-") or "=" in entry:
        return []
    names = [m.group(1).strip() for m in PLACEHOLDER_RE.finditer(entry)]
    if not names or any(render_value(values[n]) for n in names):
        return []
    return names


def dash_problems(tool: ToolSpec, values: Mapping[str, Value], masker: Masker) -> list[str]:
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
                f"{shown(entry, masker)} as the bare option {shown(rendered.text, masker)}, "
                "and the program would read the next argv entry as its value"
            )
        for name in rendered.openers:
            param = tool.param(name)
            if param is None or param.allow_dash:
                continue
            value = render_value(values[name])
            if value:
                problem = (
                    f"{name}: the value {shown(value, masker)} begins with '-' and would begin "
                    f"the argv entry {shown(entry, masker)}, where the program would read it "
                    "as an option"
                )
            else:
                problem = (
                    f"{name}: the empty value would leave the argv entry {shown(entry, masker)} "
                    f"beginning with '-' ({shown(rendered.text, masker)}), where the program "
                    "would read it as an option"
                )
            if problem not in problems:
                problems.append(problem)
    return problems
