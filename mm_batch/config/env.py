"""`${VAR}` in agent files: read from mm-batch's own environment, remembered as secrets."""

from __future__ import annotations

import re
from collections.abc import Mapping

from mm_batch.config.hostile import string_problem
from mm_batch.config.yamlnodes import At, Reader
from mm_batch.jsontypes import JsonValue

ENV_REF_RE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
ENV_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


class Expander:
    """Expands ${VAR} from mm-batch's own environment and remembers the values as secrets."""

    def __init__(self, reader: Reader, environ: Mapping[str, str]) -> None:
        self.reader = reader
        self.environ = environ
        self.secrets: list[str] = []

    def expand(self, at: At, text: str) -> str:
        """The text with every ${VAR} replaced; a value no file could hold is refused."""

        def substitute(match: re.Match[str]) -> str:
            name = match.group(1)
            value = self.environ.get(name)
            if value is None:
                self.reader.problem(
                    at, f"environment variable {name} is not set (from ${{{name}}})"
                )
                return ""
            problem = string_problem(value, quote=False)
            if problem is not None:
                self.reader.problem(at, f"the value of ${{{name}}}: {problem}")
                return ""
            self.secrets.append(value)
            return value

        return ENV_REF_RE.sub(substitute, text)

    def expand_data(self, at: At, data: JsonValue) -> JsonValue:
        """Data with ${VAR} expanded in every string value (keys are the file's own)."""
        if isinstance(data, str):
            return self.expand(at, data)
        if isinstance(data, dict):
            return {k: self.expand_data(At(at.node, at.key(k)), v) for k, v in data.items()}
        if isinstance(data, list):
            return [self.expand_data(at, v) for v in data]
        return data
