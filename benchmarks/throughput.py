"""Throughput of a batch against the fake model with a fixed latency per call.

Prints, for 500 task runs at jobs 1, 4 and 16: the wall time against the ideal (model time /
jobs) as a ratio. Then, at jobs 16 for a quarter, a half and all of that latency, the same
ratio beside the floor: bare litellm.completion calls from 16 threads with no mm-batch around
them, which is as fast as any caller of litellm in one interpreter can go. Then the peak memory
of batches of 1,000 and 5,000 runs (each in a fresh process, so the figures do not mix). Goals:
ratio <= 1.1 at jobs 16; memory flat in the number of runs. Each task run is one model turn
that answers without a tool call. litellm is imported before the first figure: its import is
start-up, not throughput, and is printed on its own.

The latency stands for the model's time per call. The default, 200 ms, is shorter than any
model's measured here (the packaged 0.5B model takes 1-2 s a turn): the ratio then shows what
the batch adds around the model. Much shorter latencies measure litellm instead: each call
costs it a few ms of CPU under one interpreter lock, and at 50 ms with 16 jobs that alone
keeps the floor near 1.4, with or without mm-batch around it.

First, issue 13's figure: 160 runs at jobs 16 against 50 ms a turn, as the span of the records'
`ts` (first record to last) over the ideal (runs x latency / jobs), beside the bare-litellm floor
measured the same way (first answer to last) in the same invocation; goal <= 1.25. `--span`
prints only that figure.

Run: python benchmarks/throughput.py [--latency 0.2] [--runs 500] [--span]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from pathlib import Path

from mm_batch.cli import main as mm_batch
from mm_batch.config.tasks import MAX_REPEAT
from mm_batch.effects.litellm import load_litellm


def tasks_file(directory: Path, runs: int) -> Path:
    """`runs` task runs: one task repeated, or several once the count is past `repeat`'s limit."""
    (directory / "agent.yaml").write_text("tools: []\n")
    tasks = -(-runs // MAX_REPEAT)
    assert runs % tasks == 0, f"{runs} runs cannot be split into {tasks} equal tasks"
    lines = ["agent: agent.yaml", f"repeat: {runs // tasks}", "tasks:"]
    lines += [f"  - {{id: t{n}, prompt: go}}" for n in range(tasks)]
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
    """Wall seconds of one `mm-batch run` (in this process); its terminal output goes nowhere."""
    return batch_run(runs, jobs, latency, lambda _out: None)


def records_span(runs: int, jobs: int, latency: float) -> float:
    """Seconds from the first record of one `mm-batch run` to its last, by their `ts`."""
    spans: list[float] = []

    def read(out: Path) -> None:
        lines = (out / "calls.jsonl").read_text().splitlines()
        stamps = [datetime.fromisoformat(json.loads(line)["ts"]) for line in lines]
        spans.append((max(stamps) - min(stamps)).total_seconds())

    batch_run(runs, jobs, latency, read)
    return spans[0]


def batch_run(runs: int, jobs: int, latency: float, inspect: Callable[[Path], None]) -> float:
    """Wall seconds of one `mm-batch run` (in this process), its results folder inspected."""
    server, url = fake_model(latency)
    try:
        with tempfile.TemporaryDirectory() as tmp, open(os.devnull, "w") as sink:
            tasks = tasks_file(Path(tmp), runs)
            args = ["run", str(tasks), "--model", "hosted_vllm/fake", "--jobs", str(jobs)]
            args += ["--model-option", f"api_base={url}", "--out", f"{tmp}/out"]
            started = time.perf_counter()
            with contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink):
                code = mm_batch(args)
            elapsed = time.perf_counter() - started
            assert code == 0, code
            inspect(Path(tmp) / "out")
            return elapsed
    finally:
        server.communicate("")


def bare_call(url: str) -> None:
    """One model call straight through litellm, as LiteLLMClient makes it, without mm-batch."""
    messages = [{"role": "user", "content": "go"}]
    load_litellm().completion(
        model="hosted_vllm/fake", messages=messages, api_base=url, num_retries=0
    )


