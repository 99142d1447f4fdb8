"""mm-batch's own model options are typed once at plan time, and never reach litellm."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mm_batch.config.load import load_tasks
from mm_batch.plan import Overrides, make_plan
from mm_batch.testing.fake_openai import by_prompt, text
from tests.helpers import Cli, Fake, model_args, write


def tasks(tmp_path: Path, options: str = "{}") -> Path:
    write(tmp_path, "agent.yaml", f"model_options: {options}\ntools: []\n")
    return write(tmp_path, "tasks.yaml", "agent: agent.yaml\ntasks:\n  - {id: t, prompt: hi}\n")


def test_own_options_are_typed_and_taken_out_of_what_litellm_gets(tmp_path: Path) -> None:
    path = tasks(tmp_path, "{max_parallel: 2, recover_text_tool_calls: true, timeout: 7, top_p: 1}")
    plan = make_plan(load_tasks(path), Overrides(models=("hosted_vllm/x",)))
    (run,) = plan.runs
    assert (run.settings.max_parallel, run.settings.recover_text_tool_calls) == (2, True)
    assert run.settings.timeout == 7.0
    assert dict(run.model_options) == {"top_p": 1}
    assert plan.parallel_limits == {"hosted_vllm/x": 2}


def test_local_models_rescue_text_calls_by_default(tmp_path: Path) -> None:
    plan = make_plan(load_tasks(tasks(tmp_path)), Overrides(models=("local/qwen2.5-coder-0.5b",)))
    assert plan.runs[0].settings.recover_text_tool_calls is True
    other = make_plan(load_tasks(tasks(tmp_path)), Overrides(models=("hosted_vllm/x",)))
    assert other.runs[0].settings.recover_text_tool_calls is False


@pytest.mark.parametrize(
    ("option", "message"),
    [
        (
            "max_parallel=abc",
            "model option max_parallel must be a whole number from 1 to 1024, got 'abc'",
        ),
        (
            "max_parallel=0",
            "model option max_parallel must be a whole number from 1 to 1024, got 0",
        ),
        ("recover_text_tool_calls=yes", "recover_text_tool_calls must be true or false, got 'yes'"),
        (
            "timeout=-1",
            "model option timeout must be a number of seconds > 0 and at most 604800, got -1",
        ),
    ],
)
def test_a_bad_own_option_on_the_command_line_is_a_usage_error(
    cli: Cli,
    fake_model: Fake,
    tmp_path: Path,
    option: str,
    message: str,
) -> None:
    fake = fake_model(by_prompt({"hi": [text("hello")]}))
    out = tmp_path / "out"
    result = cli("run", tasks(tmp_path), *model_args(fake), "--model-option", option, "--out", out)
    assert result.code == 2
    assert message in result.err and "nothing ran" in result.err
    assert fake.requests == [] and not out.exists()


def test_mm_batch_s_own_options_never_reach_a_hosted_provider(
    cli: Cli, fake_model: Fake, tmp_path: Path
) -> None:
    """`call_grammar` is for mm-batch's own local server: a hosted model is never sent it."""
    fake = fake_model(by_prompt({"hi": [text("hello")]}))
    out = tmp_path / "out"
    options = ["--model-option", "call_grammar=true", "--model-option", "max_parallel=2"]
    result = cli("run", tasks(tmp_path), *model_args(fake), *options, "--out", out)
    assert result.code == 0, result.err
    assert fake.requests and all(
        "call_grammar" not in json.dumps(r) and "max_parallel" not in json.dumps(r)
        for r in fake.requests
    )
