"""A provider litellm cannot use is a usage error before anything runs (SPEC 6, 8)."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mm_batch.config.secrets import Masker
from mm_batch.effects.litellm import LiteLLMClient, load_litellm
from mm_batch.effects.model_calls import Retries
from mm_batch.effects.providers import SDKS, known_providers, provider_problem
from mm_batch.run.ports import ModelError
from tests.helpers import Cli, write

VERTEX = "vertex_ai/gemini-2.5-pro"
UNKNOWN = "nosuchprovider/model-x"
google_auth_missing = pytest.mark.skipif(
    provider_problem(VERTEX, {}) is None, reason="google-auth is installed here"
)


def project(tmp_path: Path, model: str) -> Path:
    write(tmp_path, "agent.yaml", "yolo: true\ntools: []\n")
    return write(
        tmp_path,
        "tasks.yaml",
        f"agent: agent.yaml\nmodels: [{model}]\ntasks:\n  - {{id: t, prompt: hi}}\n",
    )


@pytest.mark.parametrize(
    ("model", "said"),
    [
        pytest.param(
            VERTEX,
            f"model '{VERTEX}': litellm needs the package google-cloud-aiplatform for vertex_ai/ "
            "models, and it is not installed on this machine (pip install google-cloud-aiplatform)",
            marks=google_auth_missing,
        ),
        (UNKNOWN, f"model '{UNKNOWN}': litellm "),
    ],
)
@pytest.mark.parametrize("command", ["run", "plan", "validate"])
def test_an_unusable_provider_is_a_usage_error_in_every_command(
    cli: Cli, tmp_path: Path, command: str, model: str, said: str
) -> None:
    out = tmp_path / "out"
    tasks = project(tmp_path, model)
    args = ("run", tasks, "--out", out) if command == "run" else (command, tasks)
    result = cli(*args)
    assert result.code == 2, result.err  # refused before any call: nothing to retry
    assert said in result.err and "nothing ran" in result.err
    assert not out.exists()


@google_auth_missing
def test_a_missing_sdk_met_at_run_time_is_not_retried_as_a_network_failure() -> None:
    """Past the start check (a table that missed a provider), litellm's ImportError still ends
    the turn at once, named, instead of three tries as if the network were down."""
    slept: list[float] = []
    client = LiteLLMClient(VERTEX, {}, masker=Masker([]))
    client.retries = Retries(3, 0.01, slept.append)
    with pytest.raises(ModelError) as caught:
        client.complete([{"role": "user", "content": "hi"}], [], 30)
    assert str(caught.value).startswith("the model's provider cannot be used here: ")
    assert "Google Cloud SDK not found" in str(caught.value)
    assert slept == []


def test_every_provider_in_the_sdk_table_is_one_litellm_knows() -> None:
    known = known_providers()
    assert known is not None and set(SDKS) <= known
    assert {"openai", "anthropic", "bedrock", "gemini", "azure", "hosted_vllm"} <= known


_prefix = st.one_of(
    st.sampled_from(sorted(known_providers() or ())),
    st.from_regex(r"[a-z][a-z0-9_\-]{0,14}", fullmatch=True),
    st.sampled_from(["mistralai", "meta-llama", "google", "openrouter", "together_ai", "ft:gpt"]),
)
_name = st.from_regex(r"[A-Za-z0-9][A-Za-z0-9.\-_:/]{0,20}", fullmatch=True)


@settings(max_examples=200, deadline=None)
@given(prefix=_prefix, name=_name)
def test_nothing_litellm_would_use_is_refused(prefix: str, name: str) -> None:
    """The start check refuses a provider as unknown only where litellm's own lookup refuses
    it too: it reads litellm's files instead of importing it, and must never block a model."""
    model = f"{prefix}/{name}"
    problem = provider_problem(model, {})
    if problem is None or "knows no provider" not in problem:
        return
    litellm = load_litellm()
    with pytest.raises(Exception, match="LLM Provider NOT provided"):
        litellm.get_llm_provider(model)
