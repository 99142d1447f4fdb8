"""Hostile configuration files: refused with an exact message, fast, before anything runs.

Each case goes through `validate` and `run`: exit 2, the same message on stderr, no results
folder, the model never asked and no MARK left by the `mark` tool a fake model keeps asking
for. Alias bombs, deep nesting and huge numbers are refused from the event stream, before any
node is built: each in well under a second (asserted loosely, < 2 s).
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from mm_batch.testing.fake_openai import FakeOpenAI
from tests.config.corpus import cases, marking_model, refused_everywhere
from tests.helpers import Cli, write

__all__ = ["marking_model"]  # the fixture: one fake model for the module
ATTACKS = cases(attacks=True)
MAX_SECONDS = 2.0
MARK_AGENT = """\
model: hosted_vllm/fake
yolo: true
tools:
  - name: mark
    description: Leave a marker.
    command: ["touch", "MARK"]
"""
TASKS = "agent: agent.yaml\ntasks: [{id: t1, prompt: p}]\n"
TOO_BIG = "the file is over 1 MiB; mm-batch reads files of at most 1 MiB (1048576 bytes)"


def test_every_attack_of_the_issue_has_a_case() -> None:
    wanted = {
        "attack-alias-bomb",
        "attack-recursive-alias",
        "attack-deep-nesting",
        "attack-4301-digit-integer",
        "attack-5000-digit-model-option",
        "attack-nul-in-argv",
        "attack-nul-in-workdir",
        "attack-nul-in-env",
        "attack-surrogate-in-path",
        "attack-equals-in-env-name",
        "attack-tasks-file-without-tasks",
        "attack-uid-0-spellings",
        "attack-tool-bash-rule",
    }
    assert wanted <= set(ATTACKS)


@pytest.mark.parametrize("case", ATTACKS)
def test_hostile_file_is_refused_fast_and_nothing_runs(
    case: str, cli: Cli, marking_model: FakeOpenAI, tmp_path: Path
) -> None:
    seconds = refused_everywhere(case, cli, marking_model, tmp_path)
    assert seconds < MAX_SECONDS


def _refused(cli: Cli, server: FakeOpenAI, folder: Path, expected: list[str]) -> None:
    """validate and run both refuse the folder's tasks.yaml with these lines; nothing ran."""
    lines = [*expected, f"mm-batch: {len(expected)} configuration error(s); nothing ran"]
    started = time.monotonic()
    checked = cli("validate", "tasks.yaml", cwd=folder)
    assert time.monotonic() - started < MAX_SECONDS
    assert (checked.code, checked.out, checked.err.splitlines()) == (2, "", lines)
    out = folder.parent / "out"
    ran = cli(
        "run",
        "tasks.yaml",
        "--out",
        out,
        "--model",
        "hosted_vllm/fake",
        "--model-option",
        f"api_base={server.url}",
        cwd=folder,
    )
    assert (ran.code, ran.out, ran.err.splitlines()) == (2, "", lines)
    assert not out.exists() and server.requests == [] and not (folder / "MARK").exists()


