"""Hostile YAML, refused from PyYAML's event stream before any node is built.

One pass over the events (which never expands an alias and never recurses) refuses aliases and
anchors, nesting deeper than `MAX_DEPTH`, over-long integers, non-finite numbers, NULs and
unencodable characters, so that whatever then reaches a getter is small and clean.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass

import yaml
from yaml.resolver import Resolver

from mm_batch.config.problems import excerpt, join_key

STR_TAG = "tag:yaml.org,2002:str"
BOOL_TAG = "tag:yaml.org,2002:bool"
INT_TAG = "tag:yaml.org,2002:int"
FLOAT_TAG = "tag:yaml.org,2002:float"
NULL_TAG = "tag:yaml.org,2002:null"
_DIGITS_RE = re.compile(r"[-+]?[0-9_]+")
# `010`: octal 8 to a YAML 1.1 reader (PyYAML, most CI tools), decimal 10 to YAML 1.2.
_LEADING_ZERO_RE = re.compile(r"[-+]?0[0-9_]+")
_NON_FINITE_RE = re.compile(r"[-+]?\.(inf|Inf|INF)|\.(nan|NaN|NAN)")

MAX_DEPTH = 64  # collections, the top-level mapping being 1
MAX_INTEGER_DIGITS = 30
# Characters no path, argv entry or environment entry can carry.
_SURROGATE_RE = re.compile("[\ud800-\udfff]")


def string_problem(text: str, *, quote: bool = True) -> str | None:
    """Why a string cannot become a path, an argv entry or an environment entry, if it cannot.

    `quote=False` for a secret's value, which no message may show.
    """
    shown = f": '{excerpt(text)}'" if quote else ""
    if "\x00" in text:
        return (
            "a NUL character is refused (no path, argv entry or environment entry can carry "
            f"one){shown}"
        )
    surrogate = _SURROGATE_RE.search(text)
    if surrogate is not None:
        code = f"\\u{ord(surrogate.group()):04x}"
        return f"a character that cannot be encoded ({code}, a lone surrogate) is refused{shown}"
    return None


def digits_problem(text: str) -> str | None:
    """Refuse integers longer than MAX_INTEGER_DIGITS: Python cannot even read some of them."""
    digits = sum(c.isalnum() for c in text.lstrip("+-").removeprefix("0x").removeprefix("0b"))
    if digits > MAX_INTEGER_DIGITS:
        return (
            f"an integer of {digits} digits is refused (integers have at most "
            f"{MAX_INTEGER_DIGITS} digits)"
        )
    return None


@dataclass
class _Frame:
    """An open collection in the event stream, and where its next node goes."""

    path: str
    is_mapping: bool
    index: int = 0  # the next item of a sequence
    key: str | None = None  # the key whose value comes next; None while a key is expected


def first_hostile(text: str) -> tuple[int, str, str] | None:
    """(line, key path, message) of the first hostile construct, found without composing."""
    resolver = Resolver()
    frames: list[_Frame] = []
    for event in yaml.parse(text, Loader=yaml.SafeLoader):
        if isinstance(event, yaml.CollectionEndEvent):
            frames.pop()
            _advance(frames, None)
            continue
        if not isinstance(event, yaml.NodeEvent):
            continue
        line = int(event.start_mark.line) + 1 if event.start_mark is not None else 1
        path, is_key = _where(frames)
        if isinstance(event, yaml.AliasEvent):
            return (
                line,
                path,
                f"YAML aliases are refused (*{excerpt(str(event.anchor))}): "
                + ("no mm-batch file needs them; write the value out"),
            )
        if event.anchor is not None:
            return (
                line,
                path,
                f"YAML anchors are refused (&{excerpt(str(event.anchor))}): "
                + ("no mm-batch file needs them; write the value out"),
            )
        if isinstance(event, yaml.CollectionStartEvent):
            if len(frames) + 1 > MAX_DEPTH:
                return line, path, f"nested deeper than {MAX_DEPTH} levels of mappings and lists"
            frames.append(_Frame(path, isinstance(event, yaml.MappingStartEvent)))
            continue
        assert isinstance(event, yaml.ScalarEvent)
        value = str(event.value)
        key_path = join_key(path, value) if is_key else path
        problem = string_problem(value) or _scalar_problem(resolver, event)
        if problem is not None:
            return line, key_path, problem
        _advance(frames, value)
    return None


def _where(frames: list[_Frame]) -> tuple[str, bool]:
    """The key path of the next node, and whether that node is a mapping key."""
    if not frames:
        return "", False
    top = frames[-1]
    if not top.is_mapping:
        return f"{top.path}[{top.index}]", False
    if top.key is None:
        return top.path, True
    return join_key(top.path, top.key), False


def _advance(frames: list[_Frame], scalar: str | None) -> None:
    """A node ended: move its parent to the next slot."""
    if not frames:
        return
    top = frames[-1]
    if not top.is_mapping:
        top.index += 1
    elif top.key is None:
        top.key = scalar if scalar is not None else "?"
    else:
        top.key = None


def _scalar_problem(resolver: Resolver, event: yaml.ScalarEvent) -> str | None:
    """Numbers mm-batch refuses to read: integers over MAX_INTEGER_DIGITS, non-finite ones and
    plain ones with a leading zero (read as octal or decimal by one YAML or another)."""
    value = str(event.value)
    plain = event.style is None
    tag = event.tag if event.tag not in (None, "!") else None
    if tag is None:
        tag = _resolve(resolver, value, event.implicit) if plain else STR_TAG
    integer = tag == INT_TAG or (plain and _DIGITS_RE.fullmatch(value))
    too_long = digits_problem(value.replace("_", "")) if integer else None
    if too_long is not None:
        return too_long
    if plain and event.implicit[0] and _LEADING_ZERO_RE.fullmatch(value):
        return (
            f"'{excerpt(value)}' is refused: YAML 1.1 readers take a leading 0 for an octal "
            "number and YAML 1.2 readers for a decimal one; write the number without it, or "
            "quote it for a string"
        )
    if integer:
        return None
    if tag == FLOAT_TAG:
        if _NON_FINITE_RE.fullmatch(value):
            return f"a non-finite number is refused: '{excerpt(value)}'"
        try:
            number = float(value.replace("_", ""))
        except ValueError:
            return None  # a sexagesimal or otherwise odd float: the getters refuse it
        if not math.isfinite(number):
            return f"a non-finite number is refused: '{excerpt(value)}'"
    return None


def _resolve(resolver: Resolver, value: str, implicit: tuple[bool, bool]) -> str:
    """The tag PyYAML gives a plain scalar (its stubs leave `resolve` untyped)."""
    resolve: Callable[[type[yaml.Node], str, tuple[bool, bool]], str] = resolver.resolve
    return resolve(yaml.ScalarNode, value, implicit)
