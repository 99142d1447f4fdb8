"""mm-batch's model calls skip litellm's success logging, which nothing of mm-batch reads."""

from __future__ import annotations

import importlib
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from mm_batch.config.secrets import NO_SECRETS
from mm_batch.effects.litellm import LiteLLMClient, load_litellm
from mm_batch.testing.fake_openai import text
from tests.helpers import Fake

MESSAGES = [{"role": "user", "content": "go"}]


@pytest.fixture
def logged() -> Iterator[threading.Event]:
    """A litellm success callback, registered for the test: set when litellm logs a call."""
    litellm = load_litellm()
    seen = threading.Event()

    def callback(*_args: Any) -> None:
        seen.set()

    saved = list(litellm.success_callback)
    litellm.success_callback = [callback]
    try:
        yield seen
    finally:
        litellm.success_callback = saved


def test_litellm_logs_a_call_of_its_own_to_the_callback(
    fake_model: Fake, logged: threading.Event
) -> None:
    fake = fake_model(lambda _r: text("ok"))
    load_litellm().completion(
        model="hosted_vllm/fake", messages=MESSAGES, api_base=fake.url, num_retries=0
    )
    assert logged.wait(5)  # what the test below relies on: the callback does see calls


def test_mm_batch_s_model_calls_are_not_logged_by_litellm(
    fake_model: Fake, logged: threading.Event
) -> None:
    fake = fake_model(lambda _r: text("ok"))
    client = LiteLLMClient("hosted_vllm/fake", {"api_base": fake.url}, masker=NO_SECRETS)
    replies = [client.complete(MESSAGES, [], 30).text for _ in range(3)]
    assert replies == ["ok"] * 3
    time.sleep(0.5)  # litellm logs on its own executor threads, after the call returned
    assert not logged.is_set()


@pytest.fixture
def litellm_priced(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every model litellm's own price calculation is asked about, while the test runs."""
    load_litellm()
    calculator = importlib.import_module("litellm.cost_calculator")
    original = calculator.completion_cost
    asked: list[str] = []

    def recording(*args: Any, **kwargs: Any) -> Any:
        asked.append(str(kwargs.get("model")))
        return original(*args, **kwargs)

    monkeypatch.setattr(calculator, "completion_cost", recording)
    return asked


@pytest.mark.parametrize("model", ["hosted_vllm/fake", "openai/gpt-4o-mini"])
def test_litellm_does_not_price_mm_batch_s_calls_and_mm_batch_still_does(
    fake_model: Fake, litellm_priced: list[str], model: str
) -> None:
    litellm = load_litellm()
    fake = fake_model(lambda _r: text("ok"))
    # litellm's OpenAI client wants a key, which the fake server never reads.
    options = {"api_base": fake.url, "api_key": "not-a-real-key"}
    reply = LiteLLMClient(model, options, masker=NO_SECRETS).complete(MESSAGES, [], 30)
    assert reply.text == "ok"
    # litellm's calculation (a third of its CPU a call, under the interpreter lock) never ran...
    assert litellm_priced == []
    # ...and the turn's cost is mm-batch's own, from the bundled price map: 10 + 5 fake tokens.
    if model.startswith("openai/"):
        price = litellm.model_cost["gpt-4o-mini"]
        expected = 10 * price["input_cost_per_token"] + 5 * price["output_cost_per_token"]
        assert reply.cost_usd == pytest.approx(expected)
    else:
        assert reply.cost_usd is None
