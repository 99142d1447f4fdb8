"""Consent: yolo, or the preapproved allowlist. A decision names the rule that matched."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache

from mm_batch.config.model import AllowRule

# A glob rule never matches a command holding any of these: only an exact rule can.
SHELL_METACHARACTERS = frozenset(";&|$`<>()\n")


@dataclass(frozen=True)
class Decision:
    allowed: bool
    rule: str | None
    reason: str | None = None


@lru_cache(maxsize=1024)
def _glob(pattern: str) -> re.Pattern[str]:
    return re.compile(".*".join(re.escape(part) for part in pattern.split("*")), re.DOTALL)


def glob_match(pattern: str, value: str) -> bool:
    """Whole-value match where `*` is the only wildcard."""
    return _glob(pattern).fullmatch(value) is not None


def bash_rule_matches(pattern: str, command: str) -> bool:
    if "*" not in pattern:
        return pattern == command
    if any(c in SHELL_METACHARACTERS for c in command):
        return False
    return glob_match(pattern, command)


def decide(
    yolo: bool,
    rules: tuple[AllowRule, ...],
    tool: str,
    arguments: Mapping[str, str],
    bash_command: str | None = None,
) -> Decision:
    """Whether a validated call may run. `arguments` are the coerced values, rendered."""
    if yolo:
        return Decision(True, "yolo")
    for rule in rules:
        if bash_command is not None and rule.bash is not None:
            if bash_rule_matches(rule.bash, bash_command):
                return Decision(True, rule.label)
            continue
        if rule.tool != tool:
            continue
        patterns = rule.args or {}
        if all(k in arguments and glob_match(p, arguments[k]) for k, p in patterns.items()):
            return Decision(True, rule.label)
    shown = ", ".join(f"{k}={v}" for k, v in arguments.items())
    with_args = f" with {shown}" if shown else ""
    return Decision(False, None, f"refused: {tool}{with_args} is not on this run's allowlist")
