"""The reports in their five shapes, made once a test session (see shapes.py)."""

from __future__ import annotations

import pytest

from tests.consumers.shapes import Reports, build


@pytest.fixture(scope="session")
def reports(tmp_path_factory: pytest.TempPathFactory) -> Reports:
    return build(tmp_path_factory.mktemp("checkout"))
