"""A local model's turn with tools goes to its server natively: the prompt rendered by the
server's template with the tools (`/apply-template`), then a completion of exactly that prompt
bound by the call grammar (`/completion`); the call it writes is taken by the text rescue and
recorded as before. The real CLI runs against a stand-in llama-server (standin_llama.py) that
logs every request."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from mm_batch.config.local_catalog import CATALOG
from mm_batch.effects.llama import MAX_TOKENS
from tests.helpers import read_calls, standin_llama, write

ROOT = Path(__file__).resolve().parents[2]
SMALL = CATALOG["qwen2.5-coder-0.5b"]
CALL = '{"name": "greet", "arguments": {"who": "ada"}}'
AGENT = """\
yolo: true
tools:
  - name: greet
    description: Greet someone.
    parameters:
      who: {type: string, description: "Whom to greet."}
      loud: {type: boolean, required: false, description: "Shout."}
    command: ["./greet.sh", "{{who}}"]
"""


def _run(
    tmp_path: Path, *args: str, agent: str = AGENT, texts: tuple[str, ...] = (CALL,)
) -> subprocess.CompletedProcess[str]:
    """The CLI on a one-task suite, its local model served by the stand-in, which writes
    `texts` (the call), then "done"."""
    env = {**os.environ, **standin_llama(tmp_path, SMALL), "PYTHONPATH": str(ROOT)}
    env["LLAMA_STANDIN_TEXTS"] = json.dumps(list(texts))
    suite = tmp_path / "suite"
    write(suite, "agent.yaml", agent)
    skill = "---\nname: greeting\ndescription: How to greet.\n---\nRun ./greet.sh NAME.\n"
    write(suite, "skills/greeting/SKILL.md", skill)
    script = write(suite, "greet.sh", f'#!/bin/sh\necho "$1" > "{tmp_path}/greeted"\n')
    script.chmod(0o755)
    tasks = write(suite, "tasks.yaml", "agent: agent.yaml\ntasks: [{id: t, prompt: greet ada}]\n")
    command = [sys.executable, "-m", "mm_batch", "run", str(tasks), "--model", SMALL.model]
    return subprocess.run(
        [*command, "--out", str(tmp_path / "out"), *args],
        check=False,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def _all_requests(tmp_path: Path) -> list[dict[str, Any]]:
    lines = (tmp_path / "requests.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines]


def _prefill(request: dict[str, Any]) -> bool:
    body = request["body"]
    return 0 in (body.get("n_predict"), body.get("max_tokens"))


def _requests(tmp_path: Path) -> list[dict[str, Any]]:
    """The requests of the model's turns: without the server's first request, which computes
    the prompt only (and its rendering)."""
    requests = _all_requests(tmp_path)
    first = next(i for i, r in enumerate(requests) if _prefill(r))
    if requests[first]["path"] == "/completion":
        assert requests[first - 1]["path"] == "/apply-template"
        return requests[: first - 1] + requests[first + 1 :]
    return requests[:first] + requests[first + 1 :]


def test_a_turn_with_tools_is_rendered_by_the_template_and_bound_by_the_grammar(
    tmp_path: Path,
) -> None:
    done = _run(tmp_path, "--model-option", "call_grammar=true")
    assert done.returncode == 0, done.stderr
    # The server's first request computes the first turn's prompt into the run's slot, alone.
    rendered, prefill, *_ = _all_requests(tmp_path)
    assert (rendered["path"], prefill["path"]) == ("/apply-template", "/completion")
    assert prefill["body"] == {
        "prompt": f"TEMPLATE({json.dumps(rendered['body'], sort_keys=True)})",
        "n_predict": 0,
        "cache_prompt": True,
        "id_slot": 0,
    }
    requests = _requests(tmp_path)
    assert [r["path"] for r in requests] == [
        "/apply-template",
        "/completion",
        "/apply-template",
        "/completion",
    ]
    rendering, completion = requests[0]["body"], requests[1]["body"]
    assert [m["role"] for m in rendering["messages"]] == ["user"]
    assert [t["function"]["name"] for t in rendering["tools"]] == ["greet"]
    # The completion is of exactly the prompt the template rendered, bound by the grammar.
    assert completion["prompt"] == f"TEMPLATE({json.dumps(rendering, sort_keys=True)})"
    assert "tools" not in completion and "messages" not in completion
    assert completion["n_predict"] == MAX_TOKENS and completion["temperature"] == 0
    assert completion["id_slot"] == 0  # the run's slot, which holds its prompt
    # Stopped where the call ends: the fence's close and the end of the turn are the
    # grammar's, never the decoder's; the text comes back whole.
    assert completion["stop"] == ["}}"]
    grammar = completion["grammar"]
    assert 'call-0 ::= "{\\"name\\": \\"greet\\", \\"arguments\\": "' in grammar
    assert '"\\"who\\": " string' in grammar and '"\\"loud\\": " boolean' in grammar
    # The call written as text is rescued and ran; the records say so, as before.
    assert (tmp_path / "greeted").read_text() == "ada\n"
    records = read_calls(tmp_path / "out")
    model = [r for r in records if r["kind"] == "model"]
    assert [(r["content"], r["finish_reason"], r["tool_calls"]) for r in model] == [
        (CALL, "stop", []),
        ("done", "stop", []),
    ]
    assert [(r["completion_tokens"], r["prompt_tokens"]) for r in model] == [(1, 10), (1, 10)]
    [tool] = [r for r in records if r["kind"] == "tool"]
    assert (tool["tool"], tool["outcome"], tool["recovered_from_text"]) == ("greet", "ran", True)


def test_by_default_a_turn_with_tools_is_bound_by_the_grammar(tmp_path: Path) -> None:
    """`auto`, the default, binds an agent's calls unless it offers `bash` (below)."""
    done = _run(tmp_path)
    assert done.returncode == 0, done.stderr
    paths = [r["path"] for r in _requests(tmp_path)]
    assert paths == ["/apply-template", "/completion"] * 2
    assert (tmp_path / "greeted").read_text() == "ada\n"


