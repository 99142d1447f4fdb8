"""The held-out set (benchmarks/heldout): it validates, its tools are its own, and it judges
honestly: the exact expected calls pass every task, and each near miss fails every task."""

from __future__ import annotations

import functools
import os
import re
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from mm_batch.config.load import load_tasks
from mm_batch.config.model import AnyOf, CallExpectation, TaskSpec, ToolSpec, Value
from mm_batch.testing.fake_openai import Reply, Script, by_prompt, text, tool_call
from tests.helpers import ROOT, Cli, CliResult, Fake, model_args, read_calls

HELDOUT = ROOT / "benchmarks" / "heldout"
LOG = "heldout-received.log"
# Folders that are not the project's own text: history, installs, caches, results.
NOT_THE_PROJECT = {
    ".git",
    ".venv",
    "node_modules",
    "__pycache__",
    ".mypy_cache",
    ".ruff_cache",
    ".pytest_cache",
    ".hypothesis",
    "mm-batch-results",
    "seed-experiment-results",
}


@functools.cache
def heldout_tasks() -> tuple[TaskSpec, ...]:
    return load_tasks(HELDOUT / "tasks.yaml").tasks


def expected_call(task: TaskSpec) -> CallExpectation:
    assert task.expect is not None, task.id
    (call,) = task.expect.calls
    return call


def tool_of(task: TaskSpec) -> ToolSpec:
    tool = task.agent.tool(expected_call(task).tool)
    assert tool is not None, task.id
    return tool


def the_call(task: TaskSpec) -> dict[str, Any]:
    """The expected call as a model sends it: the tool's name and the expected arguments."""
    return tool_call(expected_call(task).tool, dict(expected_call(task).args or {}))


@pytest.fixture
def heldout(tmp_path: Path) -> Path:
    """A private copy of the set, so that its scripts log beside it."""
    target = tmp_path / "heldout"
    shutil.copytree(HELDOUT, target, ignore=shutil.ignore_patterns(LOG, "__pycache__"))
    return target


def run_set(cli: Cli, folder: Path, script: Script, fake_model: Fake, out: Path) -> CliResult:
    return cli("run", folder / "tasks.yaml", *model_args(fake_model(script)), "--out", out)


def verdicts(out: Path) -> dict[str, dict[str, Any]]:
    """Each task's record, by task id."""
    return {r["task"]: r for r in read_calls(out) if r["kind"] == "task"}


def test_the_set_validates_and_pins_one_exact_call_per_task(cli: Cli) -> None:
    result = cli("validate", HELDOUT / "tasks.yaml")
    assert result.code == 0, result.out + result.err
    tasks = heldout_tasks()
    assert len(tasks) >= 12
    languages = [t.id.rsplit("-", 1)[1] for t in tasks]
    assert {lang: languages.count(lang) >= 3 for lang in ("en", "fr", "de", "es")} == {
        "en": True,
        "fr": True,
        "de": True,
        "es": True,
    }
    for task in tasks:
        assert task.expect is not None and task.expect.check is not None, task.id
        assert expected_call(task).times == 1, task.id
        assert task.expect.check[0] == "./heldout_check.sh", task.id
    # Every kind of parameter the brief asks for is exercised by some expected call.
    kinds: set[str] = set()
    for task in tasks:
        tool = tool_of(task)
        for name in expected_call(task).args or {}:
            param = tool.param(name)
            assert param is not None, f"{task.id}: {name}"
            kinds.add("enum" if param.enum else param.type)
        kinds |= {
            "optional left out"
            for p in tool.params
            if not p.required and p.name not in (expected_call(task).args or {})
        }
    assert kinds >= {"enum", "integer", "boolean", "string", "optional left out"}


def _project_text_files() -> list[Path]:
    files = []
    for directory, subdirs, names in os.walk(ROOT):
        here = Path(directory)
        subdirs[:] = [
            d
            for d in subdirs
            if d not in NOT_THE_PROJECT and not d.endswith(".egg-info") and here / d != HELDOUT
        ]
        files += [here / n for n in names]
    return files


def test_every_tool_and_script_of_the_set_appears_nowhere_else() -> None:
    (agent,) = {t.agent.path: t.agent for t in heldout_tasks()}.values()
    names = {t.name for t in agent.tools} | {Path(t.command[0]).stem for t in agent.tools}
    assert len(names) >= 7
    word = re.compile(
        r"(?<![A-Za-z0-9_])(" + "|".join(map(re.escape, sorted(names))) + r")(?![A-Za-z0-9_])"
    )
    found = []
    for path in _project_text_files():
        try:
            content = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue  # binary files and dangling links hold no prompt or tool
        found += [f"{path.relative_to(ROOT)}: {m.group(1)}" for m in word.finditer(content)]
    assert found == [], "the held-out tools must be unseen by any tuning"


