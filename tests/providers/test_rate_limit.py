"""A 429 whose wait would pass the task's deadline fails the run, saying so (SPEC 6, 7)."""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from mm_batch.config.secrets import Masker
from mm_batch.effects.litellm import LiteLLMClient
from mm_batch.effects.model_errors import retry_after_s
from mm_batch.run.ports import ModelRateLimitError, ModelReply
from mm_batch.testing.fake_openai import FakeOpenAI, HttpFailure, Reply, text
from tests.helpers import Cli, Fake, check_report, read_calls, write

KEY = "sk-rate-limited-5d1e9a"
MESSAGES = [{"role": "user", "content": "go"}]


def project(tmp_path: Path) -> Path:
    write(tmp_path, "agent.yaml", "yolo: true\ntools: []\n")
    return write(
        tmp_path,
        "tasks.yaml",
        "agent: agent.yaml\ntasks:\n  - {id: t, prompt: hi, timeout: 30}\n",
    )


def test_a_429_asking_past_the_deadline_fails_the_run_naming_the_rate_limit(
    cli: Cli, fake_model: Fake, tmp_path: Path
) -> None:
    fake = fake_model(
        lambda _r: HttpFailure(429, f"quota exceeded for {KEY}", {"Retry-After": "120"})
    )
    out = tmp_path / "out"
    result = cli(
        "run",
        project(tmp_path),
        "--model",
        "hosted_vllm/fake",
        "--model-option",
        f"api_base={fake.url}",
        "--model-option",
        f"api_key={KEY}",
        "--out",
        out,
    )
    assert result.code == 1, result.err
    model, task = read_calls(out)
    assert task["status"] == "failed"
    # Said before any wait (a wait of 120 s would have ended at the task's 30 s as a timeout).
    assert (
        task["reason"] == "rate limited (429, Retry-After 120 s): the task's deadline comes first"
    )
    # The turn that got no answer has its record, with the tries it took.
    assert model["kind"] == "model" and model["attempts"] == 1 and model["finish_reason"] is None
    assert model["cost_usd"] == 0  # a refused request is not billed: --max-cost counts it
    assert len(fake.requests) == 1
    check_report(out / "junit.xml")
    for written in out.rglob("*"):
        assert KEY not in written.read_text(errors="replace"), written
    assert KEY not in result.out + result.err


def client(fake: FakeOpenAI) -> LiteLLMClient:
    return LiteLLMClient(
        "hosted_vllm/fake",
        {"api_base": fake.url},
        masker=Masker([]),
        backoff_s=0.01,
    )


@pytest.mark.parametrize(
    ("headers", "reason"),
    [
        ({"Retry-After": "45"}, "rate limited (429, Retry-After 45 s)"),
        ({"Retry-After": "9" * 400}, "rate limited (429, Retry-After inf s)"),
        ({}, "rate limited (429, backoff "),  # no header: the backoff passes a short deadline
    ],
)
def test_the_reason_names_the_wait_asked(
    fake_model: Fake, headers: dict[str, str], reason: str
) -> None:
    fake = fake_model(lambda _r: HttpFailure(429, "slow down", headers))
    slow = LiteLLMClient("hosted_vllm/fake", {"api_base": fake.url}, masker=Masker([]), backoff_s=5)
    with pytest.raises(ModelRateLimitError) as caught:
        slow.complete(MESSAGES, [], 3)
    assert str(caught.value).startswith(reason)
    assert str(caught.value).endswith(": the task's deadline comes first")
    assert caught.value.attempts == 1


def test_a_run_that_waits_on_another_run_s_429_says_so_too(fake_model: Fake) -> None:
    answers: Iterator[Reply] = iter([HttpFailure(429, "slow down", {"Retry-After": "2"})])
    fake = fake_model(lambda _r: next(answers, text("ok")))
    first, second = client(fake), client(fake)
    replies: list[ModelReply] = []
    waiting = threading.Thread(target=lambda: replies.append(first.complete(MESSAGES, [], 30)))
    waiting.start()
    while not fake.requests:
        time.sleep(0.01)
    time.sleep(0.2)  # the first run now waits out the pause of 2 s, for every run of the model
    with pytest.raises(ModelRateLimitError) as caught:
        second.complete(MESSAGES, [], 1)
    waiting.join()
    assert str(caught.value).startswith("rate limited (429, Retry-After 2 s)")
    assert caught.value.attempts == 0  # it sent nothing: no model record for it
    assert replies[0].text == "ok"


@pytest.mark.parametrize(
    ("body", "asked"),
    [
        ('"retryDelay": "37s"', 37.0),
        ('"retryDelay":"2.5s"', 2.5),
        (f'"retryDelay": "{"9" * 400}s"', math.inf),  # past any deadline, never an error
        ('"retryDelay": "soon"', None),
        ('"message": "retry in 37s"', None),  # words are no RetryInfo
    ],
)
def test_a_google_api_s_retry_delay_is_the_wait_asked(body: str, asked: float | None) -> None:
    """Gemini says how long to wait in its error's body (`google.rpc.RetryInfo`), with no
    `Retry-After` header; litellm quotes the body in its message."""
    error = RuntimeError(f'GeminiException - {{"error": {{"code": 429, "details": [{{{body}}}]}}}}')
    assert retry_after_s(error) == asked
