"""Bedrock (Converse) through litellm's real client and boto3's signing: a reasoning model's
`reasoningContent` goes back with the second turn (SPEC 6)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from tests.helpers import Cli, CliResult, check_report, read_calls
from tests.providers.project import release_project
from tests.providers.wire import Thinking, Turn, WireServer, bedrock

SECRET = "bedrock-secret-key-0a9f3c"
MODEL = "bedrock/us.anthropic.claude-sonnet-4-5-20250929-v1:0"
THINKING = Thinking("Release 1.4.2 with the tool.", "c2lnbmF0dXJlLWJlZHJvY2s=")
SCRIPT = (
    Turn("Releasing.", calls=(("release", {"version": "1.4.2"}),), thinking=THINKING),
    Turn("Released 1.4.2."),
)
pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("boto3") is None, reason="boto3 is not installed here"
)


def run(cli: Cli, tmp_path: Path, server: WireServer, options: str) -> CliResult:
    return cli(
        "run",
        release_project(tmp_path, options),
        "--model",
        MODEL,
        "--model-option",
        f"aws_bedrock_runtime_endpoint={server.url}",
        "--model-option",
        "aws_region_name=us-east-1",
        "--model-option",
        "aws_access_key_id=AKIAFAKEFAKEFAKE",
        "--model-option",
        f"aws_secret_access_key={SECRET}",
        "--out",
        tmp_path / "out",
    )


def test_reasoning_content_goes_back_with_the_second_turn(cli: Cli, tmp_path: Path) -> None:
    with WireServer(bedrock(SCRIPT)) as server:
        result = run(cli, tmp_path, server, "{thinking: {type: enabled, budget_tokens: 1024}}")
    assert result.code == 0, result.err + str(read_calls(tmp_path / "out"))[-1500:]
    second = server.requests[1].body
    assistant = second["messages"][1]
    assert assistant["content"][0] == {
        "reasoningContent": {
            "reasoningText": {"text": THINKING.text, "signature": THINKING.signature}
        }
    }
    check_report(tmp_path / "out" / "junit.xml")
    assert SECRET not in result.out + result.err
