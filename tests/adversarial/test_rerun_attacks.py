"""Attacks on `mm-batch run --rerun-failed DIR`: DIR is hostile input (a CI cache, another job's
artifact, a pull request's), the model and the commands of the rerun may be hostile too.

What must hold: a damaged or hostile DIR is a usage error (exit 2) naming the file, before
anything runs or is replaced; no run is reported as passed unless DIR said so in summary.json and
junit.xml alike, and no failure is hidden; the reports stay valid; memory and time stay bounded;
secrets stay masked; a rerun into DIR itself loses nothing DIR had.
"""

from __future__ import annotations

import json
import os
import resource
import signal
import subprocess
import sys
import xml.etree.ElementTree as ET
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from mm_batch.plan import classname
from mm_batch.testing.fake_openai import FakeOpenAI, RawReply, text, tool_call, turn
from tests.commands.reruns import TASKS, refusing_script, write_project
from tests.helpers import (
    OK_AGENT,
    Cli,
    CliResult,
    Fake,
    case_verdicts,
    check_report,
    model_args,
    prompts_asked,
    read_calls,
    run_until_marker,
)

MODEL = "hosted_vllm/fake"
ALPHA, BETA, GAMMA = (f"{t}[{MODEL}]#1" for t in ("alpha", "beta", "gamma"))


def _failed_beta(cli: Cli, fake_model: Fake, tmp_path: Path, tasks: str = TASKS) -> Path:
    """A real results folder in tmp_path/base where alpha and gamma passed and beta failed."""
    project = write_project(tmp_path, tasks)
    base = tmp_path / "base"
    first = cli(
        "run", project, *model_args(fake_model(refusing_script({"Do beta."}))), "--out", base
    )
    assert first.code == 1, first.err
    return base


def _summary(base: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((base / "summary.json").read_text())
    return data


def _put_summary(base: Path, data: dict[str, Any]) -> None:
    (base / "summary.json").write_text(json.dumps(data))


def _run_entry(data: dict[str, Any], run_id: str) -> dict[str, Any]:
    entry: dict[str, Any] = next(r for r in data["runs"] if r["run"] == run_id)
    return entry


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file() and not p.is_symlink()}


def _rerun(
    cli: Cli, fake: FakeOpenAI, base: Path, out: Path | None = None, *options: str
) -> CliResult:
    tasks = base.parent / "tasks.yaml"
    return cli(
        "run", tasks, *model_args(fake), *options, "--rerun-failed", base, "--out", out or base
    )


def _assert_refused(cli: Cli, fake_model: Fake, base: Path, name: str) -> None:
    """A rerun into DIR itself is a usage error naming `name` (a file of DIR), asks no model,
    and leaves every byte of DIR as it was."""
    before = _snapshot(base)
    fake = fake_model(refusing_script(set()))
    result = _rerun(cli, fake, base)
    assert result.code == 2, (result.code, result.err[-3000:])
    assert name in result.err and "nothing ran" in result.err, result.err[-3000:]
    assert "Traceback" not in result.err
    assert fake.requests == []
    assert _snapshot(base) == before


# --- (1) A damaged DIR is a usage error naming the file; nothing runs, nothing is replaced.


@pytest.mark.parametrize(
    "record",
    [{"run": ["a", "list"]}, {"run": {"an": "object"}}],
    ids=["list", "object"],
)
def test_a_record_whose_run_is_not_a_string_is_refused_and_dir_is_kept(
    cli: Cli, fake_model: Fake, tmp_path: Path, record: dict[str, Any]
) -> None:
    base = _failed_beta(cli, fake_model, tmp_path)
    with (base / "calls.jsonl").open("a") as log:
        log.write(json.dumps(record) + "\n")
    _assert_refused(cli, fake_model, base, "calls.jsonl")


