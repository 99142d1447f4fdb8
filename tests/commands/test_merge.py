"""`mm-batch merge`: plan order, flaky runs judged on the whole, and shards of one plan only."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path

from mm_batch.testing.fake_openai import FakeOpenAI
from tests.helpers import FLAKY_TASKS, OK_AGENT, Cli, Fake, check_report, flaky_script, model_args

TWO_TASKS = (
    FLAKY_TASKS + "\n  - id: second\n    prompt: Publish.\n    expect:\n      calls: [{tool: ok}]\n"
)


def _cases(junit: Path) -> list[tuple[str, str, str]]:
    """Each test case in file order: classname, name, and the verdict element it holds."""
    return [
        (
            c.get("classname", ""),
            c.get("name", ""),
            next((e.tag for e in c if e.tag != "system-out"), "passed"),
        )
        for c in ET.parse(junit).getroot().iter("testcase")
    ]


def _run_shards(cli: Cli, fake: FakeOpenAI, tasks: Path, out: Path, n: int) -> list[Path]:
    shards = []
    for k in range(1, n + 1):
        shard = out / f"shard{k}"
        cli(
            "run",
            tasks,
            *model_args(fake),
            "--model",
            "hosted_vllm/b",
            "--shard",
            f"{k}/{n}",
            "--out",
            shard,
        )
        shards.append(shard)
    return shards


def test_a_merge_keeps_plan_order_and_judges_flaky_runs_on_the_whole(
    cli: Cli, fake_model: Fake, tmp_path: Path
) -> None:
    (tmp_path / "agent.yaml").write_text(OK_AGENT)
    tasks = tmp_path / "tasks.yaml"
    tasks.write_text(TWO_TASKS)
    whole = cli(
        "run",
        tasks,
        *model_args(fake_model(flaky_script(0))),
        "--model",
        "hosted_vllm/b",
        "--out",
        tmp_path / "whole",
    )
    assert whole.code == 0, whole.err
    # One job a shard, one fake for all: the 3rd conversation is shard 1's run of index 6,
    # second[fake]#1, alone of its task and model in that shard: a failure there.
    shards = _run_shards(cli, fake_model(flaky_script(3)), tasks, tmp_path, 3)
    in_shard = {name: tag for cls, name, tag in _cases(shards[0] / "junit.xml") if "fake" in cls}
    assert in_shard["second#1"] == "failure"
    merged = cli("merge", *reversed(shards), "--out", tmp_path / "merged")
    assert merged.code == 0, merged.err
    check_report(tmp_path / "merged" / "junit.xml")
    cases = _cases(tmp_path / "merged" / "junit.xml")
    # Plan order within each testsuite, whatever order the shards came in.
    assert [(cls, name) for cls, name, _ in cases] == [
        (cls, name) for cls, name, _ in _cases(tmp_path / "whole" / "junit.xml")
    ]
    names = [name for _, name, _ in cases[:6]]
    assert names == ["publish#1", "publish#2", "publish#3", "second#1", "second#2", "second#3"]
    # On the whole, 2 of 3 passed >= 0.6: the failing repeat is tolerated, a flaky pass.
    assert [(name, tag) for cls, name, tag in cases if tag != "passed"] == [
        ("second#1", "flakyFailure")
    ]
    root = ET.parse(tmp_path / "merged" / "junit.xml").getroot()
    assert (root.get("tests"), root.get("failures"), root.get("errors")) == ("12", "0", "0")
    summary = json.loads((tmp_path / "merged" / "summary.json").read_text())
    assert [r["index"] for r in summary["runs"]] == list(range(12))
    assert summary["exit_code"] == 0


def test_shards_of_different_files_or_versions_are_refused_by_name(
    cli: Cli, fake_model: Fake, tmp_path: Path
) -> None:
    (tmp_path / "agent.yaml").write_text(OK_AGENT)
    tasks = tmp_path / "tasks.yaml"
    tasks.write_text(TWO_TASKS)
    fake = fake_model(flaky_script(0))
    first, second = _run_shards(cli, fake, tasks, tmp_path, 2)
    tasks.write_text(TWO_TASKS.replace("prompt: Publish.", "prompt: Publish now.", 1))
    other = tmp_path / "other"
    cli(
        "run",
        tasks,
        *model_args(fake),
        "--model",
        "hosted_vllm/b",
        "--shard",
        "2/2",
        "--out",
        other,
    )
    mixed = cli("merge", first, other, "--out", tmp_path / "bad")
    assert mixed.code == 2
    assert f"{first} and {other} do not come from the same plan (sha256:" in mixed.err
    assert not (tmp_path / "bad").exists()
    summary = json.loads((second / "summary.json").read_text())
    summary["provenance"]["mm_batch_version"] = "0.0.1"
    (second / "summary.json").write_text(json.dumps(summary))
    older = cli("merge", first, second, "--out", tmp_path / "bad")
    assert older.code == 2
    assert "mm_batch_version: " in older.err and f"0.0.1 in {second}" in older.err


def test_shards_run_from_other_working_directories_merge(
    cli: Cli, fake_model: Fake, tmp_path: Path
) -> None:
    """The same files named by other paths (each shard's own working directory) are one plan."""
    (tmp_path / "agent.yaml").write_text(OK_AGENT)
    tasks = tmp_path / "tasks.yaml"
    tasks.write_text(TWO_TASKS)
    fake = fake_model(flaky_script(0))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    for k, cwd in ((1, tmp_path), (2, elsewhere)):
        cli(
            "run",
            tasks,
            *model_args(fake),
            "--shard",
            f"{k}/2",
            "--out",
            tmp_path / f"s{k}",
            cwd=cwd,
        )
    names = [
        {
            k
            for k in json.loads((tmp_path / f"s{k}" / "summary.json").read_text())["provenance"]
            if k.startswith("sha256:")
        }
        for k in (1, 2)
    ]
    assert names[0] != names[1]  # the same files, named from two places
    merged = cli("merge", tmp_path / "s1", tmp_path / "s2", "--out", tmp_path / "merged")
    assert merged.code == 0, merged.err
