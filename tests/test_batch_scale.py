"""CI scale: shards, merge, 429 storms, a provider that goes down, GitHub Actions output."""

from __future__ import annotations

import io
import json
import threading
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from junitparser import JUnitXml

from mm_batch.config.model import AgentConfig, TasksFile, TaskSpec
from mm_batch.effects.model_calls import SHARED_BACKOFF
from mm_batch.plan import Overrides, make_plan
from mm_batch.report.terminal import Progress, escape_data, github_annotations
from mm_batch.run.records import RunResult
from mm_batch.testing.fake_openai import (
    HttpFailure,
    by_prompt,
    text,
    tool_call,
)
from tests.helpers import (
    GOOD,
    RELEASE_EN,
    STATUS_EN,
    Cli,
    Fake,
    check_report,
    model_args,
    read_calls,
)

AGENT = AgentConfig(path=Path("/nowhere/agent.yaml"), sha256="", tools=())


@settings(max_examples=200, deadline=None)
@given(
    tasks=st.integers(1, 12),
    models=st.integers(1, 3),
    repeat=st.integers(1, 4),
    shards=st.integers(1, 40),
)
def test_shards_cover_every_run_exactly_once(
    tasks: int, models: int, repeat: int, shards: int
) -> None:
    tasks_file = TasksFile(
        Path("/nowhere/tasks.yaml"), "", tuple(TaskSpec(f"t{i}", "p", AGENT) for i in range(tasks))
    )
    base = Overrides(models=tuple(f"m/{i}" for i in range(models)), repeat=repeat)
    everything = [r.run_id for r in make_plan(tasks_file, base).runs]
    parts = [
        [
            r.run_id
            for r in make_plan(
                tasks_file, Overrides(models=base.models, repeat=repeat, shard=(k, shards))
            ).runs
        ]
        for k in range(1, shards + 1)
    ]
    merged = [run for part in parts for run in part]
    assert sorted(merged) == sorted(everything)
    assert len(set(merged)) == len(merged)
    assert max(map(len, parts)) - min(map(len, parts)) <= 1  # balanced


def _cases(folder: Path) -> set[tuple[str, str, str]]:
    xml = JUnitXml.fromfile(str(folder / "junit.xml"))
    return {
        (c.classname, c.name, type(c.result[0]).__name__ if c.result else "passed")
        for s in xml
        for c in s
    }


def test_merge_of_shards_equals_one_unsharded_run(
    cli: Cli, fake_model: Fake, release_example: Path, tmp_path: Path
) -> None:
    replies = dict(GOOD)
    replies[STATUS_EN] = [GOOD[STATUS_EN][1]]  # answers without running anything: fails
    fake = fake_model(by_prompt(replies))
    tasks = release_example / "tasks.yaml"
    args = (*model_args(fake), "--model", "hosted_vllm/second", "--repeat", "2")
    whole = cli("run", tasks, *args, "--out", tmp_path / "whole")
    shards = []
    for k in (1, 2, 3):
        out = tmp_path / f"shard{k}"
        cli("run", tasks, *args, "--shard", f"{k}/3", "--out", out)
        shards.append(out)
    merged = cli("merge", *shards, "--out", tmp_path / "merged")
    assert merged.code == 0, merged.err
    assert f"as one run it would exit {whole.code}" in merged.err
    assert _cases(tmp_path / "merged") == _cases(tmp_path / "whole")
    assert len(_cases(tmp_path / "whole")) == 24
    summary = {
        k: json.loads((tmp_path / k / "summary.json").read_text()) for k in ("whole", "merged")
    }

    def verdicts(data: dict[str, Any]) -> list[tuple[Any, ...]]:
        return sorted(
            (t["task"], t["model"], t["runs"], t["passed"], t["status"]) for t in data["tasks"]
        )

    assert verdicts(summary["merged"]) == verdicts(summary["whole"])
    assert summary["merged"]["exit_code"] == summary["whole"]["exit_code"] == 1
    assert summary["merged"]["plan"] == summary["whole"]["plan"]
    assert summary["whole"]["plan"] == {"shard": None, "whole_runs": 24}
    # A shard whose results never arrived (its CI job died) is named; nothing is merged.
    partial = cli("merge", shards[0], shards[2], "--out", tmp_path / "bad")
    assert partial.code == 2
    assert "shard 2/3 missing: its runs would be absent from the merged report" in partial.err
    other = tmp_path / "other-plan"
    cli("run", tasks, *args, "--repeat", "1", "--shard", "2/3", "--out", other)
    mixed = cli("merge", shards[0], other, shards[2], "--out", tmp_path / "bad")
    assert mixed.code == 2
    assert "the 3 shards hold 20 runs but were cut from plans of 12, 24" in mixed.err
    runs = {k: sorted({r["run"] for r in read_calls(tmp_path / k)}) for k in ("whole", "merged")}
    assert runs["merged"] == runs["whole"]
    # Overlapping shards, or a folder that holds no results, are refused.
    again = cli("merge", shards[0], shards[0], "--out", tmp_path / "bad")
    assert again.code == 2 and "shards must not overlap" in again.err
    assert cli("merge", release_example, "--out", tmp_path / "bad").code == 2
    # A torn record (a shard killed mid-write) is named by file and line, never copied on.
    calls = shards[1] / "calls.jsonl"
    lines = calls.read_text().count("\n")
    with calls.open("a") as handle:
        handle.write('{"ts": "2026-')
    torn = cli("merge", *shards, "--out", tmp_path / "bad")
    assert torn.code == 2
    assert f"{calls}:{lines + 1}: not a JSON record" in torn.err
    assert torn.err.rstrip().endswith("nothing merged")
    assert not (tmp_path / "bad").exists()


