"""`mm-batch run --rerun-failed DIR`: what did not pass runs again; the rest is kept as it was."""

from __future__ import annotations

import json
import signal
import threading
from pathlib import Path
from typing import Any

from mm_batch.testing.fake_openai import (
    HttpFailure,
    text,
    tool_call,
    turn,
)
from tests.commands.reruns import TASKS, refusing_script, write_project
from tests.helpers import (
    OK_AGENT,
    Cli,
    Fake,
    case_verdicts,
    check_report,
    model_args,
    prompts_asked,
    read_calls,
    run_until_marker,
)


def test_a_rerun_asks_again_only_for_the_runs_that_failed_and_keeps_the_others_as_they_were(
    cli: Cli, fake_model: Fake, tmp_path: Path
) -> None:
    tasks = write_project(tmp_path)
    out = tmp_path / "results"
    first = cli("run", tasks, *model_args(fake_model(refusing_script({"Do beta."}))), "--out", out)
    assert first.code == 1, first.err
    assert case_verdicts(out) == {"alpha": "passed", "beta": "failure", "gamma": "passed"}
    before = {r["run"]: r for r in read_calls(out) if r["kind"] == "task"}
    started = json.loads((out / "summary.json").read_text())["provenance"]["started_at"]
    fake = fake_model(refusing_script(set()))
    # Into the same folder: the common case, and the one where DIR is replaced as it is read.
    again = cli("run", tasks, *model_args(fake), "--rerun-failed", out, "--out", out)
    assert again.code == 0, again.err
    assert prompts_asked(fake) == ["Do beta."]  # nothing else reached the model
    check_report(out / "junit.xml")
    assert case_verdicts(out) == {"alpha": "passed", "beta": "passed", "gamma": "passed"}
    tasks_records = {r["run"]: r for r in read_calls(out) if r["kind"] == "task"}
    beta = "beta[hosted_vllm/fake]#1"
    for run in ("alpha[hosted_vllm/fake]#1", "gamma[hosted_vllm/fake]#1"):
        assert tasks_records[run] == before[run]  # the very record, time stamp and all
        assert tasks_records[run]["rerun"] is False
    assert tasks_records[beta]["rerun"] is True and tasks_records[beta]["status"] == "passed"
    assert tasks_records[beta]["ts"] > before[beta]["ts"]
    summary = json.loads((out / "summary.json").read_text())
    assert [(r["task"], r["status"], r["rerun"]) for r in summary["runs"]] == [
        ("alpha", "passed", False),
        ("beta", "passed", True),
        ("gamma", "passed", False),
    ]
    assert [r["index"] for r in summary["runs"]] == [0, 1, 2]
    assert summary["exit_code"] == 0
    assert summary["models"][0]["passed"] == 3
    assert summary["provenance"]["rerun_of"] == started
    page = (out / "report.html").read_text()
    assert "<code>beta[hosted_vllm/fake]#1</code> (rerun)" in page
    assert "<code>alpha[hosted_vllm/fake]#1</code> (rerun)" not in page


def test_a_rerun_that_fails_again_stays_failed_and_exits_1(
    cli: Cli, fake_model: Fake, tmp_path: Path
) -> None:
    tasks = write_project(tmp_path)
    base, out = tmp_path / "base", tmp_path / "out"
    cli(
        "run",
        tasks,
        *model_args(fake_model(refusing_script({"Do beta.", "Do gamma."}))),
        "--out",
        base,
    )
    fake = fake_model(refusing_script({"Do gamma."}))
    again = cli("run", tasks, *model_args(fake), "--rerun-failed", base, "--out", out)
    assert again.code == 1, again.err
    assert prompts_asked(fake) == ["Do beta.", "Do gamma."]
    check_report(out / "junit.xml")
    assert case_verdicts(out) == {"alpha": "passed", "beta": "passed", "gamma": "failure"}
    assert case_verdicts(base) == {
        "alpha": "passed",
        "beta": "failure",
        "gamma": "failure",
    }  # untouched


