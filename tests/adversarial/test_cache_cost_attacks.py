"""Attacks on the model response cache (`--cache DIR`) and on tokens, cost and `--max-cost`.

The cache folder is hostile input (a CI cache a pull request can write), the model may be
hostile (its replies are stored for the next run; it reports the usage it likes), and so may
the config author. What must hold: a cached reply is a model reply like any other (consent and
`expect` judge what really ran); a damaged cache is a miss, never an error, exit 4 or a hang;
read mode writes nothing, write mode reads nothing; no secret reaches the cache files; two
different requests never share an entry; no run starts once the batch spent `--max-cost`, and
no hostile cost makes it start runs past the limit unnoticed; the reports stay valid.
"""

from __future__ import annotations

import json
import os
import socket
import stat
from pathlib import Path
from typing import Any

import pytest

from mm_batch.effects import cache as cache_module
from mm_batch.testing.fake_openai import (
    FakeOpenAI,
    RawReply,
    Reply,
    Script,
    by_prompt,
    first_user_message,
    text,
    tool_call,
)
from tests.helpers import Cli, CliResult, Fake, check_report, read_calls, turn_usd, write
from tests.helpers import priced_model_args as _model

PROMPT = "Probe the service."
PRICED = "openai/gpt-4o-mini"  # litellm prices it
SECRET = "sk-leaked-by-the-provider-42"


def _suite(directory: Path, agent_top: str = "yolo: true", tasks_top: str = "") -> Path:
    """An agent with `probe` (counts its runs in ran.log) and `danger` (leaves a marker)."""
    tools = (
        "tools:\n"
        "  - name: probe\n"
        "    description: Report the state of the service.\n"
        '    command: ["./probe.sh"]\n'
        "  - name: danger\n"
        "    description: Drop the production database.\n"
        '    command: ["touch", "danger-ran"]\n'
    )
    write(directory, "agent.yaml", f"{agent_top}\n{tools}")
    probe = write(directory, "probe.sh", "#!/bin/sh\necho ran >> ran.log\necho 'state: green'\n")
    probe.chmod(0o755)
    return write(
        directory,
        "tasks.yaml",
        f"agent: agent.yaml\n{tasks_top}tasks:\n  - id: probe\n    prompt: {PROMPT}\n"
        "    expect: {calls: [{tool: probe}], answer_contains: [green]}\n",
    )


def _script() -> Script:
    return by_prompt({PROMPT: [tool_call("probe", {}), text("The service is green.")]})


def _run(
    cli: Cli, tasks: Path, server: FakeOpenAI, out: Path, *extra: str | Path, model: str = PRICED
) -> CliResult:
    result = cli("run", tasks, *_model(server, model), "--out", out, *extra)
    assert result.code != 4, result.err
    check_report(out / "junit.xml")
    return result


def _turns(out: Path) -> list[dict[str, Any]]:
    return [r for r in read_calls(out) if r["kind"] == "model"]


def _tools(out: Path) -> list[dict[str, Any]]:
    return [r for r in read_calls(out) if r["kind"] == "tool"]


def _entries(folder: Path) -> list[Path]:
    return sorted(folder.glob("*.json"))


def _tool_runs(suite: Path) -> int:
    log = suite / "ran.log"
    return len(log.read_text().splitlines()) if log.exists() else 0


def _first_turn_entry(cache: Path) -> Path:
    """The entry of the first request: the reply that asks for the tool."""
    for path in _entries(cache):
        message = json.loads(path.read_text())["response"]["choices"][0]["message"]
        if message.get("tool_calls"):
            return path
    raise AssertionError("no entry asks for a tool")


def _rewrite_message(entry: Path, message: dict[str, Any]) -> None:
    data = json.loads(entry.read_text())
    data["response"]["choices"][0]["message"] = message
    data["response"]["choices"][0]["finish_reason"] = (
        "tool_calls" if "tool_calls" in message else "stop"
    )
    entry.write_text(json.dumps(data))


def _filled(cli: Cli, tasks: Path, server: FakeOpenAI, tmp_path: Path, *extra: str) -> Path:
    """A cache holding both turns of the task, from a run that passed."""
    cache = tmp_path / "cache"
    first = _run(cli, tasks, server, tmp_path / "fill", "--cache", cache, *extra)
    assert first.code == 0, first.err
    assert len(_entries(cache)) == 2
    return cache


def _snapshot(folder: Path) -> dict[str, tuple[str, bytes]]:
    """Every name in the folder, its kind, and a regular file's bytes."""
    shot: dict[str, tuple[str, bytes]] = {}
    for entry in os.scandir(folder):
        if entry.is_symlink():
            shot[entry.name] = ("link", os.readlink(entry.path).encode())
        elif entry.is_file(follow_symlinks=False):
            shot[entry.name] = ("file", Path(entry.path).read_bytes())
        else:
            shot[entry.name] = ("other", b"")
    return shot


# --- (1) consent and the verdict hold whatever the cache replays -------------------------------


