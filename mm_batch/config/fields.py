"""Mappings as tables of keys read by one function, so that mypy sees each value's type."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar, cast

from mm_batch.config.yamlnodes import At, Reader, excerpt


class HasReader(Protocol):
    """What every key's reader gets: the file's reader, and whatever else its file kind needs."""

    @property
    def reader(self) -> Reader: ...


C_contra = TypeVar("C_contra", bound=HasReader, contravariant=True)
T = TypeVar("T")


@dataclass(frozen=True)
class Key(Generic[C_contra, T]):
    """One key of a mapping: how its value is read, and whether it must be given.

    Keys are read in the order of their table, and `read` sees what the keys before it gave
    (allow rules name the tools declared above them in the table, whatever the file's order).
    """

    name: str
    read: Callable[[C_contra, At, Fields], T | None]
    required: bool = False


class Fields:
    """What one mapping gave, key by key: `fields[KEY]` has the type of that key's value."""

    def __init__(self, at: At) -> None:
        self.at = at
        self._values: dict[str, object] = {}
        self._given: dict[str, At] = {}

    def __getitem__(self, key: Key[Any, T]) -> T | None:
        return cast("T | None", self._values.get(key.name))

    def given(self, key: Key[Any, Any]) -> At | None:
        """Where the key's value was written, when it was."""
        return self._given.get(key.name)


def read_fields(ctx: HasReader, at: At, table: Sequence[Key[Any, Any]]) -> Fields | None:
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


def scalar(
    name: str, read: Callable[[Reader, At], T | None], *, required: bool = False
) -> Key[HasReader, T]:
    """A key whose value one getter of the reader reads, needing nothing else."""
    return Key(name, lambda ctx, at, _: read(ctx.reader, at), required)


# `$schema` names the JSON Schema an editor validates the file with; mm-batch reads nothing in it.
SCHEMA_KEY = "$schema"


def schema_key() -> Key[HasReader, str]:
    return scalar(SCHEMA_KEY, lambda reader, at: reader.string(at, non_empty=True))


def choice(name: str, allowed: tuple[str, ...]) -> Key[HasReader, str]:
    """A key whose value is one word of a closed vocabulary."""
    return scalar(name, lambda reader, at: one_of(reader, at, allowed))


def one_of(reader: Reader, at: At, allowed: tuple[str, ...]) -> str | None:
    value = reader.string(at)
    if value is not None and value not in allowed:
        reader.problem(at, f"expected one of {', '.join(allowed)}, got '{excerpt(value)}'")
        return None
    return value
