"""Text rescue confusions: data that mentions a tool must stay text, and a rescued call gets
no more than a real one (validation and consent apply alike).

Each case is a real `mm-batch run` with rescue on, and asserts the marker `deploy` would
leave, the records, the verdict and the exit code.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from mm_batch.testing.fake_openai import text
from tests.helpers import Cli, CliResult, Fake, RescueMeter, model_args, read_calls, write

AGENT = """
yolo: {yolo}
tools:
  - name: deploy
    description: Deploy a service.
    parameters:
      service: {{type: string, required: false}}
    command: ["./deploy.sh", "{{{{service}}}}"]
"""
DEPLOY = '#!/bin/sh\ntouch deployed\necho "deployed $1"\n'
TASKS = """
agent: agent.yaml
tasks:
  - id: answer
    prompt: answer
"""


def run(
    cli: Cli,
    fake_model: Fake,
    tmp_path: Path,
    answer: str,
    *,
    yolo: bool = True,
    rescue: bool = True,
) -> tuple[CliResult, list[dict[str, Any]]]:
    write(tmp_path, "agent.yaml", AGENT.format(yolo="true" if yolo else "false"))
    write(tmp_path, "deploy.sh", DEPLOY).chmod(0o755)
    tasks = write(tmp_path, "tasks.yaml", TASKS)
    answers = iter([text(answer)])
    fake = fake_model(lambda _r: next(answers, text("done")))
    option = f"recover_text_tool_calls={'true' if rescue else 'false'}"
    out = tmp_path / "out"
    result = cli("run", tasks, *model_args(fake), "--model-option", option, "--out", out)
    assert "Traceback" not in result.err, result.err
    return result, read_calls(out)


def tool_records(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in records if r["kind"] == "tool"]


STAYS_TEXT = {
    "data naming the tool": '{"name": "deploy", "owner": "ops"}',
    "a name alone": 'The service is {"name": "deploy"}.',
    "a call with one key too many": '{"name": "deploy", "arguments": {}, "owner": "ops"}',
    "a call nested in other JSON": '{"services": [{"name": "deploy", "arguments": {}}]}',
    "a list of calls": '[{"name": "deploy", "arguments": {}}]',
    "arguments that are a list": '{"name": "deploy", "arguments": ["billing"]}',
    "arguments a string of no object": '{"name": "deploy", "arguments": "billing"}',
    "a tool the agent lacks": '{"name": "drop_db", "arguments": {}}',
    "a fenced example in a sentence": (
        'Here is how the config looks:\n```json\n{"deploy": {"name": "deploy", '
        '"arguments": {"service": "billing"}}}\n```'
    ),
}


@pytest.mark.parametrize("name", list(STAYS_TEXT))
def test_data_that_mentions_a_tool_runs_nothing(
    cli: Cli, fake_model: Fake, tmp_path: Path, name: str
) -> None:
    result, records = run(cli, fake_model, tmp_path, STAYS_TEXT[name])
    assert not (tmp_path / "deployed").exists()
    assert tool_records(records) == []
    assert records[-1]["status"] == "passed" and records[-1]["answer"] == STAYS_TEXT[name]
    assert result.code == 0


def test_an_exact_call_in_text_runs_and_says_so(cli: Cli, fake_model: Fake, tmp_path: Path) -> None:
    """The reference case: with the same set-up an exact call object is rescued and runs."""
    answer = 'Sure.\n<tool_call>\n{"name": "deploy", "arguments": {"service": "x"}}\n</tool_call>'
    result, records = run(cli, fake_model, tmp_path, answer)
    assert (tmp_path / "deployed").exists()
    [record] = tool_records(records)
    assert record["outcome"] == "ran" and record["recovered_from_text"] is True
    assert record["argv"] == ["./deploy.sh", "x"]
    assert result.code == 0


def test_without_rescue_an_exact_call_stays_text(
    cli: Cli, fake_model: Fake, tmp_path: Path
) -> None:
    result, records = run(
        cli, fake_model, tmp_path, '{"name": "deploy", "arguments": {}}', rescue=False
    )
    assert not (tmp_path / "deployed").exists() and tool_records(records) == []
    assert result.code == 0


def test_a_rescued_call_needs_consent_like_a_real_one(
    cli: Cli, fake_model: Fake, tmp_path: Path
) -> None:
    answer = '{"name": "deploy", "parameters": {"service": "prod"}}'
    result, records = run(cli, fake_model, tmp_path, answer, yolo=False)
    assert not (tmp_path / "deployed").exists()
    [record] = tool_records(records)
    assert record["outcome"] == "refused" and record["recovered_from_text"] is True
    assert records[-1]["status"] == "failed" and result.code == 1


def test_a_rescued_call_is_validated_like_a_real_one(
    cli: Cli, fake_model: Fake, tmp_path: Path
) -> None:
    answer = '{"name": "deploy", "arguments": "{\\"service\\": \\"--all\\"}"}'
    result, records = run(cli, fake_model, tmp_path, answer)
    assert not (tmp_path / "deployed").exists()
    [record] = tool_records(records)
    assert record["outcome"] == "invalid" and "begins with '-'" in record["reason"]
    assert result.code == 0


def test_a_ten_mib_answer_full_of_braces_ends_in_bounded_time(
    cli: Cli, fake_model: Fake, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Bounded by construction: the rescue's work is counted (linear in the answer, as its
    budget allows), not timed; `python benchmarks/hostile_inputs.py` times it."""
    answer = ('{"name": "deploy", "arguments": {"service": [' + "1," * 2000) * 2600
    meter = RescueMeter(monkeypatch)
    result, records = run(cli, fake_model, tmp_path, answer)
    assert meter.over is None and len(answer) in meter.texts
    assert not (tmp_path / "deployed").exists() and tool_records(records) == []
    assert records[-1]["status"] == "passed" and result.code == 0
