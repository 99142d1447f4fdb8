"""Tokens and cost, end to end through litellm and the scripted server, and `--max-cost`.

The fake server answers every request with 10 prompt and 5 completion tokens. Under a model
string litellm prices (`openai/gpt-4o-mini`, with `api_base` set to the fake server) each turn
costs what litellm's bundled price map says; under `hosted_vllm/fake` litellm knows no price.
"""

from __future__ import annotations

import json
import operator
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest

from mm_batch.commands import run as run_command
from mm_batch.effects import litellm as litellm_effects
from mm_batch.plan import Overrides
from mm_batch.testing.fake_openai import (
    Script,
    by_prompt,
    first_user_message,
    text,
    tool_call,
)
from tests.helpers import Cli, Fake, check_report, read_calls, turn_usd, write
from tests.helpers import priced_model_args as _model

PRICED = "openai/gpt-4o-mini"
UNPRICED = "hosted_vllm/fake"
PROMPTS = ["Check billing.", "Check search.", "Check mail.", "Check disks."]


def _suite(directory: Path, prompts: list[str] = PROMPTS, jobs: int = 1) -> Path:
    write(
        directory,
        "agent.yaml",
        """
        yolo: true
        tools:
          - name: status
            description: Show the status of a service.
            parameters:
              service: {type: string, description: The service.}
            command: ["echo", "ok {{service}}"]
        """,
    )
    tasks = "".join(f"  - id: t{i}\n    prompt: {p}\n" for i, p in enumerate(prompts, 1))
    return write(directory, "tasks.yaml", f"agent: agent.yaml\njobs: {jobs}\ntasks:\n{tasks}")


def _script() -> Script:
    """The first task asks for a tool, then answers (two turns); every other answers at once."""
    return by_prompt(
        {PROMPTS[0]: [tool_call("status", {"service": "billing"}), text("billing is ok")]},
        default=text("all good"),
    )


def _summary(out: Path) -> dict[str, Any]:
    return dict(json.loads((out / "summary.json").read_text(encoding="utf-8")))


def _turns(out: Path) -> list[dict[str, Any]]:
    return [r for r in read_calls(out) if r["kind"] == "model"]


def test_tokens_and_cost_reach_records_and_every_summary(
    cli: Cli, fake_model: Fake, tmp_path: Path
) -> None:
    tasks = _suite(tmp_path, PROMPTS[:2])
    fake = fake_model(_script())
    out = tmp_path / "out"
    result = cli("run", tasks, *_model(fake), "--out", out)
    assert result.code == 0, result.err
    check_report(out / "junit.xml")
    turn = turn_usd()
    assert turn == pytest.approx(4.5e-6)  # gpt-4o-mini: 0.15 and 0.60 USD per million tokens
    turns = _turns(out)
    assert len(turns) == 3
    for record in turns:
        assert record["cost_usd"] == pytest.approx(turn)
    summary = _summary(out)
    (model,) = summary["models"]
    assert (model["prompt_tokens"], model["completion_tokens"]) == (30, 15)
    assert model["cost_usd"] == pytest.approx(3 * turn)
    runs = {r["task"]: r for r in summary["runs"]}
    assert (runs["t1"]["prompt_tokens"], runs["t1"]["completion_tokens"]) == (20, 10)
    assert runs["t1"]["cost_usd"] == pytest.approx(2 * turn)
    assert (runs["t2"]["prompt_tokens"], runs["t2"]["completion_tokens"]) == (10, 5)
    markdown = (out / "summary.md").read_text(encoding="utf-8")
    header = (
        "| Model | Passes/runs | Failed | Errors | Mean s per task | Tokens in/out | Cost USD |"
    )
    assert header in markdown
    row = next(line for line in markdown.splitlines() if line.startswith(f"| {PRICED} |"))
    assert row.endswith("| 30/15 | 0.0000135 |"), row
    table = result.err.splitlines()
    head = next(i for i, line in enumerate(table) if line.startswith("model "))
    assert table[head].split()[-4:] == ["tokens", "in/out", "cost", "usd"]
    assert table[head + 1].split()[-2:] == ["30/15", "0.0000135"]