@pytest.mark.parametrize("key", ["provenance", "plan", "plan.whole_runs"])
def test_a_summary_without_a_part_older_versions_lacked_reads_as_no_facts_and_dir_s_runs(
    cli: Cli, fake_model: Fake, tmp_path: Path, key: str
) -> None:
    """No traceback: such a DIR is read as holding no provenance and an unsharded plan of its
    own runs, and the rerun writes valid reports of all three."""
    base = _failed_beta(cli, fake_model, tmp_path)
    data = _summary(base)
    if key == "plan.whole_runs":
        del data["plan"]["whole_runs"]
    else:
        del data[key]
    _put_summary(base, data)
    fake = fake_model(refusing_script(set()))
    result = _rerun(cli, fake, base)
    assert result.code == 0, result.err[-3000:]
    assert len(fake.requests) == 2  # beta's two turns, nothing else
    check_report(base / "junit.xml")
    summary = _summary(base)
    assert summary["plan"] == {"shard": None, "whole_runs": 3}
    assert summary["provenance"]["rerun_of"] == (
        "unknown" if key == "provenance" else data["provenance"]["started_at"]
    )


@pytest.mark.parametrize(
    "content",
    [
        "[" * 100_000,
        '{"runs": ' + "[" * 50_000 + "]" * 50_000 + "}",
        "{" * 200_000,
        '{"suite": "tasks", "runs": [], "min_pass_rate": 1e999999}',
    ],
    ids=["deep-list", "deep-runs", "deep-object", "huge-exponent"],
)
def test_a_summary_too_deep_or_not_json_is_refused(
    cli: Cli, fake_model: Fake, tmp_path: Path, content: str
) -> None:
    base = _failed_beta(cli, fake_model, tmp_path)
    (base / "summary.json").write_text(content)
    _assert_refused(cli, fake_model, base, "summary.json")


def test_a_calls_line_too_deep_for_the_parser_is_refused(
    cli: Cli, fake_model: Fake, tmp_path: Path
) -> None:
    base = _failed_beta(cli, fake_model, tmp_path)
    with (base / "calls.jsonl").open("a") as log:
        log.write('{"run": "x", "deep": ' + "[" * 100_000 + "]" * 100_000 + "}\n")
    _assert_refused(cli, fake_model, base, "calls.jsonl")


def _nested(depth: int) -> Any:
    value: Any = "leaf"
    for _ in range(depth):
        value = [value]
    return value


@pytest.mark.parametrize(
    "junit",
    [
        "<testsuites>" + "<a>" * 200_000 + "</a>" * 200_000 + "</testsuites>",
        '<?xml version="1.0"?><!DOCTYPE l [<!ENTITY a "aaaaaaaaaa">'
        + "".join(
            f'<!ENTITY {c} "{("&" + p + ";") * 10}">'
            for p, c in zip("abcdefgh", "bcdefghi", strict=True)
        )
        + "]><testsuites><testsuite>&i;</testsuite></testsuites>",
        "<testsuites><testsuite",
    ],
    ids=["deep-elements", "billion-laughs", "cut"],
)
def test_a_hostile_junit_is_refused_in_bounded_time(
    cli: Cli, fake_model: Fake, tmp_path: Path, junit: str
) -> None:
    base = _failed_beta(cli, fake_model, tmp_path)
    (base / "junit.xml").write_text(junit)
    _assert_refused(cli, fake_model, base, "junit.xml")


def test_an_external_entity_in_junit_reads_no_file(
    cli: Cli, fake_model: Fake, tmp_path: Path
) -> None:
    base = _failed_beta(cli, fake_model, tmp_path)
    secret = tmp_path / "private.txt"
    secret.write_text("PRIVATE-CONTENT-42\n")
    junit = (base / "junit.xml").read_text()
    doctype = f'<!DOCTYPE testsuites [<!ENTITY x SYSTEM "file://{secret}">]>'
    junit = junit.replace("?>", "?>" + doctype, 1).replace("</system-out>", "&x;</system-out>", 1)
    (base / "junit.xml").write_text(junit)
    out = tmp_path / "out"
    result = _rerun(cli, fake_model(refusing_script(set())), base, out)
    assert "Traceback" not in result.err
    assert result.code in (0, 2), result.err[-2000:]
    written = "".join(p.read_text() for p in out.iterdir()) if out.exists() else ""
    assert "PRIVATE-CONTENT-42" not in written


@pytest.mark.parametrize("name", ["summary.json", "junit.xml", "calls.jsonl"])
def test_a_results_file_replaced_by_a_link_is_refused(
    cli: Cli, fake_model: Fake, tmp_path: Path, name: str
) -> None:
    base = _failed_beta(cli, fake_model, tmp_path)
    elsewhere = tmp_path / f"elsewhere-{name}"
    (base / name).rename(elsewhere)
    (base / name).symlink_to(elsewhere)
    _assert_refused(cli, fake_model, base, name)
    assert (base / name).is_symlink() and elsewhere.is_file()


