"""Masking leaks a hostile tool can cause (SPEC 7), failing until fixed.

Each case runs the real thing: an agent whose one tool gets a secret through a `${VAR}` env
entry and prints it changed the way a program or a library may change it, the scripted fake
model, and `mm-batch run` with a response cache. Then every file mm-batch wrote (reports, calls,
cache), its stdout and stderr, and every request the model received are searched for the
secret as the tool wrote it.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from mm_batch.testing.fake_openai import by_prompt, text, tool_call
from tests.helpers import Cli, Fake, model_args, write

SECRET_VAR = "MYAPP_SECRET"


def _leaked_into(
    cli: Cli,
    fake_model: Fake,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    secret: str,
    printed: str,
    shown: str,
) -> list[str]:
    """Run a task whose tool prints `printed` (a Python expression of `s`, the secret it gets
    from its environment), which is `shown`; the places where `shown` is found, by name."""
    monkeypatch.setenv(SECRET_VAR, secret)
    write(
        tmp_path, "leak.py", f"import os, sys\ns = os.environ['SEC']\nsys.stdout.write({printed})\n"
    )
    write(
        tmp_path,
        "agent.yaml",
        f"""
        yolo: true
        tools:
          - name: leak
            description: Print the configuration.
            parameters: {{}}
            command: [{json.dumps(sys.executable)}, leak.py]
            env: {{SEC: "${{{SECRET_VAR}}}"}}
        """,
    )
    write(tmp_path, "tasks.yaml", "agent: agent.yaml\ntasks:\n  - id: t\n    prompt: go\n")
    fake = fake_model(by_prompt({"go": [tool_call("leak", {}), text("done")]}))
    out, cache = tmp_path / "out", tmp_path / "cache"
    result = cli("run", tmp_path / "tasks.yaml", *model_args(fake), "--out", out, "--cache", cache)
    assert result.code == 0, result.err
    places = {"stdout": result.out, "stderr": result.err}
    places["requests"] = json.dumps(fake.requests, ensure_ascii=False)
    for path in [*out.rglob("*"), *cache.rglob("*")]:
        if path.is_file():
            places[str(path.relative_to(tmp_path))] = path.read_text("utf-8", errors="replace")
    # calls.jsonl and the cache are JSON: the text as JSON escapes it counts too.
    spellings = {shown, json.dumps(shown)[1:-1]}
    return sorted(name for name, body in places.items() if any(s in body for s in spellings))


def test_a_secret_ending_in_a_newline_leaks_no_part_without_it(
    cli: Cli, fake_model: Fake, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A secret pasted with its line's end (a CI secret, a key file read whole) is still that
    key: a tool that strips the newline (`.strip()`, `$(cat key)`, a header value) writes all of
    the secret but its last character, a prefix SPEC 7 says no cut may leak. Fails today: the
    masker looks for the value with its trailing white space, so `token=<key>;` is kept."""
    leaks = _leaked_into(
        cli,
        fake_model,
        tmp_path,
        monkeypatch,
        "hunter2-Secret-Value\n",
        "'token=' + s.strip() + ';'",
        "token=hunter2-Secret-Value;",
    )
    assert leaks == []


def test_a_secret_upper_cased_by_full_case_mapping_is_masked(
    cli: Cli, fake_model: Fake, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SPEC 7: changed case. Python's, ICU's and most languages' upper case of `ß` is `SS` (of
    `ﬁ`, `FI`): a tool that upper-cases its configuration writes the secret in a case the
    masker does not read, since it keeps one character per character."""
    leaks = _leaked_into(
        cli, fake_model, tmp_path, monkeypatch, "Straße-key-01", "s.upper()", "STRASSE-KEY-01"
    )
    assert leaks == []


def test_a_zero_padded_html_character_reference_is_read(
    cli: Cli, fake_model: Fake, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SPEC 7: escaping. `&#00000104;` is a valid HTML reference to `h` (HTML reads any number
    of digits, leading zeros included), and the masker reads HTML's numeric references, but
    only up to 7 digits (hexadecimal: 6): the secret so written is kept in calls.jsonl and sent
    to the model."""
    leaks = _leaked_into(
        cli,
        fake_model,
        tmp_path,
        monkeypatch,
        "hunter2-Secret-Value",
        "''.join('&#%08d;' % ord(c) for c in s)",
        "".join(f"&#{ord(c):08d};" for c in "hunter2-Secret-Value"),
    )
    assert leaks == []
