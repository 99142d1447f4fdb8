"""pipelines/: valid against their platforms' published schemas, and the GitHub one really works."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from mm_batch.cli import cli as mm_batch_cli
from mm_batch.testing.fake_openai import FakeOpenAI, Script, by_prompt
from tests.conftest import ROOT
from tests.test_end_to_end import GOOD, STATUS_EN

PIPELINES = ROOT / "pipelines"
BIN = Path(sys.executable).parent


@pytest.mark.parametrize(
    ("path", "schema"),
    [
        ("github/mm-batch.yml", "vendor.github-workflows"),
        ("github/mm-batch-status-cron.yml", "vendor.github-workflows"),
        ("gitlab/.gitlab-ci.yml", "vendor.gitlab-ci"),
    ],
)
def test_valid_against_the_published_schema(path: str, schema: str) -> None:
    checker = shutil.which("check-jsonschema", path=str(BIN)) or shutil.which("check-jsonschema")
    assert checker is not None, "check-jsonschema comes with the test extra"
    done = subprocess.run(
        [checker, "--builtin-schema", schema, str(PIPELINES / path)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def _options(command: str) -> set[str]:
    sub = mm_batch_cli.commands[command]
    return {
        o
        for p in sub.params
        for o in getattr(p, "opts", []) + getattr(p, "secondary_opts", [])
        if o.startswith("--")
    }


@pytest.mark.parametrize(
    "path",
    sorted(
        str(p.relative_to(PIPELINES))
        for p in PIPELINES.rglob("*")
        if p.is_file() and p.name != "README.md"
    ),
)
def test_every_mm_batch_command_they_use_exists(path: str) -> None:
    text = (PIPELINES / path).read_text()
    uses = re.findall(r"mm-batch (run|merge|validate|plan) ([^\n|;]*)", text)
    assert uses, "the pipeline runs mm-batch"
    for command, rest in uses:
        for option in re.findall(r"(--[a-z-]+)", rest):
            assert option in _options(command), f"{path}: mm-batch {command} has no {option}"


def run_step(script: str, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """A `run:` step as GitHub's runner runs it (bash -e)."""
    return subprocess.run(
        ["bash", "-e", "-c", script], cwd=cwd, env=env, capture_output=True, text=True, check=False
    )


def _steps(job: dict[str, Any]) -> list[str]:
    return [s["run"] for s in job["steps"] if "run" in s and not s["run"].startswith("pip install")]


def test_the_github_workflow_runs_as_documented(
    fake_model: Callable[[Script], FakeOpenAI], tmp_path: Path
) -> None:
    """Its run steps, as written, on a repository holding a tasks file (one task fails)."""
    replies = dict(GOOD)
    replies[STATUS_EN] = [GOOD[STATUS_EN][1]]  # answers without running anything: fails
    fake = fake_model(by_prompt(replies))
    repo = tmp_path / "repo"
    shutil.copytree(
        ROOT / "examples" / "release",
        repo / "examples" / "release",
        ignore=shutil.ignore_patterns("calls-received.log"),
    )
    agent = repo / "examples" / "release" / "agent.yaml"
    agent.write_text(
        agent.read_text() + "model: hosted_vllm/fake\n"
        'model_options: {api_base: "${FAKE_MODEL_URL}"}\n'
    )
    workflow = yaml.safe_load((PIPELINES / "github" / "mm-batch.yml").read_text())
    env = {
        **os.environ,
        **workflow["env"],
        "FAKE_MODEL_URL": fake.url,
        "PATH": f"{BIN}:{os.environ['PATH']}",
        "GITHUB_STEP_SUMMARY": str(tmp_path / "sum.md"),
    }
    env.pop("GITHUB_ACTIONS", None)

    def sh(script: str) -> int:
        return run_step(script, repo, env).returncode

    run_job, report_job = workflow["jobs"]["run"], workflow["jobs"]["report"]
    # The install steps are not run here (the suite runs in mm-batch's own virtualenv).
    installs = [
        s["run"]
        for job in (run_job, report_job)
        for s in job["steps"]
        if s.get("run", "").startswith("pip install")
    ]
    assert installs == ['pip install "$MM_BATCH_PACKAGE"', 'pip install "$MM_BATCH_MERGE_PACKAGE"']
    assert workflow["env"]["MM_BATCH_MERGE_PACKAGE"] == "."  # mm-batch itself, no extra
    for shard in run_job["strategy"]["matrix"]["shard"]:
        for step in _steps(run_job):
            assert sh(step.replace("${{ matrix.shard }}", str(shard))) == 0, step
        # upload-artifact + download-artifact with a pattern: one folder per artifact.
        shutil.move(str(repo / "results"), str(repo / "shards" / f"mm-batch-shard-{shard}"))
    codes = [sh(step) for step in _steps(report_job)]
    assert codes[:-1] == [0] * (len(codes) - 1)
    assert codes[-1] == 1  # the batch's verdict: one task failed
    merged = repo / "merged"
    assert sorted(p.name for p in merged.iterdir()) == [
        "calls.jsonl",
        "junit.xml",
        "summary.json",
        "summary.md",
    ]
    assert "| hosted_vllm/fake | 5/6 |" in (tmp_path / "sum.md").read_text()
    # A shard that cannot run (a configuration error, exit 2) fails its own job; the report job
    # then names the shard whose results are missing rather than publish a partial report.
    shard_step = _steps(run_job)[0].replace("${{ matrix.shard }}", "2")
    broken = run_step(shard_step, repo, {**env, "MM_BATCH_TASKS": "missing.yaml"})
    assert broken.returncode == 2, broken.stderr
    shutil.rmtree(repo / "shards" / "mm-batch-shard-2")
    merge_step = next(s for s in _steps(report_job) if s.startswith("mm-batch merge"))
    merged_without = run_step(merge_step, repo, env)
    assert merged_without.returncode == 2
    assert "shard 2/4 missing: its runs would be absent" in merged_without.stderr