def test_a_results_file_replaced_by_a_fifo_is_refused_without_blocking(
    cli: Cli, fake_model: Fake, tmp_path: Path
) -> None:
    base = _failed_beta(cli, fake_model, tmp_path)
    (base / "calls.jsonl").unlink()
    os.mkfifo(base / "calls.jsonl")
    _assert_refused(cli, fake_model, base, "calls.jsonl")


# --- (2) No failure hidden, no pass believed unless summary.json and junit.xml agree.


def _swap_run_ids(data: dict[str, Any]) -> None:
    """alpha's entry (passed) takes beta's id and beta's (failed) takes alpha's; every field
    that junit.xml is matched by (task, model, repeat) stays as it was."""
    alpha, beta = _run_entry(data, ALPHA), _run_entry(data, BETA)
    alpha["run"], beta["run"] = BETA, ALPHA


def _beta_renamed(data: dict[str, Any]) -> None:
    """beta's entry says passed under another task name, with a matching passing test case."""
    beta = _run_entry(data, BETA)
    beta.update(task="zeta", status="passed", reason="")


def _beta_run_id_on_gamma(data: dict[str, Any]) -> None:
    """The failed beta keeps its fields but names itself after a run of another model."""
    _run_entry(data, BETA)["run"] = "beta[other/model]#1"


@pytest.mark.parametrize(
    "tamper",
    [_swap_run_ids, _beta_renamed, _beta_run_id_on_gamma],
    ids=["swapped-ids", "fields-of-another-task", "id-of-another-model"],
)
def test_a_run_whose_id_disagrees_with_its_fields_is_refused(
    cli: Cli, fake_model: Fake, tmp_path: Path, tamper: Callable[[dict[str, Any]], None]
) -> None:
    base = _failed_beta(cli, fake_model, tmp_path)
    data = _summary(base)
    tamper(data)
    _put_summary(base, data)
    if tamper is _beta_renamed:  # junit.xml says the same as the lie
        junit = ET.parse(base / "junit.xml")
        case = next(c for c in junit.getroot().iter("testcase") if c.get("name") == "beta")
        case.set("name", "zeta")
        for child in [c for c in case if c.tag == "failure"]:
            case.remove(child)
        junit.write(base / "junit.xml", encoding="unicode")
    _assert_refused(cli, fake_model, base, "summary.json")


def test_the_swapped_ids_never_end_in_a_green_rerun_with_beta_unseen(
    cli: Cli, fake_model: Fake, tmp_path: Path
) -> None:
    """Whatever the fix (refusal or not), the failed beta never disappears behind exit 0."""
    base = _failed_beta(cli, fake_model, tmp_path)
    data = _summary(base)
    _swap_run_ids(data)
    _put_summary(base, data)
    out = tmp_path / "out"
    fake = fake_model(refusing_script({"Do beta."}))  # beta would fail again
    result = _rerun(cli, fake, base, out)
    if result.code == 2:
        return
    assert result.code == 1, result.err[-2000:]
    assert "beta" in case_verdicts(out)


def test_a_run_passed_in_summary_but_skipped_in_junit_is_refused(
    cli: Cli, fake_model: Fake, tmp_path: Path
) -> None:
    base = _failed_beta(cli, fake_model, tmp_path)
    junit = (base / "junit.xml").read_text()
    case = junit.index('name="alpha"')
    close = junit.index(">", case)
    if junit[close - 1] == "/":  # <testcase .../>
        junit = junit[: close - 1] + "><skipped/></testcase>" + junit[close + 1 :]
    else:
        junit = junit[: close + 1] + "<skipped/>" + junit[close + 1 :]
    (base / "junit.xml").write_text(junit)
    _assert_refused(cli, fake_model, base, "junit.xml")


def test_a_duplicate_run_id_in_summary_is_refused(
    cli: Cli, fake_model: Fake, tmp_path: Path
) -> None:
    base = _failed_beta(cli, fake_model, tmp_path)
    data = _summary(base)
    passed_copy = dict(_run_entry(data, BETA), status="passed", reason="")
    data["runs"].insert(0, passed_copy)
    _put_summary(base, data)
    _assert_refused(cli, fake_model, base, BETA)


