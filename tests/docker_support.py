"""Docker fixtures: the tests run against a real engine; in CI they must run, never skip."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest

from mm_batch.run.ports import SandboxError

TEST_IMAGE = "mm-batch/sandbox:tiny"
BASE_IMAGE = "mm-batch/sandbox:base"
# .ci/run sets this: there a missing engine or image fails the suite instead of skipping it.
REQUIRED = os.environ.get("MM_BATCH_REQUIRE_DOCKER") == "1"


def _unavailable(reason: str) -> None:
    if REQUIRED:
        pytest.fail(f"Docker is required here: {reason}")
    pytest.skip(reason)


@pytest.fixture(scope="session")
def docker_client() -> Iterator[Any]:
    from mm_batch.effects.docker import connect

    try:
        client = connect()
    except SandboxError as exc:
        _unavailable(str(exc))
    require_image(client, TEST_IMAGE)
    yield client
    client.close()


def containers_of(client: Any, run_prefix: str = "") -> list[Any]:
    """Containers of mm-batch runs (stopped ones too) whose run id starts with the prefix."""
    found = client.containers.list(all=True, filters={"label": "mm-batch"})
    return [c for c in found if c.labels.get("mm-batch.run", "").startswith(run_prefix)]


def require_image(client: Any, image: str) -> None:
    try:
        client.images.get(image)
    except Exception:
        _unavailable(f"image {image} is missing: run containers/build.sh {image.rsplit(':', 1)[1]}")
