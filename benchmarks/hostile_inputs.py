"""How long mm-batch takes over hostile inputs: the timings its tests no longer assert.

The tests prove these bounds by construction (work counted, structure checked, input refused by
its size); this script only measures, and prints, the time each case takes:
- `mm-batch validate` on each hostile configuration file of tests/config/bad/attack-*, a 2 MiB
  tasks file, 3000 nested mappings and /dev/zero;
- the text rescue over 10 MiB of hostile JSON (tools/text_calls.py);
- the copied-example hold over 2 MiB said (tools/declared.py);
- an allowlist glob over a 64 KiB value (tools/consent.py);
- the masker over 1 MiB outputs made to be slow to mask (config/secrets.py);
- `mm-batch merge` of two shards claiming 999999999 shards, and of a shard whose junit.xml is a
  billion laughs.
Each figure is the best of --repeat rounds, in milliseconds.

Run: python benchmarks/hostile_inputs.py [--repeat N]
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import io
import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from mm_batch.cli import main
from mm_batch.config.model import AgentConfig
from mm_batch.config.secrets import Masker
from mm_batch.run.ports import McpTool
from mm_batch.run.toolbox import Toolbox
from mm_batch.testing.fake_openai import FakeOpenAI, by_prompt, text, tool_call
from mm_batch.tools.consent import bash_rule_matches, glob_match
from mm_batch.tools.text_calls import recover_tool_calls

ROOT = Path(__file__).resolve().parent.parent
BAD = ROOT / "tests" / "config" / "bad"
AGENT = """\
yolo: true
tools:
  - name: ok
    description: Do it.
    command: ["true"]
