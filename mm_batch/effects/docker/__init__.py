"""The Docker sandbox: one hardened container per task run, each call an exec of the argv list.

Only this package imports the Docker SDK. Its modules, by job: `engine` (the SDK's client,
typed by what is used of it, and one container's requests, each bounded in time), `stream`
(an exec's output, capped, under its deadline and kill), `workspace` (the copied or mounted
folder, and the copies placed in the container), `lifecycle` (the hardened container, its
start-up check, orphans), `sweep` (what a call leaves behind, cleared before the next),
`outcome` (how a call ended), `sandbox` (the Executor) and `pool` (a batch's sandboxes).

The names below are loaded at their first use: a run without Docker never loads the sandbox's
modules (tens of milliseconds of start-up).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from mm_batch.effects.docker.engine import DockerClient, connect
    from mm_batch.effects.docker.lifecycle import (
        LABEL,
        LABEL_PID_NS,
        LABEL_RUN,
        pid_namespace,
        remove_orphans,
    )
    from mm_batch.effects.docker.pool import DockerSandboxes
    from mm_batch.effects.docker.sandbox import DockerSandbox

__all__ = [
    "LABEL",
    "LABEL_PID_NS",
    "LABEL_RUN",
    "DockerClient",
    "DockerSandbox",
    "DockerSandboxes",
    "connect",
    "pid_namespace",
    "remove_orphans",
]

_HOMES = {
    "LABEL": "lifecycle",
    "LABEL_PID_NS": "lifecycle",
    "LABEL_RUN": "lifecycle",
    "DockerClient": "engine",
    "DockerSandbox": "sandbox",
    "DockerSandboxes": "pool",
    "connect": "engine",
    "pid_namespace": "lifecycle",
    "remove_orphans": "lifecycle",
}


def __getattr__(name: str) -> object:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{home}"), name)
