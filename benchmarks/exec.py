"""Cost of the Docker sandbox: one call through it vs a raw SDK exec_run vs the docker CLI.

Prints, measured side by side in one run (medians):
- one call of `true` through mm-batch's Docker executor, against `container.exec_run` of the
  SDK and `docker exec` of the CLI on the same container, with ratios. Calls are spaced by a
  pause, as a model turn spaces them: after a call returns, off the caller's path, the verified
  sweep (a root exec that kills every process of the tools' uid and confirms none is left) and
  the next call's fresh HOME (an exec that empties /tmp and makes it) run, and the next call
  waits for both; back-to-back calls (no pause) show their cost too;
- what the fresh HOME adds to a call: the same calls through a second executor that only
  sweeps (HOME kept), spaced and back to back;
- the per-task-run cost of starting the hardened container (with a `readonly` workspace, and
  with the default `copy` of examples/release: the difference is what the copy adds) and of
  removing it.
Goals: a call through the verified sweep within 1.2x of the raw SDK exec when spaced like a
model turn; the fresh HOME adds at most 20 ms to such a call; the copy adds at most 50 ms to a
start.

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
from dataclasses import replace
from pathlib import Path
from typing import Any

from mm_batch.config.model import SandboxSpec
from mm_batch.effects.docker import DockerSandbox, connect

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "release"


def timed(action: Callable[[], object]) -> float:
    started = time.perf_counter()
    action()
    return time.perf_counter() - started


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=50, help="calls of each kind (default 50)")
    parser.add_argument("--starts", type=int, default=10, help="container starts (default 10)")
    parser.add_argument("--image", default="mm-batch/sandbox:tiny")
    parser.add_argument(
        "--pause",
        type=float,
        default=0.5,
        help="seconds between calls, as a model turn (a local 1.5B takes 2.5-3.5 s)",
    )
    options = parser.parse_args()
    client = connect()
    spec = SandboxSpec(kind="docker", image=options.image, workspace="readonly")
    workdir = Path(tempfile.mkdtemp(prefix="mm-batch-bench-"))
    docker_cli = shutil.which("docker")
    try:
        sandbox = DockerSandbox(client, spec, workdir, "bench-exec")
        sandbox.start()
        container: Any = sandbox.container  # the SDK's: exec_run is none of mm-batch's requests

        same_home = DockerSandbox(client, spec, workdir, "bench-exec-same-home")
        same_home.fresh_home_per_call = False
        same_home.start()

        def through_executor() -> None:
            assert sandbox.execute(["true"], workdir, {}, 30).exit_code == 0

        def home_kept() -> None:
            assert same_home.execute(["true"], workdir, {}, 30).exit_code == 0

        def raw_sdk() -> None:
            assert container.exec_run(["true"], user=spec.user).exit_code == 0

        def cli() -> None:
            assert docker_cli is not None
            subprocess.run(
                [docker_cli, "exec", "-u", spec.user, container.id, "true"],
                check=True,
                capture_output=True,
            )

        kinds: dict[str, list[float]] = {
            "executor": [],
            "sdk": [],
            "cli": [],
            "burst": [],
            "kept": [],
            "kept-burst": [],
        }
        for _ in range(options.calls):  # interleaved, so that noise falls on all alike
            time.sleep(options.pause)
            kinds["executor"].append(timed(through_executor))
            time.sleep(options.pause)
            kinds["kept"].append(timed(home_kept))
            time.sleep(options.pause)
            kinds["sdk"].append(timed(raw_sdk))
            if docker_cli:
                time.sleep(options.pause)
                kinds["cli"].append(timed(cli))
        time.sleep(options.pause)
        for _ in range(options.calls):
            kinds["burst"].append(timed(through_executor))
        time.sleep(options.pause)
        for _ in range(options.calls):
            kinds["kept-burst"].append(timed(home_kept))
        sandbox.close()
        same_home.close()

        copy_spec = replace(spec, workspace="copy")
        starts: dict[str, list[float]] = {"readonly": [], "copy": []}
        removals = []
        for i in range(options.starts):
            for name, box_spec, folder in (
                ("readonly", spec, EXAMPLE),
                ("copy", copy_spec, EXAMPLE),
            ):
                box = DockerSandbox(client, box_spec, folder, f"bench-start-{name}-{i}")
                starts[name].append(timed(box.start))
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
    home = med["executor"] - med["kept"]
    print(
        f"what the fresh HOME adds a call     {home * 1000:8.1f} ms  goal <= 20 ms  "
        f"{'ok' if home <= 0.02 else 'MISSED'}  (spaced; HOME kept: {med['kept'] * 1000:.1f} ms)"
    )
    print(
        f"back-to-back calls (sweep waited)   {med['burst'] * 1000:8.1f} ms  "
        f"({med['burst'] / med['sdk']:.2f}x the SDK: no model turn to hide the sweep in)"
    )
    print(
        f"back-to-back, HOME kept             {med['kept-burst'] * 1000:8.1f} ms  "
        f"(the fresh HOME's exec adds {(med['burst'] - med['kept-burst']) * 1000:.1f} ms "
        "when nothing hides it)"
    )
    if "cli" in med:
        print(f"executor / CLI                      {med['executor'] / med['cli']:8.2f}")
    readonly, copy = (statistics.median(starts[k]) for k in ("readonly", "copy"))
    print(
        f"start a hardened container          {readonly * 1000:8.1f} ms  "
        f"(workspace: readonly, median of {options.starts})"
    )
    print(f"start with workspace: copy          {copy * 1000:8.1f} ms  (examples/release)")
    added = copy - readonly
    print(
        f"what the copy adds                  {added * 1000:8.1f} ms  goal <= 50 ms  "
        f"{'ok' if added <= 0.05 else 'MISSED'}"
    )
    print(f"remove it                           {statistics.median(removals) * 1000:8.1f} ms")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
