"""A strict reader over PyYAML nodes: typed getters that record problems with their line.

PyYAML resolves plain scalars with YAML 1.1 rules, which is exactly what lets us catch the
surprises (`1.10` read as a number, `no` read as false): a getter that expects a string refuses
a plain scalar that YAML 1.1 would have turned into something else, and tells how to quote it.

Hostile files are refused before any node is built (see `hostile`); files over `MAX_FILE_BYTES`
are not even parsed. Whatever then reaches a getter is small and clean.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import yaml

from mm_batch.config.hostile import (
    BOOL_TAG,
    FLOAT_TAG,
    INT_TAG,
    NULL_TAG,
    STR_TAG,
    digits_problem,
    first_hostile,
)
from mm_batch.config.paths import read_regular
from mm_batch.config.problems import Problem, excerpt, join_key
from mm_batch.jsontypes import JsonValue

_INTEGER_RE = re.compile(r"[-+]?[0-9]+")
_NUMBER_RE = re.compile(r"[-+]?([0-9]+(\.[0-9]*)?|\.[0-9]+)")
_TRUE_FALSE = {"true": True, "false": False}

MAX_FILE_BYTES = 1024 * 1024


@dataclass(frozen=True)
class At:
    """A node and the key path that led to it."""

    node: yaml.Node
    path: str

    @property
    def line(self) -> int:
        return int(self.node.start_mark.line) + 1

    def key(self, name: str) -> str:
        return join_key(self.path, name)

    def index(self, i: int) -> str:
        return f"{self.path}[{i}]"


def one_edit_apart(a: str, b: str) -> bool:
    """Whether one insertion, deletion, substitution or swap of neighbours turns a into b."""
    if a == b or abs(len(a) - len(b)) > 1:
        return False
    if len(a) > len(b):
        a, b = b, a
    i = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), len(a))
    if len(a) < len(b):
        return a[i:] == b[i + 1 :]
    swapped = i + 1 < len(a) and a[i] == b[i + 1] and a[i + 1] == b[i]
    return a[i + 1 :] == b[i + 1 :] or (swapped and a[i + 2 :] == b[i + 2 :])


class Reader:
    """Reads one file's nodes, collecting problems instead of stopping at the first."""

    def __init__(self, display_name: str, problems: list[Problem]) -> None:
        self.file = display_name
        self.problems = problems

    def problem(self, at: At | None, message: str, *, path: str | None = None) -> None:
        line = at.line if at is not None else 1
        key_path = path if path is not None else (at.path if at is not None else "")
        self.problems.append(Problem(self.file, line, key_path, message))

    def read_text(self, path: Path) -> str | None:
        """A file's text, refusing files over MAX_FILE_BYTES before reading them whole, and
        anything but a regular file (a FIFO would block the read forever)."""
        try:
            data = read_regular(path, MAX_FILE_BYTES + 1)
        except FileNotFoundError:
            self.problems.append(Problem(self.file, 1, "", "file not found"))
            return None
        except OSError as exc:
            self.problems.append(Problem(self.file, 1, "", f"cannot read the file: {exc}"))
            return None
        if len(data) > MAX_FILE_BYTES:
            self.problems.append(
                Problem(
                    self.file,
                    1,
                    "",
                    "the file is over 1 MiB; mm-batch reads files of at most 1 MiB "
                    f"({MAX_FILE_BYTES} bytes)",
                )
            )
            return None
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError as exc:
            self.problems.append(Problem(self.file, 1, "", f"cannot read the file: {exc}"))
            return None

    def load(self, path: Path) -> At | None:
        """Parse the file into a node tree; report syntax errors with their line."""
        text = self.read_text(path)
        return None if text is None else self.compose(text)

    def compose(self, text: str) -> At | None:
        """Parse YAML text into a node tree, once the event stream was found harmless."""
        try:
            hostile = first_hostile(text)
            if hostile is not None:
                line, path, message = hostile
                self.problems.append(Problem(self.file, line, path, message))
                return None
            node = yaml.compose(text, Loader=yaml.SafeLoader)
        except yaml.MarkedYAMLError as exc:
            mark = exc.problem_mark or exc.context_mark
            line = mark.line + 1 if mark is not None else 1
            what = excerpt(exc.problem or str(exc))
            self.problems.append(Problem(self.file, line, "", f"invalid YAML: {what}"))
            return None
        except yaml.YAMLError as exc:
            self.problems.append(Problem(self.file, 1, "", f"invalid YAML: {excerpt(str(exc))}"))
            return None
        if node is None:
            self.problems.append(Problem(self.file, 1, "", "the file is empty"))
            return None
        return At(node, "")

    # -- structure -----------------------------------------------------------------------

    def _entries(self, at: At) -> list[tuple[str, At, At]] | None:
        """(name, key, value) of a mapping's entries; non-string and duplicate keys reported."""
        if not isinstance(at.node, yaml.MappingNode):
            self.problem(at, f"expected a mapping, got {_describe(at.node)}")
            return None
        first_line: dict[str, int] = {}
        entries: list[tuple[str, At, At]] = []
        for key_node, value_node in at.node.value:
            if not (isinstance(key_node, yaml.ScalarNode) and key_node.tag == STR_TAG):
                self.problem(
                    At(key_node, at.path), f"keys must be strings, got {_describe(key_node)}"
                )
                continue
            name = str(key_node.value)
            key = At(key_node, at.key(name))
            if name in first_line:
                self.problem(
                    key,
                    f"duplicate key '{excerpt(name)}' (first given at line {first_line[name]})",
                )
                continue
            first_line[name] = key.line
            entries.append((name, key, At(value_node, key.path)))
        return entries

    def mapping(
        self,
        at: At,
        known: set[str],
        required: set[str] = frozenset(),  # type: ignore[assignment]
    ) -> dict[str, At] | None:
        """Keys of a mapping: refuse duplicates, unknown keys and missing required keys.

        An unknown key one edit away from a known one is a typo: it gets a hint, and the key
        it names is not reported missing a second time.
        """
        entries = self._entries(at)
        if entries is None:
            return None
        found: dict[str, At] = {}
        hinted: set[str] = set()
        for name, key, value in entries:
            if name in known:
                found[name] = value
                continue
            near = sorted(k for k in known - {n for n, _, _ in entries} if one_edit_apart(name, k))
            if near:
                hinted.update(near)
                self.problem(key, f"unknown key; did you mean {' or '.join(near)}?")
            else:
                hint = ", ".join(sorted(known))
                self.problem(key, f"unknown key '{excerpt(name)}' (known keys: {hint})")
        for name in sorted(required - found.keys() - hinted):
            self.problem(at, f"missing required key '{name}'", path=at.key(name))
        return found

    def sequence(self, at: At) -> list[At] | None:
        if not isinstance(at.node, yaml.SequenceNode):
            self.problem(at, f"expected a list, got {_describe(at.node)}")
            return None
        return [At(n, at.index(i)) for i, n in enumerate(at.node.value)]

    def free_mapping(self, at: At) -> list[tuple[str, At]] | None:
        """A mapping whose keys are the user's own (parameters, env, options)."""
        entries = self._entries(at)
        return None if entries is None else [(name, value) for name, _, value in entries]

    # -- scalars -------------------------------------------------------------------------

    def string(self, at: At, *, non_empty: bool = False) -> str | None:
        node = at.node
        if not isinstance(node, yaml.ScalarNode):
            self.problem(at, f"expected a string, got {_describe(node)}")
            return None
        if node.tag != STR_TAG:
            self.problem(at, _not_a_string(node))
            return None
        value = str(node.value)
        if non_empty and not value:
            self.problem(at, "must not be empty")
            return None
        return value

    def integer(
        self, at: At, *, minimum: int | None = None, maximum: int | None = None
    ) -> int | None:
        node = at.node
        if not (isinstance(node, yaml.ScalarNode) and node.style is None) or not (
            _INTEGER_RE.fullmatch(str(node.value))
        ):
            self.problem(at, f"expected an integer, got {_show(node)}")
            return None
        too_long = digits_problem(str(node.value))
        if too_long is not None:
            self.problem(at, too_long)
            return None
        value = int(str(node.value))
        if minimum is not None and value < minimum:
            self.problem(at, f"must be at least {minimum}, got {value}")
            return None
        if maximum is not None and value > maximum:
            self.problem(at, f"must be at most {maximum}, got {value}")
            return None
        return value

    def number(
        self,
        at: At,
        *,
        minimum: float | None = None,
        positive: bool = False,
        maximum: float | None = None,
    ) -> float | None:
        node = at.node
        if not (isinstance(node, yaml.ScalarNode) and node.style is None) or not (
            _NUMBER_RE.fullmatch(str(node.value))
        ):
            self.problem(at, f"expected a number, got {_show(node)}")
            return None
        value = float(str(node.value))
        if not math.isfinite(value):
            self.problem(at, f"a non-finite number is refused: '{excerpt(str(node.value))}'")
            return None
        if positive and value <= 0:
            self.problem(at, f"must be greater than 0, got {excerpt(str(node.value))}")
            return None
        if minimum is not None and value < minimum:
            self.problem(at, f"must be at least {minimum:g}, got {excerpt(str(node.value))}")
            return None
        if maximum is not None and value > maximum:
            self.problem(at, f"must be at most {maximum:g}, got {excerpt(str(node.value))}")
            return None
        return value

    def boolean(self, at: At) -> bool | None:
        node = at.node
        if isinstance(node, yaml.ScalarNode) and node.style is None:
            value = _TRUE_FALSE.get(str(node.value).lower())
            if value is not None:
                return value
            if node.tag == BOOL_TAG:
                self.problem(
                    at,
                    f"'{node.value}' is a YAML 1.1 boolean that other readers take as a string: "
                    "write true or false",
                )
                return None
        self.problem(at, f"expected true or false, got {_show(node)}")
        return None

    def string_list(self, at: At, *, non_empty: bool = False) -> list[str] | None:
        items = self.sequence(at)
        if items is None:
            return None
        if non_empty and not items:
            self.problem(at, "must not be an empty list")
            return None
        values = [self.string(item) for item in items]
        if any(v is None for v in values):
            return None
        return [v for v in values if v is not None]

    def plain_data(self, at: At) -> JsonValue:
        """Free-form data (model options) read as YAML 1.2 would, refusing 1.1-only booleans."""
        node = at.node
        if isinstance(node, yaml.MappingNode):
            items = self.free_mapping(at)
            return None if items is None else {k: self.plain_data(v) for k, v in items}
        if isinstance(node, yaml.SequenceNode):
            return [self.plain_data(At(n, at.index(i))) for i, n in enumerate(node.value)]
        assert isinstance(node, yaml.ScalarNode)
        if node.tag == STR_TAG:
            return str(node.value)
        readers: dict[str, Callable[[At], JsonValue]] = {
            BOOL_TAG: self.boolean,
            INT_TAG: self.integer,
            FLOAT_TAG: self.number,
        }
        if node.tag == NULL_TAG:
            return None
        reader = readers.get(node.tag)
        if reader is None:
            self.problem(at, _not_a_string(node))
            return None
        return reader(at)


