"""Start-up and exit of `mm-batch run`: one task, one model turn, against the fake model.

Spawns the real CLI (`python -m mm_batch run` and the `mm-batch` console script) on a one-task
plan whose fake model (in a process of its own) answers at once, and measures:

  launch -> first request: from spawning the process to the fake receiving the first request;
  last answer -> exit:      from the fake sending its last answer to the process having exited.

Goals (issue 13): first request <= 2 s, exit <= 0.2 s. `import litellm` alone (with the
settings mm-batch imports it with) is printed beside them, for context. `--compare REF` measures
REF's code too, from a git worktree of REF in a temporary folder run with its own PYTHONPATH,
interleaved with the working tree's runs so that both see the same machine load.

Run: python benchmarks/startup.py [--times 5] [--compare REF]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
GOAL_FIRST_S = 2.0
GOAL_EXIT_S = 0.2

# The fake model: prints the monotonic time of each request it answers (the clock is the
# machine's, shared by every process), one line a request.
FAKE = """\
import sys, time
from mm_batch.testing.fake_openai import FakeOpenAI, text

def answer(_request):
    print(time.monotonic(), flush=True)
    return text("ok")

with FakeOpenAI(answer) as fake:
    print(fake.url, flush=True)
    sys.stdin.read()
"""

# `import litellm` as such (offline, as mm-batch imports it), and mm-batch's `load_litellm`.
IMPORT = """\
import os, sys, time
os.environ.update(
    LITELLM_LOCAL_MODEL_COST_MAP="True", LITELLM_MODE="PRODUCTION", LITELLM_TELEMETRY="False"
)
started = time.perf_counter()
if sys.argv[1] == "plain":
    import litellm
else:
    from mm_batch.effects.litellm import load_litellm
    load_litellm()
print(time.perf_counter() - started)
"""


@dataclass(frozen=True)
class Tree:
    """A tree of mm-batch's code to measure: its name in the table and its root."""

    name: str
    root: Path

    def env(self) -> dict[str, str]:
        return {**os.environ, "PYTHONPATH": str(self.root)}


@contextmanager
def fake_model() -> Iterator[tuple[subprocess.Popen[str], str]]:
    proc = subprocess.Popen(
        [sys.executable, "-c", FAKE],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=Tree("here", ROOT).env(),
    )
    assert proc.stdout is not None
    try:
        yield proc, proc.stdout.readline().strip()
    finally:
        proc.communicate("")


def tasks_file(directory: Path) -> Path:
    (directory / "agent.yaml").write_text("tools: []\n")
    path = directory / "tasks.yaml"
    path.write_text("agent: agent.yaml\ntasks:\n  - {id: t, prompt: go}\n")
    return path


def launch(tree: Tree, how: str, tasks: Path, url: str, out: Path) -> list[str]:
    """The command line of one run: `python -m mm_batch` or the console script."""
    head = [sys.executable, "-m", "mm_batch"]
    if how == "script":
        # The console script imports mm_batch like any program: PYTHONPATH decides whose.
        head = [str(Path(sys.executable).parent / "mm-batch")]
    tail = ["--model", "hosted_vllm/fake", "--model-option", f"api_base={url}", "--out", str(out)]
    return [*head, "run", str(tasks), *tail]


def one_run(
    tree: Tree, how: str, fake: subprocess.Popen[str], url: str, tmp: Path
) -> tuple[float, float]:
    """(launch -> first request, last answer -> exit) of one process, in seconds."""
    tasks = tasks_file(tmp)
    command = launch(tree, how, tasks, url, tmp / "out")
    started = time.monotonic()
    proc = subprocess.run(
        command, check=False, env=tree.env(), capture_output=True, text=True, cwd=tmp
    )
    exited = time.monotonic()
    if proc.returncode != 0:
        raise SystemExit(f"{tree.name} {how}: exit {proc.returncode}\n{proc.stderr}")
    assert fake.stdout is not None
    answered = float(fake.stdout.readline())  # one task, one turn: first request is last
    return answered - started, exited - answered


def import_s(tree: Tree, how: str) -> float:
    """Seconds of `import litellm` ("plain") or of the tree's `load_litellm` ("load")."""
    done = subprocess.run(
        [sys.executable, "-c", IMPORT, how],
        cwd=tree.root,  # `-c` puts the working directory first on the path: the tree's own
        env=tree.env(),
        capture_output=True,
        text=True,
        check=True,
    )
    return float(done.stdout.strip().splitlines()[-1])


@contextmanager
def worktree(ref: str) -> Iterator[Path]:
    """A detached worktree of REF in a temporary folder, removed afterwards."""
    with tempfile.TemporaryDirectory(prefix="mm-batch-ref-") as tmp:
        path = Path(tmp) / "tree"
        subprocess.run(
            ["git", "-C", str(ROOT), "worktree", "add", "--detach", "-q", str(path), ref],
            check=True,
        )
        try:
            yield path
        finally:
            subprocess.run(
                ["git", "-C", str(ROOT), "worktree", "remove", "--force", str(path)], check=False
            )


def median(values: list[float]) -> str:
    ordered = sorted(values)
    return f"{statistics.median(ordered):6.2f} ({ordered[0]:.2f}-{ordered[-1]:.2f})"


def measure(trees: list[Tree], times: int) -> None:
    hows = ("module", "script")
    first: dict[tuple[str, str], list[float]] = {(t.name, h): [] for t in trees for h in hows}
    leave: dict[tuple[str, str], list[float]] = {key: [] for key in first}
    imports: dict[str, list[float]] = {"plain": [], **{t.name: [] for t in trees}}
    with fake_model() as (fake, url):
        for tree in trees:  # a first, unmeasured run of each: the file cache is warm for all
            with tempfile.TemporaryDirectory() as tmp:
                one_run(tree, "module", fake, url, Path(tmp))
        for _ in range(times):
            imports["plain"].append(import_s(trees[0], "plain"))
            for tree in trees:
                imports[tree.name].append(import_s(tree, "load"))
                for how in hows:
                    with tempfile.TemporaryDirectory() as tmp:
                        a, b = one_run(tree, how, fake, url, Path(tmp))
                    first[tree.name, how].append(a)
                    leave[tree.name, how].append(b)
    print(
        f"median of {times} (range), seconds; goals: first request <= {GOAL_FIRST_S:g} s, "
        f"exit <= {GOAL_EXIT_S:g} s"
    )
    print("| code | launched as | launch -> first request | last answer -> exit |")
    print("|---|---|---|---|")
    for tree in trees:
        for how in hows:
            label = "python -m mm_batch" if how == "module" else "mm-batch"
            print(
                f"| {tree.name} | {label} | {median(first[tree.name, how])} "
                f"| {median(leave[tree.name, how])} |"
            )
    print(f"import litellm alone: {median(imports['plain'])}")
    for tree in trees:
        print(f"load_litellm alone ({tree.name}): {median(imports[tree.name])}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--times", type=int, default=5, help="runs of each (the median shown)")
    parser.add_argument("--compare", metavar="REF", help="also measure this git ref's code")
    options = parser.parse_args()
    here = Tree("working tree", ROOT)
    if options.compare is None:
        measure([here], options.times)
        return 0
    with worktree(options.compare) as path:
        measure([Tree(options.compare, path), here], options.times)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
