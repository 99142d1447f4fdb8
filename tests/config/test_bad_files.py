"""Every bad file in tests/config/bad/ is refused with exactly the messages in its expected.txt."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from tests.conftest import CliResult

BAD = Path(__file__).parent / "bad"
CASES = sorted(p.name for p in BAD.iterdir() if p.is_dir())


def test_the_corpus_is_there() -> None:
    assert len(CASES) >= 12


@pytest.mark.parametrize("case", CASES)
def test_bad_file_is_refused_with_its_exact_message(
    case: str, cli: Callable[..., CliResult], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("MM_BATCH_TEST_UNSET_VAR", raising=False)
    monkeypatch.delenv("MM_BATCH_TEST_UNSET_TOKEN", raising=False)
    result = cli("validate", "tasks.yaml", cwd=BAD / case)
    assert result.code == 2
    assert result.err == (BAD / case / "expected.txt").read_text()
    assert result.out == ""


@pytest.mark.parametrize("case", ["program-from-parameter", "tasks-problems"])
def test_run_validates_first_and_runs_nothing(
    case: str, cli: Callable[..., CliResult], tmp_path: Path
) -> None:
    out = tmp_path / "out"
    result = cli("run", BAD / case / "tasks.yaml", "--out", out, "--model", "hosted_vllm/x")
    assert result.code == 2
    assert "configuration error(s); nothing ran" in result.err
    assert not out.exists()
