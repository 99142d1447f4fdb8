"""GitHub Actions: one ::error per failing task and model, at the task's line, at most ten."""

from __future__ import annotations

import itertools
import re
from pathlib import Path
from typing import Any

import pytest

from mm_batch.report.terminal import ANNOTATION_LIMIT, escape_property, github_annotations
from mm_batch.run.records import RunResult
from mm_batch.testing.fake_openai import by_prompt, text
from tests.helpers import Cli, Fake, model_args, write, yolo_agent

AGENT = yolo_agent("noop", "Does nothing.")

_COMMAND = re.compile(r"^::(?P<kind>\w+) (?P<props>[^:]*)::(?P<message>.*)$")


def parse(line: str) -> tuple[str, dict[str, str], str]:
    """A workflow command as the runner reads it: kind, properties, message, all unescaped."""
    match = _COMMAND.match(line)
    assert match, line
    props = dict(p.split("=", 1) for p in match["props"].split(","))
    return match["kind"], {k: _unescape(v) for k, v in props.items()}, _unescape(match["message"])


def _unescape(text: str) -> str:
    for escaped, char in (("%0D", "\r"), ("%0A", "\n"), ("%3A", ":"), ("%2C", ","), ("%25", "%")):
        text = text.replace(escaped, char)
    return text


def failing_tasks(directory: Path, count: int, extra: str = "") -> Path:
    """A tasks file of `count` tasks, each expecting an answer the model never gives."""
    write(directory, "agent.yaml", AGENT)
    items = "".join(
        f"  - id: task-{i:02d}\n    prompt: p{i}\n    expect: {{answer_contains: [never]}}\n"
        for i in range(count)
    )
    return write(directory, "tasks.yaml", f"agent: agent.yaml\n{extra}tasks:\n{items}")


def item_lines(tasks: Path) -> dict[str, int]:
    """Each task's 1-based line, read from the file itself."""
    found = {}
    for number, line in enumerate(tasks.read_text().splitlines(), 1):
        if line.startswith("  - id: "):
            found[line.split(": ", 1)[1]] = number
    return found