def bare_litellm(runs: int, jobs: int, latency: float) -> float:
    """The floor: the same number of model calls from `jobs` threads, nothing else."""
    server, url = fake_model(latency)
    try:
        with ThreadPoolExecutor(jobs) as pool:
            started = time.perf_counter()
            list(pool.map(lambda _: bare_call(url), range(runs)))
            return time.perf_counter() - started
    finally:
        server.communicate("")


def bare_span(runs: int, jobs: int, latency: float) -> float:
    """The floor, measured as `records_span` is: from the first answer to the last."""
    server, url = fake_model(latency)
    answered: list[float] = []

    def call(_: int) -> None:
        bare_call(url)
        answered.append(time.monotonic())

    try:
        with ThreadPoolExecutor(jobs) as pool:
            list(pool.map(call, range(runs)))
        return max(answered) - min(answered)
    finally:
        server.communicate("")


def issue_figure(times: int = 5) -> None:
    """Issue 13: 160 runs, jobs 16, 50 ms a turn: records' span / ideal, beside the floor."""
    runs, jobs, latency = 160, 16, 0.05
    ours = ratios(records_span, runs, jobs, latency, times)
    floor = ratios(bare_span, runs, jobs, latency, times)
    goal = "ok" if statistics.median(ours) <= 1.25 else "MISSED"
    print(
        f"{runs} runs, jobs {jobs}, {latency * 1000:.0f} ms a turn, span / ideal (median of "
        f"{times}): mm-batch {shown(ours)}, bare litellm {shown(floor)}   goal <= 1.25 {goal}",
        flush=True,
    )


def litellm_cpu_ms(calls: int = 200) -> float:
    """litellm's own CPU per call, one call at a time, against a fake that answers at once."""
    server, url = fake_model(0.0)
    try:
        for _ in range(calls):  # warm: connection, caches
            bare_call(url)
        started = time.process_time()
        for _ in range(calls):
            bare_call(url)
        return (time.process_time() - started) / calls * 1000
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


def ratios(
    measure: Callable[[int, int, float], float], runs: int, jobs: int, latency: float, times: int
) -> list[float]:
    """Seconds `measure` gives over the ideal (model time / jobs), `times` times, sorted."""
    ideal = runs * latency / jobs
    return sorted(measure(runs, jobs, latency) / ideal for _ in range(times))


def shown(values: list[float]) -> str:
    """The median, with the range when there are several values."""
    spread = f" ({values[0]:.2f}-{values[-1]:.2f})" if len(values) > 1 else ""
    return f"{statistics.median(values):5.2f}{spread}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--latency", type=float, default=0.2, help="seconds per model call")
    parser.add_argument("--runs", type=int, default=500)
    parser.add_argument("--span", action="store_true", help="only issue 13's figure")
    options = parser.parse_args()
    runs, latency = options.runs, options.latency
    started = time.perf_counter()
    load_litellm()
    print(f"litellm import: {time.perf_counter() - started:.1f} s (start-up, not counted below)")
    print(f"litellm's own CPU per call: {litellm_cpu_ms():.2f} ms", flush=True)
    issue_figure()
    if options.span:
        return 0
    print(f"{runs} runs, {latency * 1000:.0f} ms per model call; ratio: wall / (model time / jobs)")
    for jobs, times in ((1, 1), (4, 1), (16, 5)):
        values = ratios(batch, runs, jobs, latency, times)
        goal = "ok" if statistics.median(values) <= 1.1 else "MISSED"
        line = f"jobs {jobs:2}: ratio {shown(values)}"
        print(line + (f"   goal <= 1.10 {goal}" if jobs == 16 else ""), flush=True)
    print("jobs 16, mm-batch against the floor (bare litellm from 16 threads), median of 3:")
    for each in (latency / 4, latency / 2, latency):
        ours = shown(ratios(batch, runs, 16, each, 3))
        floor = shown(ratios(bare_litellm, runs, 16, each, 3))
        print(f"  {each * 1000:4.0f} ms per call: mm-batch {ours}, floor {floor}", flush=True)
    for count in (1000, 5000):
        print(f"peak memory, {count:5} runs: {peak_rss_mb(count, latency):7.1f} MB", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