def _describe(node: yaml.Node) -> str:
    if isinstance(node, yaml.MappingNode):
        return "a mapping"
    if isinstance(node, yaml.SequenceNode):
        return "a list"
    return _show(node)


def _show(node: yaml.Node) -> str:
    if isinstance(node, yaml.ScalarNode):
        if node.tag == NULL_TAG and node.value in ("", "~"):
            return "an empty value"
        return f"'{excerpt(str(node.value))}'"
    return _describe(node)


def _not_a_string(node: yaml.ScalarNode) -> str:
    """Explain a YAML 1.1 surprise: a plain scalar that is not read as the string it looks like."""
    text = excerpt(str(node.value))
    if node.tag == NULL_TAG:
        return "expected a string, got an empty value"
    if node.tag == BOOL_TAG:
        return f"'{text}' is read as a boolean in YAML 1.1; quote it to mean the string: \"{text}\""
    if node.tag in (INT_TAG, FLOAT_TAG) and node.style is None:
        read_as = yaml.safe_load(str(node.value))
        return (
            f"'{text}' is read as the number {read_as!r}; quote it to keep it as written: "
            f'"{text}"'
        )
    kind = node.tag.rsplit(":", 1)[-1]
    return f"'{text}' is read as a YAML {kind}; quote it to mean the string: \"{text}\""
