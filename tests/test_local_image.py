"""The image with mm-batch, llama.cpp's server and the embedded models in it
(mm-batch/mm-batch:local, built by `containers/build.sh mm-batch-local`): the README's first
command passes the release example inside it, with no network."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from mm_batch.config.local_catalog import CATALOG
from tests.helpers import EXAMPLE, LIVE_REQUIRED, check_report

LOCAL_IMAGE = "mm-batch/mm-batch:local"
DEFAULT_MODEL = "local/qwen2.5-coder-1.5b"  # what `mm-batch run` uses with no model named


def _docker_with_image() -> str:
    """The docker client, when the engine answers and the image is built; else skip (fail in CI)."""
    docker = shutil.which("docker")
    if docker is None:
        reason = "no docker client here"
    elif subprocess.run(
        [docker, "image", "inspect", LOCAL_IMAGE], capture_output=True, check=False
    ).returncode:
        reason = f"{LOCAL_IMAGE} is not built here (containers/build.sh mm-batch-local)"
    else:
        return docker
    if LIVE_REQUIRED:
        pytest.fail(f"MM_BATCH_REQUIRE_LIVE=1: {reason}", pytrace=False)
    pytest.skip(reason)


@pytest.mark.docker
@pytest.mark.live
def test_the_local_image_passes_the_release_example_offline(tmp_path: Path) -> None:
    """README command 1 (`mm-batch run examples/release/tasks.yaml`, no flags) in the image, as a
    CI job runs it on a checkout: no network, so the server and the model must be inside it."""
    docker = _docker_with_image()
    checkout = tmp_path / "project"
    shutil.copytree(
        EXAMPLE, checkout / "examples" / "release", ignore=shutil.ignore_patterns("*.log")
    )
    # Not as root: the image serves any uid (`docker run --user`; CI runners use root).
    user = f"{os.getuid()}:{os.getgid()}" if os.getuid() else "1000:1000"
    for path in [checkout, *checkout.rglob("*")]:
        path.chmod(path.stat().st_mode | (0o777 if path.is_dir() else 0o666))
    done = subprocess.run(
        [
            docker, "run", "--rm", "--network", "none", "--user", user,
            "-v", f"{checkout}:/builds/project", "-w", "/builds/project",
            # As the GitLab component sets it: the models are still the image's own.
            "-e", "MM_BATCH_CACHE=/builds/project/.cache/mm-batch",
            LOCAL_IMAGE,
            "mm-batch", "run", "examples/release/tasks.yaml",
        ],
        capture_output=True,
        text=True,
        check=False,
        timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"{DEFAULT_MODEL} ready in" in done.stderr
    results = checkout / "mm-batch-results"
    check_report(results / "junit.xml")
    summary = json.loads((results / "summary.json").read_text())
    assert summary["exit_code"] == 0
    assert [(m["model"], m["passed"], m["runs"]) for m in summary["models"]] == [
        (DEFAULT_MODEL, 6, 6)
    ]
    # The model that answered is the catalogue's, byte for byte.
    name = DEFAULT_MODEL.removeprefix("local/")
    assert summary["provenance"][f"sha256:{DEFAULT_MODEL}"] == CATALOG[name].sha256
    assert list(checkout.glob(".cache/mm-batch/models/*.gguf")) == []  # none assembled again
    junit = (results / "junit.xml").read_text()
    assert '<testsuites tests="6" failures="0" errors="0"' in junit
    # The release scripts really ran, inside the container, on the mounted checkout.
    assert (checkout / "examples" / "release" / "calls-received.log").read_text()