def test_with_repeats_only_the_failing_repeat_runs_again_and_the_pass_rate_is_the_whole_s(
    cli: Cli, fake_model: Fake, tmp_path: Path
) -> None:
    tasks = write_project(
        tmp_path,
        TASKS.replace("jobs: 1", "jobs: 1\nrepeat: 3\nmin_pass_rate: 0.6").split("  - id: beta")[0],
    )
    lock, seen = threading.Lock(), [0]

    def second_refuses(request: dict[str, Any]) -> Any:
        if turn(request) > 0:
            return text("Done.")
        with lock:
            seen[0] += 1
            return text("No.") if seen[0] == 2 else tool_call("ok", {})

    base, out = tmp_path / "base", tmp_path / "out"
    first = cli("run", tasks, *model_args(fake_model(second_refuses)), "--out", base)
    assert first.code == 0, first.err  # 2 of 3 >= 0.6: a tolerated, flaky failure
    assert case_verdicts(base) == {
        "alpha#1": "passed",
        "alpha#2": "flakyFailure",
        "alpha#3": "passed",
    }
    fake = fake_model(refusing_script(set()))
    again = cli("run", tasks, *model_args(fake), "--rerun-failed", base, "--out", out)
    assert again.code == 0, again.err
    assert len(prompts_asked(fake)) == 1
    check_report(out / "junit.xml")
    assert case_verdicts(out) == {"alpha#1": "passed", "alpha#2": "passed", "alpha#3": "passed"}
    summary = json.loads((out / "summary.json").read_text())
    assert [r["rerun"] for r in summary["runs"]] == [False, True, False]
    # Another number of repeats names other runs: refused, not guessed.
    other = cli("run", tasks, *model_args(fake), "--repeat", "2", "--rerun-failed", base)
    assert other.code == 2
    assert "was run with 3 repeat(s), this plan has 2" in other.err


def test_nothing_to_rerun_asks_nothing_and_keeps_every_run(
    cli: Cli, fake_model: Fake, tmp_path: Path
) -> None:
    tasks = write_project(tmp_path)
    base, out = tmp_path / "base", tmp_path / "out"
    cli("run", tasks, *model_args(fake_model(refusing_script(set()))), "--out", base)
    fake = fake_model(refusing_script(set()))
    again = cli("run", tasks, *model_args(fake), "--rerun-failed", base, "--out", out)
    assert again.code == 0, again.err
    assert "nothing to rerun" in again.err
    assert fake.requests == []
    check_report(out / "junit.xml")
    assert case_verdicts(out) == case_verdicts(base)
    assert read_calls(out) == read_calls(base)


def test_a_filter_reruns_part_of_the_failures_and_keeps_the_others_failing(
    cli: Cli, fake_model: Fake, tmp_path: Path
) -> None:
    tasks = write_project(tmp_path)
    base, out = tmp_path / "base", tmp_path / "out"
    cli(
        "run",
        tasks,
        *model_args(fake_model(refusing_script({"Do alpha.", "Do gamma."}))),
        "--out",
        base,
    )
    fake = fake_model(refusing_script(set()))
    again = cli(
        "run", tasks, *model_args(fake), "--filter", "gam*", "--rerun-failed", base, "--out", out
    )
    assert again.code == 1, again.err
    assert "1 run(s) that did not pass" in again.err and "kept as they were" in again.err
    assert prompts_asked(fake) == ["Do gamma."]
    check_report(out / "junit.xml")
    assert case_verdicts(out) == {"alpha": "failure", "beta": "passed", "gamma": "passed"}


def test_a_damaged_or_foreign_folder_is_refused_before_anything_runs_or_is_replaced(
    cli: Cli, fake_model: Fake, tmp_path: Path
) -> None:
    tasks = write_project(tmp_path)
    base = tmp_path / "base"
    cli("run", tasks, *model_args(fake_model(refusing_script({"Do beta."}))), "--out", base)
    fake = fake_model(refusing_script(set()))
    # A junit.xml that disagrees with summary.json: the folder was tampered with.
    junit = (base / "junit.xml").read_text()
    (base / "junit.xml").write_text(
        junit.replace("<failure", "<skipped").replace("</failure>", "</skipped>")
    )
    before = {p.name: p.read_bytes() for p in base.iterdir()}
    bad = cli("run", tasks, *model_args(fake), "--rerun-failed", base, "--out", base)
    assert bad.code == 2, bad.err
    assert "junit.xml: test case" in bad.err and "nothing ran" in bad.err
    assert {p.name: p.read_bytes() for p in base.iterdir()} == before
    (base / "junit.xml").write_text(junit)
    before = {p.name: p.read_bytes() for p in base.iterdir()}
    # Results of another tasks file.
    other = tmp_path / "other.yaml"
    other.write_text(TASKS)
    foreign = cli("run", other, *model_args(fake), "--rerun-failed", base, "--out", base)
    assert foreign.code == 2
    assert "holds results of tasks, not of other" in foreign.err
    # Not a results folder at all.
    empty = tmp_path / "empty"
    empty.mkdir()
    none = cli("run", tasks, *model_args(fake), "--rerun-failed", empty, "--out", base)
    assert none.code == 2 and "not an mm-batch results folder" in none.err
    assert fake.requests == []
    assert {p.name: p.read_bytes() for p in base.iterdir()} == before