def test_a_2_mib_tasks_file_is_refused_before_parsing(
    cli: Cli, marking_model: FakeOpenAI, tmp_path: Path
) -> None:
    write(tmp_path, "agent.yaml", MARK_AGENT)
    # Valid YAML throughout: only its size can refuse it.
    write(tmp_path, "tasks.yaml", TASKS + "# padding\n" * (2 * 1024 * 1024 // 10))
    _refused(
        cli,
        marking_model,
        tmp_path,
        [f"tasks.yaml:1: {TOO_BIG}"],
    )


def test_a_2_mib_agent_file_is_refused_before_parsing(
    cli: Cli, marking_model: FakeOpenAI, tmp_path: Path
) -> None:
    write(tmp_path, "agent.yaml", MARK_AGENT + "# padding\n" * (2 * 1024 * 1024 // 10))
    write(tmp_path, "tasks.yaml", TASKS)
    _refused(
        cli,
        marking_model,
        tmp_path,
        [f"agent.yaml:1: {TOO_BIG}"],
    )


def test_an_endless_file_is_not_read_at_all(cli: Cli) -> None:
    """A device is no regular file (SPEC 1): refused before a byte of it is read."""
    started = time.monotonic()
    result = cli("validate", "/dev/zero")
    assert time.monotonic() - started < MAX_SECONDS
    assert result.code == 2
    assert result.err.splitlines()[0] == (
        "/dev/zero:1: cannot read the file: a character device, not a regular file: "
        "mm-batch reads only regular files"
    )


def test_3000_deep_mappings_are_refused_without_recursion(
    cli: Cli, marking_model: FakeOpenAI, tmp_path: Path
) -> None:
    write(tmp_path, "agent.yaml", MARK_AGENT + "model_options: " + "{a: " * 3000 + "1" + "}" * 3000)
    write(tmp_path, "tasks.yaml", TASKS)
    path = "model_options" + ".a" * 63  # the 65th collection: the top mapping is the 1st
    _refused(
        cli,
        marking_model,
        tmp_path,
        [f"agent.yaml:7: {path}: nested deeper than 64 levels of mappings and lists"],
    )


def test_a_secret_that_cannot_be_encoded_is_refused_without_showing_it(
    cli: Cli, marking_model: FakeOpenAI, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A byte that is no UTF-8 reaches os.environ as a lone surrogate.
    monkeypatch.setenv("MM_BATCH_TEST_TOKEN", "s3cr3t-\udcff-value")
    write(tmp_path, "agent.yaml", MARK_AGENT + '    env: {TOKEN: "${MM_BATCH_TEST_TOKEN}"}\n')
    write(tmp_path, "tasks.yaml", TASKS)
    _refused(
        cli,
        marking_model,
        tmp_path,
        [
            "agent.yaml:7: tools[0].env.TOKEN: the value of ${MM_BATCH_TEST_TOKEN}: a character "
            "that cannot be encoded (\\udcff, a lone surrogate) is refused"
        ],
    )


def test_an_agent_file_given_to_run_is_refused(
    cli: Cli, marking_model: FakeOpenAI, tmp_path: Path
) -> None:
    write(tmp_path, "agent.yaml", MARK_AGENT)
    checked = cli("validate", "agent.yaml", cwd=tmp_path)
    assert (checked.code, checked.out) == (0, "agent.yaml: agent file, 1 declared tool: fine\n")
    message = [
        "agent.yaml:1: this is an agent file, not a tasks file (a tasks file has a top-level "
        "'tasks' key): give the tasks file that names it",
        "mm-batch: 1 configuration error(s); nothing ran",
    ]
    out = tmp_path / "out"
    for command in (["plan"], ["run", "--out", str(out)]):
        result = cli(
            *command,
            "agent.yaml",
            "--model",
            "hosted_vllm/fake",
            "--model-option",
            f"api_base={marking_model.url}",
            cwd=tmp_path,
        )
        assert (result.code, result.out, result.err.splitlines()) == (2, "", message)
    assert not out.exists() and marking_model.requests == [] and not (tmp_path / "MARK").exists()


def test_models_sharing_a_junit_classname_are_refused_by_run_plan_and_validate(
    cli: Cli, marking_model: FakeOpenAI, tmp_path: Path
) -> None:
    write(tmp_path, "agent.yaml", MARK_AGENT)
    write(tmp_path, "tasks.yaml", TASKS)
    message = (
        "mm-batch: the models 'hosted_vllm/m.1' and 'hosted_vllm/m_1' would share the JUnit "
        "classname 'tasks.hosted_vllm_m_1' ('.' and '/' become '_'): run them in separate "
        "plans or rename one; nothing ran\n"
    )
    models = ["--model", "hosted_vllm/m.1", "--model", "hosted_vllm/m_1"]
    out = tmp_path / "out"
    api_base = f"api_base={marking_model.url}"
    for command in (["plan"], ["run", "--out", str(out)]):
        result = cli(*command, "tasks.yaml", *models, "--model-option", api_base, cwd=tmp_path)
        assert (result.code, result.out, result.err) == (2, "", message)
    write(tmp_path, "tasks.yaml", TASKS + "models: [hosted_vllm/m.1, hosted_vllm/m_1]\n")
    assert cli("validate", "tasks.yaml", cwd=tmp_path).err == message
    assert not out.exists() and marking_model.requests == [] and not (tmp_path / "MARK").exists()