@pytest.mark.parametrize("form", ["tool_call", "text_call"])
def test_a_cached_call_off_the_allowlist_is_refused_and_fails_the_task(
    cli: Cli, fake_model: Fake, tmp_path: Path, form: str
) -> None:
    """The entry asks for `danger`, as a real call or as a call written in the text (which
    recover_text_tool_calls takes as one): consent still decides."""
    agent = "yolo: false\nallow:\n  - tool: probe\nmodel_options: {recover_text_tool_calls: true}"
    tasks = _suite(tmp_path / "suite", agent_top=agent)
    server = fake_model(_script())
    cache = _filled(cli, tasks, server, tmp_path)
    planted = (
        tool_call("danger", {})
        if form == "tool_call"
        else text('{"name": "danger", "arguments": {}}')
    )
    _rewrite_message(_first_turn_entry(cache), planted)
    result = _run(cli, tasks, server, tmp_path / "out", "--cache", cache)
    assert result.code == 1, result.err
    assert not (tasks.parent / "danger-ran").exists()
    (danger,) = [t for t in _tools(tmp_path / "out") if t["tool"] == "danger"]
    assert danger["outcome"] == "refused" and danger["started"] is False
    assert danger["recovered_from_text"] is (form == "text_call")
    assert _turns(tmp_path / "out")[0]["cached"] is True
    (task,) = [r for r in read_calls(tmp_path / "out") if r["kind"] == "task"]
    assert task["status"] == "failed"


def test_a_cached_answer_without_the_tool_does_not_meet_expect(
    cli: Cli, fake_model: Fake, tmp_path: Path
) -> None:
    """The entry answers 'green' at once: `expect` asks for a probe that really ran."""
    tasks = _suite(tmp_path / "suite")
    server = fake_model(_script())
    cache = _filled(cli, tasks, server, tmp_path)
    _rewrite_message(_first_turn_entry(cache), text("The service is green."))
    result = _run(cli, tasks, server, tmp_path / "out", "--cache", cache)
    assert result.code == 1, result.err
    assert _tool_runs(tasks.parent) == 1  # only the filling run probed
    (task,) = [r for r in read_calls(tmp_path / "out") if r["kind"] == "task"]
    assert task["status"] == "failed"
    assert not next(c for c in task["checks"] if "probe" in json.dumps(c))["ok"]


def test_a_cached_call_with_hostile_arguments_is_answered_as_invalid(
    cli: Cli, fake_model: Fake, tmp_path: Path
) -> None:
    """An option injection replayed from the cache is checked like one from the model."""
    tasks = _suite(tmp_path / "suite")
    write(
        tmp_path / "suite",
        "agent.yaml",
        """
        yolo: true
        tools:
          - name: probe
            description: Report the state of the service.
            parameters:
              target: {type: string, description: What to probe.}
            command: ["./probe.sh", "{{target}}"]
        """,
    )
    server = fake_model(by_prompt({PROMPT: [tool_call("probe", {"target": "db"}), text("green")]}))
    cache = _filled(cli, tasks, server, tmp_path)
    _rewrite_message(_first_turn_entry(cache), tool_call("probe", {"target": "--rm=/"}))
    result = _run(cli, tasks, server, tmp_path / "out", "--cache", cache)
    assert result.code == 1, result.err
    (call, *_) = _tools(tmp_path / "out")
    assert call["outcome"] == "invalid" and call["started"] is False
    assert _tool_runs(tasks.parent) == 1


def test_a_reply_the_model_sent_oddly_replays_as_it_ran(
    cli: Cli, fake_model: Fake, tmp_path: Path
) -> None:
    """A hostile model sends its call's arguments as a JSON object, not a string, and a text
    beside the call: stored, then replayed, the run records the same call and the same verdict."""
    tasks = _suite(tmp_path / "suite")
    odd = tool_call("probe", {})
    odd["tool_calls"][0]["function"]["arguments"] = {"extra": [1, {"deep": None}]}
    odd["content"] = "Let me look."
    server = fake_model(by_prompt({PROMPT: [odd, text("The service is green.")]}))
    cache = tmp_path / "cache"
    first = _run(cli, tasks, server, tmp_path / "out1", "--cache", cache)
    second = _run(cli, tasks, server, tmp_path / "out2", "--cache", cache)
    assert len(server.requests) == 2
    assert first.code == second.code
    fields = ("tool", "raw_arguments", "outcome", "started")

    def calls(out: Path) -> list[tuple[Any, ...]]:
        return [tuple(t[f] for f in fields) for t in _tools(out)]

    assert calls(tmp_path / "out2") == calls(tmp_path / "out1")
    assert [t["tool_calls"] for t in _turns(tmp_path / "out2")] == [
        t["tool_calls"] for t in _turns(tmp_path / "out1")
    ]
    assert [t.get("content") for t in _turns(tmp_path / "out2")] == [
        t.get("content") for t in _turns(tmp_path / "out1")
    ]


