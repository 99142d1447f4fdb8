"""A strict reader over PyYAML nodes: typed getters that record problems with their line.

PyYAML resolves plain scalars with YAML 1.1 rules, which is exactly what lets us catch the
surprises (`1.10` read as a number, `no` read as false): a getter that expects a string refuses
a plain scalar that YAML 1.1 would have turned into something else, and tells how to quote it.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from mm_batch.config.problems import Problem

_STR = "tag:yaml.org,2002:str"
_BOOL = "tag:yaml.org,2002:bool"
_INT = "tag:yaml.org,2002:int"
_FLOAT = "tag:yaml.org,2002:float"
_NULL = "tag:yaml.org,2002:null"
_INTEGER_RE = re.compile(r"[-+]?[0-9]+")
_NUMBER_RE = re.compile(r"[-+]?([0-9]+(\.[0-9]*)?|\.[0-9]+)")
_TRUE_FALSE = {"true": True, "false": False}


@dataclass(frozen=True)
class At:
    """A node and the key path that led to it."""

    node: yaml.Node
    path: str

    @property
    def line(self) -> int:
        return int(self.node.start_mark.line) + 1

    def key(self, name: str) -> str:
        return f"{self.path}.{name}" if self.path else name

    def index(self, i: int) -> str:
        return f"{self.path}[{i}]"


class Reader:
    """Reads one file's nodes, collecting problems instead of stopping at the first."""

    def __init__(self, display_name: str, problems: list[Problem]) -> None:
        self.file = display_name
        self.problems = problems

    def problem(self, at: At | None, message: str, *, path: str | None = None) -> None:
        line = at.line if at is not None else 1
        key_path = path if path is not None else (at.path if at is not None else "")
        self.problems.append(Problem(self.file, line, key_path, message))

    def load(self, path: Path) -> At | None:
        """Parse the file into a node tree; report syntax errors with their line."""
        try:
            text = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            self.problems.append(Problem(self.file, 1, "", "file not found"))
            return None
        except (OSError, UnicodeDecodeError) as exc:
            self.problems.append(Problem(self.file, 1, "", f"cannot read the file: {exc}"))
            return None
        return self.compose(text)

    def compose(self, text: str) -> At | None:
        """Parse YAML text into a node tree; report syntax errors with their line."""
        try:
            node = yaml.compose(text, Loader=yaml.SafeLoader)
        except yaml.MarkedYAMLError as exc:
            mark = exc.problem_mark or exc.context_mark
            line = mark.line + 1 if mark is not None else 1
            what = exc.problem or str(exc)
            self.problems.append(Problem(self.file, line, "", f"invalid YAML: {what}"))
            return None
        except yaml.YAMLError as exc:
            self.problems.append(Problem(self.file, 1, "", f"invalid YAML: {exc}"))
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
            if not (isinstance(key_node, yaml.ScalarNode) and key_node.tag == _STR):
                self.problem(
                    At(key_node, at.path), f"keys must be strings, got {_describe(key_node)}"
                )
                continue
            name = str(key_node.value)
            key = At(key_node, at.key(name))
            if name in first_line:
                self.problem(
                    key, f"duplicate key '{name}' (first given at line {first_line[name]})"
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
        """Keys of a mapping: refuse duplicates, unknown keys and missing required keys."""
        entries = self._entries(at)
        if entries is None:
            return None
        found: dict[str, At] = {}
        for name, key, value in entries:
            if name not in known:
                hint = ", ".join(sorted(known))
                self.problem(key, f"unknown key '{name}' (known keys: {hint})")
                continue
            found[name] = value
        for name in sorted(required - found.keys()):
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
        if node.tag != _STR:
            self.problem(at, _not_a_string(node))
            return None
        value = str(node.value)
        if non_empty and not value:
            self.problem(at, "must not be empty")
            return None
        return value

    def integer(self, at: At, *, minimum: int | None = None) -> int | None:
        node = at.node
        if not (isinstance(node, yaml.ScalarNode) and node.style is None) or not (
            _INTEGER_RE.fullmatch(str(node.value))
        ):
            self.problem(at, f"expected an integer, got {_show(node)}")
            return None
        value = int(str(node.value))
        if minimum is not None and value < minimum:
            self.problem(at, f"must be at least {minimum}, got {value}")
            return None
        return value

    def number(
        self, at: At, *, minimum: float | None = None, positive: bool = False
    ) -> float | None:
        node = at.node
        if not (isinstance(node, yaml.ScalarNode) and node.style is None) or not (
            _NUMBER_RE.fullmatch(str(node.value))
        ):
            self.problem(at, f"expected a number, got {_show(node)}")
            return None
        value = float(str(node.value))
        if positive and value <= 0:
            self.problem(at, f"must be greater than 0, got {node.value}")
            return None
        if minimum is not None and value < minimum:
            self.problem(at, f"must be at least {minimum:g}, got {node.value}")
            return None
        return value

    def boolean(self, at: At) -> bool | None:
        node = at.node
        if isinstance(node, yaml.ScalarNode) and node.style is None:
            value = _TRUE_FALSE.get(str(node.value).lower())
            if value is not None:
                return value
            if node.tag == _BOOL:
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

    def plain_data(self, at: At) -> Any:
        """Free-form data (model options) read as YAML 1.2 would, refusing 1.1-only booleans."""
        node = at.node
        if isinstance(node, yaml.MappingNode):
            items = self.free_mapping(at)
            return None if items is None else {k: self.plain_data(v) for k, v in items}
        if isinstance(node, yaml.SequenceNode):
            return [self.plain_data(At(n, at.index(i))) for i, n in enumerate(node.value)]
        assert isinstance(node, yaml.ScalarNode)
        if node.tag == _STR:
            return str(node.value)
        readers: dict[str, Callable[[At], Any]] = {
            _BOOL: self.boolean,
            _INT: self.integer,
            _FLOAT: self.number,
        }
        if node.tag == _NULL:
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
        if node.tag == _NULL and node.value in ("", "~"):
            return "an empty value"
        return f"'{node.value}'"
    return _describe(node)


def _not_a_string(node: yaml.ScalarNode) -> str:
    """Explain a YAML 1.1 surprise: a plain scalar that is not read as the string it looks like."""
    text = node.value
    if node.tag == _NULL:
        return "expected a string, got an empty value"
    if node.tag == _BOOL:
        return f"'{text}' is read as a boolean in YAML 1.1; quote it to mean the string: \"{text}\""
    if node.tag in (_INT, _FLOAT):
        read_as = yaml.safe_load(text)
        return (
            f"'{text}' is read as the number {read_as!r}; quote it to keep it as written: "
            f'"{text}"'
        )
    kind = node.tag.rsplit(":", 1)[-1]
    return f"'{text}' is read as a YAML {kind}; quote it to mean the string: \"{text}\""
