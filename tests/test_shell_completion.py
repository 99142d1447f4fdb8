"""Shell completion, as docs/guides/ci.md documents it: the installed `mm-batch` program writes
click's completion script for bash, zsh and fish, and completes commands, options and choices."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

PROGRAM = Path(sys.executable).parent / "mm-batch"
GUIDE = Path(__file__).resolve().parent.parent / "docs" / "guides" / "ci.md"


def completion(**env: str) -> subprocess.CompletedProcess[str]:
    if not PROGRAM.exists():
        pytest.skip("mm-batch is not installed beside this Python (pip install -e .)")
    return subprocess.run(
        [str(PROGRAM)],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )


@pytest.mark.parametrize("shell", ["bash", "zsh", "fish"])
def test_the_program_writes_its_completion_script(shell: str) -> None:
    done = completion(_MM_BATCH_COMPLETE=f"{shell}_source")
    assert done.returncode == 0, done.stderr
    assert "_MM_BATCH_COMPLETE" in done.stdout and f"{shell}_complete" in done.stdout
    assert f"_MM_BATCH_COMPLETE={shell}_source mm-batch" in GUIDE.read_text()


def complete(words: str) -> list[str]:
    """What bash would offer for the last word of `words`."""
    parts = words.split(" ")
    done = completion(
        _MM_BATCH_COMPLETE="bash_complete", COMP_WORDS=words, COMP_CWORD=str(len(parts) - 1)
    )
    assert done.returncode == 0, done.stderr
    return [line.split(",", 1)[1] for line in done.stdout.splitlines()]


def test_commands_options_and_choices_complete() -> None:
    assert complete("mm-batch ru") == ["run"]
    assert "--sandbox" in complete("mm-batch run --sa")
    assert complete("mm-batch run tasks.yaml --sandbox ") == ["host", "docker"]


def test_the_bash_script_sources_in_bash() -> None:
    bash = shutil.which("bash")
    assert bash is not None
    script = completion(_MM_BATCH_COMPLETE="bash_source").stdout
    done = subprocess.run(
        [bash, "--norc", "-c", f"{script}\ncomplete -p mm-batch"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "_mm_batch_completion" in done.stdout
