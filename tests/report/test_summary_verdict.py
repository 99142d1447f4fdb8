"""summary.md and the GitHub step summary: titled by the tasks file, led by one verdict line that
points at report.html."""

from __future__ import annotations

from pathlib import Path

import pytest

from mm_batch.report.summary import summary_markdown
from mm_batch.run.records import RunResult, Status
from mm_batch.testing.fake_openai import text
from tests.helpers import Cli, Fake, model_args, write


def shown(line: str) -> str:
    """A markdown line as it reads once rendered: escapes taken out (see markdown_text)."""
    return line.replace("\\", "")


def _result(task: str, status: Status, repeat: int = 1) -> RunResult:
    run_id = f"{task}[m]#{repeat}"
    return RunResult(run_id, task, "m", repeat, status, "why", (), 1.0, None, ())


@pytest.mark.parametrize(
    ("statuses", "verdict"),
    [
        (["passed"], "**Passed**: 1 task passed, 1 run."),
        (["passed", "passed"], "**Passed**: all 2 tasks passed, 2 runs."),
        (["passed", "failed"], "**Failed**: 1 of 2 tasks did not pass (1 failed), 2 runs."),
        (
            ["error", "passed"],
            "**Error**: 1 of 2 tasks did not pass (1 could not be judged), 2 runs.",
        ),
        (
            ["failed", "error", "passed"],
            "**Failed**: 2 of 3 tasks did not pass (1 failed, 1 could not be judged), 3 runs.",
        ),
    ],
)
def test_the_first_line_after_the_title_is_the_verdict_with_the_report_path(
    statuses: list[Status], verdict: str
) -> None:
    results = [_result(f"t{i}", s) for i, s in enumerate(statuses)]
    markdown = summary_markdown(
        "ci/tasks.yaml", results, 1.0, report="mm-batch-results/report.html"
    )
    lines = [shown(line) for line in markdown.splitlines()]
    assert lines[0] == "## mm-batch: ci/tasks.yaml"
    assert lines[2] == f"{verdict} Details: mm-batch-results/report.html"


def test_a_run_names_its_tasks_file_and_report_in_the_summary_and_the_step_summary(
    cli: Cli,
    fake_model: Fake,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    write(tmp_path, "ci/agent.yaml", "yolo: true\n")
    write(tmp_path, "ci/status-checks.yaml", "agent: agent.yaml\ntasks: [{id: a, prompt: hi}]\n")
    step_summary = tmp_path / "step.md"
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(step_summary))
    monkeypatch.setenv("GITHUB_WORKSPACE", str(tmp_path))
    fake = fake_model(lambda _request: text("hello"))
    out = tmp_path / "results"
    result = cli("run", tmp_path / "ci/status-checks.yaml", *model_args(fake), "--out", out)
    assert result.code == 0, result.err
    for summary in (out / "summary.md", step_summary):
        lines = [shown(line) for line in summary.read_text().splitlines()]
        assert lines[0] == "## mm-batch: ci/status-checks.yaml"
        assert lines[2].startswith("**Passed**: 1 task passed, 1 run.")
        assert lines[2].endswith(f"Details: {out.as_posix()}/report.html")