@pytest.mark.parametrize(
    ("key", "value"),
    [("duration_s", 1.7e308), ("duration_s", 1e7), ("cost_usd", 1.7e308), ("cost_usd", 1e10)],
)
def test_a_run_too_long_or_too_costly_to_have_happened_is_refused_by_rerun_and_merge(
    cli: Cli, fake_model: Fake, tmp_path: Path, key: str, value: float
) -> None:
    """Finite but beyond any run (a timeout is a week at most): summed over runs it overflows
    to infinity, which no JSON can hold; a clean usage error, never a traceback (exit 4)."""
    base = _failed_beta(cli, fake_model, tmp_path)
    data = _summary(base)
    for run in data["runs"]:
        run[key] = value
    _put_summary(base, data)
    _assert_refused(cli, fake_model, base, "summary.json")
    merged = cli("merge", base, "--out", tmp_path / "merged")
    assert merged.code == 2, (merged.code, merged.err[-3000:])
    assert "summary.json" in merged.err and "Traceback" not in merged.err


def test_an_index_clash_is_refused_or_never_written_on(
    cli: Cli, fake_model: Fake, tmp_path: Path
) -> None:
    base = _failed_beta(cli, fake_model, tmp_path)
    data = _summary(base)
    _run_entry(data, GAMMA)["index"] = _run_entry(data, ALPHA)["index"]
    _put_summary(base, data)
    out = tmp_path / "out"
    result = _rerun(cli, fake_model(refusing_script(set())), base, out)
    assert "Traceback" not in result.err
    if result.code != 2:
        indexes = [r["index"] for r in _summary(out)["runs"]]
        assert len(set(indexes)) == len(indexes), indexes


def test_a_failed_run_with_odd_characters_outside_the_plan_stays_failed_in_valid_reports(
    cli: Cli, fake_model: Fake, tmp_path: Path
) -> None:
    """A failed run DIR holds that no task of the plan names is kept, failing, and the reports
    stay valid whatever its name holds."""
    base = _failed_beta(cli, fake_model, tmp_path)
    data = _summary(base)
    odd_task, odd_model = "../../x]#1\u202e<b>", "m\n[x]/y"
    odd = dict(
        _run_entry(data, BETA),
        run=f"{odd_task}[{odd_model}]#1",
        task=odd_task,
        model=odd_model,
        index=3,
    )
    data["runs"].append(odd)
    data["plan"]["whole_runs"] = 4
    _put_summary(base, data)
    junit = ET.parse(base / "junit.xml")
    suite = ET.SubElement(
        junit.getroot(),
        "testsuite",
        {
            "name": "odd",
            "tests": "1",
            "failures": "1",
            "errors": "0",
            "time": "0",
            "file": "tasks.yaml",
            "timestamp": "2026-01-01T00:00:00Z",
            "hostname": "h",
        },
    )
    case = ET.SubElement(
        suite,
        "testcase",
        {"name": odd_task, "classname": classname("tasks", odd_model), "time": "0"},
    )
    ET.SubElement(case, "failure", {"message": "failed"}).text = "failed"
    junit.write(base / "junit.xml", encoding="unicode")
    out = tmp_path / "out"
    result = _rerun(cli, fake_model(refusing_script(set())), base, out)
    assert "Traceback" not in result.err
    if result.code == 2:
        return
    assert result.code == 1, result.err[-2000:]
    check_report(out / "junit.xml")
    assert [r["status"] for r in _summary(out)["runs"] if r["task"] == odd_task] == ["failed"]


