"""Secrets that reach a report by a road the masker does not watch: a hostile model or tool.

SPEC 7: a secret (here the value of `${MY_TOKEN}`, also mm-batch's own env var named `*TOKEN*`)
is masked as `***` in everything mm-batch writes or sends, the model included, and masking comes
before any change to a text: folded whitespace, changed case, quoting or escaping. Each test
drives `mm-batch run` as its own process against the scripted fake provider, then reads every
file of the results folder (and of the response cache), mm-batch's stdout and stderr and every
request the provider received, for the secret in the one form the attack brings it in.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from mm_batch.testing.fake_openai import (
    FakeOpenAI,
    Finished,
    RawReply,
    Reply,
    by_prompt,
    text,
    tool_call,
)
from tests.helpers import model_args

SECRET = "sk-live-7Qx9Zr2Lm4Np"
PASSPHRASE = "correct horse battery staple"  # a secret with spaces in it

AGENT = """\
yolo: true
{extra}
tools:
  - name: emit
    description: Print what the deploy log says.
    parameters:
      mode: {{type: string, description: "Which part of the log."}}
    command: ["python3", "emit.py", "{{{{mode}}}}"]
    env: {{MY_TOKEN: "${{MY_TOKEN}}"}}
"""
TASKS = """\
agent: agent.yaml
tasks:
  - id: leaky
    prompt: Show the log.
"""


def _written(
    tmp_path: Path,
    secret: str,
    replies: list[Reply],
    *,
    emit: str = "",
    agent_extra: str = "",
    options: tuple[str, ...] = (),
    files: dict[str, str] | None = None,
) -> dict[str, str]:
    """Run the one task with `replies` as the model's turns; every text mm-batch wrote or sent,
    by where it went."""
    (tmp_path / "agent.yaml").write_text(AGENT.format(extra=agent_extra))
    (tmp_path / "tasks.yaml").write_text(TASKS)
    (tmp_path / "emit.py").write_text(
        "import os, sys\ns = os.environ['MY_TOKEN']\nmode = sys.argv[1]\n" + emit
    )
    for name, content in (files or {}).items():
        (tmp_path / name).write_text(content)
    out = tmp_path / "out"
    with FakeOpenAI(by_prompt({"Show the log.": replies})) as fake:
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "mm_batch",
                "run",
                str(tmp_path / "tasks.yaml"),
                *model_args(fake),
                "--out",
                str(out),
                *options,
            ],
            check=False,
            capture_output=True,
            env={**os.environ, "MY_TOKEN": secret},
            cwd=tmp_path,
            timeout=120,
        )
        sent = [json.dumps(r, ensure_ascii=False) for r in fake.requests]
    assert done.returncode in (0, 1, 3), done.stderr.decode()[-2000:]
    texts = {
        "stdout": done.stdout.decode("utf-8", "replace"),
        "stderr": done.stderr.decode("utf-8", "replace"),
    }
    texts.update({f"request {i}": r for i, r in enumerate(sent)})
    for folder in (out, tmp_path / "cache"):
        for path in sorted(folder.rglob("*")) if folder.exists() else []:
            if path.is_file():
                texts[str(path.relative_to(tmp_path))] = path.read_text("utf-8", "replace")
    return texts


def _holding(texts: dict[str, str], form: str) -> list[str]:
    return [where for where, written in texts.items() if form in written]


def test_a_secret_with_spaces_folded_back_together_from_a_hooks_lines_is_masked(
    tmp_path: Path,
) -> None:
    """A preToolCall hook refuses with the passphrase broken over two lines: no text holds it
    then, so nothing is masked, and the terminal and summary.md fold the reason to one line,
    which spells the passphrase again."""
    hook = (
        "import sys\nsys.stdin.read()\nprint('no: correct\\nhorse   battery staple')\nsys.exit(1)\n"
    )
    texts = _written(
        tmp_path,
        PASSPHRASE,
        [tool_call("emit", {"mode": "x"}), text("ok")],
        agent_extra='hooks: {preToolCall: ["python3", "hook.py"]}',
        files={"hook.py": hook},
    )
    assert _holding(texts, PASSPHRASE) == []


def test_a_provider_finish_reason_holding_a_secret_is_masked(tmp_path: Path) -> None:
    """`finish_reason` is the provider's text, not a closed vocabulary: a hostile provider can
    put anything there, and calls.jsonl and report.html show it."""
    texts = _written(tmp_path, SECRET, [Finished(text("hi"), SECRET)])
    assert _holding(texts, SECRET) == []


def test_an_upper_cased_secret_beside_a_dotted_capital_i_is_masked(tmp_path: Path) -> None:
    """The masker finds a secret in another case only where lower-casing the whole text keeps
    its length: one `İ` (U+0130, two characters lower-cased) anywhere in the text turns that
    off, for the tool's output, the model's answer and the provider's error alike."""
    error = {"error": {"message": "İnvalid API key: " + SECRET.upper()}}
    cases: dict[str, tuple[list[Reply], str]] = {
        "tool": (
            [tool_call("emit", {"mode": "x"}), text("ok")],
            "print('İstanbul ' + s.upper())\n",
        ),
        "answer": ([text("İ " + SECRET.upper())], ""),
        "provider": ([RawReply(json.dumps(error, ensure_ascii=False).encode(), 401)], ""),
    }
    leaks: dict[str, list[str]] = {}
    for name, (replies, emit) in cases.items():
        folder = tmp_path / name
        folder.mkdir()
        leaks[name] = _holding(_written(folder, SECRET, replies, emit=emit), SECRET.upper())
    assert leaks == {"tool": [], "answer": [], "provider": []}


