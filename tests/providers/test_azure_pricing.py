"""An Azure deployment is priced as its `model_options.base_model` (SPEC 6), so that
`--max-cost` caps Azure spend; litellm's real Azure client talks to the fake server."""

from __future__ import annotations

import math
from pathlib import Path

from mm_batch.effects.litellm import load_litellm
from mm_batch.testing.fake_openai import FakeOpenAI, by_prompt, text
from tests.helpers import Cli, CliResult, Fake, check_report, read_calls, write

KEY = "azure-key-8c3f1d2e9b"
DEPLOYMENT = "azure/acme-prod-chat"  # a name litellm has no price for


def project(tmp_path: Path, options: str) -> Path:
    write(tmp_path, "agent.yaml", f"yolo: true\nmodel_options: {options}\ntools: []\n")
    return write(
        tmp_path,
        "tasks.yaml",
        "agent: agent.yaml\ntasks:\n  - {id: a, prompt: one}\n  - {id: b, prompt: two}\n",
    )


def run(cli: Cli, tmp_path: Path, fake: FakeOpenAI, options: str, *more: str) -> CliResult:
    return cli(
        "run",
        project(tmp_path, options),
        "--model",
        DEPLOYMENT,
        "--model-option",
        f"api_base={fake.url.removesuffix('/v1')}",
        "--model-option",
        f"api_key={KEY}",
        "--model-option",
        "api_version=2024-10-21",
        "--jobs",
        "1",
        "--out",
        tmp_path / "out",
        *more,
    )


def test_a_deployment_is_priced_as_its_base_model(
    cli: Cli, fake_model: Fake, tmp_path: Path
) -> None:
    fake = fake_model(by_prompt({}, default=text("done")))
    result = run(cli, tmp_path, fake, "{base_model: azure/gpt-4o}", "--max-cost", "100")
    assert result.code == 0, result.err
    assert "knows no price" not in result.err
    prompt, completion = load_litellm().cost_per_token(
        model="azure/gpt-4o", prompt_tokens=10, completion_tokens=5
    )
    costs = [r["cost_usd"] for r in read_calls(tmp_path / "out") if r["kind"] == "model"]
    assert len(costs) == 2 and all(math.isclose(c, prompt + completion) for c in costs)
    assert all(c > 0 for c in costs)
    check_report(tmp_path / "out" / "junit.xml")


def test_max_cost_stops_an_azure_batch(cli: Cli, fake_model: Fake, tmp_path: Path) -> None:
    fake = fake_model(by_prompt({}, default=text("done")))
    result = run(cli, tmp_path, fake, "{base_model: azure/gpt-4o}", "--max-cost", "0.00000001")
    assert len(fake.requests) == 1  # the first run spent past the limit: the second never ran
    second = read_calls(tmp_path / "out")[-1]
    assert second["status"] == "error" and "cost" in second["reason"], second
    assert result.code == 3


def test_without_base_model_the_deployment_is_unpriced_and_said_so(
    cli: Cli, fake_model: Fake, tmp_path: Path
) -> None:
    fake = fake_model(by_prompt({}, default=text("done")))
    result = run(cli, tmp_path, fake, "{}", "--max-cost", "100")
    assert result.code == 0, result.err
    assert f"litellm knows no price for {DEPLOYMENT}" in result.err
    costs = [r["cost_usd"] for r in read_calls(tmp_path / "out") if r["kind"] == "model"]
    assert costs == [None, None]
    assert KEY not in result.err
