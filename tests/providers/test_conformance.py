"""Provider conformance (SPEC 6): each provider, through `mm-batch run` and litellm's real code
path, against a local server speaking that provider's own wire format.

For every provider a two-turn tool task passes and its second request carries what that
provider requires of the history; a refused key, a 429 (retried; and one whose wait passes the
deadline) and a 500 each end as SPEC 6 says. The key comes from the environment, as a CI
job gives it, and shows nowhere: calls.jsonl, junit.xml, summary.*, report.html, stdout, stderr.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from mm_batch.commands import effects as composition
from mm_batch.effects import model_calls
from mm_batch.effects.litellm import LiteLLMClient
from mm_batch.testing.http_server import RawReply
from tests.helpers import Cli, CliResult, check_report, read_calls
from tests.providers.matrix import PROVIDERS, WRONG_KEY, Provider
from tests.providers.project import release_project
from tests.providers.wire import Request, Respond, WireServer, failing_first
from tests.providers.wire_openai import redacted

BOTO3 = importlib.util.find_spec("boto3") is not None


def _params(names: Sequence[str]) -> list[Any]:
    needs_boto3 = pytest.mark.skipif(not BOTO3, reason="boto3 is not installed here")
    return [
        pytest.param(PROVIDERS[n], id=n, marks=[needs_boto3] if n == "bedrock" else [])
        for n in names
    ]


EVERY = _params(list(PROVIDERS))
# The failures, once a provider.
ONE_EACH = _params(["openai", "anthropic", "gemini", "azure", "bedrock", "ollama", "vllm"])


@pytest.fixture(autouse=True)
def quick_backoff(monkeypatch: pytest.MonkeyPatch) -> None:
    """The CLI's clients back off 10 ms instead of 1 s, so that a 500 tried three times takes
    no seconds; a wait a 429 asks for (`Retry-After`) is still waited in full."""
    quick = functools.partial(LiteLLMClient, backoff_s=0.01)
    monkeypatch.setattr(composition, "LiteLLMClient", quick)


@dataclass
class Served:
    """A provider's server, and when each request reached it."""

    server: WireServer
    arrived: list[float] = field(default_factory=list)


@pytest.fixture
def serve() -> Iterator[Callable[[Respond], Served]]:
    """Start a provider's server (stopped when the test ends), noting when requests arrive."""
    started: list[WireServer] = []

    def start(respond: Respond) -> Served:
        arrived: list[float] = []

        def timed(request: Request) -> RawReply:
            arrived.append(time.monotonic())
            return respond(request)

        server = WireServer(timed).__enter__()
        started.append(server)
        return Served(server, arrived)

    yield start
    for server in started:
        server.__exit__(None, None, None)


def run(
    cli: Cli,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    provider: Provider,
    server: WireServer,
    timeout_s: int | None = None,
) -> CliResult:
    for name, value in provider.env.items():
        monkeypatch.setenv(name, value)
    options = [a for o in provider.options(server.url) for a in ("--model-option", o)]
    return cli(
        "run",
        release_project(tmp_path, provider.agent_options, timeout_s),
        "--model",
        provider.model,
        *options,
        "--out",
        tmp_path / "out",
    )


def assert_masked(out: Path, result: CliResult, provider: Provider) -> None:
    """No secret of the provider's shows in any file of the results or in what was printed,
    nor either end of the key as a 401 quotes it redacted (OpenAI's `sk-proj-****...abcd`)."""
    quoted = redacted(provider.key)
    shown = [*provider.secrets, quoted[:9], quoted[-5:]]
    written = [p for p in out.rglob("*") if p.is_file()]
    reports = {"calls.jsonl", "junit.xml", "summary.json", "summary.md", "report.html"}
    assert {p.name for p in written} >= reports
    texts = {p.name: p.read_text(errors="replace") for p in written}
    for where, text in {**texts, "stdout": result.out, "stderr": result.err}.items():
        for secret in shown:
            assert secret not in text, f"{where} shows {secret!r}"


def _task(out: Path) -> dict[str, Any]:
    return read_calls(out)[-1]


def _models(out: Path) -> list[dict[str, Any]]:
    return [r for r in read_calls(out) if r["kind"] == "model"]


@pytest.mark.parametrize("provider", EVERY)
def test_a_two_turn_tool_task_passes_and_the_second_request_keeps_the_history(
    cli: Cli,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    serve: Callable[[Respond], Served],
    provider: Provider,
) -> None:
    served = serve(provider.serve(provider.key))
    result = run(cli, tmp_path, monkeypatch, provider, served.server)
    out = tmp_path / "out"
    assert result.code == 0, result.err + json.dumps(read_calls(out))[-2000:]
    for request in served.server.requests:  # where the provider takes it, and how it is keyed
        assert request.path == provider.path
        header, value = provider.auth
        assert (request.header(header) or "").startswith(value), request.headers
    provider.second(served.server.requests[1])
    assert [r["finish_reason"] for r in _models(out)] == ["tool_calls", "stop"]
    assert [r["outcome"] for r in read_calls(out) if r["kind"] == "tool"] == ["ran"]
    check_report(out / "junit.xml")
    assert_masked(out, result, provider)


