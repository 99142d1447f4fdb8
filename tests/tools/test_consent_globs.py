"""Allowlist globs as classes (SPEC §4): an `args` `*` never matches '/' nor a value holding a
`..` segment; a bash glob never matches a metacharacter nor lets its `*` cover a `..` segment.
The bash property asks bash itself which words a matched command becomes."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import SupportsIndex

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mm_batch.config.model import AllowRule
from mm_batch.tools import consent
from mm_batch.tools.consent import bash_rule_matches, decide, glob_match

# -- args ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("pattern", "value"),
    [
        ("docs/*", "docs/../secret.txt"),
        ("docs/*", "docs/.."),
        ("docs/*", "docs/a/b"),
        ("docs/*.md", "docs/../x.md"),
        ("*", ".."),
        ("*", "../etc/passwd"),
        ("*/x", "../x"),
    ],
)
def test_an_args_glob_never_allows_a_parent_segment_or_a_deeper_path(
    pattern: str, value: str
) -> None:
    rules = (AllowRule(0, tool="read", args={"path": pattern}),)
    assert not decide(False, rules, "read", {"path": value}).allowed


def test_an_args_glob_still_allows_names_with_dots() -> None:
    for value in ("docs/a.md", "docs/...", "docs/a..b", "docs/.hidden", "docs/"):
        assert glob_match("docs/*", value), value
    assert glob_match("1.*", "1.4.2") and glob_match("*", "a b")
    assert glob_match("..", "..")  # an exact pattern is the author's own words


PIECES = st.lists(st.sampled_from(["a", "b", "/", ".", "..", "*", "-"]), max_size=6).map("".join)
VALUES = st.lists(st.sampled_from(["a", "b", "/", ".", "..", "-", " "]), max_size=8).map("".join)


def _reference(pattern: str, value: str) -> bool:
    """The rule as written in SPEC §4, with a backtracking regex (fine for short values)."""
    if "*" not in pattern:
        return pattern == value
    if ".." in value.split("/"):
        return False
    regex = "[^/]*".join(re.escape(part) for part in pattern.split("*"))
    return re.fullmatch(regex, value, re.DOTALL) is not None


@settings(max_examples=300, deadline=None)
@given(pattern=PIECES, value=VALUES)
def test_an_args_glob_matches_as_the_rule_says(pattern: str, value: str) -> None:
    matched = glob_match(pattern, value)
    assert matched == _reference(pattern, value)
    if matched and "*" in pattern:
        assert ".." not in value.split("/")
        assert value.count("/") == pattern.count("/")  # `*` never covers a '/'


class _Scanned(str):
    """A text that counts the characters its `find` scans: the matcher's whole search. Past
    `limit` it stops the match, so that a backtracking matcher fails at once."""

    scanned = 0
    limit = 0

    def find(
        self, sub: str, start: SupportsIndex | None = None, end: SupportsIndex | None = None
    ) -> int:
        found = super().find(sub, start, end)
        low = 0 if start is None else int(start)
        high = len(self) if end is None else min(int(end), len(self))
        self.scanned += max(0, (found + len(sub) if found != -1 else high) - low)
        if self.scanned > self.limit:
            raise AssertionError(f"{self.scanned} characters scanned: not linear in {len(self)}")
        return found


class _NoRegex:
    def __getattr__(self, name: str) -> object:
        raise AssertionError(f"{name} called while a value was matched")


def test_a_hostile_value_cannot_make_a_glob_slow(monkeypatch: pytest.MonkeyPatch) -> None:
    """Linear by construction, counted rather than timed: each literal of the pattern costs
    one scan of the value at most, and no regex is built from the pattern at match time (a
    backtracking one would take hours here). `python benchmarks/hostile_inputs.py` times it."""
    monkeypatch.setattr(consent, "re", _NoRegex())
    monkeypatch.setattr(consent, "fnmatch", _NoRegex())  # no `..`-like segment: never needed
    pattern = "*a*a*a*a*a*a*b"
    for matches, glob, text in (
        (glob_match, pattern, "a" * (64 * 1024)),
        (bash_rule_matches, "ls " + pattern, "ls " + "a" * (64 * 1024)),
    ):
        value = _Scanned(text)
        value.limit = (glob.count("*") + 1) * 2 * len(text)
        assert not matches(glob, value)


# -- bash ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "command",
    [
        "./scripts/../../usr/bin/env touch MARK",
        "./scripts/..",
        "./scripts/x/../../bin/sh",
        "./scripts/'..'/'..'/usr/bin/env",
        './scripts/"."./x',
        "./scripts/.?/x",
        "./scripts/.*/x",
        "./scripts/[.][.]/x",
        "./scripts/run.sh --dir=../..",
        "./scripts/run.sh a,../b",
    ],
)
def test_a_bash_glob_never_covers_a_parent_segment(command: str) -> None:
    assert not bash_rule_matches("./scripts/*", command)


def test_a_bash_glob_still_matches_dotted_names_and_literal_parents() -> None:
    for command in ("./scripts/run.sh v1..v2", "./scripts/run.sh ...", "./scripts/a.b ./x"):
        assert bash_rule_matches("./scripts/*", command), command
    assert bash_rule_matches("../tools/run.sh *", "../tools/run.sh --fast")
    assert not bash_rule_matches("../tools/run.sh *", "../tools/run.sh ../x")
    assert bash_rule_matches("ls *", "ls *.py ~/x 'a b'")


TAILS = st.lists(
    st.sampled_from(
        ["a", "x", ".", "..", "/", " ", "'", '"', "?", "*", "[.]", "=", "-", ";", "$", "~"]
    ),
    max_size=10,
).map("".join)


@pytest.fixture(scope="module")
def tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder where pathname expansion has something to find, dot entries included."""
    root = tmp_path_factory.mktemp("tree")
    for name in ("scripts/a", "scripts/x/a", "scripts/.x/a", "a/x"):
        (root / name).mkdir(parents=True)
    return root


def _words(command: str, cwd: Path) -> list[str] | None:
    """The words bash makes of a command (quotes removed, patterns expanded); None when it is
    not a command bash can parse."""
    done = subprocess.run(
        ["bash", "-c", "printf '%s\\0' " + command],
        cwd=cwd,
        capture_output=True,
        timeout=10,
        check=False,
    )
    if done.returncode != 0:
        return None
    return done.stdout.decode("utf-8", "replace").split("\0")[:-1]


@settings(
    max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(tail=TAILS)
def test_what_a_bash_glob_allows_never_steps_out_of_its_folder(tree: Path, tail: str) -> None:
    command = "./scripts/" + tail
    if not bash_rule_matches("./scripts/*", command):
        return
    assert not any(c in command for c in ";$\n"), command
    words = _words(command, tree)
    if words is None:
        return
    for word in words:
        assert ".." not in word.split("/"), (command, words)