def test_an_empty_shard_passes_with_empty_reports_and_merges(
    cli: Cli, fake_model: Fake, release_example: Path, tmp_path: Path
) -> None:
    fake = fake_model(by_prompt(GOOD))
    tasks = release_example / "tasks.yaml"
    empty = cli("run", tasks, *model_args(fake), "--shard", "7/7", "--out", tmp_path / "empty")
    assert empty.code == 0, empty.err
    assert _cases(tmp_path / "empty") == set()
    check_report(tmp_path / "empty" / "junit.xml")
    assert fake.requests == []
    rest = [tmp_path / f"shard{k}" for k in range(1, 7)]
    for k, out in enumerate(rest, 1):
        cli("run", tasks, *model_args(fake), "--shard", f"{k}/7", "--out", out)
    merged = cli("merge", tmp_path / "empty", *rest, "--out", tmp_path / "merged")
    assert merged.code == 0, merged.err
    twice = cli("merge", tmp_path / "empty", tmp_path / "empty", *rest, "--out", tmp_path / "x")
    assert twice.code == 2
    assert f"shard 7/7 is in both {tmp_path / 'empty'} and {tmp_path / 'empty'}" in twice.err
    assert len(_cases(tmp_path / "merged")) == 6


def test_a_429_storm_is_ridden_out_with_shared_backoff(
    cli: Cli, fake_model: Fake, release_example: Path, tmp_path: Path
) -> None:
    storm = {"left": 4}
    lock = threading.Lock()
    good = by_prompt(GOOD)

    def stormy(request: dict[str, Any]) -> Any:
        with lock:
            if storm["left"] > 0:
                storm["left"] -= 1
                return HttpFailure(429, "slow down")
        return good(request)

    fake = fake_model(stormy)
    out = tmp_path / "out"
    result = cli(
        "run", release_example / "tasks.yaml", *model_args(fake), "--jobs", "4", "--out", out
    )
    assert result.code == 0, result.err
    tasks = [r for r in read_calls(out) if r["kind"] == "task"]
    assert len(tasks) == 6 and {t["status"] for t in tasks} == {"passed"}