def test_a_kept_failure_commands_nothing_on_github_actions(
    cli: Cli, fake_model: Fake, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """DIR's texts reach the log (the annotations, the terminal lines): GitHub's runner reads
    workflow commands in stdout and stderr alike, so none may start a line or hold `##[`."""
    base = _failed_beta(cli, fake_model, tmp_path)
    inject = "\n::add-mask::x\n::set-env name=A::b\r\n##[set-output name=x]y\x1b[2J"
    data = _summary(base)
    beta = _run_entry(data, BETA)
    beta["reason"] = inject
    _put_summary(base, data)
    monkeypatch.setenv("GITHUB_ACTIONS", "true")
    # beta is outside the plan of alpha alone: kept failing, its reason shown as it was.
    result = _rerun(
        cli, fake_model(refusing_script(set())), base, tmp_path / "out", "--filter", "alpha"
    )
    assert result.code == 1, result.err[-2000:]
    lines = (result.out + result.err).splitlines()
    assert (
        [line for line in lines if line.startswith("::")]
        == [line for line in lines if line.startswith("::error ")]
        != []
    )
    assert [line for line in lines if "##[" in line or "\x1b" in line] == []


# --- (3) The reports of a rerun from a hostile but accepted DIR stay valid.


@pytest.mark.parametrize(
    "record",
    [
        {"run": ALPHA, "kind": "bogus"},
        {"run": f"ghost[{MODEL}]#1", "task": "ghost"},
        {},
        {"run": ALPHA, "deep": _nested(900)},
    ],
    ids=["bad-kind", "ghost-run", "empty", "deep"],
)
def test_a_record_that_is_no_mm_batch_record_is_refused_or_never_copied(
    cli: Cli, fake_model: Fake, tmp_path: Path, record: dict[str, Any]
) -> None:
    base = _failed_beta(cli, fake_model, tmp_path)
    with (base / "calls.jsonl").open("a") as log:
        log.write(json.dumps(record) + "\n")
    out = tmp_path / "out"
    result = _rerun(cli, fake_model(refusing_script(set())), base, out)
    assert "Traceback" not in result.err
    if result.code != 2:
        check_report(out / "junit.xml")


@pytest.mark.parametrize(
    "attributes",
    [{"timestamp": "0000"}, {"file": None}, {"hostname": None}],
    ids=["timestamp", "no-file", "no-hostname"],
)
def test_hostile_testsuite_attributes_are_refused_or_never_copied(
    cli: Cli, fake_model: Fake, tmp_path: Path, attributes: dict[str, str | None]
) -> None:
    base = _failed_beta(cli, fake_model, tmp_path)
    junit = ET.parse(base / "junit.xml")
    for suite in junit.getroot().iter("testsuite"):
        for key, value in attributes.items():
            if value is None:
                suite.attrib.pop(key, None)
            else:
                suite.set(key, value)
    junit.write(base / "junit.xml", encoding="unicode")
    out = tmp_path / "out"
    # alpha passed: nothing runs again, DIR's testsuite is the only one of the new junit.xml.
    result = _rerun(cli, fake_model(refusing_script(set())), base, out, "--filter", "alpha")
    assert "Traceback" not in result.err
    if result.code != 2:
        check_report(out / "junit.xml")


@pytest.mark.parametrize("time", ["soon", "nan", "-1", "1e400"])
def test_a_hostile_testcase_time_is_refused_or_never_copied(
    cli: Cli, fake_model: Fake, tmp_path: Path, time: str
) -> None:
    base = _failed_beta(cli, fake_model, tmp_path)
    junit = ET.parse(base / "junit.xml")
    next(c for c in junit.getroot().iter("testcase") if c.get("name") == "alpha").set("time", time)
    junit.write(base / "junit.xml", encoding="unicode")
    before = _snapshot(base)
    result = _rerun(cli, fake_model(refusing_script(set())), base)
    assert "Traceback" not in result.err, result.err[-2000:]
    if result.code == 2:
        assert "junit.xml" in result.err and _snapshot(base) == before
    else:
        assert result.code == 0, result.err[-2000:]
        check_report(base / "junit.xml")


def test_a_kept_test_case_keeps_spec_limits_on_its_texts(
    cli: Cli, fake_model: Fake, tmp_path: Path
) -> None:
    base = _failed_beta(cli, fake_model, tmp_path)
    junit = ET.parse(base / "junit.xml")
    beta = next(c for c in junit.getroot().iter("testcase") if c.get("name") == "beta")
    failure = next(c for c in beta if c.tag == "failure")
    failure.set("message", "m" * 4096)
    failure.text = "t" * (1 << 20)
    junit.write(base / "junit.xml", encoding="unicode")
    out = tmp_path / "out"
    # beta is outside the plan of alpha alone: its test case is kept as DIR had it.
    result = _rerun(cli, fake_model(refusing_script(set())), base, out, "--filter", "alpha")
    assert "Traceback" not in result.err
    if result.code == 2:
        return
    kept = next(c for c in ET.parse(out / "junit.xml").iter("testcase") if c.get("name") == "beta")
    for child in kept:
        assert len(child.get("message", "")) <= 1024, child.tag
        assert len(child.text or "") <= 64 * 1024, child.tag


@pytest.mark.parametrize(
    "started_at",
    ["yesterday\u0001", {"a": "dict"}, "x" * 2_000_000],
    ids=["control", "dict", "two-mb"],
)
def test_a_hostile_started_at_leaves_the_reports_valid(
    cli: Cli, fake_model: Fake, tmp_path: Path, started_at: Any
) -> None:
    base = _failed_beta(cli, fake_model, tmp_path)
    data = _summary(base)
    data["provenance"]["started_at"] = started_at
    _put_summary(base, data)
    out = tmp_path / "out"
    result = _rerun(cli, fake_model(refusing_script(set())), base, out)
    assert "Traceback" not in result.err
    if result.code != 2:
        assert result.code == 0, result.err[-2000:]
        check_report(out / "junit.xml")


def test_a_hostile_model_in_the_rerun_leaves_the_merged_reports_valid(
    cli: Cli, fake_model: Fake, tmp_path: Path
) -> None:
    """The new junit.xml is parsed again and merged with DIR's: what the model wrote must
    survive that round trip."""
    base = _failed_beta(cli, fake_model, tmp_path)
    hostile = "\ud800 \uffff \ufffe \x01 \x1b[31m ]]> </testcase> &amp; \r\n <![CDATA[ x"

    def script(request: dict[str, Any]) -> Any:
        return tool_call("ok", {}) if turn(request) == 0 else text(hostile)

    out = tmp_path / "out"
    result = _rerun(cli, fake_model(script), base, out)
    assert result.code == 0, result.err[-2000:]
    check_report(out / "junit.xml")
    assert case_verdicts(out) == {"alpha": "passed", "beta": "passed", "gamma": "passed"}


# --- (4) Memory and time bounded.


def _limited_rerun(base: Path, fake: FakeOpenAI, gib: int) -> subprocess.CompletedProcess[str]:
    """The rerun as its own process, its address space capped at `gib` GiB."""

    def cap() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (gib << 30, gib << 30))

    tasks = base.parent / "tasks.yaml"
    command = [sys.executable, "-m", "mm_batch", "run", str(tasks), *model_args(fake)]
    return subprocess.run(
        [*command, "--rerun-failed", str(base), "--out", str(base)],
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
        preexec_fn=cap,
        cwd=base.parent,
    )


