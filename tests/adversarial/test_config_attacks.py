"""Hostile configuration files: refused with an exact message, cheaply, before anything runs.

Each case goes through `validate` and `run`: exit 2, the same message on stderr, no results
folder, the model never asked and no MARK left by the `mark` tool a fake model keeps asking
for. Alias bombs, deep nesting and huge numbers are refused from the event stream, before any
node is built: asserted by construction, not by a stopwatch. PyYAML reads each file at most once
a command, in one pass over its events (none over MAX_FILE_BYTES), and builds nodes only from a
file with no alias, no anchor and no nesting past MAX_DEPTH, whose tree any walk then reads in
time linear in its size. `python benchmarks/hostile_inputs.py` times the cases.
"""

from __future__ import annotations

import os
import stat
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml

from mm_batch.config.hostile import MAX_DEPTH
from mm_batch.config.yamlnodes import MAX_FILE_BYTES
from mm_batch.testing.fake_openai import FakeOpenAI
from tests.config.corpus import cases, marking_model, refused_everywhere
from tests.helpers import Cli, write

__all__ = ["marking_model"]  # the fixture: one fake model for the module
ATTACKS = cases(attacks=True)
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


@dataclass
class YamlWork:
    """The texts PyYAML was given while mm-batch ran: read as events, and built into nodes."""

    parsed: list[str] = field(default_factory=list)
    composed: list[str] = field(default_factory=list)

    def check(self, commands: int) -> None:
        """Each text read in one pass at most once a command, none over MAX_FILE_BYTES, and
        nodes built only from a harmless one."""
        sizes = [len(t.encode("utf-8", "surrogatepass")) for t in self.parsed]
        assert max(sizes, default=0) <= MAX_FILE_BYTES, f"a text of {max(sizes)} bytes parsed"
        assert max(Counter(self.parsed).values(), default=0) <= commands, "a file read twice"
        assert max(Counter(self.composed).values(), default=0) <= commands, "a file built twice"
        for text in self.composed:
            assert text in self.parsed, "nodes built from a text whose events were never read"
            aliases, depth = _shape(text)
            assert not aliases, "nodes built from a file with an alias or an anchor"
            assert depth <= MAX_DEPTH, f"nodes built from a file nested {depth} deep"


YAML_PARSE, YAML_COMPOSE = yaml.parse, yaml.compose


def _shape(text: str) -> tuple[bool, int]:
    """Whether the text's events hold an alias or an anchor, and its deepest nesting."""
    aliases, depth, deepest = False, 0, 0
    for event in YAML_PARSE(text, Loader=yaml.SafeLoader):
        if isinstance(event, yaml.AliasEvent) or getattr(event, "anchor", None) is not None:
            aliases = True
        if isinstance(event, yaml.CollectionStartEvent):
            depth += 1
            deepest = max(deepest, depth)
        elif isinstance(event, yaml.CollectionEndEvent):
            depth -= 1
    return aliases, deepest


@pytest.fixture
def yaml_work(monkeypatch: pytest.MonkeyPatch) -> YamlWork:
    """What PyYAML is given during the test (mm-batch runs in-process)."""
    work = YamlWork()

    def parse(stream: str, Loader: type[yaml.SafeLoader]) -> Iterator[yaml.Event]:  # noqa: N803
        work.parsed.append(stream)
        return YAML_PARSE(stream, Loader=Loader)

    def compose(stream: str, Loader: type[yaml.SafeLoader]) -> yaml.Node | None:  # noqa: N803
        work.composed.append(stream)
        return YAML_COMPOSE(stream, Loader=Loader)

    monkeypatch.setattr(yaml, "parse", parse)
    monkeypatch.setattr(yaml, "compose", compose)
    return work


@pytest.mark.parametrize("case", ATTACKS)
def test_hostile_file_is_refused_fast_and_nothing_runs(
    case: str, cli: Cli, marking_model: FakeOpenAI, tmp_path: Path, yaml_work: YamlWork
) -> None:
    refused_everywhere(case, cli, marking_model, tmp_path)
    assert yaml_work.parsed, "no file was read"
    yaml_work.check(commands=2)  # validate, then run


def _refused(
    cli: Cli, server: FakeOpenAI, folder: Path, expected: list[str], work: YamlWork
) -> None:
    """validate and run both refuse the folder's tasks.yaml with these lines; nothing ran, and
    what PyYAML was given passes `YamlWork.check`."""
    lines = [*expected, f"mm-batch: {len(expected)} configuration error(s); nothing ran"]
    checked = cli("validate", "tasks.yaml", cwd=folder)
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
    work.check(commands=2)


def test_a_2_mib_tasks_file_is_refused_before_parsing(
    cli: Cli, marking_model: FakeOpenAI, tmp_path: Path, yaml_work: YamlWork
) -> None:
    write(tmp_path, "agent.yaml", MARK_AGENT)
    # Valid YAML throughout: only its size can refuse it.
    write(tmp_path, "tasks.yaml", TASKS + "# padding\n" * (2 * 1024 * 1024 // 10))
    _refused(
        cli,
        marking_model,
        tmp_path,
        [f"tasks.yaml:1: {TOO_BIG}"],
        yaml_work,
    )


def test_a_2_mib_agent_file_is_refused_before_parsing(
    cli: Cli, marking_model: FakeOpenAI, tmp_path: Path, yaml_work: YamlWork
) -> None:
    write(tmp_path, "agent.yaml", MARK_AGENT + "# padding\n" * (2 * 1024 * 1024 // 10))
    write(tmp_path, "tasks.yaml", TASKS)
    _refused(
        cli,
        marking_model,
        tmp_path,
        [f"agent.yaml:1: {TOO_BIG}"],
        yaml_work,
    )


def test_an_endless_file_is_not_read_at_all(cli: Cli, monkeypatch: pytest.MonkeyPatch) -> None:
    """A device is no regular file (SPEC 1): refused before a byte of it is read."""
    read_from: list[int] = []  # the mode of each file descriptor read while mm-batch ran
    read = os.read

    def counted(fd: int, n: int) -> bytes:
        read_from.append(os.fstat(fd).st_mode)
        return read(fd, n)

    monkeypatch.setattr(os, "read", counted)
    result = cli("validate", "/dev/zero")
    assert not [mode for mode in read_from if not stat.S_ISREG(mode)], "a device was read"
    assert result.code == 2
    assert result.err.splitlines()[0] == (
        "/dev/zero:1: cannot read the file: a character device, not a regular file: "
        "mm-batch reads only regular files"
    )


def test_3000_deep_mappings_are_refused_without_recursion(
    cli: Cli, marking_model: FakeOpenAI, tmp_path: Path, yaml_work: YamlWork
) -> None:
    write(tmp_path, "agent.yaml", MARK_AGENT + "model_options: " + "{a: " * 3000 + "1" + "}" * 3000)
    write(tmp_path, "tasks.yaml", TASKS)
    path = "model_options" + ".a" * 63  # the 65th collection: the top mapping is the 1st
    _refused(
        cli,
        marking_model,
        tmp_path,
        [f"agent.yaml:7: {path}: nested deeper than 64 levels of mappings and lists"],
        yaml_work,
    )


def test_a_secret_that_cannot_be_encoded_is_refused_without_showing_it(
    cli: Cli,
    marking_model: FakeOpenAI,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    yaml_work: YamlWork,
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
        yaml_work,
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