@pytest.mark.parametrize(
    ("options", "agent"),
    [
        ([], f"{AGENT}builtins: [bash]\n"),
        (["--model-option", "call_grammar=auto"], f"{AGENT}builtins: [bash]\n"),
        (["--model-option", "call_grammar=off"], AGENT),
    ],
)
def test_without_call_grammar_the_chat_endpoint_is_asked_with_the_tools(
    tmp_path: Path, options: list[str], agent: str
) -> None:
    """Off where the agent offers `bash` (a one-line call cost the seed experiment's skill +
    `bash` column 5 of 30 runs), or when asked."""
    done = _run(tmp_path, *options, agent=agent)
    assert done.returncode == 0, done.stderr
    prefill, *_ = _all_requests(tmp_path)
    assert (prefill["body"]["max_tokens"], prefill["body"]["id_slot"]) == (0, 0)
    requests = _requests(tmp_path)
    assert prefill["body"]["messages"] == requests[0]["body"]["messages"]
    assert [r["path"] for r in requests] == ["/v1/chat/completions"] * 2
    assert requests[0]["body"]["tools"][0]["function"]["name"] == "greet"
    assert "call_grammar" not in requests[0]["body"] and "grammar" not in requests[0]["body"]
    assert (tmp_path / "greeted").read_text() == "ada\n"


def test_without_the_rescue_the_chat_endpoint_is_asked_for_native_calls(tmp_path: Path) -> None:
    """The grammar's calls are text: with text calls not taken, a grammar would leave the model
    no way to call a tool, so the turn goes to the chat endpoint with its tools, as before."""
    _run(
        tmp_path,
        "--model-option",
        "recover_text_tool_calls=false",
        "--model-option",
        "call_grammar=types",
    )
    requests = _requests(tmp_path)
    assert [r["path"] for r in requests] == ["/v1/chat/completions"]
    assert [t["function"]["name"] for t in requests[0]["body"]["tools"]] == ["greet"]


def test_a_call_grammar_that_is_no_level_is_said(tmp_path: Path) -> None:
    done = _run(tmp_path, "--model-option", "call_grammar=tight")
    records = read_calls(tmp_path / "out")
    [task] = [r for r in records if r["kind"] == "task"]
    assert task["status"] == "error"
    assert (
        "call_grammar must be auto, true, false or one of names, types, required, enum"
        in (task["reason"])
    ), done.stderr


def test_a_skills_name_is_a_call_the_grammar_admits(tmp_path: Path) -> None:
    """The rescue takes a skill's name written as a call (to answer how to read it): the
    grammar lets the model write it, beside the tools' calls."""
    agent = f"{AGENT}builtins: [bash, read_skill]\nskills: [skills/]\n"
    done = _run(tmp_path, "--model-option", "call_grammar=types", agent=agent)
    assert done.returncode == 0, done.stderr
    grammar = _requests(tmp_path)[1]["body"]["grammar"]
    for name in ("greet", "bash", "read_skill", "greeting"):
        assert f'"{{\\"name\\": \\"{name}\\", \\"arguments\\": "' in grammar, name


VALUE_CALL = '{"name": "greet", "arguments": {"who": "a}}b"}}'


@pytest.mark.parametrize(
    ("first", "recorded"),
    [
        # a `}}` inside a value: the cut text is no whole call
        (VALUE_CALL, VALUE_CALL),
        (f"```json\n{VALUE_CALL}\n```", f"```json\n{VALUE_CALL}\n```"),
        # an answer that writes `}}`: never taken for the end of a call
        ("Use {{who}} in the template.", "Use {{who}} in the template."),
    ],
)
def test_a_turn_cut_where_no_call_ended_is_asked_again_whole(
    tmp_path: Path, first: str, recorded: str
) -> None:
    """The stand-in writes the same text twice: cut at its first `}}`, then whole when asked
    again without that stop; what the model wrote is recorded (and run) as written, its
    tokens counted for both asks."""
    done = _run(tmp_path, "--model-option", "call_grammar=types", texts=(first, first))
    assert done.returncode in (0, 1), done.stderr
    completions = [r["body"] for r in _requests(tmp_path) if r["path"] == "/completion"]
    assert [c.get("stop") for c in completions[:2]] == [["}}"], None]
    assert completions[0]["prompt"] == completions[1]["prompt"]
    model = [r for r in read_calls(tmp_path / "out") if r["kind"] == "model"]
    assert (model[0]["content"], model[0]["completion_tokens"]) == (recorded, 2)
    if first.startswith("Use"):
        assert len(model) == 1 and not (tmp_path / "greeted").exists()
    else:
        assert (tmp_path / "greeted").read_text() == "a}}b\n"


def test_a_users_stop_strings_are_kept_beside_the_calls_end(tmp_path: Path) -> None:
    _run(tmp_path, "--model-option", "call_grammar=types", "--model-option", "stop=END")
    completion = next(r["body"] for r in _requests(tmp_path) if r["path"] == "/completion")
    assert completion["stop"] == ["END", "}}"]