# --- (2) a damaged cache is a miss: never an error, exit 4 or a hang ---------------------------


def _damage(entry: Path, damage: str, tmp_path: Path) -> None:
    data = json.loads(entry.read_text())
    entry.unlink()
    if damage == "directory":
        entry.mkdir()
        (entry / "x").write_text("x")
    elif damage == "huge_sparse":  # over the 32 MiB bound, costs no disk
        with entry.open("wb") as handle:
            handle.truncate(33 * 1024 * 1024)
    elif damage == "deep_inside":  # a valid envelope, content nested past any recursion limit
        data["response"]["choices"][0]["message"]["content"] = "@"
        text_ = json.dumps(data).replace('"@"', "[" * 200_000 + "]" * 200_000)
        entry.write_text(text_)
    elif damage == "dangling_link":
        entry.symlink_to(tmp_path / "nowhere.json")
    elif damage == "link_to_dev_zero":
        entry.symlink_to("/dev/zero")
    elif damage == "socket":
        listener = socket.socket(socket.AF_UNIX)
        here = Path.cwd()
        os.chdir(entry.parent)  # a socket's path must be short: bind its bare name
        try:
            listener.bind(entry.name)
        finally:
            os.chdir(here)
            listener.close()
    elif damage == "content_list":  # a shape litellm cannot turn into a reply
        data["response"]["choices"][0]["message"]["content"] = [{"type": "text", "text": "x"}]
        entry.write_text(json.dumps(data))
    elif damage == "no_choices":
        data["response"]["choices"] = []
        entry.write_text(json.dumps(data))
    elif damage == "huge_number":  # past Python's limit on the digits of an int it parses
        data["response"]["usage"] = {"prompt_tokens": "@"}
        entry.write_text(json.dumps(data).replace('"@"', "9" * 5000))
    elif damage == "device":  # /dev/zero's node, planted as a file of the folder
        try:
            os.mknod(entry, 0o600 | stat.S_IFCHR, os.makedev(1, 5))
        except PermissionError:
            pytest.skip("no permission to make a device node here")
    elif damage == "unreadable":
        entry.write_text(json.dumps(data))
        entry.chmod(0)
    else:
        raise AssertionError(damage)


DAMAGES = [
    "directory",
    "huge_sparse",
    "deep_inside",
    "dangling_link",
    "link_to_dev_zero",
    "socket",
    "content_list",
    "no_choices",
    "huge_number",
    "device",
    "unreadable",
]


@pytest.mark.parametrize("damage", DAMAGES)
def test_a_damaged_entry_is_a_miss_and_the_model_is_asked(
    cli: Cli, fake_model: Fake, tmp_path: Path, damage: str
) -> None:
    tasks = _suite(tmp_path / "suite")
    server = fake_model(_script())
    cache = _filled(cli, tasks, server, tmp_path)
    entry = _first_turn_entry(cache)
    _damage(entry, damage, tmp_path)
    asked = len(server.requests)
    result = _run(cli, tasks, server, tmp_path / "out", "--cache", cache)
    assert result.code == 0, result.err
    cached = [t["cached"] for t in _turns(tmp_path / "out")]
    if damage == "unreadable" and os.geteuid() == 0:  # root reads a mode-0 file anyway
        assert cached == [True, True]
        return
    assert cached == [False, True]
    assert len(server.requests) == asked + 1


def test_a_reply_with_a_field_nested_too_deep_is_stored_as_the_run_read_it(
    cli: Cli, fake_model: Fake, tmp_path: Path
) -> None:
    """A hostile model nests a field 600 levels deep: the reply is used, and the cache stores
    the reply the run read (the nesting never reaches the folder); the next run replays it."""
    tasks = _suite(tmp_path / "suite")
    deep = "[" * 600 + "]" * 600
    body = (
        '{"id": "x", "object": "chat.completion", "created": 1, "model": "gpt-4o-mini", '
        f'"extra": {deep}, "choices": [{{"index": 0, "message": {{"role": "assistant", '
        '"content": "The service is green."}, "finish_reason": "stop"}], '
        '"usage": {"prompt_tokens": 10, "completion_tokens": 5}}'
    )

    def script(request: dict[str, Any]) -> Reply:
        if request["messages"][-1]["role"] == "user":
            return tool_call("probe", {})
        return RawReply(body.encode())

    server = fake_model(script)
    cache = tmp_path / "cache"
    for out in ("out1", "out2"):
        result = _run(cli, tasks, server, tmp_path / out, "--cache", cache)
        assert result.code == 0, result.err
    assert [t["cached"] for t in _turns(tmp_path / "out2")] == [True, True]
    assert len(server.requests) == 2
    assert len(_entries(cache)) == 2
    assert all("[[[" not in entry.read_text() for entry in _entries(cache))


