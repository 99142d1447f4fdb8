"""The verdict from the provider's own words (SPEC 6): only a stop or a tool call ends a turn.

litellm calls "stop" every finish reason it does not know (`model_length`, `max_output_tokens`,
one a provider adds) and a few it folds in (`ERROR`, `MALFORMED_FUNCTION_CALL`): a cut answer
would pass. These cases drive the real litellm path against the fake OpenAI server, scripting
the reason the provider sends, and read the verdict and the model record.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mm_batch.config.secrets import NO_SECRETS
from mm_batch.effects.litellm import LiteLLMClient, load_litellm
from mm_batch.effects.model_calls import NORMAL_NATIVE_FINISHES
from mm_batch.run.judge import unfinished_turn
from mm_batch.testing.fake_openai import (
    FakeOpenAI,
    Finished,
    Reply,
    Script,
    by_prompt,
    text,
    tool_call,
)
from tests.helpers import Cli, CliResult, Fake, model_args, read_calls, write, yolo_agent

MESSAGES: list[dict[str, Any]] = [{"role": "user", "content": "go"}]

# What providers send for a cut or filtered turn, and what they send beside it.
HIDDEN_BY_LITELLM = ["model_length", "max_output_tokens", "ERROR", "MALFORMED_FUNCTION_CALL"]
MAPPED_BY_LITELLM = {
    "max_tokens": "length",
    "refusal": "content_filter",
    "SAFETY": "content_filter",
}
ABNORMAL = [*HIDDEN_BY_LITELLM, "length", "content_filter", "a-reason-a-provider-adds"]


class _Reasons:
    """A fake server that answers each request with the reason set last (one server for many
    examples: starting one per example would dominate the property's time)."""

    def __init__(self) -> None:
        self.reason: str | None = "stop"
        self.calls = False

    def script(self, _request: object) -> Finished:
        message = tool_call("note", {"text": "x"}) if self.calls else text("an answer")
        return Finished(message, self.reason)


@pytest.fixture(scope="module")
def reasons() -> Iterator[tuple[_Reasons, FakeOpenAI]]:
    state = _Reasons()
    with FakeOpenAI(state.script) as fake:
        yield state, fake


def _ask(fake: FakeOpenAI) -> str | None:
    client = LiteLLMClient("hosted_vllm/fake", {"api_base": fake.url}, masker=NO_SECRETS)
    return client.complete(MESSAGES, [], 30).finish_reason


# Any text a provider might send as a reason, and the spellings that matter most.
REASON = st.one_of(
    st.sampled_from(
        [*NORMAL_NATIVE_FINISHES, *ABNORMAL, *MAPPED_BY_LITELLM, "FINISH_REASON_UNSPECIFIED"]
    ),
    st.text(min_size=1, max_size=40),
)


def _litellm_name(reason: str) -> str:
    """What litellm 1.110 calls a provider's reason (its table; "stop" for what it lacks)."""
    load_litellm()
    helpers = importlib.import_module("litellm.litellm_core_utils.core_helpers")
    return str(helpers._FINISH_REASON_MAP.get(reason, "stop"))


@settings(max_examples=150, deadline=None)
@given(reason=REASON, calls=st.booleans())
def test_only_a_stop_or_a_tool_call_ends_a_turn(
    reasons: tuple[_Reasons, FakeOpenAI], reason: str, calls: bool
) -> None:
    """Through real litellm: a turn passes exactly when the provider said stop or tool call
    (in any provider's spelling); otherwise the reason recorded is the provider's own, or
    litellm's name for it where litellm did not call it a stop."""
    state, fake = reasons
    state.reason, state.calls = reason, calls
    recorded = _ask(fake)
    failure = unfinished_turn(recorded, calls)
    if reason in NORMAL_NATIVE_FINISHES:
        assert failure is None, (reason, recorded)
    else:
        assert failure is not None, (reason, recorded)
        named = _litellm_name(reason)
        # litellm's name where it says the turn did not end normally, else the provider's.
        assert recorded == (reason if named in ("stop", "tool_calls", "function_call") else named)
        assert f"finish_reason: {recorded}" in failure


@pytest.mark.parametrize("reason", HIDDEN_BY_LITELLM)
def test_a_reason_litellm_calls_stop_is_read_from_the_provider(
    reasons: tuple[_Reasons, FakeOpenAI], reason: str
) -> None:
    state, fake = reasons
    state.reason, state.calls = reason, False
    assert _ask(fake) == reason


def test_no_reason_at_all_reads_as_a_stop(reasons: tuple[_Reasons, FakeOpenAI]) -> None:
    state, fake = reasons
    state.reason, state.calls = None, False
    assert unfinished_turn(_ask(fake), False) is None


# -- end to end: the run's verdict, record and reports ---------------------------------------

AGENT = yolo_agent(
    "note", "Take a note.", '["sh", "-c", "echo noted >> notes.txt"]', "{text: {type: string}}"
)
TASKS = """
    agent: agent.yaml
    tasks:
      - id: t
        prompt: go
"""


def _run(
    cli: Cli, fake_model: Fake, tmp_path: Path, script: Script, *extra: str | Path
) -> CliResult:
    write(tmp_path, "agent.yaml", AGENT)
    write(tmp_path, "tasks.yaml", TASKS)
    fake = fake_model(script)
    return cli("run", tmp_path / "tasks.yaml", *model_args(fake), "--out", tmp_path / "out", *extra)


@pytest.mark.parametrize("reason", ABNORMAL)
def test_a_cut_or_filtered_answer_fails_the_run(
    cli: Cli, fake_model: Fake, tmp_path: Path, reason: str
) -> None:
    result = _run(cli, fake_model, tmp_path, by_prompt({"go": [Finished(text("1.4"), reason)]}))
    assert result.code == 1, result.err
    records = read_calls(tmp_path / "out")
    model = [r for r in records if r["kind"] == "model"]
    task = records[-1]
    assert model[-1]["finish_reason"] == reason
    assert task["status"] == "failed"
    assert f"finish_reason: {reason}" in task["reason"]


@pytest.mark.parametrize("reason", ["model_length", "content_filter", "length"])
def test_a_cut_tool_call_never_runs(
    cli: Cli, fake_model: Fake, tmp_path: Path, reason: str
) -> None:
    """A turn cut while it wrote a call: the call (maybe cut too) is not run."""
    cut = Finished(tool_call("note", {"text": "x"}), reason)
    result = _run(cli, fake_model, tmp_path, by_prompt({"go": [cut, text("done")]}))
    assert result.code == 1, result.err
    assert not (tmp_path / "notes.txt").exists()
    records = read_calls(tmp_path / "out")
    assert not [r for r in records if r["kind"] == "tool"]
    assert records[-1]["status"] == "failed"
    assert f"finish_reason: {reason}" in records[-1]["reason"]


@pytest.mark.parametrize("reason", ["stop", "end_turn", "eos"])
def test_a_normal_stop_passes(cli: Cli, fake_model: Fake, tmp_path: Path, reason: str) -> None:
    steps: list[Reply] = [tool_call("note", {"text": "x"}), Finished(text("noted"), reason)]
    result = _run(cli, fake_model, tmp_path, by_prompt({"go": steps}))
    assert result.code == 0, result.err
    records = read_calls(tmp_path / "out")
    assert [r["finish_reason"] for r in records if r["kind"] == "model"] == ["tool_calls", "stop"]
    assert (tmp_path / "notes.txt").read_text() == "noted\n"


def test_a_cached_cut_answer_fails_again_when_replayed(
    cli: Cli, fake_model: Fake, tmp_path: Path
) -> None:
    """The response cache replays litellm's response: the provider's word must survive it."""
    script = by_prompt({"go": [Finished(text("1.4"), "model_length")]})
    cache = tmp_path / "cache"
    first = _run(cli, fake_model, tmp_path, script, "--cache", cache)
    assert first.code == 1, first.err
    again = _run(cli, fake_model, tmp_path, script, "--cache", cache, "--cache-mode", "read")
    assert again.code == 1, again.err
    records = read_calls(tmp_path / "out")
    model = [r for r in records if r["kind"] == "model"]
    assert model[-1]["cached"] is True
    assert model[-1]["finish_reason"] == "model_length"
    assert records[-1]["status"] == "failed"


@pytest.mark.parametrize("reason", ["tool_calls", "function_call"])
def test_a_turn_that_says_it_called_a_tool_but_holds_none_fails(
    cli: Cli, fake_model: Fake, tmp_path: Path, reason: str
) -> None:
    """Neither a stop nor a tool call (second attack): its text is no final answer."""
    result = _run(cli, fake_model, tmp_path, by_prompt({"go": [Finished(text("1.4"), reason)]}))
    assert result.code == 1, result.err
    task = read_calls(tmp_path / "out")[-1]
    assert task["status"] == "failed"
    assert f"finish_reason: {reason} but held no tool call" in task["reason"]