def test_a_huge_calls_log_is_refused_in_bounded_memory(
    cli: Cli, fake_model: Fake, tmp_path: Path
) -> None:
    base = _failed_beta(cli, fake_model, tmp_path)
    fake = fake_model(refusing_script(set()))
    control = tmp_path / "control"
    # The same rerun on an untouched copy runs under the cap: the cap is no reason to fail.
    subprocess.run(["cp", "-a", str(base), str(control)], check=True)
    assert _limited_rerun(control, fake, 2).returncode == 0
    with (base / "calls.jsonl").open("r+b") as log:
        log.truncate(3 << 30)
    before = {p.name: p.stat().st_size for p in base.iterdir()}
    asked = len(fake.requests)
    result = _limited_rerun(base, fake, 2)
    assert result.returncode == 2, result.stderr[-2000:]
    assert "calls.jsonl" in result.stderr
    assert len(fake.requests) == asked
    assert {p.name: p.stat().st_size for p in base.iterdir()} == before


# --- (5) Secrets from the environment stay masked in everything the rerun writes.


def test_a_secret_of_the_reruns_environment_is_masked_in_what_dir_kept(
    cli: Cli, fake_model: Fake, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    secret = "tok-0123456789-abcdef"
    # DIR was written by a job where this value was no secret yet: alpha's prompt carries it.
    base = _failed_beta(cli, fake_model, tmp_path, TASKS.replace("Do alpha.", f"Use {secret}."))
    assert secret in (base / "calls.jsonl").read_text()
    monkeypatch.setenv("MM_DEPLOY_TOKEN", secret)
    out = tmp_path / "out"
    result = _rerun(cli, fake_model(refusing_script(set())), base, out)
    assert result.code == 0, result.err[-2000:]
    assert secret not in result.err + result.out
    leaking = sorted(p.name for p in out.iterdir() if secret in p.read_text())
    assert leaking == []


def test_a_secret_is_masked_in_the_reruns_own_runs(
    cli: Cli, fake_model: Fake, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    secret = "tok-0123456789-abcdef"
    monkeypatch.setenv("MM_DEPLOY_TOKEN", secret)
    base = _failed_beta(cli, fake_model, tmp_path)

    def script(request: dict[str, Any]) -> Any:
        return tool_call("ok", {}) if turn(request) == 0 else text(f"the token is {secret}")

    result = _rerun(cli, fake_model(script), base)
    assert result.code == 0, result.err[-2000:]
    assert [p.name for p in base.iterdir() if secret in p.read_text()] == []
    assert "the token is ***" in (base / "calls.jsonl").read_text()


# --- (6) A rerun into DIR itself loses nothing DIR had, interrupted or failing.

SLOW = """\
  - name: slow
    description: Slow.
    parameters: {}
    command: ["/bin/sh", "-c", "echo started > started; sleep 300"]
"""


def _hangs(request: dict[str, Any]) -> Any:
    return tool_call("slow", {}) if turn(request) == 0 else text("never")


def test_a_rerun_into_dir_killed_mid_run_leaves_dir_a_results_folder(
    cli: Cli, fake_model: Fake, tmp_path: Path
) -> None:
    base = _failed_beta(cli, fake_model, tmp_path)
    (tmp_path / "agent.yaml").write_text(OK_AGENT + SLOW)
    before = _summary(base)["runs"]
    proc = run_until_marker(
        tmp_path / "tasks.yaml",
        fake_model(_hangs),
        base,
        tmp_path / "started",
        "--rerun-failed",
        str(base),
    )
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=60)
    assert {"summary.json", "junit.xml", "calls.jsonl"} <= {p.name for p in base.iterdir()}
    assert _summary(base)["runs"] == before
    assert case_verdicts(base) == {"alpha": "passed", "beta": "failure", "gamma": "passed"}


def test_a_rerun_into_dir_whose_model_answers_garbage_keeps_every_kept_record(
    cli: Cli, fake_model: Fake, tmp_path: Path
) -> None:
    base = _failed_beta(cli, fake_model, tmp_path)
    kept = [r for r in read_calls(base) if r["task"] != "beta"]
    fake = fake_model(lambda _: RawReply(b'{"choices": "not a list"}'))
    result = _rerun(cli, fake, base)
    assert result.code in (1, 3), result.err[-2000:]
    assert "Traceback" not in result.err
    check_report(base / "junit.xml")
    assert [r for r in read_calls(base) if r["task"] != "beta"] == kept
    assert case_verdicts(base)["alpha"] == "passed" and case_verdicts(base)["beta"] in (
        "failure",
        "error",
    )
    assert prompts_asked(fake)[:1] == ["Do beta."]


PLANT = """\
  - name: plant
    description: Plant links.
    parameters: {}
    command: ["/bin/sh", "-c", "for f in $0; do ln -sf \\"$PWD/victim.txt\\" base/$f; done",
              "NAMES"]
"""


@pytest.mark.parametrize(
    "names",
    [
        "junit.xml summary.json summary.md report.html",
        "calls.jsonl",
    ],
    ids=["reports", "calls"],
)
def test_links_a_command_plants_in_dir_during_the_rerun_are_not_written_through(
    cli: Cli, fake_model: Fake, tmp_path: Path, names: str
) -> None:
    base = _failed_beta(cli, fake_model, tmp_path)
    (tmp_path / "agent.yaml").write_text(OK_AGENT + PLANT.replace("NAMES", names))
    (tmp_path / "victim.txt").write_text("precious\n")
    kept = [r for r in read_calls(base) if r["task"] != "beta"]

    def script(request: dict[str, Any]) -> Any:
        return [tool_call("plant", {}), tool_call("ok", {}), text("Done.")][min(turn(request), 2)]

    result = _rerun(cli, fake_model(script), base)
    assert (tmp_path / "victim.txt").read_text() == "precious\n"
    assert result.code == 0, result.err[-2000:]
    check_report(base / "junit.xml")
    assert case_verdicts(base) == {"alpha": "passed", "beta": "passed", "gamma": "passed"}
    assert [r for r in read_calls(base) if r["task"] != "beta"] == kept
