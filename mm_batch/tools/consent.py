"""Consent: yolo, or the preapproved allowlist. A decision names the rule that matched."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache

from mm_batch.config.model import AllowRule
from mm_batch.config.secrets import NO_SECRETS, Masked, Masker, head

# A glob rule never matches a command holding any of these: only an exact rule can. With them
# bash chains or backgrounds a second command (; & |), substitutes one ($ ` and $'..' quoting),
# redirects (< >), opens a subshell or a group (( ) { }), expands one word into several programs'
# worth of words ({a,b}), or escapes what follows (\, also before a newline).
SHELL_METACHARACTERS = frozenset(";&|$`<>(){}\\")
SHOWN_VALUE_LIMIT = 120  # a refusal quotes at most this much of each value


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


def glob_safe(command: str) -> bool:
    """Whether a glob rule may match this command: no metacharacter and no control character
    (a newline or carriage return ends a line, a NUL or escape hides what follows), tab aside."""
    return not any(
        c in SHELL_METACHARACTERS or (c != "\t" and (c < " " or c == "\x7f")) for c in command
    )


def bash_rule_matches(pattern: str, command: str) -> bool:
    if "*" not in pattern:
        return pattern == command
    return glob_safe(command) and glob_match(pattern, command)


def _shown(arguments: Mapping[str, str], masker: Masker) -> str:
    def clip(value: Masked) -> str:
        """Cut a masked value only: a secret straddling the cut leaks no prefix."""
        if len(value) <= SHOWN_VALUE_LIMIT:
            return value
        return head(value, SHOWN_VALUE_LIMIT - 3) + "..."

    return ", ".join(f"{clip(masker.text(k))}={clip(masker.text(v))}" for k, v in arguments.items())


def decide(
    yolo: bool,
    rules: tuple[AllowRule, ...],
    tool: str,
    arguments: Mapping[str, str],
    bash_command: str | None = None,
    masker: Masker = NO_SECRETS,
) -> Decision:
    """Whether a validated call may run. `arguments` are the coerced values, rendered; a
    refusal quotes them masked by `masker`."""
    if yolo:
        return Decision(True, "yolo")
    builtin_bash = tool == "bash" or bash_command is not None
    for rule in rules:
        if builtin_bash:
            # Only `bash:` rules consent to the built-in: a `{tool: bash, args: ...}` rule would
            # match its command with a plain glob, metacharacters and all.
            matched = rule.bash is not None and bash_command is not None
            if matched and bash_rule_matches(rule.bash or "", bash_command or ""):
                return Decision(True, rule.label)
            continue
        if rule.bash is not None or rule.tool != tool:
            continue
        patterns = rule.args or {}
        if all(k in arguments and glob_match(p, arguments[k]) for k, p in patterns.items()):
            return Decision(True, rule.label)
    shown = _shown(arguments, masker)
    with_args = f" with {shown}" if shown else ""
    return Decision(False, None, f"refused: {tool}{with_args} is not on this run's allowlist")
