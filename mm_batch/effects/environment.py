"""The environments mm-batch gives the processes it starts: a tool's, and its own helpers'."""

from __future__ import annotations

import os
from collections.abc import Mapping

_ENV_PASSED = ("PATH", "HOME", "LANG", "TZ")
_DEFAULT_PATH = "/usr/local/bin:/usr/bin:/bin"


def host_environment(
    extra: Mapping[str, str], source: Mapping[str, str] | None = None
) -> dict[str, str]:
    """PATH, HOME, LANG, TZ from mm-batch's environment plus the tool's own: nothing else leaks."""
    environ = os.environ if source is None else source
    env = {k: environ[k] for k in _ENV_PASSED if k in environ}
    env.setdefault("PATH", _DEFAULT_PATH)
    env.update(extra)
    return env


def service_environment(*kept_prefixes: str) -> dict[str, str]:
    """What a helper process of mm-batch's own (a model server, the watchdog) is given: PATH,
    HOME, LANG, TZ and the variables it reads (`kept_prefixes`), never mm-batch's secrets. A
    process's environment is readable, in /proc, by every process of its user: a host tool
    could read it there."""
    env = host_environment({})
    env.update({k: v for k, v in os.environ.items() if k.startswith(kept_prefixes)})
    return env