def test_a_rerun_whose_model_is_down_keeps_the_passing_runs_and_reports_the_rest_as_errors(
    cli: Cli, fake_model: Fake, tmp_path: Path
) -> None:
    tasks = write_project(tmp_path)
    out = tmp_path / "results"
    cli("run", tasks, *model_args(fake_model(refusing_script({"Do beta."}))), "--out", out)
    down = fake_model(lambda _: HttpFailure(401, "no key"))
    again = cli("run", tasks, *model_args(down), "--rerun-failed", out, "--out", out)
    assert again.code == 3, again.err
    check_report(out / "junit.xml")
    assert case_verdicts(out) == {"alpha": "passed", "beta": "error", "gamma": "passed"}
    runs = json.loads((out / "summary.json").read_text())["runs"]
    assert [(r["status"], r["rerun"]) for r in runs] == [
        ("passed", False),
        ("error", True),
        ("passed", False),
    ]


def test_a_rerun_interrupted_by_sigterm_keeps_every_run_it_did_not_make_again(
    cli: Cli, fake_model: Fake, tmp_path: Path
) -> None:
    tasks = write_project(tmp_path)
    (tmp_path / "agent.yaml").write_text(
        OK_AGENT
        + """\
  - name: slow
    description: Slow.
    parameters: {}
    command: ["/bin/sh", "-c", "echo started > started; sleep 300"]
"""
    )
    out = tmp_path / "results"
    cli("run", tasks, *model_args(fake_model(refusing_script({"Do beta."}))), "--out", out)
    before = [r for r in read_calls(out) if r["task"] != "beta"]

    def hangs(request: dict[str, Any]) -> Any:
        return tool_call("slow", {}) if turn(request) == 0 else text("never")

    proc = run_until_marker(
        tasks, fake_model(hangs), out, tmp_path / "started", "--rerun-failed", str(out)
    )
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err.decode()
    check_report(out / "junit.xml")
    assert [r for r in read_calls(out) if r["task"] != "beta"] == before
    assert case_verdicts(out) == {"alpha": "passed", "beta": "error", "gamma": "passed"}
    beta = [r for r in read_calls(out) if r["task"] == "beta" and r["kind"] == "task"]
    assert [(r["status"], r["rerun"]) for r in beta] == [("error", True)]


def test_a_task_added_since_keeps_dir_s_order_and_the_changed_file_is_named(
    cli: Cli, fake_model: Fake, tmp_path: Path
) -> None:
    tasks = write_project(tmp_path)
    out = tmp_path / "results"
    cli("run", tasks, *model_args(fake_model(refusing_script({"Do beta."}))), "--out", out)
    added = "tasks:\n  - id: aardvark\n    prompt: Do aardvark.\n"
    tasks.write_text(TASKS.replace("tasks:\n", added, 1))
    fake = fake_model(refusing_script(set()))
    again = cli("run", tasks, *model_args(fake), "--rerun-failed", out, "--out", out)
    assert again.code == 0, again.err
    assert "tasks.yaml changed since" in again.err
    assert "1 run(s) of the plan are not in" in again.err  # aardvark: never run before
    assert prompts_asked(fake) == ["Do beta."]
    check_report(out / "junit.xml")
    runs = json.loads((out / "summary.json").read_text())["runs"]
    assert [(r["task"], r["index"]) for r in runs] == [("alpha", 0), ("beta", 1), ("gamma", 2)]
    assert list(case_verdicts(out)) == ["alpha", "beta", "gamma"]


def test_plan_with_rerun_failed_lists_just_the_runs_a_rerun_would_make(
    cli: Cli, fake_model: Fake, tmp_path: Path
) -> None:
    tasks = write_project(tmp_path)
    base = tmp_path / "base"
    cli("run", tasks, *model_args(fake_model(refusing_script({"Do beta."}))), "--out", base)
    fake = fake_model(refusing_script(set()))
    listed = cli("plan", tasks, *model_args(fake), "--rerun-failed", base)
    assert listed.code == 0, listed.err
    assert [line.split("\t")[0] for line in listed.out.splitlines()] == ["beta[hosted_vllm/fake]#1"]
    assert fake.requests == []