def test_the_exact_expected_calls_pass_every_task(
    cli: Cli, fake_model: Fake, heldout: Path, tmp_path: Path
) -> None:
    script = by_prompt({t.prompt: [the_call(t), text("Done.")] for t in heldout_tasks()})
    out = tmp_path / "out"
    result = run_set(cli, heldout, script, fake_model, out)
    assert result.code == 0, result.err
    runs = verdicts(out)
    assert {t.id: runs[t.id]["status"] for t in heldout_tasks()} == {
        t.id: "passed" for t in heldout_tasks()
    }
    for task in heldout_tasks():
        checks = {c["check"]: c["ok"] for c in runs[task.id]["checks"]}
        assert checks == {"calls[0]": True, "check": True}, task.id
    assert not (heldout / LOG).exists(), "each check clears the log for the next run"


def _near_value(value: Value, allowed: tuple[Value, ...] | None) -> Value:
    """A value one slip away: another allowed value, one more, the other truth, a next version."""
    if allowed:
        return next(v for v in allowed if v != value)
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return value + 1
    assert isinstance(value, str)
    if re.fullmatch(r"[0-9]+(\.[0-9]+)*", value):
        head, _, last = value.rpartition(".")
        return f"{head}.{int(last) + 1}" if head else str(int(last) + 1)
    return value.capitalize()


def wrong_value(task: TaskSpec) -> list[Reply]:
    """The right tool with its last argument one slip off (enum, integer, boolean or string)."""
    args = dict(expected_call(task).args or {})
    name = list(args)[-1]
    param = tool_of(task).param(name)
    assert param is not None
    value = args[name]
    assert not isinstance(value, AnyOf)  # the held-out set expects one value each
    args[name] = _near_value(value, param.enum)
    return [tool_call(expected_call(task).tool, args), text("Done.")]


def another_tool(task: TaskSpec) -> list[Reply]:
    """A well-formed call of a different tool: the expected call of the next task using one."""
    tasks = heldout_tasks()
    start = tasks.index(task)
    other = next(
        t
        for t in tasks[start + 1 :] + tasks[:start]
        if expected_call(t).tool != expected_call(task).tool
    )
    return [the_call(other), text("Done.")]


def called_twice(task: TaskSpec) -> list[Reply]:
    """The right call, another, then the right one again: a release tool would act twice.

    (The same call right after it succeeded is answered, not run: only a later one runs again.)
    """
    return [the_call(task), another_tool(task)[0], the_call(task), text("Done.")]


@pytest.mark.parametrize("near_miss", [wrong_value, another_tool, called_twice])
def test_each_near_miss_fails_every_task_on_both_pins(
    near_miss: Callable[[TaskSpec], list[Reply]],
    cli: Cli,
    fake_model: Fake,
    heldout: Path,
    tmp_path: Path,
) -> None:
    script = by_prompt({t.prompt: near_miss(t) for t in heldout_tasks()})
    out = tmp_path / "out"
    result = run_set(cli, heldout, script, fake_model, out)
    assert result.code == 1, result.err
    runs = verdicts(out)
    for task in heldout_tasks():
        assert runs[task.id]["status"] == "failed", task.id
        # The recorded call and the argv the script received each catch the slip on their own.
        checks = {c["check"]: c["ok"] for c in runs[task.id]["checks"]}
        assert checks == {"calls[0]": False, "check": False}, (task.id, runs[task.id]["checks"])


def test_an_optional_argument_the_request_leaves_out_is_pinned_by_the_argv(
    cli: Cli, fake_model: Fake, heldout: Path, tmp_path: Path
) -> None:
    """Expected args list only what the request says; the argv check catches an extra field."""
    cases = [
        (task, optional)
        for task in heldout_tasks()
        for optional in tool_of(task).params
        if not optional.required and optional.name not in (expected_call(task).args or {})
    ]
    assert cases, "the set has a task whose right call leaves an optional parameter out"
    for task, optional in cases:
        # Not the description's example (1.0.0), which is answered, not run: this one runs.
        extra = {**(expected_call(task).args or {}), optional.name: "2.0.1"}
        script = by_prompt({task.prompt: [tool_call(expected_call(task).tool, extra), text("ok")]})
        out = tmp_path / f"out-{task.id}"
        result = cli(
            "run",
            heldout / "tasks.yaml",
            *model_args(fake_model(script)),
            "--out",
            out,
            "--filter",
            task.id,
        )
        assert result.code == 1, result.err
        checks = {c["check"]: c["ok"] for c in verdicts(out)[task.id]["checks"]}
        assert checks == {"calls[0]": True, "check": False}, task.id