def test_a_reply_too_big_to_replay_is_not_written(
    cli: Cli, fake_model: Fake, tmp_path: Path
) -> None:
    """A hostile model answers with 33 MiB of text: an entry that size is never read back (a
    miss, by the 32 MiB bound), so writing it only fills the CI cache's disk, run after run."""
    tasks = _suite(tmp_path / "suite")
    huge = "green " * (33 * 1024 * 1024 // 6)

    def script(request: dict[str, Any]) -> Reply:
        if request["messages"][-1]["role"] == "user":
            return tool_call("probe", {})
        return text(huge)

    server = fake_model(script)
    cache = tmp_path / "cache"
    result = _run(cli, tasks, server, tmp_path / "out", "--cache", cache)
    assert result.code == 0, result.err
    sizes = [p.stat().st_size for p in _entries(cache)]
    assert all(size <= cache_module.MAX_ENTRY_BYTES for size in sizes), sizes


# --- (3) read mode writes nothing, write mode reads nothing ------------------------------------


def test_read_mode_leaves_a_damaged_folder_exactly_as_it_was(
    cli: Cli, fake_model: Fake, tmp_path: Path
) -> None:
    tasks = _suite(tmp_path / "suite")
    server = fake_model(_script())
    cache = _filled(cli, tasks, server, tmp_path)
    first = _first_turn_entry(cache)
    first.write_text("not json")  # a miss: in readwrite it would be replaced
    (cache / "notes.txt").write_text("left alone")
    before = _snapshot(cache)
    result = _run(cli, tasks, server, tmp_path / "out", "--cache", cache, "--cache-mode", "read")
    assert result.code == 0, result.err
    assert [t["cached"] for t in _turns(tmp_path / "out")] == [False, True]
    assert _snapshot(cache) == before


def test_write_mode_replays_no_planted_entry(cli: Cli, fake_model: Fake, tmp_path: Path) -> None:
    """Planted entries ask for `danger`, a FIFO sits in another's place: write mode asks the
    model for every turn, opens no entry, and the planted call never runs."""
    tasks = _suite(tmp_path / "suite")
    server = fake_model(_script())
    cache = _filled(cli, tasks, server, tmp_path)
    first = _first_turn_entry(cache)
    _rewrite_message(first, tool_call("danger", {}))
    (second,) = [p for p in _entries(cache) if p != first]
    second.unlink()
    os.mkfifo(second)
    asked = len(server.requests)
    result = _run(cli, tasks, server, tmp_path / "out", "--cache", cache, "--cache-mode", "write")
    assert result.code == 0, result.err
    assert len(server.requests) == asked + 2
    assert [t["cached"] for t in _turns(tmp_path / "out")] == [False, False]
    assert not (tasks.parent / "danger-ran").exists()
    assert "cannot be used" not in result.err  # nothing was even looked at
    # Both entries rewritten with what the model said.
    assert first.is_file() and second.is_file() and not second.is_fifo()
    assert _first_turn_entry(cache) == first
    assert "probe" in first.read_text()


# --- (4) no secret reaches the cache files -----------------------------------------------------


def test_a_secret_a_provider_echoes_reaches_no_cache_file(
    cli: Cli, fake_model: Fake, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The provider puts the API key it was sent into its reply (a debugging proxy, a hostile
    provider). calls.jsonl masks it; the stored reply is something mm-batch writes too."""
    monkeypatch.setenv("PROVIDER_API_KEY", SECRET)
    tasks = _suite(
        tmp_path / "suite", agent_top="yolo: true\nmodel_options: {api_key: '${PROVIDER_API_KEY}'}"
    )
    server = fake_model(by_prompt({PROMPT: [tool_call("probe", {}), text(f"green; key {SECRET}")]}))
    cache = tmp_path / "cache"
    model = ["--model", PRICED, "--model-option", f"api_base={server.url}"]
    out = tmp_path / "out"
    result = cli("run", tasks, *model, "--out", out, "--cache", cache)
    assert result.code == 0, result.err
    assert SECRET not in (out / "calls.jsonl").read_text()
    stored = b"".join(p.read_bytes() for p in cache.iterdir())
    assert SECRET.encode() not in stored


# --- (5) the key ---------------------------------------------------------------------------------


def test_requests_that_differ_anywhere_never_share_an_entry(
    cli: Cli, fake_model: Fake, tmp_path: Path
) -> None:
    """Another system prompt, another tool description, another seed, another repeat, another
    model string: each asks the model. The same request on another port hits."""
    suite = tmp_path / "suite"
    tasks = _suite(suite)
    cache = tmp_path / "cache"
    server = fake_model(_script())
    runs = iter(range(100))

    def asks(*extra: str, model: str = PRICED, on: FakeOpenAI = server) -> int:
        before = len(on.requests)
        out = tmp_path / f"out{next(runs)}"
        result = _run(cli, tasks, on, out, "--cache", cache, *extra, model=model)
        assert result.code == 0, result.err
        return len(on.requests) - before

    assert asks() == 2
    assert asks() == 0
    assert asks(on=fake_model(_script())) == 0  # another port: the same request
    agent = suite / "agent.yaml"
    original = agent.read_text()
    agent.write_text("system: You are careful.\n" + original)
    assert asks() == 2
    agent.write_text(original.replace("Report the state", "Report the health"))
    assert asks() == 2
    agent.write_text(original)
    assert asks("--model-option", "seed=7") == 2
    assert asks("--model-option", "seed=8") == 2
    assert asks("--repeat", "2") == 2  # repeat 1 hits, repeat 2 is its own trial
    assert asks(model="openai/gpt-4o") == 2
    assert asks() == 0


@pytest.mark.parametrize(
    ("where", "option", "with_cache"),
    [
        ("agent", "caching=false", True),
        ("agent", "cache_key=abc", True),
        ("agent", "cache={no-store: true}", True),
        ("agent", "num_retries=5", False),
        ("cli", "caching=false", True),
        ("cli", "num_retries=5", False),
        ("cli", "messages=x", False),
    ],
)
def test_a_model_option_that_clashes_is_refused_before_anything_runs(
    cli: Cli, fake_model: Fake, tmp_path: Path, where: str, option: str, with_cache: bool
) -> None:
    """SPEC 1: what `run` cannot honour is refused before running (the agent file's reserved
    option names are), never every run an error."""
    name, value = option.split("=", 1)
    top = f"yolo: true\nmodel_options: {{{name}: {value}}}" if where == "agent" else "yolo: true"
    tasks = _suite(tmp_path / "suite", agent_top=top)
    server = fake_model(_script())
    extra = ["--cache", str(tmp_path / "cache")] if with_cache else []
    if where == "cli":
        extra += ["--model-option", option]
    result = _run_or_refused(cli, tasks, server, tmp_path / "out", *extra)
    assert result.code in (0, 2), result.err
    if result.code == 2:
        assert name in result.err and server.requests == []


def _run_or_refused(
    cli: Cli, tasks: Path, server: FakeOpenAI, out: Path, *extra: str | Path
) -> CliResult:
    """A run whose reports are checked when it ran; a usage error leaves none."""
    result = cli("run", tasks, *_model(server), "--out", out, *extra)
    if result.code != 2:
        check_report(out / "junit.xml")
    return result


# --- the folder itself: swapped mid-run, inside a mount, the results folder --------------------


def test_a_cache_folder_swapped_mid_run_is_never_written_through(
    cli: Cli, fake_model: Fake, tmp_path: Path
) -> None:
    """The tool replaces the cache folder with a link to another folder: the run goes on, and
    the reply of the next turn is not written through the link."""
    tasks = _suite(tmp_path / "suite")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    cache = tmp_path / "cache"
    (tasks.parent / "probe.sh").write_text(
        "#!/bin/sh\necho ran >> ran.log\n"
        f"mv '{cache}' '{cache}.old' && ln -s '{elsewhere}' '{cache}'\necho 'state: green'\n"
    )
    server = fake_model(_script())
    result = _run(cli, tasks, server, tmp_path / "out", "--cache", cache)
    assert result.code == 0, result.err
    assert cache.is_symlink()
    assert list(elsewhere.iterdir()) == []
    assert len(_entries(Path(f"{cache}.old"))) == 2


@pytest.mark.parametrize("how", ["cli", "file", "link"])
def test_a_cache_inside_a_mounted_workspace_is_a_usage_error(
    cli: Cli, fake_model: Fake, tmp_path: Path, how: str
) -> None:
    agent = "yolo: true\nsandbox: {kind: docker, workspace: mount}"
    tasks_top = "cache: inner/cache\n" if how == "file" else ""
    tasks = _suite(tmp_path / "suite", agent_top=agent, tasks_top=tasks_top)
    server = fake_model(_script())
    extra = ["--cache", str(tasks.parent / "inner" / "cache")] if how == "cli" else []
    if how == "link":  # a path outside that leads inside
        (tmp_path / "outside").symlink_to(tasks.parent / "inner", target_is_directory=True)
        (tasks.parent / "inner").mkdir()
        extra = ["--cache", str(tmp_path / "outside" / "cache")]
    result = cli("run", tasks, *_model(server), "--out", tmp_path / "out", *extra)
    assert result.code == 2, result.err
    assert "keep the cache elsewhere" in result.err
    assert server.requests == [] and not (tasks.parent / "inner" / "cache").exists()


def test_the_results_folder_as_the_cache_keeps_both(
    cli: Cli, fake_model: Fake, tmp_path: Path
) -> None:
    """`--cache out --out out`: each run's reports are valid, the entries survive the clearing
    of the previous results, and the second run hits them."""
    tasks = _suite(tmp_path / "suite")
    server = fake_model(_script())
    out = tmp_path / "out"
    assert _run(cli, tasks, server, out, "--cache", out).code == 0
    assert len(_entries(out)) == 2 + 1  # summary.json lies beside the two entries
    result = _run(cli, tasks, server, out, "--cache", out)
    assert result.code == 0, result.err
    assert [t["cached"] for t in _turns(out)] == [True, True]
    assert len(server.requests) == 2


@pytest.mark.parametrize("mode", ["Read", "read-only", "rw", "READWRITE", "true", "'read '"])
def test_a_cache_mode_typo_is_a_configuration_error(cli: Cli, tmp_path: Path, mode: str) -> None:
    tasks = _suite(tmp_path / "suite", tasks_top=f"cache: c\ncache_mode: {mode}\n")
    result = cli("validate", tasks)
    assert result.code == 2, result.out + result.err
    assert "tasks.yaml:3: cache_mode:" in result.out + result.err


@pytest.mark.parametrize("kind", ["fifo", "loop", "file_link", "empty"])
def test_a_hostile_cache_path_is_a_usage_or_config_error(
    cli: Cli, fake_model: Fake, tmp_path: Path, kind: str
) -> None:
    suite = tmp_path / "suite"
    suite.mkdir()
    if kind == "fifo":
        os.mkfifo(suite / "c")
    elif kind == "loop":
        (suite / "c").symlink_to(suite / "d")
        (suite / "d").symlink_to(suite / "c")
    elif kind == "file_link":
        write(suite, "file", "x")
        (suite / "c").symlink_to(suite / "file")
    value = "''" if kind == "empty" else "c"
    tasks = _suite(suite, tasks_top=f"cache: {value}\n")
    server = fake_model(_script())
    result = cli("run", tasks, *_model(server), "--out", tmp_path / "out")
    assert result.code == 2, result.err
    assert server.requests == [] and not (tmp_path / "out").exists()


# --- (6) --max-cost ------------------------------------------------------------------------------

PROMPTS = ["Check billing.", "Check search.", "Check mail.", "Check disks."]


def _cost_suite(directory: Path, prompts: list[str] = PROMPTS, jobs: int = 1) -> Path:
    write(
        directory,
        "agent.yaml",
        """
        yolo: true
        tools:
          - name: status
            description: Show the status.
            command: ["echo", "ok"]
        """,
    )
    tasks = "".join(f"  - id: t{i}\n    prompt: {p}\n" for i, p in enumerate(prompts, 1))
    return write(directory, "tasks.yaml", f"agent: agent.yaml\njobs: {jobs}\ntasks:\n{tasks}")


def _completion(usage: str, content: str = "all good", top: str = "") -> RawReply:
    """A completion as raw JSON; `top` adds fields at the top (ending in a comma)."""
    body = (
        f'{{{top}"id": "x", "object": "chat.completion", "created": 1, "model": "gpt-4o-mini", '
        f'"choices": [{{"index": 0, "message": {{"role": "assistant", "content": "{content}"}}, '
        f'"finish_reason": "stop"}}], "usage": {usage}}}'
    )
    return RawReply(body.encode())


def _hostile_first(usage: str) -> Script:
    """The first task's reply reports `usage`; every other is an honest 10/5 turn."""

    def script(request: dict[str, Any]) -> Reply:
        if first_user_message(request) == PROMPTS[0]:
            return _completion(usage)
        return text("all good")

    return script


def _summary(out: Path) -> dict[str, Any]:
    return dict(json.loads((out / "summary.json").read_text(encoding="utf-8")))


@pytest.mark.parametrize(
    "usage",
    [
        '{"prompt_tokens": -100000000, "completion_tokens": 5, "total_tokens": 15}',
        '{"prompt_tokens": 1' + "0" * 400 + ', "completion_tokens": 5, "total_tokens": 15}',
    ],
    ids=["negative", "astronomic"],
)
def test_a_hostile_usage_cannot_dodge_max_cost_unnoticed(
    cli: Cli, fake_model: Fake, tmp_path: Path, usage: str
) -> None:
    tasks = _cost_suite(tmp_path)
    server = fake_model(_hostile_first(usage))
    out = tmp_path / "out"
    limit = str(turn_usd() / 2)  # any honest first turn spends past it
    result = cli("run", tasks, *_model(server), "--max-cost", limit, "--out", out)
    assert result.code != 4, result.err
    check_report(out / "junit.xml")
    later = [r for r in server.requests if first_user_message(r) != PROMPTS[0]]
    assert later == [] or "--max-cost" in result.err.split("[1/4]", 1)[-1], result.err


HONEST_USAGE = '{"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}'


@pytest.mark.parametrize(
    ("top", "usage"),
    [
        ('"_hidden_params": {"cache_hit": true},', HONEST_USAGE),
        ('"_hidden_params": {"response_cost": 0},', HONEST_USAGE),
        ("", HONEST_USAGE.replace("}", ', "cost": 0}')),
    ],
    ids=["hidden_cache_hit", "hidden_response_cost", "usage_cost"],
)
def test_a_reply_cannot_set_its_own_cost(
    cli: Cli, fake_model: Fake, tmp_path: Path, top: str, usage: str
) -> None:
    tasks = _cost_suite(tmp_path)
    server = fake_model(lambda _: _completion(usage, top=top))
    out = tmp_path / "out"
    limit = str(turn_usd() / 2)  # what gpt-4o-mini's price map says a turn costs is more
    result = cli("run", tasks, *_model(server), "--max-cost", limit, "--out", out)
    assert result.code != 4, result.err
    check_report(out / "junit.xml")
    assert [t["cached"] for t in _turns(out)] == [False] * len(_turns(out))  # no --cache
    later = [r for r in server.requests if first_user_message(r) != PROMPTS[0]]
    assert later == [] or "--max-cost" in result.err.split("[1/4]", 1)[-1], result.err


def test_costs_whose_sum_overflows_keep_the_reports_valid(
    cli: Cli, fake_model: Fake, tmp_path: Path
) -> None:
    usage = HONEST_USAGE.replace("}", ', "cost": 1e308}')
    tasks = _cost_suite(tmp_path, PROMPTS[:2])
    server = fake_model(lambda _: _completion(usage))
    out = tmp_path / "out"
    result = cli("run", tasks, *_model(server), "--out", out)
    assert result.code == 0, result.err
    check_report(out / "junit.xml")
    # No Infinity or NaN, which JSON has not.
    json.loads((out / "summary.json").read_text(), parse_constant=pytest.fail)


def test_a_merge_of_costs_whose_sum_overflows_exits_0_or_2(
    cli: Cli, fake_model: Fake, tmp_path: Path
) -> None:
    usage = HONEST_USAGE.replace("}", ', "cost": 1e308}')
    tasks = _cost_suite(tmp_path, PROMPTS[:2])
    server = fake_model(lambda _: _completion(usage))
    shards = [tmp_path / "shard1", tmp_path / "shard2"]
    for k, shard in enumerate(shards, 1):
        result = cli("run", tasks, *_model(server), "--shard", f"{k}/2", "--out", shard)
        assert result.code == 0, result.err
    result = cli("merge", *shards, "--out", tmp_path / "merged")
    assert result.code in (0, 2), result.err
    if result.code == 0:
        check_report(tmp_path / "merged" / "junit.xml")


def test_a_reply_naming_a_free_model_cannot_dodge_max_cost(
    cli: Cli, fake_model: Fake, tmp_path: Path
) -> None:
    def script(_: dict[str, Any]) -> Reply:
        reply = _completion('{"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}')
        relabelled = reply.body.replace(
            b'"model": "gpt-4o-mini"', b'"model": "omni-moderation-latest"'
        )
        return RawReply(relabelled)

    tasks = _cost_suite(tmp_path)
    server = fake_model(script)
    out = tmp_path / "out"
    limit = str(turn_usd() / 2)  # what mm-batch asked for costs more than this a turn
    result = cli("run", tasks, *_model(server), "--max-cost", limit, "--out", out)
    assert result.code != 4, result.err
    check_report(out / "junit.xml")
    later = [r for r in server.requests if first_user_message(r) != PROMPTS[0]]
    assert later == [] or "--max-cost" in result.err.split("[1/4]", 1)[-1], result.err


@pytest.mark.parametrize(
    "tokens", [2**53 - 1, 2**60, 10**308], ids=["largest_count", "past_counts", "near_float_max"]
)
def test_a_huge_but_valid_cost_stops_the_batch_and_reports_stay_valid(
    cli: Cli, fake_model: Fake, tmp_path: Path, tokens: int
) -> None:
    """A count mm-batch takes is priced, and the spend is past the limit; a count past what it
    takes (2**53 and more) is unknown, so the turn cannot be counted: either way no later run
    starts, and the reports stay valid."""
    usage = f'{{"prompt_tokens": {tokens}, "completion_tokens": 5, "total_tokens": 15}}'
    tasks = _cost_suite(tmp_path)
    server = fake_model(_hostile_first(usage))
    out = tmp_path / "out"
    result = cli("run", tasks, *_model(server), "--max-cost", "1000", "--out", out)
    assert result.code == 3, result.err
    check_report(out / "junit.xml")
    assert len(server.requests) == 1
    runs = _summary(out)["runs"]
    assert [r["status"] for r in runs] == ["passed", "error", "error", "error"]
    assert all(r["reason"].startswith("cost limit reached: ") for r in runs[1:])
    if tokens < 2**53:
        assert runs[0]["cost_usd"] > 1e9
    else:
        assert runs[0]["cost_usd"] is None and runs[0]["prompt_tokens"] == 0
        assert "cannot be counted" in runs[1]["reason"]


def test_hostile_usage_that_litellm_rejects_is_an_error_of_that_run_only(
    cli: Cli, fake_model: Fake, tmp_path: Path
) -> None:
    """NaN tokens: litellm calls the reply malformed. That run is an error; the batch goes on
    under --max-cost, and every report stays valid."""
    usage = '{"prompt_tokens": NaN, "completion_tokens": 5, "total_tokens": 15}'
    tasks = _cost_suite(tmp_path)
    server = fake_model(_hostile_first(usage))
    out = tmp_path / "out"
    result = cli("run", tasks, *_model(server), "--max-cost", "1", "--out", out)
    assert result.code == 3, result.err
    check_report(out / "junit.xml")
    assert [r["status"] for r in _summary(out)["runs"]] == ["error", "passed", "passed", "passed"]


def test_a_planted_cache_entry_with_huge_usage_costs_nothing(
    cli: Cli, fake_model: Fake, tmp_path: Path
) -> None:
    """A cached reply counts 0 whatever usage it claims: it cannot exhaust --max-cost."""
    tasks = _cost_suite(tmp_path, PROMPTS[:2])
    server = fake_model(_hostile_first('{"prompt_tokens": 10, "completion_tokens": 5}'))
    cache = tmp_path / "cache"
    assert _run(cli, tasks, server, tmp_path / "fill", "--cache", cache).code == 0
    for path in _entries(cache):
        data = json.loads(path.read_text())
        data["response"]["usage"] = {"prompt_tokens": 2**53 - 1, "completion_tokens": 2**52}
        path.write_text(json.dumps(data))
    limit = str(turn_usd() * 10)
    result = _run(cli, tasks, server, tmp_path / "out", "--cache", cache, "--max-cost", limit)
    assert result.code == 0, result.err
    assert [t["cost_usd"] for t in _turns(tmp_path / "out")] == [0, 0]
    assert [t["cached"] for t in _turns(tmp_path / "out")] == [True, True]


def test_with_jobs_above_one_no_run_starts_after_the_limit(
    cli: Cli, fake_model: Fake, tmp_path: Path
) -> None:
    prompts = [f"Check service {i}." for i in range(6)]
    tasks = _cost_suite(tmp_path, prompts, jobs=3)
    server = fake_model(lambda _: text("all good"), latency_s=0.3)
    out = tmp_path / "out"
    result = cli("run", tasks, *_model(server), "--max-cost", str(turn_usd() / 2), "--out", out)
    assert result.code == 3, result.err
    check_report(out / "junit.xml")
    statuses = [r["status"] for r in _summary(out)["runs"]]
    assert statuses.count("passed") == len(server.requests) <= 3
    assert statuses.count("error") >= 3


def test_a_spend_that_reaches_the_limit_exactly_starts_no_more_run(
    cli: Cli, fake_model: Fake, tmp_path: Path
) -> None:
    turns = 111
    prompts = [f"Check service {i}." for i in range(turns + 2)]
    tasks = _cost_suite(tmp_path, prompts)
    server = fake_model(lambda _: text("all good"))
    assert turn_usd() == 4.5e-06
    limit = f"{turns * 45}e-7"  # exactly what 111 turns spend
    out = tmp_path / "out"
    result = cli("run", tasks, *_model(server), "--max-cost", limit, "--out", out)
    assert result.code != 4, result.err
    check_report(out / "junit.xml")
    assert len(server.requests) == turns


def test_runs_stopped_by_the_cost_limit_never_make_a_batch_pass(
    cli: Cli, fake_model: Fake, tmp_path: Path
) -> None:
    """One trial of four ran and passed; three never reached the model. The exit code must not
    say the task met its pass rate on trials that did not happen."""
    tasks = _cost_suite(tmp_path, ["Check."])
    tasks.write_text(
        tasks.read_text().replace("jobs: 1", "jobs: 1\nrepeat: 4\nmin_pass_rate: 0.25")
    )
    server = fake_model(lambda _: text("all good"))
    out = tmp_path / "out"
    result = cli("run", tasks, *_model(server), "--max-cost", str(turn_usd() / 2), "--out", out)
    check_report(out / "junit.xml")
    assert len(server.requests) == 1
    assert result.code == 3, result.err


def test_the_cost_limit_reason_shows_a_small_limit_as_it_was_given(
    cli: Cli, fake_model: Fake, tmp_path: Path
) -> None:
    tasks = _cost_suite(tmp_path, PROMPTS[:2])
    server = fake_model(lambda _: text("all good"))
    out = tmp_path / "out"
    result = cli("run", tasks, *_model(server), "--max-cost", "1e-9", "--out", out)
    assert result.code == 3, result.err
    reason = _summary(out)["runs"][1]["reason"]
    assert reason.startswith("cost limit reached: ")
    assert not reason.endswith(" of 0"), reason


@pytest.mark.parametrize("value", ["1e999", "Infinity", "-0.0", "1e-400", "NAN", "-inf", ""])
def test_a_max_cost_that_is_no_positive_amount_is_a_usage_error(
    cli: Cli, fake_model: Fake, tmp_path: Path, value: str
) -> None:
    tasks = _cost_suite(tmp_path)
    server = fake_model(lambda _: text("x"))
    result = cli("run", tasks, *_model(server), "--max-cost", value, "--out", tmp_path / "out")
    assert result.code == 2, result.err
    assert server.requests == [] and not (tmp_path / "out").exists()
