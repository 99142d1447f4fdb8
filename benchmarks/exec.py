"""Cost of the Docker sandbox: one call through it vs a raw SDK exec_run vs the docker CLI.

Prints, measured side by side in one run (medians):
- one call of `true` through mm-batch's Docker executor, against `container.exec_run` of the
  SDK and `docker exec` of the CLI on the same container, with ratios;
- the per-task-run cost of starting the hardened container and of removing it.
Goal: the executor within 1.2x of the raw SDK exec.

Needs a running engine and the test image: containers/build.sh tiny.
Run: python benchmarks/exec.py [--calls N] [--image IMAGE]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from mm_batch.config.model import SandboxSpec
from mm_batch.effects.docker import DockerSandbox, connect


def timed(action: Callable[[], object]) -> float:
    started = time.perf_counter()
    action()
    return time.perf_counter() - started


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=50, help="calls of each kind (default 50)")
    parser.add_argument("--starts", type=int, default=10, help="container starts (default 10)")
    parser.add_argument("--image", default="mm-batch/sandbox:tiny")
    options = parser.parse_args()
    client = connect()
    spec = SandboxSpec(kind="docker", image=options.image)
    workdir = Path(tempfile.mkdtemp(prefix="mm-batch-bench-"))
    docker_cli = shutil.which("docker")
    try:
        sandbox = DockerSandbox(client, spec, workdir, "bench-exec")
        sandbox.start()
        container = sandbox.container

        def through_executor() -> None:
            assert sandbox.execute(["true"], workdir, {}, 30).exit_code == 0

        def raw_sdk() -> None:
            assert container.exec_run(["true"], user=spec.user).exit_code == 0

        def cli() -> None:
            assert docker_cli is not None
            subprocess.run(
                [docker_cli, "exec", "-u", spec.user, container.id, "true"],
                check=True,
                capture_output=True,
            )

        kinds: dict[str, list[float]] = {"executor": [], "sdk": [], "cli": []}
        for _ in range(options.calls):  # interleaved, so that noise falls on all alike
            kinds["executor"].append(timed(through_executor))
            kinds["sdk"].append(timed(raw_sdk))
            if docker_cli:
                kinds["cli"].append(timed(cli))
        sandbox.close()

        starts, removals = [], []
        for i in range(options.starts):
            box = DockerSandbox(client, spec, workdir, f"bench-start-{i}")
            starts.append(timed(box.start))
            removals.append(timed(box.close))
    finally:
        shutil.rmtree(workdir, ignore_errors=True)

    med = {k: statistics.median(v) for k, v in kinds.items() if v}
    print(
        f"call through the Docker executor   {med['executor'] * 1000:8.1f} ms  "
        f"(median of {options.calls})"
    )
    print(f"raw SDK exec_run                    {med['sdk'] * 1000:8.1f} ms")
    if "cli" in med:
        print(f"docker exec (CLI)                   {med['cli'] * 1000:8.1f} ms")
    ratio = med["executor"] / med["sdk"]
    print(
        f"executor / SDK                      {ratio:8.2f}    goal <= 1.20  "
        f"{'ok' if ratio <= 1.2 else 'MISSED'}"
    )
    if "cli" in med:
        print(f"executor / CLI                      {med['executor'] / med['cli']:8.2f}")
    print(
        f"start a hardened container          {statistics.median(starts) * 1000:8.1f} ms  "
        f"(median of {options.starts})"
    )
    print(f"remove it                           {statistics.median(removals) * 1000:8.1f} ms")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
