"""Mappings as tables of keys read by one function, so that mypy sees each value's type."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Generic, Never, Protocol, TypeVar, cast

from mm_batch.config.problems import excerpt
from mm_batch.config.yamlnodes import At, Reader


class HasReader(Protocol):
    """What every key's reader gets: the file's reader, and whatever else its file kind needs."""

    @property
    def reader(self) -> Reader: ...


C = TypeVar("C", bound=HasReader)
C_contra = TypeVar("C_contra", bound=HasReader, contravariant=True)
T = TypeVar("T")
T_co = TypeVar("T_co", covariant=True)
W = TypeVar("W", bound=str)


@dataclass(frozen=True)
class Key(Generic[C_contra, T_co]):
    """One key of a mapping: how its value is read, and whether it must be given.

    Keys are read in the order of their table, and `read` sees what the keys before it gave
    (allow rules name the tools declared above them in the table, whatever the file's order).
    A table is a tuple of `Key[Context, object]`: each key's own value type is kept where the
    key is named (`fields[KEY]`).
    """

    name: str
    read: Callable[[C_contra, At, Fields], T_co | None]
    required: bool = False


class Fields:
    """What one mapping gave, key by key: `fields[KEY]` has the type of that key's value."""

    def __init__(self, at: At) -> None:
        self.at = at
        self._values: dict[str, object] = {}
        self._given: dict[str, At] = {}

    def __getitem__(self, key: Key[Never, T]) -> T | None:
        # The value was stored by this very key's `read`, so it has the key's type.
        return cast("T | None", self._values.get(key.name))

    def given(self, key: Key[Never, object]) -> At | None:
        """Where the key's value was written, when it was."""
        return self._given.get(key.name)


def read_fields(ctx: C, at: At, table: Sequence[Key[C, object]]) -> Fields | None:
    """Read a mapping by its table: unknown, duplicate and missing keys reported once each."""
    found = ctx.reader.mapping(at, {k.name for k in table}, {k.name for k in table if k.required})
    if found is None:
        return None
    fields = Fields(at)
    for key in table:
        if key.name in found:
            fields._given[key.name] = found[key.name]
            fields._values[key.name] = key.read(ctx, found[key.name], fields)
    return fields


def or_default(value: T | None, default: T) -> T:
    """A key's value, or the default of the field it fills when the key was not given."""
    return default if value is None else value


def scalar(
    name: str, read: Callable[[Reader, At], T | None], *, required: bool = False
) -> Key[HasReader, T]:
    """A key whose value one getter of the reader reads, needing nothing else."""
    return Key(name, lambda ctx, at, _: read(ctx.reader, at), required)


# `$schema` names the JSON Schema an editor validates the file with; mm-batch reads nothing in it.
SCHEMA_KEY = "$schema"


def schema_key() -> Key[HasReader, str]:
    return scalar(SCHEMA_KEY, lambda reader, at: reader.string(at, non_empty=True))


def choice(name: str, allowed: tuple[W, ...], *, required: bool = False) -> Key[HasReader, W]:
    """A key whose value is one word of a closed vocabulary."""
    return scalar(name, lambda reader, at: one_of(reader, at, allowed), required=required)


def one_of(reader: Reader, at: At, allowed: tuple[W, ...]) -> W | None:
    """One word of a closed vocabulary, as its own type (a `Literal`)."""
    value = reader.string(at)
    if value is None:
        return None
    for word in allowed:
        if word == value:
            return word
    reader.problem(at, f"expected one of {', '.join(allowed)}, got '{excerpt(value)}'")
    return None
