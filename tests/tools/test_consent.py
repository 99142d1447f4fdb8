"""Consent: yolo, the allowlist with argument globs, and bash rules against metacharacters."""

from __future__ import annotations

import pytest

from mm_batch.config.model import AllowRule
from mm_batch.tools.consent import decide

RULES = (
    AllowRule(0, tool="status"),
    AllowRule(1, tool="release", args={"channel": "beta", "version": "1.*"}),
    AllowRule(2, bash="git status"),
    AllowRule(3, bash="ls *"),
)


def test_yolo_runs_everything() -> None:
    decision = decide(True, (), "drop_db", {"name": "prod"})
    assert decision.allowed and decision.rule == "yolo"


def test_rule_is_named() -> None:
    assert decide(False, RULES, "status", {"service": "x"}).rule == "allow[0]"
    assert decide(False, RULES, "release", {"version": "1.4.2", "channel": "beta"}).rule == (
        "allow[1]"
    )


def test_refusal_says_what_was_refused() -> None:
    decision = decide(False, RULES, "release", {"version": "1.4.2", "channel": "stable"})
    assert not decision.allowed and decision.rule is None
    assert decision.reason == (
        "refused: release with version=1.4.2, channel=stable is not on this run's allowlist"
    )


def test_argument_globs_match_the_whole_value() -> None:
    assert not decide(False, RULES, "release", {"version": "21.0", "channel": "beta"}).allowed
    assert not decide(False, RULES, "release", {"version": "1.0", "channel": "beta2"}).allowed
    assert not decide(False, RULES, "release", {"channel": "beta"}).allowed


def test_bash_exact_and_glob_rules() -> None:
    assert decide(False, RULES, "bash", {"command": "git status"}, "git status").rule == "allow[2]"
    assert decide(False, RULES, "bash", {"command": "ls -la src"}, "ls -la src").rule == "allow[3]"
    assert not decide(False, RULES, "bash", {}, "git status --short").allowed


@pytest.mark.parametrize(
    "command",
    [
        "ls x; rm -rf ~",
        "ls x && rm -rf ~",
        "ls x | sh",
        "ls $(id)",
        "ls `id`",
        "ls x\nrm -rf ~",
        "ls > /etc/passwd",
        "ls < secret",
        "ls (x)",
        "ls & sleep 9",
    ],
)
def test_a_glob_never_matches_shell_metacharacters(command: str) -> None:
    assert not decide(False, RULES, "bash", {"command": command}, command).allowed


def test_an_exact_rule_may_hold_metacharacters() -> None:
    rules = (AllowRule(0, bash="make test | tee log"),)
    assert decide(False, rules, "bash", {}, "make test | tee log").allowed


@pytest.mark.parametrize(
    "command",
    [
        "ls x\rrm -rf ~",
        "ls $'\\x3b' rm",
        "ls x\\\nrm -rf ~",  # backslash-newline
        "ls \\; rm",
        "ls {a,b}",
        "ls x\x00rm",
        "ls x\x1b[2J",
        "ls ${HOME}",
        "ls <(id)",
        "ls x >>log",
        "ls x 2>&1",
    ],
)
def test_a_glob_never_matches_what_bash_could_expand_or_escape(command: str) -> None:
    assert not decide(False, RULES, "bash", {"command": command}, command).allowed


def test_a_glob_still_matches_plain_words_quotes_and_tabs() -> None:
    for command in ("ls -la src", "ls 'a b' \"c\"", "ls \t-la", "ls *.py ~/x"):
        assert decide(False, RULES, "bash", {"command": command}, command).rule == "allow[3]"


def test_only_bash_rules_consent_to_bash() -> None:
    """A `{tool: bash, args: ...}` rule (refused at load) never consents, were it loaded."""
    rules = (AllowRule(0, tool="bash", args={"command": "ls *"}), AllowRule(1, tool="bash"))
    command = "ls x; touch MARK"
    assert not decide(False, rules, "bash", {"command": command}, command).allowed
    assert not decide(False, rules, "bash", {"command": "ls"}, "ls").allowed


def test_a_bash_rule_consents_to_no_declared_tool() -> None:
    rules = (AllowRule(0, bash="*"),)
    assert not decide(False, rules, "deploy", {}).allowed


def test_refusal_quotes_each_value_at_most_120_characters() -> None:
    decision = decide(False, RULES, "release", {"version": "9" * 100_000})
    assert decision.reason is not None and len(decision.reason) < 200
    assert "9" * 117 + "..." in decision.reason