def test_one_429_pauses_every_run_of_that_model(
    cli: Cli,
    fake_model: Fake,
    release_example: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The first request is answered 429 once the first requests of the three other runs (jobs
    4) have come too, and those once the 429 has paused the model: every later request was sent
    after the pause began, so none may arrive while it lasts, as the model's own pause says
    (`SHARED_BACKOFF.pending`), not a stopwatch."""
    paused = threading.Event()
    keys: list[str] = []  # the model's key, as the 429's run paused it
    pause = SHARED_BACKOFF.pause

    def noted(key: str, seconds: float, asked: str = "") -> None:
        pause(key, seconds, asked)
        keys.append(key)
        paused.set()

    monkeypatch.setattr(SHARED_BACKOFF, "pause", noted)
    four_asked = threading.Event()
    during_pause: list[int] = []  # each request that came while the model was paused
    lock = threading.Lock()
    good = by_prompt(GOOD)
    answered = 0

    def once(request: dict[str, Any]) -> Any:
        nonlocal answered
        with lock:
            answered += 1
            n = answered
            if keys and SHARED_BACKOFF.pending(keys[0])[0] > 0:
                during_pause.append(n)
            if n == 4:
                four_asked.set()
        if n == 1:
            four_asked.wait(120)
            return HttpFailure(429, "slow down")
        if n <= 4:  # on their way when the 429 came
            paused.wait(120)
        return good(request)

    fake = fake_model(once)
    out = tmp_path / "out"
    args = ("--repeat", "2", "--jobs", "4", "--out", out)
    result = cli("run", release_example / "tasks.yaml", *model_args(fake), *args)
    assert result.code == 0, result.err
    assert four_asked.is_set() and paused.is_set()
    assert answered == 1 + 12 * 2  # the refused call was made again; nothing else was
    assert during_pause == []


def test_a_provider_that_goes_down_mid_batch_loses_nothing(
    cli: Cli, fake_model: Fake, release_example: Path, tmp_path: Path
) -> None:
    served = {"n": 0}
    lock = threading.Lock()
    good = by_prompt(GOOD)

    def dying(request: dict[str, Any]) -> Any:
        with lock:
            served["n"] += 1
            if served["n"] > 4:
                return HttpFailure(503, "gone")
        return good(request)

    fake = fake_model(dying)
    out = tmp_path / "out"
    result = cli(
        "run", release_example / "tasks.yaml", *model_args(fake), "--jobs", "1", "--out", out
    )
    assert result.code == 3
    tasks = {r["task"]: r for r in read_calls(out) if r["kind"] == "task"}
    assert len(tasks) == 6
    assert [t["status"] for t in tasks.values()].count("passed") == 2
    for task in tasks.values():
        if task["status"] == "error":
            assert task["reason"].startswith("the model could not be reached after 3 tries")
    cases = _cases(out)
    assert sum(kind == "Error" for *_, kind in cases) == 4


def test_github_actions_annotations_and_step_summary(
    cli: Cli,
    fake_model: Fake,
    release_example: Path,
    tmp_path: Path,
    monkeypatch: Any,
) -> None:
    summary = tmp_path / "step-summary.md"
    monkeypatch.setenv("GITHUB_ACTIONS", "true")
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    hostile = "1.4.2\n::set-output name=x::owned\r\n::add-mask::%0A"
    replies = {
        RELEASE_EN: [
            tool_call("release", {"version": hostile, "channel": "stable"}),
            text("refused"),
        ]
    }
    fake = fake_model(by_prompt(replies))
    result = cli(
        "run",
        release_example / "tasks.yaml",
        *model_args(fake),
        "--filter",
        "release-en",
        "--out",
        tmp_path / "out",
    )
    assert result.code == 1
    lines = result.out.splitlines()
    assert len(lines) == 1 and lines[0].startswith("::error file=")
    assert ",title=release-en [hosted_vllm/fake]::" in lines[0]
    assert "version=1.4.2%0A::set-output name=x::owned%0D%0A::add-mask::%250A" in lines[0]
    assert "\r" not in result.out
    title = summary.read_text().splitlines()[0]  # the tasks file, as the annotations name it
    assert title.startswith("## mm-batch: ") and title.endswith("tasks\\.yaml")
    # The answer reached the report, not the workflow: every line of stderr is ours.
    assert all(not line.startswith("::") for line in result.err.splitlines())
    # A step summary that cannot be written is said in one line; verdict and reports stand.
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(tmp_path / "missing" / "summary.md"))
    again = cli(
        "run",
        release_example / "tasks.yaml",
        *model_args(fake),
        "--filter",
        "release-en",
        "--out",
        tmp_path / "again",
    )
    assert again.code == 1
    assert "summary.md not appended to GITHUB_STEP_SUMMARY" in again.err
    assert "Traceback" not in again.err
    assert (tmp_path / "again" / "junit.xml").is_file()


def test_workflow_command_escaping() -> None:
    assert escape_data("a%b\r\nc") == "a%25b%0D%0Ac"
    result = RunResult(
        "t[m/x,y]#1", "t", "m", 1, "failed", "bad\n::stop-commands::x", (), 1.0, None, ()
    )
    (line,) = github_annotations([result], "tasks.yaml", 1.0, "out")
    assert line == "::error file=tasks.yaml,title=t [m]::bad%0A::stop-commands::x"


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_is_one_live_line_on_a_terminal() -> None:
    stream = _Terminal()
    progress = Progress(2, stream)
    for status in ("passed", "failed"):
        progress(RunResult("r", "t", "m", 1, status, "why\nnot", (), 1.0, None, ()))
    text = stream.getvalue()
    assert text.count("\n") == 1 and text.endswith("\n")
    assert "2/2 done, 1 passed, 1 failed, 0 errors" in text.split("\r")[-1]
    plain = io.StringIO()
    Progress(1, plain)(RunResult("r", "t", "m", 1, "failed", "why\nnot", (), 1.0, None, ()))
    assert plain.getvalue() == "[1/1] failed r (1.0 s): why not\n"
