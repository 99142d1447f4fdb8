"""Canaries of `effects.litellm_patches`: for each change mm-batch makes to litellm, that the
internal it replaces is still there with the signature it had (litellm 1.110), that it is still
needed, and that the patch has the effect it exists for, through the real litellm code path
against the fake OpenAI server. A litellm upgrade that moves one fails here, by name.
"""

from __future__ import annotations

import importlib
import inspect
import logging
import os
import sys
import threading
import time
from typing import Any

import pytest

from mm_batch.config.secrets import NO_SECRETS
from mm_batch.effects import litellm_patches as patches
from mm_batch.effects.litellm import LiteLLMClient, load_litellm
from mm_batch.testing.fake_openai import Finished, text, tool_call
from tests.helpers import Fake

MESSAGES = [{"role": "user", "content": "go"}]


def _parameters(function: object) -> list[str]:
    assert callable(function)
    return list(inspect.signature(function).parameters)


# -- offline and quiet -----------------------------------------------------------------------


def test_litellm_reads_its_bundled_price_map_and_production_mode() -> None:
    litellm = load_litellm()
    for name, value in patches.OFFLINE_ENVIRONMENT.items():
        assert os.environ.get(name) == value
    # What litellm read of them at import: the mode, and a price map forced local.
    assert litellm.litellm_mode == "PRODUCTION"
    cost_map = importlib.import_module("litellm.litellm_core_utils.get_model_cost_map")
    # Asked for a map from an address that answers nothing, it reads its own copy, as forced.
    loaded = cost_map.get_model_cost_map(url="http://127.0.0.1:9/no-map.json")
    assert "gpt-4o-mini" in loaded
    info = cost_map.get_model_cost_map_source_info()
    assert (info["source"], info["is_env_forced"], info["url"]) == ("local", True, None)


def test_litellm_prints_no_banner(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    litellm = load_litellm()
    assert inspect.getattr_static(litellm, "suppress_debug_info") is True
    for suppressed in (True, False):
        monkeypatch.setattr(litellm, "suppress_debug_info", suppressed)
        with pytest.raises(litellm.BadRequestError):
            litellm.get_llm_provider("no-such-provider/model")
        printed = capsys.readouterr()
        # litellm's banner names its providers, unless the switch (still read) is on.
        assert ("Provider List" in printed.out + printed.err) is not suppressed


def test_litellm_s_loggers_are_the_ones_silenced(capfd: pytest.CaptureFixture[str]) -> None:
    load_litellm()
    own = importlib.import_module("litellm._logging")
    loggers = (own.verbose_logger, own.verbose_router_logger, own.verbose_proxy_logger)
    assert tuple(logger.name for logger in loggers) == patches.LOGGERS
    for logger in loggers:
        assert not logger.propagate
        assert logging.NullHandler in {type(h) for h in logger.handlers}
    # litellm warns of a finish reason it does not know: not on stderr (it may quote a key).
    helpers = importlib.import_module(patches.FINISH_MODULE)
    assert helpers.map_finish_reason("a-reason-litellm-lacks") == "stop"
    assert "a-reason-litellm-lacks" not in capfd.readouterr().err


# -- tool-call arguments litellm cannot decode -----------------------------------------------


def test_unreadable_arguments_are_kept_as_sent(fake_model: Fake) -> None:
    """A 5000-digit integer in a call's arguments: litellm's fixer raises (the patch is still
    needed), patched it hands the calls back unchanged, and the reply reads with the call's
    arguments as the model sent them, to be answered as an invalid call."""
    load_litellm()
    reader = importlib.import_module(patches.READER_MODULE)
    original = patches.ORIGINALS[patches.FIXER]
    assert _parameters(original) == ["tool_calls"]
    patched = getattr(reader, patches.FIXER)
    assert getattr(patched, "mm_batch_tolerant", False)
    # Wherever litellm imported it by name, the name is the patched one.
    bound = [vars(m).get(patches.FIXER) for n, m in list(sys.modules.items()) if n[:7] == "litellm"]
    assert original not in bound and patched in bound
    huge = '{"n": ' + "9" * 5000 + "}"
    types = importlib.import_module("litellm.types.utils")
    call = types.ChatCompletionMessageToolCall(
        id="c", type="function", function=types.Function(name="probe", arguments=huge)
    )
    assert callable(original)
    with pytest.raises(ValueError):
        original([call])
    assert patched([call]) == [call]

    fake = fake_model(lambda _r: tool_call("probe", huge))
    client = LiteLLMClient("hosted_vllm/fake", {"api_base": fake.url}, masker=NO_SECRETS)
    (asked,) = client.complete(MESSAGES, [], 30).tool_calls
    assert (asked.name, asked.raw_arguments) == ("probe", huge)


# -- finish reasons litellm folds into a stop ------------------------------------------------


def test_a_finish_litellm_calls_stop_is_noted_as_the_provider_sent_it(fake_model: Fake) -> None:
    load_litellm()
    helpers = importlib.import_module(patches.FINISH_MODULE)
    original = patches.ORIGINALS[patches.FINISH_MAPPER]
    assert _parameters(original) == ["finish_reason"]
    assert callable(original)
    assert original("MALFORMED_FUNCTION_CALL") == "stop"  # litellm still folds it: needed
    patched = getattr(helpers, patches.FINISH_MAPPER)
    assert getattr(patched, "mm_batch_native", False)
    # The module that reads an OpenAI-compatible reply maps through the patched name.
    reader = importlib.import_module("litellm.llms.openai.chat.gpt_transformation")
    assert getattr(reader, patches.FINISH_MAPPER) is patched
    with patches.folded_finishes() as seen:
        assert patched("MALFORMED_FUNCTION_CALL") == "stop"
        assert patched("end_turn") == "stop"  # a normal end, in Anthropic's word
    assert seen == ["MALFORMED_FUNCTION_CALL"]
    assert patched("ERROR") == "stop"  # outside a completion nothing is noted

    fake = fake_model(lambda _r: Finished(text("cut"), "MALFORMED_FUNCTION_CALL"))
    client = LiteLLMClient("hosted_vllm/fake", {"api_base": fake.url}, masker=NO_SECRETS)
    assert client.complete(MESSAGES, [], 30).finish_reason == "MALFORMED_FUNCTION_CALL"


# -- litellm's success logging, skipped ------------------------------------------------------


def test_the_sub_call_context_is_where_it_was() -> None:
    load_litellm()
    context = importlib.import_module(patches.CONTEXT_MODULE)
    assert _parameters(getattr(context, patches.SUB_CALL)) == ["parent_request_id"]
    assert context.is_internal_call.get() is False
    with patches.unlogged():
        assert context.is_internal_call.get() is True
    assert context.is_internal_call.get() is False


@pytest.fixture
def logged(monkeypatch: pytest.MonkeyPatch) -> threading.Event:
    """A litellm success callback, registered for the test: set when litellm logs a call."""
    seen = threading.Event()

    def callback(*_args: Any) -> None:
        seen.set()

    monkeypatch.setattr(load_litellm(), "success_callback", [callback])
    return seen


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


# -- litellm's own price of each response, skipped -------------------------------------------


def test_litellm_s_price_calculators_are_where_they_were() -> None:
    load_litellm()
    logging_class = importlib.import_module(patches.LOGGING_MODULE).Logging
    for name in patches.PRICERS:
        original = patches.ORIGINALS[f"Logging.{name}"]
        assert _parameters(original)[:3] == ["self", "result", "cache_hit"]
        assert getattr(logging_class, name) is not original


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
