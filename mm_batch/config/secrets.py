"""Secrets: masked as *** in everything mm-batch writes or sends, the model included."""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping
from typing import Any

from mm_batch.config.model import AgentConfig

MIN_SECRET_LENGTH = 6
MASK = "***"
_SECRET_NAME = re.compile(r"KEY|TOKEN|SECRET|PASSWORD", re.IGNORECASE)


class Masker:
    """Replaces every known secret value by *** in text; keys and structure are never touched."""

    def __init__(self, secrets: Iterable[str]) -> None:
        values = sorted({s for s in secrets if len(s) >= MIN_SECRET_LENGTH}, key=len, reverse=True)
        self._secrets = tuple(values)
        self._pattern = re.compile("|".join(re.escape(v) for v in values)) if values else None

    @classmethod
    def from_environment(cls, environ: Mapping[str, str], extra: Iterable[str] = ()) -> Masker:
        named = (v for k, v in environ.items() if _SECRET_NAME.search(k))
        return cls([*named, *extra])

    def text(self, value: str, *, cut: bool = False) -> str:
        """Mask every secret. `cut`: the text was cut short (a capture limit), so a tail that
        begins a secret is masked too: a secret straddling the cut leaks no prefix."""
        if self._pattern is None:
            return value
        masked = self._pattern.sub(MASK, value)
        if cut:
            tail = max((_overlap(masked, s) for s in self._secrets), default=0)
            if tail:
                masked = masked[:-tail] + MASK
        return masked

    def data(self, value: Any) -> Any:
        """Mask the strings inside JSON-like data (its values: keys are structure)."""
        if self._pattern is None:
            return value
        if isinstance(value, str):
            return self.text(value)
        if isinstance(value, dict):
            return {k: self.data(v) for k, v in value.items()}
        if isinstance(value, list | tuple):
            return [self.data(v) for v in value]
        return value


def masker_of(agents: Iterable[AgentConfig]) -> Masker:
    """What a run masks: mm-batch's secret-named env vars and every agent's `${VAR}` values."""
    return Masker.from_environment(os.environ, [s for a in agents for s in a.secrets])


def _overlap(text: str, secret: str) -> int:
    """The length of the longest end of `text` that is a proper beginning of `secret`."""
    for n in range(min(len(secret) - 1, len(text)), 0, -1):
        if text.endswith(secret[:n]):
            return n
    return 0