def test_litellm_own_price_of_a_response_is_read_not_computed_again(
    cli: Cli, fake_model: Fake, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Per-call CPU: litellm prices each completion as it builds it; mm-batch reads that."""
    litellm = litellm_effects.load_litellm()
    asked: list[object] = []

    def completion_cost(**kwargs: object) -> float:
        asked.append(kwargs)
        return 1.0

    monkeypatch.setattr(litellm, "completion_cost", completion_cost)
    tasks = _suite(tmp_path, PROMPTS[1:2])
    result = cli("run", tasks, *_model(fake_model(_script())), "--out", tmp_path / "out")
    assert result.code == 0, result.err
    assert [r["cost_usd"] for r in _turns(tmp_path / "out")] == [pytest.approx(turn_usd())]
    assert asked == []


def test_the_cost_is_the_price_map_s_for_the_model_asked_and_a_lookup_that_raises_is_unknown(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    litellm = litellm_effects.load_litellm()
    usage = {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}
    reply = litellm.ModelResponse(
        model="omni-moderation-latest",  # what a reply says of itself is not believed
        choices=[{"message": {"role": "assistant", "content": "hi"}}],
        usage=usage,
    )
    reply._hidden_params = {"response_cost": 0.0, "cache_hit": True}
    priced = litellm_effects._reply(reply, 0.1, 1, model=PRICED)
    prompt, completion = litellm.cost_per_token(model=PRICED, prompt_tokens=10, completion_tokens=5)
    assert priced.cost_usd == prompt + completion > 0 and priced.cached is False
    assert litellm_effects._reply(reply, 0.1, 1, model=PRICED, cached=True).cost_usd == 0.0

    def broken(**_: object) -> tuple[float, float]:
        raise RuntimeError("the price map is broken")

    monkeypatch.setattr(litellm, "cost_per_token", broken)
    unknown = litellm_effects._reply(reply, 0.1, 1, model=PRICED)
    assert unknown.text == "hi" and unknown.cost_usd is None


def test_an_unpriced_model_has_a_null_cost_and_still_counts_its_tokens(
    cli: Cli, fake_model: Fake, tmp_path: Path
) -> None:
    tasks = _suite(tmp_path, PROMPTS[:2])
    out = tmp_path / "out"
    result = cli("run", tasks, *_model(fake_model(_script()), UNPRICED), "--out", out)
    assert result.code == 0, result.err
    check_report(out / "junit.xml")
    assert [r["cost_usd"] for r in _turns(out)] == [None, None, None]
    summary = _summary(out)
    (model,) = summary["models"]
    assert (model["prompt_tokens"], model["completion_tokens"], model["cost_usd"]) == (30, 15, None)
    assert all(r["cost_usd"] is None and r["status"] == "passed" for r in summary["runs"])
    assert "| 30/15 | - |" in (out / "summary.md").read_text()


def test_max_cost_starts_no_run_once_the_batch_spent_it(
    cli: Cli, fake_model: Fake, tmp_path: Path
) -> None:
    """The attack: at jobs 1, the first run spends past the limit; no later run reaches the
    model, and each is reported as an error in every report."""
    tasks = _suite(tmp_path)
    fake = fake_model(_script())
    out = tmp_path / "out"
    limit = turn_usd() / 2  # the first turn already spends past it
    result = cli("run", tasks, *_model(fake), "--max-cost", str(limit), "--out", out)
    assert result.code == 3, result.err  # nothing failed; runs could not be judged
    check_report(out / "junit.xml")
    # Only the first run reached the server: its two turns (it had started, so it finished).
    assert [first_user_message(r) for r in fake.requests] == [PROMPTS[0]] * 2
    runs = {r["task"]: r for r in _summary(out)["runs"]}
    assert runs["t1"]["status"] == "passed"
    for task in ("t2", "t3", "t4"):
        assert runs[task]["status"] == "error"
        assert runs[task]["reason"].startswith("cost limit reached: "), runs[task]
        assert (runs[task]["prompt_tokens"], runs[task]["cost_usd"]) == (0, 0.0)
        assert isinstance(runs[task]["cost_usd"], float)
    later = [r for r in read_calls(out) if r["task"] != "t1"]
    assert [r["kind"] for r in later] == ["task"] * 3  # no model turn, no tool call
    cases = {c.get("name"): c for c in ET.parse(out / "junit.xml").getroot().iter("testcase")}
    for task in ("t2", "t3", "t4"):
        error = cases[task].find("error")
        assert error is not None and error.get("message", "").startswith("cost limit reached")
    assert cases["t1"].find("error") is None
    assert "cost limit reached" in (out / "summary.md").read_text()
    assert f"ERROR t2[{PRICED}]#1 - cost limit reached" in result.err


def test_runs_already_started_finish_past_the_limit(
    cli: Cli, fake_model: Fake, tmp_path: Path
) -> None:
    """At jobs 2 both first runs start before either has spent; the third does not start."""
    tasks = _suite(tmp_path, PROMPTS[1:4], jobs=2)
    fake = fake_model(_script(), latency_s=0.5)  # no reply before both runs have started
    out = tmp_path / "out"
    result = cli("run", tasks, *_model(fake), "--max-cost", "0.000001", "--out", out)
    assert result.code == 3, result.err
    statuses = [r["status"] for r in _summary(out)["runs"]]
    assert statuses == ["passed", "passed", "error"]
    assert len(fake.requests) == 2


@pytest.mark.parametrize("value", ["0", "-1", "nan", "inf", "ten"])
def test_a_bad_max_cost_is_a_usage_error(
    cli: Cli, fake_model: Fake, tmp_path: Path, value: str
) -> None:
    tasks = _suite(tmp_path)
    fake = fake_model(_script())
    result = cli("run", tasks, *_model(fake), "--max-cost", value, "--out", tmp_path / "out")
    assert result.code == 2
    assert "--max-cost" in result.err
    assert fake.requests == [] and not (tmp_path / "out").exists()


def test_an_unpriced_model_under_max_cost_is_warned_about_once(
    fake_model: Fake, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Its calls cannot count against the limit: said once at start, and the runs go on."""
    tasks = _suite(tmp_path)
    fake = fake_model(_script())
    options = {"api_base": fake.url, "api_key": "not-a-real-key"}
    overrides = Overrides(models=(UNPRICED, PRICED), model_options=options, max_cost=1.0)
    code = run_command.run(tasks, overrides, tmp_path / "out")
    assert code == 0
    err = capsys.readouterr().err
    warning = f"litellm knows no price for {UNPRICED}: its calls cannot be counted"
    assert err.count(warning) == 1, err
    assert f"no price for {PRICED}" not in err
    assert err.index(warning) < err.index("[1/8]")  # at start, before any run ended


def test_a_merge_of_shards_keeps_tokens_and_cost(
    cli: Cli, fake_model: Fake, tmp_path: Path
) -> None:
    tasks = _suite(tmp_path)
    fake = fake_model(_script())
    shards = []
    for k in (1, 2):
        shard = tmp_path / f"shard{k}"
        result = cli("run", tasks, *_model(fake), "--shard", f"{k}/2", "--out", shard)
        assert result.code == 0, result.err
        shards.append(shard)
    merged = tmp_path / "merged"
    result = cli("merge", *shards, "--out", merged)
    assert result.code == 0, result.err
    check_report(merged / "junit.xml")
    summary = _summary(merged)
    (model,) = summary["models"]
    # Five turns in all: two for the first task, one for each other.
    assert (model["prompt_tokens"], model["completion_tokens"]) == (50, 25)
    assert model["cost_usd"] == pytest.approx(5 * turn_usd())
    parts = [r for shard in shards for r in _summary(shard)["runs"]]
    fields = ("run", "prompt_tokens", "completion_tokens", "cost_usd")
    by_run = operator.itemgetter("run")
    assert sorted(({f: r[f] for f in fields} for r in summary["runs"]), key=by_run) == sorted(
        ({f: r[f] for f in fields} for r in parts), key=by_run
    )
    assert "| 50/25 |" in (merged / "summary.md").read_text()


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("prompt_tokens", -1),
        ("prompt_tokens", 1.5),
        ("completion_tokens", True),
        ("completion_tokens", "10"),
        ("cost_usd", -0.5),
        ("cost_usd", "0.1"),
        ("cost_usd", False),
    ],
)
def test_a_merge_refuses_a_shard_with_hostile_usage(
    cli: Cli, fake_model: Fake, tmp_path: Path, key: str, value: object
) -> None:
    tasks = _suite(tmp_path, PROMPTS[:2])
    fake = fake_model(_script())
    shards = [tmp_path / "shard1", tmp_path / "shard2"]
    for k, shard in enumerate(shards, 1):
        assert cli("run", tasks, *_model(fake), "--shard", f"{k}/2", "--out", shard).code == 0
    path = shards[1] / "summary.json"
    summary = json.loads(path.read_text(encoding="utf-8"))
    summary["runs"][0][key] = value
    path.write_text(json.dumps(summary), encoding="utf-8")
    result = cli("merge", *shards, "--out", tmp_path / "merged")
    assert result.code == 2, result.err
    assert f"{path}: not an mm-batch summary" in result.err
