"""JSON read back field by field: each reader checks one value against what the schema says of
it and returns it typed, and every error names the field's path (`runs[3].duration_s: expected
a number ≥ 0, got "x"`). report/readback.py reads the results files with them.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable, Mapping
from typing import TypeAlias, TypeVar

from mm_batch.jsontypes import JsonObject, JsonValue
from mm_batch.report.summary import one_line

T = TypeVar("T")
# Reads the value at a path, or raises a FieldError naming that path.
Reader: TypeAlias = Callable[[JsonValue, str], T]


class FieldError(ValueError):
    """A field that is not what the schema says, with its path in the document."""

    def __init__(self, path: str, problem: str) -> None:
        # Keys come from the file: a path is shown on one line, bounded, controls spelled out.
        path = one_line(path, 300)
        super().__init__(f"{path}: {problem}" if path else problem)


def _unique(pairs: list[tuple[str, JsonValue]]) -> JsonObject:
    """An object of the document; a key given twice is refused (readers disagree on which
    value counts: Python's json takes the last, others the first)."""
    found = dict(pairs)
    seen: set[str] = set()
    for key, _ in pairs if len(found) != len(pairs) else ():
        if key in seen:
            raise ValueError(f"the key {one_line(json.dumps(key), 60)} twice in one object")
        seen.add(key)
    return found


def parse(text: str) -> JsonValue:
    """A JSON document, each object's keys once (a ValueError, or a RecursionError for a
    nesting deep enough, otherwise). NaN and Infinity read as numbers: `check_tree` names
    their place."""
    value: JsonValue = json.loads(text, object_pairs_hook=_unique)
    return value


# A place in a document being walked: the place it is in, and its key there.
_Trail: TypeAlias = "tuple[_Trail, str | int] | None"


def _path(trail: _Trail) -> str:
    keys: list[str | int] = []
    while trail is not None:
        trail, key = trail
        keys.append(key)
    path = ""
    for key in reversed(keys):
        path = at(path, key)
    return path


def check_tree(value: JsonValue, depth_limit: int) -> None:
    """Refuse, wherever it stands, what no file mm-batch writes holds: a number that is not
    finite (NaN, Infinity, or 1e999, which reads as infinity: JSON has none, and a report that
    copied one could not be written), and nesting deeper than `depth_limit` (it could not be
    walked without exhausting the stack). Walked without recursion."""
    if isinstance(value, float) and not math.isfinite(value):
        raise wrong("", "a finite number", value)
    stack: list[tuple[JsonValue, int, _Trail]] = [(value, 0, None)]
    while stack:
        item, depth, trail = stack.pop()
        if depth >= depth_limit:
            raise FieldError(_path(trail), f"nested deeper than {depth_limit}")
        pairs: Iterable[tuple[str | int, JsonValue]] = (
            item.items()
            if isinstance(item, dict)
            else enumerate(item)
            if isinstance(item, list)
            else ()
        )
        for key, child in pairs:
            if isinstance(child, float) and not math.isfinite(child):
                raise wrong(_path((trail, key)), "a finite number", child)
            if isinstance(child, dict | list):
                stack.append((child, depth + 1, (trail, key)))


def _shown(value: JsonValue) -> str:
    if isinstance(value, dict):
        return "an object"
    if isinstance(value, list):
        return "a list"
    return one_line(json.dumps(value), 60)


def wrong(path: str, expected: str, value: JsonValue) -> FieldError:
    return FieldError(path, f"expected {expected}, got {_shown(value)}")


def at(path: str, key: str | int) -> str:
    """The path of a field (`runs`, `.duration_s`) or an item (`[3]`) under `path`."""
    if isinstance(key, int):
        return f"{path}[{key}]"
    return f"{path}.{key}" if path else key


def string(value: JsonValue, path: str) -> str:
    if not isinstance(value, str):
        raise wrong(path, "a string", value)
    return value


def boolean(value: JsonValue, path: str) -> bool:
    if not isinstance(value, bool):
        raise wrong(path, "true or false", value)
    return value


def anything(value: JsonValue, _path: str) -> JsonValue:
    return value


def nullable(read: Reader[T]) -> Reader[T | None]:
    """`read`'s value, or None for null."""
    return lambda value, path: None if value is None else read(value, path)


def integer(low: int | None = None) -> Reader[int]:
    """An integer (never a boolean), at least `low`."""

    def read(value: JsonValue, path: str) -> int:
        if type(value) is not int or (low is not None and value < low):
            raise wrong(path, "an integer" if low is None else f"an integer ≥ {low}", value)
        return value

    return read


def number(high: float = math.inf) -> Reader[float]:
    """A finite number from 0 to `high` (never a boolean)."""

    def read(value: JsonValue, path: str) -> float:
        if (
            isinstance(value, bool)
            or not isinstance(value, int | float)
            or not (math.isfinite(value) and 0 <= value <= high)
        ):
            expected = "a number ≥ 0" if high == math.inf else f"a number from 0 to {high:.15g}"
            raise wrong(path, expected, value)
        return value

    return read


def one_of(choices: Mapping[str, T]) -> Reader[T]:
    """One of the strings `choices` names, as the value it maps to (a Literal)."""

    def read(value: JsonValue, path: str) -> T:
        if not isinstance(value, str) or value not in choices:
            raise wrong(path, f"one of {', '.join(choices)}", value)
        return choices[value]

    return read


def each(read: Reader[T], unique: Callable[[T], str] | None = None) -> Reader[tuple[T, ...]]:
    """A list whose every item `read` reads; with `unique`, no two items of one key."""

    def items(value: JsonValue, path: str) -> tuple[T, ...]:
        if not isinstance(value, list):
            raise wrong(path, "a list", value)
        found = tuple(read(item, at(path, i)) for i, item in enumerate(value))
        first: dict[str, int] = {}
        for i, key in enumerate(map(unique, found) if unique is not None else ()):
            if first.setdefault(key, i) != i:
                said = f"{one_line(key, 120)} again (it is {at(path, first[key])} too)"
                raise FieldError(at(path, i), said)
        return found

    return items


class Fields:
    """A JSON object of a known shape: each read names the field's path; `done` refuses a
    field that none read (the schemas allow no other)."""

    def __init__(self, value: JsonValue, path: str) -> None:
        if not isinstance(value, dict):
            raise wrong(path, "an object", value)
        self.data: JsonObject = value
        self.path = path
        self._read: set[str] = set()

    def need(self, key: str, read: Reader[T]) -> T:
        if key not in self.data:
            raise FieldError(at(self.path, key), "missing")
        self._read.add(key)
        return read(self.data[key], at(self.path, key))

    def may(self, key: str, read: Reader[T], default: T) -> T:
        """A field that may be absent (one an older mm-batch did not write): `default` then."""
        if key not in self.data:
            return default
        return self.need(key, read)

    def done(self, value: T) -> T:
        """`value`, read from these fields, once no field is left unread."""
        for key in self.data:
            if key not in self._read:
                raise FieldError(at(self.path, key), "no such field")
        return value
