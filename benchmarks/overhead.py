"""Overhead of mm-batch itself: one declared-tool call vs a bare subprocess.run, and start-up.

Prints, measured side by side in one run:
- the median time of one declared-tool call through the host executor (validation, argv
  rendering, process group, bounded capture) against `subprocess.run` of the same argv;
- the wall time of `mm-batch --help` and of `mm-batch validate` on the release example.
Goals: overhead ratio <= 1.2, `--help` under 0.3 s.

Run: python benchmarks/overhead.py [--calls N]
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from mm_batch.config.model import ParamSpec, ToolSpec
from mm_batch.effects.environment import host_environment
from mm_batch.effects.host import HostExecutor
from mm_batch.tools.declared import ValidCall, validate_call

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "release" / "tasks.yaml"


def median_s(action: Callable[[], object], n: int) -> float:
    samples = []
    for _ in range(n):
        started = time.perf_counter()
        action()
        samples.append(time.perf_counter() - started)
    return statistics.median(samples)


def tool_call_overhead(n: int) -> tuple[float, float]:
    program = shutil.which("printf") or "/usr/bin/printf"
    tool = ToolSpec(
        name="say",
        description="",
        params=(ParamSpec("word", "string", "", required=True),),
        command=(program, "%s\\n", "{{word}}"),
        workdir=ROOT,
    )
    executor = HostExecutor()
    raw = json.dumps({"word": "hello"})

    def through_mm_batch() -> None:
        call = validate_call(tool, raw)
        assert isinstance(call, ValidCall)
        result = executor.execute(call.argv, tool.workdir, {}, 30)
        assert result.exit_code == 0

    argv = [program, "%s\\n", "hello"]
    env = host_environment({})

    def bare() -> None:
        subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, check=True)

    # Interleave the two so that machine noise falls on both alike.
    mm, raw_times = [], []
    for _ in range(n):
        mm.append(median_s(through_mm_batch, 1))
        raw_times.append(median_s(bare, 1))
    return statistics.median(mm), statistics.median(raw_times)


def cli_wall_s(args: list[str], n: int) -> float:
    command = [sys.executable, "-m", "mm_batch", *args]
    return median_s(lambda: subprocess.run(command, capture_output=True, check=True), n)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=300, help="calls of each kind (default 300)")
    parser.add_argument("--starts", type=int, default=10, help="CLI starts (default 10)")
    options = parser.parse_args()
    mm, bare = tool_call_overhead(options.calls)
    ratio = mm / bare
    help_s = cli_wall_s(["--help"], options.starts)
    validate_s = cli_wall_s(["validate", str(EXAMPLE)], options.starts)
    print(f"declared-tool call via host executor  {mm * 1000:8.2f} ms  (median of {options.calls})")
    print(f"bare subprocess.run, same argv        {bare * 1000:8.2f} ms")
    print(
        f"overhead ratio                        {ratio:8.2f}    goal <= 1.20  "
        f"{'ok' if ratio <= 1.2 else 'MISSED'}"
    )
    print(
        f"mm-batch --help                       {help_s * 1000:8.1f} ms  goal < 300 ms  "
        f"{'ok' if help_s < 0.3 else 'MISSED'}"
    )
    print(f"mm-batch validate examples/release    {validate_s * 1000:8.1f} ms")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
