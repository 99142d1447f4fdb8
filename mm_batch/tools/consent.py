"""Consent: yolo, or the preapproved allowlist. A decision names the rule that matched."""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass

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


# A bash word is cut into path segments at these: a `..` segment steps out of a folder.
_SEGMENT_SEPARATORS = re.compile(r"[\s/=,:]+")
_QUOTES = frozenset("'\"")


def _stops(text: str, blocked: Callable[[int], bool]) -> list[int]:
    """For each position, the first blocked position at or after it (len(text) if none): how
    far a `*` starting there may reach."""
    stops = [len(text)] * (len(text) + 1)
    for i in range(len(text) - 1, -1, -1):
        stops[i] = i if blocked(i) else stops[i + 1]
    return stops


def _wildcard_match(pattern: str, text: str, stops: list[int]) -> bool:
    """Whole-text match of a pattern whose `*` covers any run of unblocked characters.

    Where the next literal may begin is kept as one interval per run of unblocked characters
    (within a run only the earliest end matters), so each literal costs one scan of the text:
    no backtracking that a hostile value could blow up, whatever the pattern.
    """
    first, *middle, last = pattern.split("*")
    if not text.startswith(first):
        return False
    reach = [(len(first), stops[len(first)])]
    for part in (p for p in middle if p):  # `**` covers what `*` covers
        ends: list[tuple[int, int]] = []
        for low, high in reach:
            q = text.find(part, low, high + len(part))
            while q != -1:
                end = q + len(part)
                if not ends or stops[end] != ends[-1][1]:
                    ends.append((end, stops[end]))
                # A later end in the same run reaches no further: skip to the next run.
                q = text.find(part, max(q + 1, stops[end] + 1 - len(part)), high + len(part))
        if not ends:
            return False
        reach = ends
    start = len(text) - len(last)
    return text.endswith(last) and any(low <= start <= high for low, high in reach)


def glob_match(pattern: str, value: str) -> bool:
    """Whole-value match of an `args` pattern, `*` the only wildcard (SPEC §4): a `*` never
    matches '/', and no pattern with a `*` matches a value holding a `..` path segment
    (`docs/*` never allows `docs/../secret.txt`)."""
    if "*" not in pattern:
        return pattern == value
    if ".." in value.split("/"):
        return False
    return _wildcard_match(pattern, value, _stops(value, lambda i: value[i] == "/"))


def _could_be_parent(segment: str) -> bool:
    """Whether bash could make this path segment `..`: written out, or as a pattern that
    pathname expansion would match with `..` (`.?`, `.*`, `[.].`; one that begins with `*`
    or `?` never matches a leading dot)."""
    if segment == "..":
        return True
    pattern = any(c in "*?[" for c in segment) and segment[0] in ".["
    return pattern and fnmatch.fnmatchcase("..", segment)


def _parent_positions(command: str) -> set[int]:
    """The positions of the command that belong to a path segment bash could make `..`,
    seen as bash sees its words: quotes removed (`'.'.` is `..`)."""
    kept = [i for i, c in enumerate(command) if c not in _QUOTES]
    unquoted = "".join(command[i] for i in kept)
    positions: set[int] = set()
    start = 0
    for separator in [*_SEGMENT_SEPARATORS.finditer(unquoted), None]:
        end = separator.start() if separator is not None else len(unquoted)
        if end > start and _could_be_parent(unquoted[start:end]):
            positions.update(range(kept[start], kept[end - 1] + 1))
        start = separator.end() if separator is not None else end
    return positions


def glob_safe(command: str) -> bool:
    """Whether a glob rule may match this command: no metacharacter and no control character
    (a newline or carriage return ends a line, a NUL or escape hides what follows), tab aside."""
    return not any(
        c in SHELL_METACHARACTERS or (c != "\t" and (c < " " or c == "\x7f")) for c in command
    )


def bash_rule_matches(pattern: str, command: str) -> bool:
    """An exact rule matches its command alone; a glob never matches a command holding a shell
    metacharacter, nor one where a `*` would cover a `..` path segment (`./scripts/*` never
    allows `./scripts/../../usr/bin/env ...`): only an exact rule can."""
    if "*" not in pattern:
        return pattern == command
    if not glob_safe(command):
        return False
    parents = _parent_positions(command)
    return _wildcard_match(pattern, command, _stops(command, parents.__contains__))


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