@pytest.mark.parametrize("provider", ONE_EACH)
def test_a_refused_key_is_an_error_not_retried(
    cli: Cli,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    serve: Callable[[Respond], Served],
    provider: Provider,
) -> None:
    served = serve(provider.serve(WRONG_KEY))
    result = run(cli, tmp_path, monkeypatch, provider, served.server)
    out = tmp_path / "out"
    assert result.code == 3, result.err
    assert len(served.server.requests) == 1
    task = _task(out)
    assert task["status"] == "error", task
    assert task["reason"].startswith("the model refused the request: "), task["reason"]
    assert f"(HTTP {provider.refused})" in task["reason"], task["reason"]
    check_report(out / "junit.xml")
    assert_masked(out, result, provider)


@pytest.mark.parametrize("provider", ONE_EACH)
def test_a_429_is_retried_after_the_wait_it_asks(
    cli: Cli,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    serve: Callable[[Respond], Served],
    provider: Provider,
) -> None:
    limited = provider.error(429, "Rate limit reached: try again in 1s.", {"Retry-After": "1"})
    served = serve(failing_first([limited], provider.serve(provider.key)))
    result = run(cli, tmp_path, monkeypatch, provider, served.server)
    out = tmp_path / "out"
    assert result.code == 0, result.err + json.dumps(read_calls(out))[-2000:]
    assert len(served.server.requests) == 3
    assert served.arrived[1] - served.arrived[0] >= 1.0  # the second try waited what was asked
    assert [r["attempts"] for r in _models(out)] == [2, 1]
    check_report(out / "junit.xml")
    assert_masked(out, result, provider)


@pytest.mark.parametrize("provider", ONE_EACH)
def test_a_429_whose_wait_passes_the_deadline_fails_the_run_naming_it(
    cli: Cli,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    serve: Callable[[Respond], Served],
    provider: Provider,
) -> None:
    limited = provider.error(429, "Quota exceeded for this model.", {"Retry-After": "120"})
    served = serve(failing_first([limited], provider.serve(provider.key)))
    result = run(cli, tmp_path, monkeypatch, provider, served.server, timeout_s=30)
    out = tmp_path / "out"
    assert result.code == 1, result.err
    assert len(served.server.requests) == 1
    task = _task(out)
    assert task["status"] == "failed"
    assert (
        task["reason"] == "rate limited (429, Retry-After 120 s): the task's deadline comes first"
    )
    (model,) = _models(out)
    assert model["attempts"] == 1 and model["finish_reason"] is None and model["cost_usd"] == 0
    check_report(out / "junit.xml")
    assert_masked(out, result, provider)


@pytest.mark.parametrize("provider", ONE_EACH)
def test_a_500_is_tried_three_times_then_an_error(
    cli: Cli,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    serve: Callable[[Respond], Served],
    provider: Provider,
) -> None:
    broken = provider.error(500, "The server had an error while processing your request.", {})
    served = serve(failing_first([broken] * 3, provider.serve(provider.key)))
    result = run(cli, tmp_path, monkeypatch, provider, served.server)
    out = tmp_path / "out"
    assert result.code == 3, result.err
    assert len(served.server.requests) == 3
    task = _task(out)
    assert task["status"] == "error", task
    assert task["reason"].startswith("the model could not be reached after 3 tries: ")
    # litellm calls Bedrock's 500 a ServiceUnavailableError (503): a 5xx all the same.
    assert "(HTTP 50" in task["reason"], task["reason"]
    assert "***" not in task["reason"]  # no key quoted: nothing of the provider's words masked
    check_report(out / "junit.xml")
    assert_masked(out, result, provider)


@pytest.mark.parametrize("provider", _params(["anthropic-thinking", "bedrock", "gemini-fields"]))
def test_the_servers_refuse_a_history_that_lost_the_provider_s_parts(
    cli: Cli,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    serve: Callable[[Respond], Served],
    provider: Provider,
) -> None:
    """The fakes hold mm-batch to the rule: a client that kept no provider part (as mm-batch
    did before SPEC 6 said so) gets the provider's own 400 on the second turn."""
    monkeypatch.setattr(model_calls, "MESSAGE_PARTS", ())
    monkeypatch.setattr(model_calls, "CALL_PARTS", ())
    served = serve(provider.serve(provider.key))
    result = run(cli, tmp_path, monkeypatch, provider, served.server)
    out = tmp_path / "out"
    assert result.code == 3, result.err
    assert len(served.server.requests) == 2  # the second turn was refused, and not retried
    reason = _task(out)["reason"]
    assert reason.startswith("the model refused the request: BadRequestError (HTTP 400)"), reason
    assert "thinking" in reason or "thought_signature" in reason, reason
