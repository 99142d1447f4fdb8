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

`--tools` prints only issue 31's figure: 160 tool-using runs at jobs 16 against 200 ms a turn
(the first turn calls a declared host tool, `true`; the second answers), as the span of the
records' `ts` over the ideal (runs x 2 turns x latency / jobs), beside the same runs without a
tool (one turn each, so their ideal is half); goal <= 1.25 for the tool-using runs. `--latency`
changes the 200 ms.

Run: python benchmarks/throughput.py [--latency 0.2] [--runs 500] [--span] [--tools]
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
from typing import Any

from mm_batch.cli import main as mm_batch
from mm_batch.config.tasks import MAX_REPEAT
from mm_batch.effects.litellm import load_litellm

# A declared host tool that does nothing, allowed without asking: each call starts a process.
TOOL_AGENT = """\
allow:
  - tool: noop
tools:
  - name: noop
    description: Do nothing.
    command: ["true"]
"""


def tasks_file(directory: Path, runs: int, tools: bool = False) -> Path:
    """`runs` task runs: one task repeated, or several once the count is past `repeat`'s limit;
    `tools`: the agent declares `noop` (the fake model then calls it once a run)."""
    (directory / "agent.yaml").write_text(TOOL_AGENT if tools else "tools: []\n")
    tasks = -(-runs // MAX_REPEAT)
    assert runs % tasks == 0, f"{runs} runs cannot be split into {tasks} equal tasks"
    lines = ["agent: agent.yaml", f"repeat: {runs // tasks}", "tasks:"]
    lines += [f"  - {{id: t{n}, prompt: go}}" for n in range(tasks)]
    path = directory / "tasks.yaml"
    path.write_text("\n".join(lines) + "\n")
    return path


def fake_model(latency: float, tools: bool = False) -> tuple[subprocess.Popen[str], str]:
    """The fake model in a process of its own, so that its work is not counted as mm-batch's.
    `tools`: its first turn of each conversation calls `noop`, its second answers."""
    script = (
        "lambda r: tool_call('noop', {}) if turn(r) == 0 else text('ok')"
        if tools
        else "lambda _r: text('ok')"
    )
    code = (
        "import sys, time\n"
        "from mm_batch.testing.fake_openai import FakeOpenAI, text, tool_call, turn\n"
        f"with FakeOpenAI({script}, {latency!r}) as fake:\n"
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


# Of each tool-using run measured, in seconds: a model turn (its record's `latency_s`), the tool
# call (from the model record that asked it to the tool record), and the whole run (the task
# record's `duration_s`).
TURNS: list[float] = []
CALLS: list[float] = []
RUNS: list[float] = []


def records_span(runs: int, jobs: int, latency: float, tools: bool = False) -> float:
    """Seconds from the first record of one `mm-batch run` to its last, by their `ts`.
    `tools`: each run calls `noop` once (checked in the records), then answers; its parts go
    to TURNS, CALLS and RUNS."""
    spans: list[float] = []

    def read(out: Path) -> None:
        records = [json.loads(line) for line in (out / "calls.jsonl").read_text().splitlines()]
        stamps = [datetime.fromisoformat(record["ts"]) for record in records]
        spans.append((max(stamps) - min(stamps)).total_seconds())
        ran = sum(1 for r in records if r["kind"] == "tool" and r["outcome"] == "ran")
        assert ran == (runs if tools else 0), f"{ran} tool calls ran in {runs} runs"
        if tools:
            for made in _by_run(records):
                assert [r["kind"] for r in made] == ["model", "tool", "model", "task"], made
                asked, called = (datetime.fromisoformat(r["ts"]) for r in made[:2])
                TURNS.extend((made[0]["latency_s"], made[2]["latency_s"]))
                CALLS.append((called - asked).total_seconds())
                RUNS.append(made[3]["duration_s"])

    batch_run(runs, jobs, latency, read, tools)
    return spans[0]


def _by_run(records: list[dict[str, object]]) -> list[list[dict[str, Any]]]:
    """The records of each run, in their `seq` order."""
    runs: dict[object, list[dict[str, Any]]] = {}
    for record in records:
        runs.setdefault(record["run"], []).append(record)
    return [sorted(made, key=lambda r: int(r["seq"])) for made in runs.values()]


def tool_span(runs: int, jobs: int, latency: float) -> float:
    """`records_span` of runs that each call a host tool, then answer: two turns a run."""
    return records_span(runs, jobs, latency, tools=True) / 2


def batch_run(
    runs: int, jobs: int, latency: float, inspect: Callable[[Path], None], tools: bool = False
) -> float:
    """Wall seconds of one `mm-batch run` (in this process), its results folder inspected."""
    server, url = fake_model(latency, tools)
    try:
        with tempfile.TemporaryDirectory() as tmp, open(os.devnull, "w") as sink:
            tasks = tasks_file(Path(tmp), runs, tools)
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


def tools_figure(latency: float = 0.2, times: int = 5) -> None:
    """Issue 31: 160 tool-using runs (a call, then an answer), jobs 16, 200 ms a turn: records'
    span / ideal, beside the same runs without a tool."""
    runs, jobs = 160, 16
    with_tools = ratios(tool_span, runs, jobs, latency, times)
    without = ratios(records_span, runs, jobs, latency, times)
    goal = "ok" if statistics.median(with_tools) <= 1.25 else "MISSED"
    print(
        f"{runs} runs, jobs {jobs}, {latency * 1000:.0f} ms a turn, span / ideal (median of "
        f"{times}): a tool call then an answer {shown(with_tools)}, one turn without tools "
        f"{shown(without)}   goal <= 1.25 {goal}",
    )
    mean = statistics.mean
    print(
        f"  a tool-using run, mean: {mean(RUNS) * 1000:.0f} ms (ideal {2 * latency * 1000:.0f}): "
        f"a model turn {mean(TURNS) * 1000:.1f} ms, the tool call {mean(CALLS) * 1000:.1f} ms "
        "(model record to tool record)",
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
    parser.add_argument("--tools", action="store_true", help="only issue 31's figure")
    options = parser.parse_args()
    runs, latency = options.runs, options.latency
    started = time.perf_counter()
    load_litellm()
    print(f"litellm import: {time.perf_counter() - started:.1f} s (start-up, not counted below)")
    print(f"litellm's own CPU per call: {litellm_cpu_ms():.2f} ms", flush=True)
    if options.tools:
        tools_figure(latency)
        return 0
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
