"""The model response cache, end to end: the CLI, the cache around the model client, the
scripted server, and a real tool script that counts its runs in a marker file; and the cache
alone, around a fake client.

The task asks for one tool call, then answers: two model turns. The second turn's request holds
the tool's output, so a tool that prints something else makes that turn a new request.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from pathlib import Path
from typing import Any

import pytest

from mm_batch.config.model import CacheMode, CacheSettings
from mm_batch.config.secrets import Masker
from mm_batch.effects import cache as cache_module
from mm_batch.effects.model_calls import Messages, ToolSchemas
from mm_batch.jsontypes import JsonObject
from mm_batch.run.ports import ModelReply, ToolCallRequest
from mm_batch.testing.fake_openai import FakeOpenAI, Script, by_prompt, text, tool_call
from tests.helpers import Cli, CliResult, Fake, check_report, read_calls, write
from tests.helpers import priced_model_args as _model

PROMPT = "Probe the service."
SECRET = "hunter2-very-secret"
PRICED = "openai/gpt-4o-mini"  # litellm prices it: a cached turn must cost 0


def _suite(directory: Path, tasks_extra: str = "", agent_extra: str = "") -> Path:
    """An agent whose tool appends to ran.log (counting its runs) and prints state.txt;
    `tasks_extra` holds whole lines for the top of the tasks file, after `agent:`."""
    write(
        directory,
        "agent.yaml",
        f"""
        yolo: true
        {agent_extra}
        tools:
          - name: probe
            description: Report the state of the service.
            command: ["./probe.sh"]
        """,
    )
    probe = write(directory, "probe.sh", "#!/bin/sh\necho ran >> ran.log\ncat state.txt\n")
    probe.chmod(0o755)
    write(directory, "state.txt", "state: green\n")
    return write(
        directory,
        "tasks.yaml",
        f"agent: agent.yaml\n{tasks_extra}tasks:\n  - id: probe\n    prompt: {PROMPT}\n"
        "    expect: {calls: [{tool: probe}], answer_contains: [green]}\n",
    )


def _script() -> Script:
    return by_prompt({PROMPT: [tool_call("probe", {}), text("The service is green.")]})


def _turns(out: Path) -> list[dict[str, Any]]:
    return [r for r in read_calls(out) if r["kind"] == "model"]


def _entries(folder: Path) -> list[Path]:
    return sorted(folder.glob("*.json"))


def _tool_runs(suite: Path) -> int:
    log = suite / "ran.log"
    return len(log.read_text().splitlines()) if log.exists() else 0


def _run(
    cli: Cli,
    tasks: Path,
    server: FakeOpenAI,
    out: Path,
    *extra: str | Path,
    model: str = PRICED,
    cwd: Path | None = None,
) -> CliResult:
    result = cli("run", tasks, *_model(server, model), "--out", out, *extra, cwd=cwd)
    check_report(out / "junit.xml")
    return result


def test_a_rerun_asks_no_model_and_its_tools_still_run(
    cli: Cli, fake_model: Fake, tmp_path: Path
) -> None:
    tasks = _suite(tmp_path / "suite")
    server = fake_model(_script())
    cache = tmp_path / "cache"
    first = _run(cli, tasks, server, tmp_path / "out1", "--cache", cache)
    assert first.code == 0, first.err
    assert len(server.requests) == 2
    assert len(_entries(cache)) == 2
    turns = _turns(tmp_path / "out1")
    assert [t["cached"] for t in turns] == [False, False]
    assert all(t["cost_usd"] > 0 for t in turns)

    second = _run(cli, tasks, server, tmp_path / "out2", "--cache", cache)
    assert second.code == 0, second.err
    assert len(server.requests) == 2  # no request at all
    replayed = _turns(tmp_path / "out2")
    assert [t["cached"] for t in replayed] == [True, True]
    assert [t["cost_usd"] for t in replayed] == [0, 0]
    assert [t["tool_calls"] for t in replayed] == [t["tool_calls"] for t in turns]
    assert _tool_runs(tasks.parent) == 2  # the tool ran in both runs
    tool = next(r for r in read_calls(tmp_path / "out2") if r["kind"] == "tool")
    assert tool["outcome"] == "ran" and tool["stdout"] == "state: green\n"

    # Without --cache, the same process asks the model again, and stores nothing.
    third = _run(cli, tasks, server, tmp_path / "out3")
    assert third.code == 0, third.err
    assert len(server.requests) == 4
    assert [t["cached"] for t in _turns(tmp_path / "out3")] == [False, False]
    assert len(_entries(cache)) == 2


def test_a_local_server_on_another_port_still_hits(
    cli: Cli, fake_model: Fake, tmp_path: Path
) -> None:
    """A local model's server listens on a new port each run: the port is not in the key (nor
    the timeout), the rest of the options are."""
    tasks = _suite(tmp_path / "suite")
    first_server, second_server = fake_model(_script()), fake_model(_script())
    assert first_server.url != second_server.url
    cache = tmp_path / "cache"
    args: list[str | Path] = ["--cache", cache, "--model-option", "timeout=30"]
    local = "hosted_vllm/qwen"
    assert _run(cli, tasks, first_server, tmp_path / "out1", *args, model=local).code == 0
    timeout = ["--model-option", "timeout=45"]
    result = _run(cli, tasks, second_server, tmp_path / "out2", *args, *timeout, model=local)
    assert result.code == 0, result.err
    assert len(second_server.requests) == 0
    assert [t["cached"] for t in _turns(tmp_path / "out2")] == [True, True]

    # A sampling option is part of the request: another temperature is another key.
    hotter = ["--model-option", "temperature=0.7"]
    assert _run(cli, tasks, second_server, tmp_path / "out3", *args, *hotter, model=local).code == 0
    assert len(second_server.requests) == 2
    assert len(_entries(cache)) == 4


def test_each_repeat_replays_its_own_replies(cli: Cli, fake_model: Fake, tmp_path: Path) -> None:
    """Repeats are separate trials: each has its own entries, whatever order they run in."""
    tasks = _suite(tmp_path / "suite", "repeat: 3\n")
    answers = iter(["green", "green, at last", "green again"])

    def script(request: dict[str, Any]) -> Any:
        if request["messages"][-1]["role"] == "user":
            return tool_call("probe", {})
        return text(f"The service is {next(answers)}.")

    server = fake_model(script)
    cache = tmp_path / "cache"
    assert _run(cli, tasks, server, tmp_path / "out1", "--cache", cache).code == 0
    assert len(server.requests) == 6 and len(_entries(cache)) == 6
    assert _run(cli, tasks, server, tmp_path / "out2", "--cache", cache).code == 0
    assert len(server.requests) == 6

    def answers_of(out: Path) -> dict[str, str]:
        return {r["run"]: r["answer"] for r in read_calls(out) if r["kind"] == "task"}

    assert answers_of(tmp_path / "out2") == answers_of(tmp_path / "out1")
    assert len(set(answers_of(tmp_path / "out1").values())) == 3


def test_a_changed_tool_output_asks_the_model_from_that_turn(
    cli: Cli, fake_model: Fake, tmp_path: Path
) -> None:
    tasks = _suite(tmp_path / "suite")
    server = fake_model(_script())
    cache = tmp_path / "cache"
    assert _run(cli, tasks, server, tmp_path / "out1", "--cache", cache).code == 0
    (tasks.parent / "state.txt").write_text("state: green, 2 replicas\n")
    result = _run(cli, tasks, server, tmp_path / "out2", "--cache", cache)
    assert result.code == 0, result.err
    # The first turn is the same request; the second holds the new output.
    assert len(server.requests) == 3
    assert "2 replicas" in json.dumps(server.requests[-1]["messages"])
    assert [t["cached"] for t in _turns(tmp_path / "out2")] == [True, False]
    assert len(_entries(cache)) == 3
    assert _tool_runs(tasks.parent) == 2


def test_read_mode_uses_hits_and_stores_nothing(cli: Cli, fake_model: Fake, tmp_path: Path) -> None:
    tasks = _suite(tmp_path / "suite")
    server = fake_model(_script())
    empty = tmp_path / "empty"
    empty.mkdir()
    read = ["--cache-mode", "read"]
    assert _run(cli, tasks, server, tmp_path / "out1", "--cache", empty, *read).code == 0
    assert len(server.requests) == 2
    assert _entries(empty) == []  # misses were asked, and not stored

    filled = tmp_path / "filled"
    assert _run(cli, tasks, server, tmp_path / "out2", "--cache", filled).code == 0
    (tasks.parent / "state.txt").write_text("state: green, 2 replicas\n")
    assert _run(cli, tasks, server, tmp_path / "out3", "--cache", filled, *read).code == 0
    assert [t["cached"] for t in _turns(tmp_path / "out3")] == [True, False]
    assert len(server.requests) == 5
    assert len(_entries(filled)) == 2


def test_write_mode_never_reads_and_stores_every_reply(
    cli: Cli, fake_model: Fake, tmp_path: Path
) -> None:
    tasks = _suite(tmp_path / "suite")
    server = fake_model(_script())
    cache = tmp_path / "cache"
    assert _run(cli, tasks, server, tmp_path / "out1", "--cache", cache).code == 0
    before = {p.name: p.stat().st_ino for p in _entries(cache)}
    result = _run(cli, tasks, server, tmp_path / "out2", "--cache", cache, "--cache-mode", "write")
    assert result.code == 0, result.err
    assert len(server.requests) == 4  # every turn asked again
    assert [t["cached"] for t in _turns(tmp_path / "out2")] == [False, False]
    after = {p.name: p.stat().st_ino for p in _entries(cache)}
    assert after.keys() == before.keys()
    # Each entry rewritten with the new reply: a new file renamed over the old one.
    assert all(after[name] != before[name] for name in before)


def test_the_tasks_file_names_the_cache_and_the_cli_overrides_it(
    cli: Cli, fake_model: Fake, tmp_path: Path
) -> None:
    tasks = _suite(tmp_path / "suite", "cache: model-cache\ncache_mode: write\n")
    server = fake_model(_script())
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    # Relative to the tasks file, wherever the command runs from.
    assert _run(cli, tasks, server, tmp_path / "out1", cwd=elsewhere).code == 0
    folder = tasks.parent / "model-cache"
    assert len(_entries(folder)) == 2
    # The file says write (never read): asked again.
    assert _run(cli, tasks, server, tmp_path / "out2").code == 0
    assert len(server.requests) == 4
    # --cache-mode wins over cache_mode:, and reads the file's folder.
    assert _run(cli, tasks, server, tmp_path / "out3", "--cache-mode", "readwrite").code == 0
    assert len(server.requests) == 4
    # --cache wins over cache:.
    other = tmp_path / "other"
    assert _run(cli, tasks, server, tmp_path / "out4", "--cache", other).code == 0
    assert len(server.requests) == 6
    assert len(_entries(other)) == 2


def test_cache_usage_errors_stop_before_anything_runs(
    cli: Cli, fake_model: Fake, tmp_path: Path
) -> None:
    tasks = _suite(tmp_path / "suite")
    server = fake_model(_script())
    out = tmp_path / "out"
    result = cli("run", tasks, *_model(server), "--out", out, "--cache-mode", "read")
    assert result.code == 2
    assert "--cache-mode needs a cache" in result.err
    missing = tmp_path / "missing"
    result = cli(
        "run", tasks, *_model(server), "--out", out, "--cache", missing, "--cache-mode", "read"
    )
    assert result.code == 2
    assert f"the cache folder {missing} does not exist" in result.err
    a_file = write(tmp_path, "a-file", "x")
    result = cli("run", tasks, *_model(server), "--out", out, "--cache", a_file / "sub")
    assert result.code == 2
    assert "cannot be used (Not a directory)" in result.err
    assert server.requests == [] and _tool_runs(tasks.parent) == 0 and not out.exists()


def test_the_tasks_file_cache_keys_are_validated_at_their_line(cli: Cli, tmp_path: Path) -> None:
    tasks = _suite(tmp_path / "suite", "cache_mode: read\n")
    result = cli("validate", tasks)
    assert result.code == 2
    assert "tasks.yaml:2: cache_mode: cache_mode needs 'cache' beside it" in result.out + result.err
    write(tmp_path / "suite", "a-file", "x")
    tasks = _suite(tmp_path / "suite", "cache: a-file\ncache_mode: sometimes\n")
    result = cli("validate", tasks)
    assert result.code == 2
    shown = result.out + result.err
    assert "tasks.yaml:2: cache: the cache must be a folder" in shown
    assert "tasks.yaml:3: cache_mode: expected one of read, write, readwrite" in shown


@pytest.mark.parametrize(
    "damage",
    [
        "garbage",
        "foreign",
        "wrong_shape",
        "fifo",
        "link",
    ],
)
def test_a_damaged_or_foreign_entry_is_a_miss(
    cli: Cli, fake_model: Fake, tmp_path: Path, damage: str
) -> None:
    tasks = _suite(tmp_path / "suite")
    server = fake_model(_script())
    cache = tmp_path / "cache"
    assert _run(cli, tasks, server, tmp_path / "out1", "--cache", cache).code == 0
    first = _entries(cache)[0]  # whichever turn it holds
    entry = json.loads(first.read_text())
    first.unlink()
    if damage == "garbage":
        first.write_bytes(b"\x00\xff not json" + b"[" * 100_000)
    elif damage == "foreign":  # another key's entry under this name
        first.write_text(json.dumps({**entry, "key": "0" * 64}))
    elif damage == "wrong_shape":  # a completion litellm cannot convert
        entry["response"]["choices"] = [{"message": {"tool_calls": "not a list"}}]
        entry["response"]["usage"] = "lots"
        first.write_text(json.dumps(entry))
    elif damage == "fifo":  # a read would block forever
        os.mkfifo(first)
    else:
        first.symlink_to(tmp_path / "out1" / "summary.json")
    target = (tmp_path / "out1" / "summary.json").read_bytes()
    result = _run(cli, tasks, server, tmp_path / "out2", "--cache", cache)
    assert result.code == 0, result.err
    assert len(server.requests) == 3  # the damaged turn was asked, the other was a hit
    assert sorted(t["cached"] for t in _turns(tmp_path / "out2")) == [False, True]
    assert f"the cache entry {first.name} cannot be used" in result.err
    # The new reply replaced the entry itself: a link's target is never written through.
    assert first.is_file() and not first.is_symlink()
    assert (tmp_path / "out1" / "summary.json").read_bytes() == target
    # The reply asked for again replaced the damaged entry: the next run hits both.
    assert _run(cli, tasks, server, tmp_path / "out3", "--cache", cache).code == 0
    assert len(server.requests) == 3


def test_no_secret_reaches_the_cache(
    cli: Cli, fake_model: Fake, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The tool prints a secret of the agent's; the model echoes what it was sent. Requests are
    masked before they are sent, so neither the keys nor the stored replies hold the secret."""
    tasks = _suite(
        tmp_path / "suite",
        agent_extra="model_options: {api_key: '${PROBE_TOKEN}'}",
    )
    write(
        tmp_path / "suite",
        "probe.sh",
        '#!/bin/sh\necho ran >> ran.log\necho "token: $PROBE_TOKEN"\n',
    ).chmod(0o755)
    agent = tasks.parent / "agent.yaml"
    agent.write_text(
        agent.read_text().replace(
            'command: ["./probe.sh"]',
            'command: ["./probe.sh"]\n    env: {PROBE_TOKEN: "${PROBE_TOKEN}"}',
        )
    )

    def echo(request: dict[str, Any]) -> Any:
        last = request["messages"][-1]
        if last["role"] == "user":
            return tool_call("probe", {})
        return text(f"I was told: {last['content']} green")

    server = fake_model(echo)
    cache = tmp_path / "cache"
    monkeypatch.setenv("PROBE_TOKEN", SECRET)
    model = ["--model", "hosted_vllm/fake", "--model-option", f"api_base={server.url}"]
    result = cli("run", tasks, *model, "--out", tmp_path / "out", "--cache", cache)
    assert result.code == 0, result.err
    assert SECRET not in json.dumps(server.requests)
    stored = b"".join(p.read_bytes() for p in cache.iterdir())
    assert b"token: ***" in stored  # the masked output, echoed by the model, was stored
    assert SECRET.encode() not in stored


