"""Anthropic through litellm's real client: a two-turn tool task, with and without extended
thinking, against a server that refuses what Anthropic refuses (SPEC 6)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.helpers import Cli, CliResult, check_report, read_calls
from tests.providers.project import release_project
from tests.providers.wire import Thinking, Turn, WireServer, anthropic

KEY = "sk-ant-test-4f9c2e7d1b"
MODEL = "anthropic/claude-sonnet-4-5"
THINKING = Thinking("The user wants 1.4.2 on beta: call release.", "EqQBCkgIARABGAIiQL+sig==")
SCRIPT = (
    Turn("I will release it.", calls=(("release", {"version": "1.4.2"}),), thinking=THINKING),
    Turn("Released 1.4.2."),
)


def run(cli: Cli, tmp_path: Path, server: WireServer, options: str) -> CliResult:
    return cli(
        "run",
        release_project(tmp_path, options),
        "--model",
        MODEL,
        "--model-option",
        f"api_base={server.url}",
        "--model-option",
        f"api_key={KEY}",
        "--out",
        tmp_path / "out",
    )


@pytest.mark.parametrize(
    "options",
    [
        "{thinking: {type: enabled, budget_tokens: 1024}}",
        "{reasoning_effort: low}",  # litellm turns it into `thinking` for Claude
    ],
)
def test_the_signed_thinking_block_goes_back_with_the_second_turn(
    cli: Cli, tmp_path: Path, options: str
) -> None:
    with WireServer(anthropic(SCRIPT, key=KEY)) as server:
        result = run(cli, tmp_path, server, options)
    assert result.code == 0, result.err + json.dumps(read_calls(tmp_path / "out"))[-2000:]
    first, second = (r.body for r in server.requests)
    assert first["thinking"]["type"] == "enabled"
    assistant = second["messages"][1]
    assert assistant["role"] == "assistant"
    assert assistant["content"][0] == {
        "type": "thinking",
        "thinking": THINKING.text,
        "signature": THINKING.signature,
    }
    assert [b["type"] for b in assistant["content"]] == ["thinking", "text", "tool_use"]
    check_report(tmp_path / "out" / "junit.xml")


def test_without_thinking_the_history_holds_text_and_tool_use_only(
    cli: Cli, tmp_path: Path
) -> None:
    with WireServer(anthropic(SCRIPT, key=KEY)) as server:
        result = run(cli, tmp_path, server, "{}")
    assert result.code == 0, result.err
    second = server.requests[1].body
    assert "thinking" not in second
    assert [b["type"] for b in second["messages"][1]["content"]] == ["text", "tool_use"]
    records = read_calls(tmp_path / "out")
    assert [r["finish_reason"] for r in records if r["kind"] == "model"] == ["tool_calls", "stop"]


def test_a_refused_key_is_an_error_with_the_provider_s_reason_and_the_key_masked(
    cli: Cli, tmp_path: Path
) -> None:
    """Anthropic's 401 quotes the key it got: the run is an error, not retried, and the key
    is nowhere in what mm-batch writes or prints."""
    with WireServer(anthropic(SCRIPT, key="another-key-entirely")) as server:
        result = run(cli, tmp_path, server, "{thinking: {type: enabled, budget_tokens: 1024}}")
    assert result.code == 3, result.err
    assert len(server.requests) == 1  # a refusal is not retried
    task = read_calls(tmp_path / "out")[-1]
    assert task["status"] == "error" and "HTTP 401" in task["reason"], task["reason"]
    for written in (tmp_path / "out").rglob("*"):
        if written.is_file():
            assert KEY not in written.read_text(errors="replace"), written
    assert KEY not in result.out + result.err
