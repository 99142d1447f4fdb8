"""Choosing runs from the command line: `--filter` (repeatable), `--exclude`, and `--exitfirst`
(`-x`), on `run` and `plan` alike."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from mm_batch.testing.fake_openai import first_user_message, text
from tests.helpers import Cli, Fake, check_report, model_args, write

TASKS = """\
agent: agent.yaml
jobs: 1
tasks:
  - {id: status-en, prompt: one, expect: {answer_contains: [ok]}}
  - {id: status-fr, prompt: two, expect: {answer_contains: [ok]}}
  - {id: release-en, prompt: three, expect: {answer_contains: [ok]}}
  - {id: release-fr, prompt: four, expect: {answer_contains: [ok]}}
"""


@pytest.fixture
def tasks(tmp_path: Path) -> Path:
    write(tmp_path, "agent.yaml", "yolo: true\n")
    return write(tmp_path, "tasks.yaml", TASKS)


def planned(cli: Cli, tasks: Path, *options: str) -> list[str]:
    result = cli("plan", tasks, "--model", "hosted_vllm/m", *options)
    assert result.code == 0, result.err
    return [line.split("\t")[0].split("[")[0] for line in result.out.splitlines()]


def test_filters_add_up_instead_of_the_last_one_winning(cli: Cli, tasks: Path) -> None:
    assert planned(cli, tasks, "--filter", "status-en", "--filter", "release-*") == [
        "status-en",
        "release-en",
        "release-fr",
    ]


def test_exclude_leaves_out_what_it_matches_after_the_filters(cli: Cli, tasks: Path) -> None:
    assert planned(cli, tasks, "--exclude", "*-fr") == ["status-en", "release-en"]
    both = ["--exclude", "*-fr", "--exclude", "release-*"]
    assert planned(cli, tasks, "--filter", "*-en", "--filter", "*-fr", *both) == ["status-en"]


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (["--filter", "status-*", "--filter", "nope"], "--filter 'nope' matches no task id"),
        (["--exclude", "nope"], "--exclude 'nope' matches no task id"),
        (["--filter", "status-*", "--exclude", "status-*"], "leave no task to run"),
    ],
)
def test_a_glob_that_matches_nothing_is_a_usage_error(
    cli: Cli, tasks: Path, options: list[str], message: str
) -> None:
    for command in ("plan", "run"):
        result = cli(command, tasks, "--model", "hosted_vllm/m", *options)
        assert result.code == 2, result.err
        assert message in result.err


def test_exitfirst_starts_no_run_after_the_first_failure(
    cli: Cli, fake_model: Fake, tasks: Path, tmp_path: Path
) -> None:
    # The second task fails; with one job, the third and fourth have not started by then.
    answers = {"one": "ok", "two": "no", "three": "ok", "four": "ok"}
    fake = fake_model(lambda request: text(answers[first_user_message(request)]))
    out = tmp_path / "out"
    result = cli("run", tasks, *model_args(fake), "-x", "--out", out)
    assert result.code == 1, result.err
    assert len(fake.requests) == 2  # nothing was asked for the runs not started
    summary = json.loads((out / "summary.json").read_text())
    statuses = {r["task"]: (r["status"], r["reason"]) for r in summary["runs"]}
    assert statuses["status-en"][0] == "passed"
    assert statuses["status-fr"][0] == "failed"
    for task in ("release-en", "release-fr"):
        assert statuses[task] == (
            "error",
            "not started: --exitfirst after status-fr[hosted_vllm/fake]#1 failed",
        )
    # junit.xml agrees with the exit code: a failure, and the runs not started as errors.
    check_report(out / "junit.xml")
    suite = ET.parse(out / "junit.xml").getroot().find("testsuite")
    assert suite is not None
    assert (suite.get("failures"), suite.get("errors"), suite.get("skipped")) == ("1", "2", "0")


def test_without_exitfirst_every_run_starts(
    cli: Cli, fake_model: Fake, tasks: Path, tmp_path: Path
) -> None:
    answers = {"one": "ok", "two": "no", "three": "ok", "four": "ok"}
    fake = fake_model(lambda request: text(answers[first_user_message(request)]))
    result = cli("run", tasks, *model_args(fake), "--out", tmp_path / "out")
    assert result.code == 1, result.err
    assert len(fake.requests) == 4


def test_plan_takes_exitfirst_as_run_does(cli: Cli, tasks: Path) -> None:
    assert len(planned(cli, tasks, "--exitfirst")) == 4