def test_a_secret_the_model_writes_json_escaped_in_its_arguments_is_masked(
    tmp_path: Path,
) -> None:
    """`\\u0073k-live-...` is the secret as JSON reads it (the argv that ran holds it whole):
    the raw arguments, written as the model sent them, must not carry it in that form."""
    escaped = "\\u0073" + SECRET[1:]
    texts = _written(
        tmp_path, SECRET, [tool_call("emit", '{"mode": "' + escaped + '"}'), text("ok")]
    )
    assert _holding(texts, escaped) == []


def test_a_secret_as_a_key_of_a_providers_own_parts_is_masked_in_the_cache(
    tmp_path: Path,
) -> None:
    """The provider's own parts of a turn are kept (and cached) with their values masked but
    their keys as they came: a key is as much the provider's text as a value."""
    reply = tool_call("emit", {"mode": "x"})
    reply["provider_specific_fields"] = {SECRET: "x"}
    texts = _written(tmp_path, SECRET, [reply, text("ok")], options=("--cache", "cache"))
    assert _holding(texts, SECRET) == []


def test_a_secret_as_a_tool_name_or_call_id_is_not_sent_back_to_the_model(
    tmp_path: Path,
) -> None:
    """The history sends the model's calls back with their arguments masked, but their tool
    name and call id as they came."""
    by_name = tool_call(SECRET, {"mode": "x"})
    by_id = tool_call("emit", {"mode": "x"})
    by_id["tool_calls"][0]["id"] = SECRET
    texts = _written(tmp_path, SECRET, [by_name, by_id, text("ok")])
    assert _holding(texts, SECRET) == []


def test_a_secret_the_model_splits_over_argv_entries_is_masked_in_every_report(
    tmp_path: Path,
) -> None:
    """Two argv entries that hold a secret with a space only together (`hunter two22` as
    `hunter` and `two22`): report.html shows argv joined, the tool result echoes it."""
    agent = (
        AGENT.format(extra="")
        .replace('["python3", "emit.py", "{{mode}}"]', '["echo", "{{mode}}", "{{part}}"]')
        .replace(
            "      mode:", '      part: {type: string, description: "Which part."}\n      mode:'
        )
    )
    assert '"{{part}}"' in agent
    replies: list[Reply] = [tool_call("emit", {"mode": "hunter", "part": "two22"}), text("ok")]
    texts = _written(tmp_path, "hunter two22", replies, files={"agent.yaml": agent})
    assert any('"ran"' in t for t in texts.values())  # the call ran, its argv recorded
    assert _holding(texts, "hunter two22") == []


def test_a_secret_with_a_quote_is_masked_before_the_echo_quotes_it(tmp_path: Path) -> None:
    """The echoed command is shell-quoted: `it's-secret9` becomes `'it'"'"'s-secret9'`, which
    no longer reads as the secret. Masked first, the quoting quotes the mask."""
    secret = "it's-secret9"
    texts = _written(tmp_path, secret, [tool_call("emit", {"mode": secret}), text("ok")])
    quoted = "'it'\"'\"'s-secret9'"
    assert _holding(texts, secret) == [] and _holding(texts, quoted) == []


def test_a_secret_inside_a_key_of_a_providers_parts_leaves_the_request_its_structure(
    tmp_path: Path,
) -> None:
    """SPEC 7: masking never changes a request's structure. A secret `reasoning` (part of the
    key `reasoning_content`) leaves that key as it is in the history sent back."""
    reply = tool_call("emit", {"mode": "x"})
    reply["provider_specific_fields"] = {"reasoning_content": "thought"}
    texts = _written(tmp_path, "reasoning", [reply, text("ok")])
    assert any("reasoning_content" in texts[k] for k in texts if k.startswith("request 1"))