@pytest.fixture
def on_github(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    summary = tmp_path / "step-summary.md"
    monkeypatch.setenv("GITHUB_ACTIONS", "true")
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    monkeypatch.setenv("GITHUB_WORKSPACE", str(tmp_path))
    return summary


def test_twelve_failing_tasks_repeated_make_ten_errors_and_a_notice(
    cli: Cli, fake_model: Fake, tmp_path: Path, on_github: Path
) -> None:
    tasks = failing_tasks(tmp_path / "suite", 12, "repeat: 3\njobs: 4\n")
    fake = fake_model(by_prompt({}, default=text("nope")))
    result = cli("run", tasks, *model_args(fake), "--out", tmp_path / "out", cwd=tmp_path)
    assert result.code == 1, result.err
    commands = [parse(line) for line in result.out.splitlines()]
    errors = [c for c in commands if c[0] == "error"]
    notices = [c for c in commands if c[0] == "notice"]
    assert len(errors) == ANNOTATION_LIMIT and len(notices) == 1
    assert len(commands) == 11 and commands[-1][0] == "notice"  # the notice comes last
    lines = item_lines(tasks)
    titles = []
    for _, props, message in errors:
        assert set(props) == {"file", "line", "title"}
        # The path GitHub links a file by: relative to the workspace, in the checkout.
        assert props["file"] == "suite/tasks.yaml"
        task, bracket, model = props["title"].partition(" [")
        assert bracket and model.endswith("]")
        model = model[:-1]
        assert model == "hosted_vllm/fake"
        assert int(props["line"]) == lines[task]
        assert message == "answer_contains:never: not in the final answer"
        titles.append(task)
    # One per task and model, not one per repeat, in plan order.
    assert titles == [f"task-{i:02d}" for i in range(10)]
    ((_, _, notice),) = notices
    assert notice.startswith("2 more task and model pair(s) did not pass; all 12 are in ")
    out = (tmp_path / "out").as_posix()
    assert notice.endswith(f"{out}/junit.xml and {out}/summary.md")
    # The step summary got the table; stderr carries no workflow command.
    title = on_github.read_text().splitlines()[0]  # the tasks file, as the annotations name it
    assert title.startswith("## mm-batch: ") and title.endswith("tasks\\.yaml")
    assert not any(line.startswith("::") for line in result.err.splitlines())


def test_a_task_whose_pass_rate_is_met_gets_no_error(
    cli: Cli, fake_model: Fake, tmp_path: Path, on_github: Path
) -> None:
    write(tmp_path, "agent.yaml", AGENT)
    tasks = write(
        tmp_path,
        "tasks.yaml",
        """
        agent: agent.yaml
        repeat: 3
        jobs: 1
        min_pass_rate: 0.6
        tasks:
          - id: flaky
            prompt: flaky
            expect: {answer_contains: [ok]}
          - id: broken
            prompt: broken
            expect: {answer_contains: [ok]}
        """,
    )
    flaky = itertools.cycle(["no, first time", "ok", "ok"])

    def script(request: dict[str, Any]) -> Any:
        prompt = next(m["content"] for m in request["messages"] if m["role"] == "user")
        return text(next(flaky) if prompt == "flaky" else "no")

    fake = fake_model(script)
    result = cli("run", tasks, *model_args(fake), "--out", tmp_path / "out", cwd=tmp_path)
    assert result.code == 1, result.err
    commands = [parse(line) for line in result.out.splitlines()]
    assert [(kind, props["title"]) for kind, props, _ in commands] == [
        ("error", "broken [hosted_vllm/fake]")
    ]
    assert commands[0][1]["line"] == str(item_lines(tasks)["broken"])


def test_the_reason_of_a_pair_is_its_first_failing_run() -> None:
    runs = [
        RunResult("t[m]#1", "t", "m", 1, "passed", "", (), 1.0, None, (), 7, 0),
        RunResult("t[m]#2", "t", "m", 2, "error", "timed out", (), 1.0, None, (), 7, 1),
        RunResult("t[m]#3", "t", "m", 3, "failed", "first\nfailure", (), 1.0, None, (), 7, 2),
        RunResult("t[m]#4", "t", "m", 4, "failed", "second", (), 1.0, None, (), 7, 3),
    ]
    (line,) = github_annotations(runs, "ci/tasks.yaml", 1.0, "out")
    # The pair failed (a failure outranks an error), so its reason is the first failure's.
    assert line == "::error file=ci/tasks.yaml,line=7,title=t [m]::first%0Afailure"
    only_errors = [r for r in runs if r.status != "failed"]
    (line,) = github_annotations(only_errors, "ci/tasks.yaml", 1.0, "out")
    assert line.endswith("::timed out")


def test_properties_and_messages_cannot_break_out_of_the_command() -> None:
    hostile = "bad\r\n::stop-commands::x %0A \x1b[2J"
    run = RunResult("t,x:y[m]#1", "t,x:y", "m::z", 1, "failed", hostile, (), 1.0, None, (), 3, 0)
    (line,) = github_annotations([run], "dir,a:b/tasks.yaml", 1.0, "out")
    assert "\r" not in line and "\n" not in line and "\x1b" not in line
    assert line.startswith(
        f"::error file={escape_property('dir,a:b/tasks.yaml')},line=3,"
        f"title={escape_property('t,x:y [m::z]')}::"
    )
    kind, props, message = parse(line)
    assert (kind, props["file"], props["title"]) == ("error", "dir,a:b/tasks.yaml", "t,x:y [m::z]")
    assert message == "bad\r\n::stop-commands::x %0A \\x1b[2J"


def test_no_annotations_when_all_pass() -> None:
    run = RunResult("t[m]#1", "t", "m", 1, "passed", "", (), 1.0, None, (), 3, 0)
    assert github_annotations([run], "tasks.yaml", 1.0, "out") == []
