"""JSON as it comes out of a file or off the wire, typed without `Any`.

A value read from JSON is a `JsonValue`; code that needs a field narrows it with `isinstance`
(or reads it through a typed record), so mypy sees every place that trusts a shape.
"""

from typing import TypeAlias

JsonValue: TypeAlias = bool | int | float | str | list["JsonValue"] | dict[str, "JsonValue"] | None
JsonObject: TypeAlias = dict[str, JsonValue]
