"""Throughput of a batch against the fake model with a fixed latency per call.

Prints, for 500 task runs at jobs 1, 4 and 16: the wall time against the ideal (model time /
jobs) as a ratio; then the peak memory of batches of 1,000 and 5,000 runs (each in a fresh
process, so the figures do not mix). Goals: ratio <= 1.1 at jobs 16; memory flat in the number
of runs. Each task run is one model turn that answers without a tool call.

Run: python benchmarks/throughput.py [--latency 0.05]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from mm_batch.cli import main as mm_batch


def tasks_file(directory: Path, runs: int) -> Path:
    (directory / "agent.yaml").write_text("tools: []\n")
    lines = ["agent: agent.yaml", f"repeat: {runs}", "tasks:", "  - {id: t, prompt: go}"]
    path = directory / "tasks.yaml"
    path.write_text("\n".join(lines) + "\n")
    return path


def fake_model(latency: float) -> tuple[subprocess.Popen[str], str]:
    """The fake model in a process of its own, so that its work is not counted as mm-batch's."""
    code = (
        "import sys, time\n"
        "from mm_batch.testing.fake_openai import FakeOpenAI, text\n"
        f"with FakeOpenAI(lambda _r: text('ok'), {latency!r}) as fake:\n"
        "    print(fake.url, flush=True)\n"
        "    sys.stdin.read()\n"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None
    return proc, proc.stdout.readline().strip()


def batch(runs: int, jobs: int, latency: float) -> float:
    server, url = fake_model(latency)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            tasks = tasks_file(Path(tmp), runs)
            started = time.perf_counter()
            code = mm_batch(
                [
                    "run",
                    str(tasks),
                    "--model",
                    "hosted_vllm/fake",
                    "--model-option",
                    f"api_base={url}",
                    "--jobs",
                    str(jobs),
                    "--out",
                    f"{tmp}/out",
                ]
            )
            elapsed = time.perf_counter() - started
            assert code == 0, code
            return elapsed
    finally:
        server.communicate("")


def peak_rss_mb(runs: int, latency: float) -> float:
    """Run one batch in a fresh process; its peak resident memory in MB."""
    here = str(Path(__file__).parent)
    code = (
        f"import resource, sys\nsys.path.insert(0, {here!r})\nfrom throughput import batch\n"
        f"batch({runs}, 16, {latency!r})\n"
        "print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return int(done.stdout.strip().splitlines()[-1]) / 1024


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--latency", type=float, default=0.05, help="seconds per model call")
    parser.add_argument("--runs", type=int, default=500)
    options = parser.parse_args()
    print(f"{options.runs} runs, {options.latency * 1000:.0f} ms per model call", flush=True)
    for jobs in (1, 4, 16):
        wall = batch(options.runs, jobs, options.latency)
        ideal = options.runs * options.latency / jobs
        print(
            f"jobs {jobs:2}: wall {wall:7.2f} s, ideal {ideal:6.2f} s, ratio {wall / ideal:5.2f}"
            + (
                "   goal <= 1.10 " + ("ok" if wall / ideal <= 1.1 else "MISSED")
                if jobs == 16
                else ""
            ),
            flush=True,
        )
    for runs in (1000, 5000):
        print(
            f"peak memory, {runs:5} runs: {peak_rss_mb(runs, options.latency):7.1f} MB", flush=True
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
