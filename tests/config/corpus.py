"""The bad-file corpus: each case folder holds a tasks.yaml, its agent files and expected.txt."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from mm_batch.testing.fake_openai import FakeOpenAI, tool_call
from tests.helpers import Cli

BAD = Path(__file__).parent / "bad"
ATTACK = "attack-"  # cases that are attacks are tested in tests/adversarial/


def cases(*, attacks: bool) -> list[str]:
    names = sorted(p.name for p in BAD.iterdir() if p.is_dir())
    return [n for n in names if n.startswith(ATTACK) == attacks]


@pytest.fixture(scope="module")
def marking_model() -> Iterator[FakeOpenAI]:
    """One fake model for a module's cases: it asks for the `mark` tool at every turn."""
    with FakeOpenAI(lambda request: tool_call("mark", {})) as server:
        yield server


def refused_everywhere(case: str, cli: Cli, server: FakeOpenAI, tmp_path: Path) -> None:
    """Assert `validate` and `run` refuse the case with its exact message, and nothing ran.

    The fake model asks for the `mark` tool at every turn, so a file that got through would
    leave a MARK file; the model must not even be asked.
    """
    folder = BAD / case
    expected = (folder / "expected.txt").read_text(encoding="utf-8")
    checked = cli("validate", "tasks.yaml", cwd=folder)
    assert (checked.code, checked.out, checked.err) == (2, "", expected)

    copy = tmp_path / case
    shutil.copytree(folder, copy)
    out = tmp_path / "out"
    args: list[str | Path] = ["run", "tasks.yaml", "--out", out]
    if "models:" not in (folder / "tasks.yaml").read_text(encoding="utf-8", errors="replace"):
        args += ["--model", "hosted_vllm/fake"]
    ran = cli(*args, "--model-option", f"api_base={server.url}", cwd=copy)
    assert (ran.code, ran.out, ran.err) == (2, "", expected)
    assert not out.exists(), "a results folder was written"
    assert server.requests == [], "the model was asked"
    assert not list(copy.rglob("MARK*")), "a tool ran"
