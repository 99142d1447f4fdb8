"""Every bad file in tests/config/bad/ is refused with exactly the messages in its expected.txt.

`validate` and `run` alike: exit 2, the same lines on stderr, no results folder, no model asked.
The cases that are attacks run in tests/adversarial/test_config_attacks.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from mm_batch.testing.fake_openai import FakeOpenAI
from tests.config.corpus import cases, marking_model, refused_everywhere
from tests.helpers import Cli

CASES = cases(attacks=False)
__all__ = ["marking_model"]  # the fixture, shared with the attack cases


def test_the_corpus_is_there() -> None:
    assert len(CASES) >= 18
    assert len(CASES) + len(cases(attacks=True)) >= 40


@pytest.mark.parametrize("case", CASES)
def test_bad_file_is_refused_with_its_exact_message(
    case: str,
    cli: Cli,
    marking_model: FakeOpenAI,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("MM_BATCH_TEST_UNSET_VAR", raising=False)
    monkeypatch.delenv("MM_BATCH_TEST_UNSET_TOKEN", raising=False)
    refused_everywhere(case, cli, marking_model, tmp_path)
