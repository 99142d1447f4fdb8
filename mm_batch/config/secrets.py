"""Secrets: masked as *** in everything mm-batch writes or sends, the model included."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

MIN_SECRET_LENGTH = 6
MASK = "***"
_SECRET_NAME = re.compile(r"KEY|TOKEN|SECRET|PASSWORD", re.IGNORECASE)


class Masker:
    """Replaces every known secret value by *** in strings and nested JSON-like data."""

    def __init__(self, secrets: Iterable[str]) -> None:
        values = sorted({s for s in secrets if len(s) >= MIN_SECRET_LENGTH}, key=len, reverse=True)
        self._pattern = re.compile("|".join(re.escape(v) for v in values)) if values else None

    @classmethod
    def from_environment(cls, environ: Mapping[str, str], extra: Iterable[str] = ()) -> Masker:
        named = (v for k, v in environ.items() if _SECRET_NAME.search(k))
        return cls([*named, *extra])

    def text(self, value: str) -> str:
        return value if self._pattern is None else self._pattern.sub(MASK, value)

    def data(self, value: Any) -> Any:
        if self._pattern is None:
            return value
        if isinstance(value, str):
            return self.text(value)
        if isinstance(value, dict):
            return {self.text(str(k)): self.data(v) for k, v in value.items()}
        if isinstance(value, list | tuple):
            return [self.data(v) for v in value]
        return value
