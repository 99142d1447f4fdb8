"""A run on a `local/` model never imports litellm: not at start, not for the cache, not for
`--max-cost`. Each case runs the real CLI in a process of its own, whose `litellm` is a trap
(a package first on its path that leaves a marker file when imported, then fails), against a
stand-in llama-server (standin_llama.py) in place of the extra's binary, and a sparse file of
the model's size in place of the assembled GGUF."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from mm_batch.config.local_catalog import CATALOG
from tests.helpers import read_calls, standin_llama, write

ROOT = Path(__file__).resolve().parents[2]
SMALL = CATALOG["qwen2.5-coder-0.5b"]

TRAP = """\
import os, pathlib
pathlib.Path(os.environ["LITELLM_TRAP"]).write_text("litellm was imported")
raise ImportError("litellm is a trap here")
"""


def _env(tmp_path: Path) -> dict[str, str]:
    """The environment of a CLI process whose litellm is the trap and whose local model is
    served by the stand-in."""
    site = tmp_path / "site"
    write(site, "litellm/__init__.py", TRAP)
    env = {**os.environ, **standin_llama(tmp_path, SMALL)}
    env["PYTHONPATH"] = os.pathsep.join([str(site), str(ROOT)])
    env["LITELLM_TRAP"] = str(tmp_path / "litellm-imported")
    return env


def _suite(tmp_path: Path) -> Path:
    write(tmp_path, "agent.yaml", "tools: []\n")
    return write(tmp_path, "tasks.yaml", "agent: agent.yaml\ntasks: [{id: t, prompt: go}]\n")


def _run(tmp_path: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "mm_batch", "run", str(_suite(tmp_path)), *args]
    return subprocess.run(
        command, check=False, env=env, capture_output=True, text=True, timeout=120
    )


def _answered(tmp_path: Path) -> int:
    """Completions the stand-in answered so far."""
    log = tmp_path / "calls.log"
    return len(log.read_text().splitlines()) if log.exists() else 0


def test_a_local_run_never_imports_litellm(tmp_path: Path) -> None:
    env = _env(tmp_path)
    out = tmp_path / "out"
    done = _run(tmp_path, env, "--model", SMALL.model, "--max-cost", "5", "--out", str(out))
    assert done.returncode == 0, done.stderr
    assert not Path(env["LITELLM_TRAP"]).exists(), done.stderr
    records = read_calls(out)
    model = [r for r in records if r["kind"] == "model"]
    assert [(r["content"], r["finish_reason"], r["cached"]) for r in model] == [
        ("done", "stop", False)
    ]
    assert [r["status"] for r in records if r["kind"] == "task"] == ["passed"]
    assert _answered(tmp_path) == 1


def test_a_local_run_with_the_cache_never_imports_litellm(tmp_path: Path) -> None:
    env = _env(tmp_path)
    cache = ["--cache", str(tmp_path / "replies")]
    for mode, out in (("write", "first"), ("read", "second")):
        args = ["--model", SMALL.model, *cache, "--cache-mode", mode, "--out", str(tmp_path / out)]
        done = _run(tmp_path, env, *args)
        assert done.returncode == 0, done.stderr
    assert not Path(env["LITELLM_TRAP"]).exists()
    assert len(list((tmp_path / "replies").glob("*.json"))) == 1
    assert _answered(tmp_path) == 1  # the second run's turn came from the cache
    second = [r for r in read_calls(tmp_path / "second") if r["kind"] == "model"]
    assert [(r["content"], r["cached"], r["cost_usd"]) for r in second] == [("done", True, 0.0)]


def test_the_trap_catches_a_run_that_imports_litellm(tmp_path: Path) -> None:
    """The control: a run on any other model imports litellm, and the trap says so."""
    env = _env(tmp_path)
    args = ["--model", "hosted_vllm/fake", "--model-option", "api_base=http://127.0.0.1:9/v1"]
    done = _run(tmp_path, env, *args, "--out", str(tmp_path / "out"))
    assert done.returncode != 0
    assert Path(env["LITELLM_TRAP"]).read_text() == "litellm was imported"
    assert "litellm cannot be imported" in done.stderr