def test_the_store_reads_only_entries_it_wrote(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The store alone: a key that is not ours reads nothing, a write lands atomically as
    JSON beside nothing else, what it hands back is the reply it stored, and a write that
    fails is said once, never raised into the run."""
    folder = cache_module.open_folder(CacheSettings(tmp_path / "c", "readwrite"))
    store = cache_module.ResponseStore(folder, Masker([]))
    try:
        key = cache_module.request_key("m", [{"role": "user", "content": "hi"}], [], {})
        reply = ModelReply("yo", (), "stop", 3, 2, 0.5, attempts=2, cost_usd=0.01)
        store.put(key, reply, "m")
        assert [p.name for p in (tmp_path / "c").iterdir()] == [f"{key}.json"]
        hit = store.get(key, time.monotonic())
        assert hit is not None and hit.cached and hit.cost_usd == 0.0 and hit.attempts == 1
        assert (hit.text, hit.finish_reason, hit.prompt_tokens) == ("yo", "stop", 3)
        assert store.get("../" + key, time.monotonic()) is None
        assert store.get(key.upper(), time.monotonic()) is None
        for path in (tmp_path / "c").iterdir():
            path.unlink()
        (tmp_path / "c").rmdir()  # gone mid-run
        for _ in range(2):
            store.put(key, reply, "m")
        assert capsys.readouterr().err.count("cannot be stored in the cache") == 1
        assert store.get(key, time.monotonic()) is None
    finally:
        folder.close()


# -- the cache as a client around any client -------------------------------------------------


class Fixed:
    """A model client that answers every turn with one reply, counting the turns it was asked."""

    def __init__(self, reply: ModelReply) -> None:
        self.reply = reply
        self.asked = 0

    def complete(self, messages: Messages, tools: ToolSchemas, timeout: float) -> ModelReply:
        self.asked += 1
        return self.reply


THINKING: JsonObject = {
    "thinking_blocks": [{"type": "thinking", "thinking": "hm", "signature": "c2ln"}]
}
SIGNED: JsonObject = {"provider_specific_fields": {"thought_signature": "abc"}}
ODD_REPLY = ModelReply(
    text=None,
    tool_calls=(
        ToolCallRequest("c0", "probe", '{"x": 1}', provider_fields={**SIGNED, "function": SIGNED}),
        ToolCallRequest("c1", "", ""),
    ),
    finish_reason="MALFORMED_FUNCTION_CALL",
    prompt_tokens=None,
    completion_tokens=7,
    latency_s=1.5,
    attempts=3,
    cost_usd=0.25,
    provider_parts=THINKING,
)


@pytest.mark.parametrize("mode", ["read", "write", "readwrite"])
def test_any_client_is_cached_and_a_replay_is_the_reply_it_was(
    tmp_path: Path, mode: CacheMode
) -> None:
    """The fake client's reply, with a provider's finish word, signed thinking and signed
    calls, replays as the same reply (the next turn sends its parts back: the same key),
    answered from the cache at no cost; read stores nothing, write reads nothing."""
    folder = cache_module.open_folder(CacheSettings(tmp_path / "c", "readwrite"))
    store = cache_module.ResponseStore(folder, Masker([]))
    fake = Fixed(ODD_REPLY)

    def client(use: CacheMode) -> cache_module.CachedClient:
        return cache_module.CachedClient(fake, store, cache_module.CacheUse(use), "m", {})

    messages: Messages = [{"role": "user", "content": "go"}]
    client("write").complete(messages, [], 30)  # fills the entry
    replay = client(mode).complete(messages, [], 30)
    if mode == "write":
        assert fake.asked == 2 and replay is ODD_REPLY
        return
    assert fake.asked == 1 and replay.cached and replay.cost_usd == 0.0
    asked = dataclasses.replace(ODD_REPLY, latency_s=replay.latency_s, attempts=1)
    assert replay == dataclasses.replace(asked, cost_usd=0.0, cached=True)
    assert dict(replay.provider_parts) == THINKING
    assert [dict(c.provider_fields) for c in replay.tool_calls] == [
        {**SIGNED, "function": SIGNED},
        {},
    ]
    other: Messages = [{"role": "user", "content": "another"}]
    client(mode).complete(other, [], 30)  # a miss
    assert fake.asked == 2
    stored = len(list((tmp_path / "c").glob("*.json")))
    assert stored == (1 if mode == "read" else 2)


def test_a_cached_reply_is_masked_in_its_entry(tmp_path: Path) -> None:
    folder = cache_module.open_folder(CacheSettings(tmp_path / "c", "readwrite"))
    store = cache_module.ResponseStore(folder, Masker([SECRET]))
    fake = Fixed(ModelReply(f"the key is {SECRET}", (), "stop", 1, 1, 0.1))
    cached = cache_module.CachedClient(fake, store, cache_module.CacheUse("readwrite"), "m", {})
    messages: Messages = [{"role": "user", "content": "go"}]
    cached.complete(messages, [], 30)
    (entry,) = (tmp_path / "c").glob("*.json")
    assert SECRET not in entry.read_text() and "the key is ***" in entry.read_text()
    replay = cached.complete(messages, [], 30)
    assert replay.cached and replay.text == "the key is ***"


# An entry as litellm 1.110's own caching wrote it, when the cache was litellm's: the
# provider's finish word beside litellm's "stop" for it.
LITELLM_ENTRY = {
    "format": "mm-batch-cache/1",
    "model": "openai/gpt-4o-mini",
    "response": {
        "choices": [
            {
                "finish_reason": "stop",
                "index": 0,
                "message": {
                    "content": None,
                    "function_call": None,
                    "role": "assistant",
                    "tool_calls": [
                        {
                            "function": {"arguments": '{"a": 1}', "name": "probe"},
                            "id": "call_1",
                            "type": "function",
                        }
                    ],
                },
                "provider_specific_fields": {"native_finish_reason": "MALFORMED_FUNCTION_CALL"},
            }
        ],
        "created": 1796618851,
        "id": "chatcmpl-2",
        "model": "gpt-4o-mini",
        "object": "chat.completion",
        "usage": {
            "completion_tokens": 5,
            "completion_tokens_details": None,
            "prompt_tokens": 10,
            "prompt_tokens_details": None,
            "total_tokens": 15,
        },
    },
}


def test_a_folder_litellm_filled_is_still_read(tmp_path: Path) -> None:
    """Existing caches stay valid: the same key for the same request, and litellm's entry
    read as the reply it was, the provider's finish word kept (a cut turn fails again)."""
    messages: Messages = [{"role": "user", "content": "hi"}]
    options = {"api_base": "http://127.0.0.1:1/v1", "api_key": "x", "temperature": 0}
    key = cache_module.request_key("openai/gpt-4o-mini", messages, [], options)
    # The key litellm's cache was given for this request: pinned, as the folders are.
    assert key == "4c03ac0e1179b44ce5203a02ed09fe290290d690e4994b07c32d52747b838f04"
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / f"{key}.json").write_text(json.dumps({**LITELLM_ENTRY, "key": key}))
    folder = cache_module.open_folder(CacheSettings(tmp_path / "c", "read"))
    store = cache_module.ResponseStore(folder, Masker([]))
    fake = Fixed(ModelReply("asked", (), "stop", 1, 1, 0.1))
    use = cache_module.CacheUse("read")
    cached = cache_module.CachedClient(fake, store, use, "openai/gpt-4o-mini", options)
    reply = cached.complete(messages, [], 30)
    assert fake.asked == 0 and reply.cached and reply.cost_usd == 0.0
    assert reply.finish_reason == "MALFORMED_FUNCTION_CALL"
    assert [(c.id, c.name, c.raw_arguments) for c in reply.tool_calls] == [
        ("call_1", "probe", '{"a": 1}')
    ]
    assert (reply.prompt_tokens, reply.completion_tokens) == (10, 5)