"""
TASKS = "agent: agent.yaml\ntasks: [{id: t1, prompt: p}]\n"


def best_ms(action: Callable[[], object], repeat: int) -> float:
    samples = []
    for _ in range(repeat):
        started = time.perf_counter()
        action()
        samples.append(time.perf_counter() - started)
    return min(samples) * 1000


@contextlib.contextmanager
def quiet_in(folder: Path) -> Iterator[None]:
    """mm-batch run in-process from `folder`, its output dropped."""
    before = Path.cwd()
    os.chdir(folder)
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            yield
    finally:
        os.chdir(before)


def cli(folder: Path, *args: str) -> int:
    with quiet_in(folder):
        return int(main(list(args)))


def refusal(folder: Path, *args: str) -> str:
    """The start of what mm-batch says on stderr: which refusal a figure measured."""
    err = io.StringIO()
    before = Path.cwd()
    os.chdir(folder)
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
            main(list(args))
    finally:
        os.chdir(before)
    return err.getvalue().strip().splitlines()[0][:90]


def configuration(repeat: int, scratch: Path) -> None:
    print("validate, hostile configuration files (ms):")
    for case in sorted(p for p in BAD.iterdir() if p.name.startswith("attack-")):
        ms = best_ms(functools.partial(cli, case, "validate", "tasks.yaml"), repeat)
        print(f"  {case.name:40} {ms:8.1f}")
    big = scratch / "big"
    big.mkdir()
    (big / "agent.yaml").write_text(AGENT)
    (big / "tasks.yaml").write_text(TASKS + "# padding\n" * (2 * 1024 * 1024 // 10))
    ms = best_ms(lambda: cli(big, "validate", "tasks.yaml"), repeat)
    print(f"  {'2 MiB tasks file':40} {ms:8.1f}")
    deep = scratch / "deep"
    deep.mkdir()
    (deep / "agent.yaml").write_text(AGENT + "model_options: " + "{a: " * 3000 + "1" + "}" * 3000)
    (deep / "tasks.yaml").write_text(TASKS)
    ms = best_ms(lambda: cli(deep, "validate", "tasks.yaml"), repeat)
    print(f"  {'3000 nested mappings':40} {ms:8.1f}")
    print(
        f"  {'/dev/zero':40} {best_ms(lambda: cli(scratch, 'validate', '/dev/zero'), repeat):8.1f}"
    )


HOSTILE_JSON = {
    "braces": "{" * (10 << 20),
    "open strings": '{"' * (5 << 20),
    "deep nesting": '{"name": [' * (1 << 20),
    "long arrays": ('{"name": [' + "1," * 5000) * 1000,
    "valid objects": '{"b": 1}' * (1 << 20),
    "a call's opening, repeated": ('{"name": "deploy", "arguments": {"service": [' + "1," * 2000)
    * 2600,
}


def text_rescue(repeat: int) -> None:
    print("text rescue, 10 MiB of hostile JSON (ms):")
    for name, hostile in HOSTILE_JSON.items():
        ms = best_ms(functools.partial(recover_tool_calls, hostile, {"deploy"}), repeat)
        print(f"  {name:40} {ms:8.1f}")


def copied_example(repeat: int) -> None:
    run = 16 * 1024
    value = "_" * run + "z"
    tool = McpTool(
        "srv",
        "put",
        "Put a key.",
        {
            "type": "object",
            "properties": {"key": {"type": "string", "description": f"The key, e.g. {value}."}},
            "required": ["key"],
        },
    )
    toolbox = Toolbox(AgentConfig(path=Path("agent.yaml"), sha256="0" * 64, tools=()), [tool])
    said = "\n".join("$ ./flood\nstdout:\n" + "_" * run for _ in range(128))
    arguments = json.dumps({"key": value})
    ms = best_ms(lambda: toolbox.prepare("srv_put", arguments, said, masker=Masker([])), repeat)
    print(f"copied-example hold, 2 MiB said (ms): {ms:.1f}")


def globs(repeat: int) -> None:
    value = "a" * (64 * 1024)
    args = best_ms(lambda: glob_match("*a*a*a*a*a*a*b", value), repeat)
    bash = best_ms(lambda: bash_rule_matches("ls *a*a*a*a*a*a*b", "ls " + value), repeat)
    print(f"allowlist glob, 64 KiB value (ms): args {args:.1f}, bash {bash:.1f}")


def masking(repeat: int) -> None:
    """The masker over 1 MiB outputs made to be slow to mask (config/secrets.py)."""
    masker = Masker(["sk-proj-7Qx9Zr2Lm4Np", "correct horse battery staple"])
    outputs = {
        "plain text": "lorem ipsum dolor sit amet " * 40_000,
        "fragments before a redaction": "sk-p" * 262_144 + "***",
        "JSON escapes everywhere": '{"a": "\\u00e9\\"x", "b": "%41%42 &amp;"} ' * 25_000,
        "an escaped secret, many times": "x \\u0073k-proj-7Qx9Zr2Lm4Np " * 32_000,
        "near misses in every case": "SK-PROJ-7qX9zR2lM4n! " * 50_000,
        "a character that folds longer": "straße " * 150_000,
    }
    print("masking 1 MiB outputs (ms):")
    for name, output in outputs.items():
        ms = best_ms(functools.partial(masker.text, output), repeat)
        print(f"  {name:40} {ms:8.1f}")


def shards(scratch: Path) -> Path:
    """Two shards of one plan, as `mm-batch run --shard K/2` writes them."""
    root = scratch / "shards"
    root.mkdir()
    (root / "agent.yaml").write_text(AGENT)
    (root / "tasks.yaml").write_text(
        "agent: agent.yaml\ntasks:\n  - {id: one, prompt: One.}\n  - {id: two, prompt: Two.}\n"
    )
    script = by_prompt({p: [tool_call("ok", {}), text("ok")] for p in ("One.", "Two.")})
    with FakeOpenAI(script) as fake:
        model = ["--model", "hosted_vllm/fake", "--model-option", f"api_base={fake.url}"]
        for k in (1, 2):
            cli(root, "run", "tasks.yaml", *model, "--shard", f"{k}/2", "--out", f"s{k}")
    return root


def merges(repeat: int, scratch: Path) -> None:
    root = shards(scratch)
    merge = ("merge", "s1", "s2", "--out", "m")

    def merged() -> int:
        shutil.rmtree(root / "m", ignore_errors=True)
        return cli(root, *merge)

    ms = best_ms(merged, repeat)
    print(f"merge, two shards of 1 run each, as a reference (ms): {ms:.1f}")
    shutil.rmtree(root / "m", ignore_errors=True)
    kept = {k: (root / f"s{k}" / "summary.json").read_text() for k in (1, 2)}
    for k in (1, 2):
        data = json.loads(kept[k])
        data["plan"]["shard"] = f"{k}/999999999"
        (root / f"s{k}" / "summary.json").write_text(json.dumps(data))
    ms = best_ms(lambda: cli(root, *merge), repeat)
    print(f"merge, 999999999 shards claimed (ms): {ms:.1f} ({refusal(root, *merge)})")
    for k in (1, 2):
        (root / f"s{k}" / "summary.json").write_text(kept[k])
    entities = '<!ENTITY a0 "lol">' + "".join(
        f'<!ENTITY a{i} "{f"&a{i - 1};" * 10}">' for i in range(1, 10)
    )
    (root / "s2" / "junit.xml").write_text(
        f'<?xml version="1.0"?><!DOCTYPE t [{entities}]>'
        '<testsuites><testsuite name="&a9;"/></testsuites>'
    )
    ms = best_ms(lambda: cli(root, *merge), repeat)
    print(f"merge, a billion laughs in junit.xml (ms): {ms:.1f} ({refusal(root, *merge)})")


def main_() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3, help="rounds of each case (the best)")
    repeat = parser.parse_args().repeat
    scratch = Path(tempfile.mkdtemp(prefix="mm-batch-hostile-"))
    try:
        configuration(repeat, scratch)
        text_rescue(repeat)
        copied_example(repeat)
        globs(repeat)
        masking(repeat)
        merges(repeat, scratch)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main_()
