"""The schemas of what mm-batch reads and writes, shipped in the package.

`junit.xsd` (junit.xml), `summary.schema.json` (summary.json), `calls.schema.json` (one line of
calls.jsonl), `agent.schema.json` and `tasks.schema.json` (the two input files). Editors and
`check-jsonschema --schemafile` take them by path; `mm_batch.schemas.path(name)` gives it.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path
from typing import Literal

SchemaName = Literal[
    "junit.xsd",
    "summary.schema.json",
    "calls.schema.json",
    "agent.schema.json",
    "tasks.schema.json",
]
NAMES: tuple[SchemaName, ...] = (
    "junit.xsd",
    "summary.schema.json",
    "calls.schema.json",
    "agent.schema.json",
    "tasks.schema.json",
)


def path(name: SchemaName) -> Path:
    """The file of one shipped schema, e.g. `path("tasks.schema.json")`."""
    if name not in NAMES:
        raise ValueError(f"no schema named {name!r} (shipped: {', '.join(NAMES)})")
    resource = resources.files(__name__).joinpath(name)
    # The package is installed as files (setuptools package data), never zipped: a real path.
    return Path(str(resource))
