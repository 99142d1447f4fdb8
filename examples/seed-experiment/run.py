"""Reproduce the design note's table: skill + bash vs an MCP stand-in vs declared tools.

One command: starts the MCP stand-in server, runs tasks.yaml (3 actions x English/French x
5 repeats = 30 runs per approach) on each local model, one run at a time, and prints
successes/30 and mean seconds per run, per approach and model.

Needs the local and mcp extras: pip install -e '.[local,mcp]'
Run: python examples/seed-experiment/run.py [--model local/...] [--approach NAME] [--repeat N]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
APPROACHES = {
    "skill-bash": "Skill + `bash`",
    "mcp-standin": "Typed tool through an MCP stand-in",
    "declared": "Declared tool",
}
MODELS = ("local/qwen2.5-coder-0.5b", "local/qwen2.5-coder-1.5b")


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def wait_for(port: int, deadline_s: float = 30) -> None:
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        with socket.socket() as probe:
            if probe.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.1)
    raise SystemExit("run.py: the MCP stand-in did not start")


def run_model(
    model: str, repeat: int, out: Path, env: dict[str, str], approaches: list[str]
) -> list[dict[str, object]]:
    (HERE / "calls-received.log").unlink(missing_ok=True)
    filters = [] if len(approaches) == len(APPROACHES) else ["--filter", f"{approaches[0]}.*"]
    subprocess.run(
        [
            sys.executable,
            "-m",
            "mm_batch",
            "run",
            str(HERE / "tasks.yaml"),
            "--model",
            model,
            "--repeat",
            str(repeat),
            "--out",
            str(out),
            *filters,
        ],
        env=env,
        check=False,
    )
    records = [json.loads(line) for line in (out / "calls.jsonl").read_text().splitlines()]
    return [r for r in records if r["kind"] == "task"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", action="append", help="model (repeatable; default both local)")
    parser.add_argument(
        "--approach",
        choices=sorted(APPROACHES),
        help="only this approach (default all three); the table shows only its column",
    )
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--out", type=Path, default=Path("seed-experiment-results"))
    options = parser.parse_args()
    port = free_port()
    standin = subprocess.Popen([sys.executable, str(HERE / "mcp_standin.py"), str(port)])
    approaches = [options.approach] if options.approach else list(APPROACHES)
    rows: list[tuple[str, dict[str, str]]] = []
    try:
        wait_for(port)
        env = {**os.environ, "SEED_MCP_URL": f"http://127.0.0.1:{port}/mcp"}
        for model in options.model or MODELS:
            out = options.out / model.replace("/", "_")
            tasks = run_model(model, options.repeat, out, env, approaches)
            cells = {}
            for approach in approaches:
                mine = [t for t in tasks if str(t["task"]).startswith(f"{approach}.")]
                ok = sum(t["status"] == "passed" for t in mine)
                mean = sum(float(str(t["duration_s"])) for t in mine) / max(len(mine), 1)
                cells[approach] = f"{ok}/{len(mine)} ({mean:.1f} s)"
            rows.append((model, cells))
    finally:
        standin.terminate()
        standin.wait(timeout=10)
    print()
    titles = [APPROACHES[a] for a in approaches]
    print("| Model | " + " | ".join(titles) + " |")
    print("|-------|" + "|".join("-" * (len(t) + 2) for t in titles) + "|")
    for model, cells in rows:
        print(f"| {model} | " + " | ".join(cells[a] for a in approaches) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
