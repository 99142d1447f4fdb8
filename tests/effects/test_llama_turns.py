"""Local servers on a shared CPU: their argv, turns between servers, the task's deadline while
waiting, the default `max_tokens`, and the prompt a server saves for the next run's. Real
stand-in server processes (standin_llama.py) play llama-server, reached through mm-batch's own
client as `default_effects` wires it."""

from __future__ import annotations

import gc
import json
import os
import socket
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest

from mm_batch.commands.effects import default_effects
from mm_batch.config.load import load_tasks
from mm_batch.config.local_catalog import CATALOG
from mm_batch.effects.gguf import ServerBuild, prompt_dir, prompt_name
from mm_batch.effects.llama import MAX_TOKENS, CpuTurns, SlotLeases, cores
from mm_batch.plan import Overrides, RunSpec, make_plan
from mm_batch.run.batch import Effects
from mm_batch.run.ports import ModelClient, ModelDeadlineError
from tests.helpers import standin_llama, wait_for, write

SMALL, LARGE = "local/qwen2.5-coder-0.5b", "local/qwen2.5-coder-1.5b"
MESSAGES = [{"role": "user", "content": "hello"}]


def _calls(directory: Path) -> list[tuple[int, float, float, str]]:
    """The stand-ins' requests: port, start, end, the max_tokens they got."""
    rows = (line.split() for line in (directory / "calls.log").read_text().splitlines())
    return [(int(port), float(start), float(end), tokens) for port, start, end, tokens in rows]


@dataclass
class _Local:
    effects: Effects
    specs: Mapping[str, RunSpec]  # each model's first run
    runs: Sequence[RunSpec]

    def complete(self, model: str, timeout: float = 30.0) -> float:
        """One model turn of `model`'s first run; its latency."""
        return self.effects.client_for(self.specs[model]).complete(MESSAGES, [], timeout).latency_s


@pytest.fixture
def local_effects(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Callable[..., _Local]]:
    """`default_effects` of a plan on local models, each served by a stand-in process."""
    # The stand-in replaces the extra's server and the assembled model, nothing else.
    for name, value in standin_llama(tmp_path).items():  # saved prompts land in its cache
        monkeypatch.setenv(name, value)
    monkeypatch.setattr("mm_batch.effects.local_models.ensure_gguf", lambda _model: tmp_path / "m")
    started: list[Effects] = []

    def start(*models: str, latency_s: float = 0.0, options: str = "{}") -> _Local:
        monkeypatch.setenv("LLAMA_STANDIN_LATENCY_S", str(latency_s))
        write(tmp_path, "agent.yaml", f"model_options: {options}\n")
        tasks_yaml = "agent: agent.yaml\njobs: 2\ntasks: [{id: a, prompt: p}, {id: b, prompt: p}]\n"
        write(tmp_path, "tasks.yaml", tasks_yaml)
        tasks = load_tasks(tmp_path / "tasks.yaml")
        plan = make_plan(tasks, Overrides(models=models))
        effects = default_effects(plan, tmp_path / "out")
        started.append(effects)
        return _Local(effects, {run.model: run for run in reversed(plan.runs)}, plan.runs)

    yield start
    for effects in started:
        effects.shutdown()


def test_server_argv_fits_the_cores_and_sleeps_when_idle(
    local_effects: Callable[..., _Local], tmp_path: Path
) -> None:
    local_effects(SMALL)
    (argv_file,) = tmp_path.glob("argv-*.json")
    argv = json.loads(argv_file.read_text())
    flags = {flag: argv[i + 1] for i, flag in enumerate(argv[:-1]) if flag.startswith("--")}
    assert argv[:2] == ["-m", str(tmp_path / "m")]
    assert flags["--threads"] == str(cores())
    assert flags["--poll"] == "0"  # idle threads sleep instead of spinning
    assert flags["--parallel"] == "2"  # the run's two jobs
    assert flags["--ctx-size"] == "8192"
    assert flags["--slot-save-path"] == str(prompt_dir())
    assert "--jinja" in argv and "--offline" in argv


def test_max_tokens_is_bounded_unless_the_agent_says(
    local_effects: Callable[..., _Local], tmp_path: Path
) -> None:
    local_effects(SMALL).complete(SMALL)
    local_effects(LARGE, options="{max_tokens: 64}").complete(LARGE)
    assert [tokens for *_, tokens in _calls(tmp_path)] == [str(MAX_TOKENS), "64"]


def test_two_servers_never_compute_at_once(
    local_effects: Callable[..., _Local], tmp_path: Path
) -> None:
    local = local_effects(SMALL, LARGE, latency_s=0.2)

    def three(model: str) -> None:
        for _ in range(3):
            local.complete(model)

    threads = [threading.Thread(target=three, args=(m,)) for m in (SMALL, SMALL, LARGE, LARGE)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    calls = _calls(tmp_path)
    assert len(calls) == 12 and len({port for port, *_ in calls}) == 2
    overlapping = [
        (port, other)
        for i, (port, start, end, _) in enumerate(calls)
        for other, o_start, o_end, _ in calls[i + 1 :]
        if start < o_end and o_start < end
    ]
    assert overlapping, "requests to one server should run together (llama.cpp batches them)"
    assert all(port == other for port, other in overlapping), "two servers computed at once"


class _NotingCondition(threading.Condition):
    """The turns' condition, calling `on_wait` before each wait on it: a request waits on it
    only once it has joined the queue, under its lock."""

    def __init__(self, on_wait: Callable[[], None]) -> None:
        super().__init__()
        self._on_wait = on_wait

    def wait(self, timeout: float | None = None) -> bool:
        self._on_wait()
        return super().wait(timeout)


class _HeldTurns(CpuTurns):
    """The servers' turns on the CPU, noting when each request asks for its turn, when it first
    waits in the queue, and when it gets its turn or gives up (time.monotonic()), and holding
    the end of `held`'s requests until the test lets them go (or gives up, after two minutes:
    a hang fails instead)."""

    def __init__(self, held: str | None = None) -> None:
        super().__init__()
        self._cond = _NotingCondition(self._waits)
        self._asking = threading.local()  # the server of this thread's request, till placed
        self._noting = threading.Lock()
        self.held = held
        self.let_go = threading.Event()
        self.noted: list[tuple[str, str, float]] = []
        self.placed = 0  # requests that got their turn or gave up without waiting, or wait

    def acquire(self, server: str, deadline: float) -> bool:
        self._note("asks", server)
        self._asking.server = server
        got = super().acquire(server, deadline)
        waited = self._asking.server is None
        self._note("gets" if got else "gives up", server, placed=not waited)
        return got

    def _waits(self) -> None:
        """Called under the turns' lock, the request queued; noted once a request."""
        server = getattr(self._asking, "server", None)
        if server is not None:
            self._asking.server = None
            self._note("waits", server, placed=True)

    def _note(self, event: str, server: str, placed: bool = False) -> None:
        with self._noting:
            self.noted.append((event, server, time.monotonic()))
            self.placed += placed

    def release(self, server: str) -> None:
        if server == self.held:
            self.let_go.wait(120)
        super().release(server)

    def events(self) -> list[tuple[str, str]]:
        return [(event, server) for event, server, _ in self.noted]

    def placed_are(self, n: int) -> Callable[[], bool]:
        """Whether `n` requests are placed: each got its turn, gave up or waits in the queue."""
        return lambda: self.placed == n


def test_the_wait_for_the_cpu_honours_the_task_deadline(
    local_effects: Callable[..., _Local], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    small, large = (CATALOG[model.removeprefix("local/")].name for model in (SMALL, LARGE))
    turns = _HeldTurns(held=small)
    monkeypatch.setattr("mm_batch.effects.local_models.CpuTurns", lambda: turns)
    local = local_effects(SMALL, LARGE, latency_s=2.0)
    busy = threading.Thread(target=local.complete, args=(SMALL,))
    busy.start()
    wait_for(lambda: ("gets", small) in turns.events(), "the small model's request has the CPU")
    with pytest.raises(ModelDeadlineError):
        local.complete(LARGE, timeout=0.5)
    # It gave up at its deadline, while the small model's request still held the CPU.
    assert turns.events() == [
        ("asks", small),
        ("gets", small),
        ("asks", large),
        ("waits", large),
        ("gives up", large),
    ]
    turns.let_go.set()
    busy.join()
    assert len(_calls(tmp_path)) == 1  # the large model's server was never asked
    # A request that waits, but within its deadline, counts the wait in its latency.
    turns.let_go.clear()
    turns.noted.clear()
    busy = threading.Thread(target=local.complete, args=(SMALL,))
    busy.start()
    wait_for(lambda: ("gets", small) in turns.events(), "the small model's request has the CPU")
    latency: list[float] = []
    waiting = threading.Thread(target=lambda: latency.append(local.complete(LARGE, timeout=600)))
    waiting.start()
    wait_for(lambda: ("asks", large) in turns.events(), "the large model's request waits")
    turns.let_go.set()
    busy.join()
    waiting.join()
    assert turns.events()[2:] == [("asks", large), ("waits", large), ("gets", large)]
    asked, got = (m for event, server, m in turns.noted if server == large and event != "waits")
    (took,) = latency
    assert took >= (got - asked) + 2.0  # its wait for the CPU, then the 2 s its server computed


def test_a_busy_server_does_not_starve_another() -> None:
    """Two requests of one server that always overlap keep it busy for ever, unless a waiting
    server's request stops new ones from joining in."""
    turns = CpuTurns()
    give_up = time.monotonic() + 120  # no acquire below waits for it: a hang fails instead
    events: list[str] = []

    def joins(server: str) -> bool:
        """Whether a new request of `server` gets in now (its deadline already passed: it
        does not wait), handed back at once."""
        if not turns.acquire(server, 0.0):
            return False
        turns.release(server)
        return True

    assert turns.acquire("a", give_up)
    turns.release("a")  # a is warm: its requests now run together
    assert turns.acquire("a", give_up) and turns.acquire("a", give_up)
    assert joins("a")  # a third joins the two: the turn would never end
    b_may_end = threading.Event()

    def b() -> None:
        assert turns.acquire("b", give_up), "b starved"
        events.append("b in")
        b_may_end.wait(120)
        events.append("b out")
        turns.release("b")

    asking = threading.Thread(target=b, daemon=True)  # a test that fails leaves it behind
    asking.start()
    wait_for(lambda: not joins("a"), "b's request stops new requests of a from joining in")
    for _ in range(2):  # the requests of a already running end: only then does b get in
        assert "b in" not in events, "b got in while requests of a still ran"
        events.append("a out")
        turns.release("a")
    wait_for(lambda: "b in" in events, "b gets its turn")
    assert not joins("a"), "a started while b ran"
    b_may_end.set()
    asking.join()
    assert joins("a"), "a goes on after b"
    assert events == ["a out", "a out", "b in", "b out"]


def test_the_turn_goes_to_the_server_that_waited_longest() -> None:
    """b, then c, then a (whose turn it is) queue while a's request runs, each only once the
    one before waits: the turn goes to b, then c, then a again."""
    turns = _HeldTurns()
    give_up = time.monotonic() + 120  # no acquire below waits for it: a hang fails instead
    order: list[str] = []
    assert turns.acquire("a", give_up)

    def request(server: str) -> None:
        assert turns.acquire(server, give_up)
        order.append(server)
        turns.release(server)

    waiters = []
    for n, server in enumerate(("b", "c", "a"), start=2):
        waiters.append(threading.Thread(target=request, args=(server,), daemon=True))
        waiters[-1].start()
        wait_for(turns.placed_are(n), f"{server}'s request waits or gets its turn")
    assert turns.events()[2:] == [
        ("asks", "b"),
        ("waits", "b"),
        ("asks", "c"),
        ("waits", "c"),
        ("asks", "a"),
        ("waits", "a"),
    ]
    turns.release("a")
    for thread in waiters:
        thread.join(120)
    assert order == ["b", "c", "a"]


def test_a_server_computes_its_first_prompt_alone_then_shares_it_with_every_slot(
    local_effects: Callable[..., _Local], tmp_path: Path
) -> None:
    """Slots share no cache: the first request's prompt (the agent's system prompt and tools)
    is computed alone, with no token generated, and copied into the other slot; then both
    runs go on side by side, each asking for its own slot on every turn."""
    local = local_effects(SMALL, latency_s=1.0)  # far longer than a waiting thread's wake-up
    first, second = (local.effects.client_for(run) for run in local.runs)

    def turns(client: ModelClient, says: str) -> None:
        for _ in range(2):
            client.complete([{"role": "user", "content": says}], [], 30)

    threads = [threading.Thread(target=turns, args=a) for a in ((first, "a"), (second, "b"))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    [(port, slot)] = [tuple(map(int, line.split())) for line in _lines(tmp_path, "prefills.log")]
    assert _shared(tmp_path) == [(port, 1 - slot)]
    asked = [json.loads(line)["body"] for line in _lines(tmp_path, "requests.jsonl")]
    slots = {b["messages"][0]["content"]: b["id_slot"] for b in asked if b["max_tokens"] != 0}
    assert sorted(slots.values()) == [0, 1]  # one slot each run, the same on both turns
    assert len(asked) == 5 and len(_calls(tmp_path)) == 4  # one prefill, four turns
    calls = _calls(tmp_path)
    first_ended = min(end for _, _, end, _ in calls)
    assert sum(start < first_ended for _, start, _, _ in calls) == 2, "the runs waited in turn"


def test_a_slot_is_held_while_its_runs_client_lives() -> None:
    leases = SlotLeases(2)
    first, second = leases.lease(), leases.lease()
    assert (first.slot, second.slot) == (0, 1)
    assert leases.lease().slot is None  # every slot held: the server chooses
    del first
    gc.collect()
    assert leases.lease().slot == 0


def _lines(directory: Path, name: str) -> list[str]:
    return (directory / name).read_text().splitlines()


def test_a_cold_server_computes_its_first_request_alone() -> None:
    """The first request fills the prompt cache: the requests that come while it runs wait
    for its end, then run together, and another joins them."""
    turns = _HeldTurns()
    give_up = time.monotonic() + 120  # no acquire below waits for it: a hang fails instead
    assert turns.acquire("a", give_up)  # cold: its first request
    later = [
        threading.Thread(target=lambda: turns.acquire("a", give_up), daemon=True) for _ in range(2)
    ]
    for n, thread in enumerate(later, start=2):
        thread.start()
        wait_for(turns.placed_are(n), "the request waits or gets its turn")
    assert turns.events() == [("asks", "a"), ("gets", "a"), *[("asks", "a"), ("waits", "a")] * 2]
    turns.release("a")  # the first request ends: the two waiting get the turn together
    assert turns.acquire("a", 0.0), "a request still waits, or a new one cannot join the two"
    for thread in later:
        thread.join(120)
    assert sorted(turns.events()[6:]) == [("asks", "a")] + [("gets", "a")] * 3
    for _ in range(3):
        turns.release("a")


def _restores(directory: Path) -> list[tuple[int, int, dict[str, int]]]:
    """The stand-ins' restored slots: port, slot, the saved file's content."""
    log = directory / "restored.log"
    rows = (line.split(" ", 2) for line in log.read_text().splitlines()) if log.exists() else ()
    return [(int(port), int(slot), json.loads(text)) for port, slot, text in rows]


def _restored(directory: Path) -> list[tuple[int, int, dict[str, int]]]:
    """The slots loaded with a prompt another server saved (an earlier run's)."""
    return [row for row in _restores(directory) if row[2]["port"] != row[0]]


def _shared(directory: Path) -> list[tuple[int, int]]:
    """The slots a server loaded with a prompt of its own: port, slot."""
    return [(port, slot) for port, slot, text in _restores(directory) if text["port"] == port]


def _saved(model: str, binary: Path) -> Path:
    """The saved prompt of `model` served by the server build `binary`."""
    build = ServerBuild((str(binary),), binary, str(binary))
    return prompt_dir() / prompt_name(CATALOG[model.removeprefix("local/")], build)


def test_a_run_loads_into_every_slot_the_prompt_the_last_run_saved(
    local_effects: Callable[..., _Local], tmp_path: Path
) -> None:
    first = local_effects(SMALL)
    first.complete(SMALL)
    first.effects.shutdown()
    saved = _saved(SMALL, tmp_path / "llama-server")
    first_port = json.loads(saved.read_text())["port"]
    assert json.loads(saved.read_text()) == {"port": first_port, "answered": 1}
    assert sorted(p.name for p in prompt_dir().iterdir()) == [saved.name]  # no partial file left
    assert _restored(tmp_path) == []  # nothing was saved when the first server started
    second = local_effects(SMALL)
    restored = _restored(tmp_path)
    assert [slot for _, slot, _ in restored] == [0, 1]  # both slots, before any request
    assert {port for port, *_ in restored} != {first_port}
    assert all(text == {"port": first_port, "answered": 1} for *_, text in restored)
    second.complete(SMALL)
    second.effects.shutdown()
    assert json.loads(saved.read_text())["port"] != first_port  # the newest prompt replaced it


def test_a_server_that_answered_nothing_saves_nothing(
    local_effects: Callable[..., _Local], tmp_path: Path
) -> None:
    local_effects(SMALL).effects.shutdown()
    assert list(prompt_dir().iterdir()) == []
    local_effects(SMALL)
    assert _restored(tmp_path) == []


def test_a_prompt_saved_by_another_build_or_model_is_not_loaded(
    local_effects: Callable[..., _Local], tmp_path: Path
) -> None:
    first = local_effects(SMALL)
    first.complete(SMALL)
    first.effects.shutdown()
    local_effects(LARGE)  # another model
    assert _restored(tmp_path) == []
    binary = tmp_path / "llama-server"
    old = _saved(SMALL, binary)
    binary.write_text(binary.read_text() + "# another build\n")
    assert _saved(SMALL, binary) != old
    local_effects(SMALL)
    assert _restored(tmp_path) == []


def _installed(site: Path, package: str, digest: str) -> ServerBuild:
    """A server binary as a package installs it: `site/<package>/bin/llama-server`, and the
    package's RECORD (beside it in its dist-info) listing the binary's digest."""
    binary = site / package / "bin" / "llama-server"
    binary.parent.mkdir(parents=True, exist_ok=True)
    binary.write_text("#!/bin/sh\n")
    record = site / f"{package}-1.0.dist-info" / "RECORD"
    record.parent.mkdir(parents=True, exist_ok=True)
    other = f"{package}/__init__.py,sha256=AAAA,0\n"
    record.write_text(f"{other}{package}/bin/llama-server,sha256={digest},10\n")
    return ServerBuild((str(binary),), binary, "test")


def test_the_same_build_installed_again_loads_what_it_saved(tmp_path: Path) -> None:
    """A CI job installs the server into a new virtualenv each time: the file's time changes,
    the build does not. Its saved prompt is named by the digest the package recorded."""
    model = CATALOG[SMALL.removeprefix("local/")]
    first = _installed(tmp_path / "a", "llama_pkg", "pLfJ")
    again = _installed(tmp_path / "b", "llama_pkg", "pLfJ")  # written later: another time
    os.utime(again.build, ns=(1, 1))
    assert prompt_name(model, first) == prompt_name(model, again)
    rebuilt = _installed(tmp_path / "c", "llama_pkg", "Zq9w")
    assert prompt_name(model, rebuilt) != prompt_name(model, first)
    # Without a record (a binary of one's own), its size and time name it.
    own = tmp_path / "own" / "llama-server"
    own.parent.mkdir()
    own.write_text("#!/bin/sh\n")
    alone = ServerBuild((str(own),), own, "own")
    named = prompt_name(model, alone)
    os.utime(own, ns=(2, 2))
    assert prompt_name(model, alone) != named


def test_saved_prompts_of_old_builds_do_not_pile_up(
    local_effects: Callable[..., _Local], tmp_path: Path
) -> None:
    model = CATALOG[SMALL.removeprefix("local/")]
    prompt_dir().mkdir(parents=True)
    stem = _saved(SMALL, tmp_path / "llama-server").name.rsplit("-", 1)[0]
    olds = [prompt_dir() / f"{stem}-old{n}.bin" for n in range(4)]
    for n, old in enumerate(olds):
        old.write_text("{}")
        os.utime(old, ns=(n + 1, n + 1))  # old3 the newest of them
    others = prompt_dir() / f"{CATALOG[LARGE.removeprefix('local/')].name}-x-old.bin"
    others.write_text("{}")
    os.utime(others, ns=(1, 1))
    local = local_effects(SMALL)
    local.complete(SMALL)
    local.effects.shutdown()
    saved = _saved(SMALL, tmp_path / "llama-server")
    left = sorted(p.name for p in prompt_dir().iterdir())
    assert left == sorted([saved.name, olds[3].name, others.name])
    assert model.name in saved.name


def test_a_prompt_the_server_cannot_load_leaves_the_slots_empty(
    local_effects: Callable[..., _Local], tmp_path: Path
) -> None:
    saved = _saved(SMALL, tmp_path / "llama-server")
    saved.parent.mkdir(parents=True)
    saved.write_text("not a state")  # the stand-in refuses it, as llama-server does
    local = local_effects(SMALL)
    assert _restored(tmp_path) == []
    local.complete(SMALL)  # the server answers as before
    local.effects.shutdown()
    assert json.loads(saved.read_text())["answered"] == 1  # and its prompt replaced the file


def test_without_a_folder_for_prompts_the_server_runs_as_before(
    local_effects: Callable[..., _Local], tmp_path: Path
) -> None:
    prompt_dir().parent.mkdir(parents=True)
    prompt_dir().write_text("a file where the folder would be")
    local = local_effects(SMALL)
    (argv_file,) = tmp_path.glob("argv-*.json")
    assert "--slot-save-path" not in json.loads(argv_file.read_text())  # else it would not start
    local.complete(SMALL)
    local.effects.shutdown()
    assert prompt_dir().read_text() == "a file where the folder would be"


def _slot_busy(directory: Path) -> bool:
    """Whether the one stand-in's slot 0 computes now, as its /slots says."""
    (argv_file,) = directory.glob("argv-*.json")
    argv = json.loads(argv_file.read_text())
    url = f"http://127.0.0.1:{argv[argv.index('--port') + 1]}/slots"
    with urllib.request.build_opener(urllib.request.ProxyHandler({})).open(url) as answer:
        slots = json.load(answer)
    return bool(slots[0]["is_processing"])


def test_a_server_stopped_mid_turn_saves_an_idle_slot_without_waiting(
    local_effects: Callable[..., _Local], tmp_path: Path
) -> None:
    local = local_effects(SMALL, latency_s=3.0)
    local.complete(SMALL)
    cut: list[BaseException] = []

    def stopped_turn() -> None:
        try:
            local.complete(SMALL)
        except Exception as exc:  # the server stops under it
            cut.append(exc)

    turn = threading.Thread(target=stopped_turn)
    turn.start()
    wait_for(lambda: _slot_busy(tmp_path), "slot 0 computes the turn")  # slot 1 holds a prompt
    local.effects.shutdown()
    turn.join()
    # Saving the busy slot would have waited for its turn to end (as llama-server does): the
    # turn was cut by the stop instead, and the idle slot saved what was answered before it.
    assert cut, "the turn in flight should have been cut by the stop"
    assert json.loads(_saved(SMALL, tmp_path / "llama-server").read_text())["answered"] == 1


def test_a_proxy_of_the_environment_never_stands_between_mm_batch_and_its_local_server(
    local_effects: Callable[..., _Local], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A CI's HTTP_PROXY (here a port that refuses every connection) must not reach loopback:
    neither the health checks nor the model's requests go through it, and mm-batch leaves the
    environment (the proxy settings its tools and other models see) as it was."""
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{closed.getsockname()[1]}"
    for name in ("HTTP_PROXY", "http_proxy", "HTTPS_PROXY", "https_proxy"):
        monkeypatch.setenv(name, dead)
    for name in ("NO_PROXY", "no_proxy"):
        monkeypatch.setenv(name, "example.com")
    local = local_effects(SMALL)
    assert local.complete(SMALL) >= 0  # through mm-batch's own client, to the stand-in
    assert os.environ["NO_PROXY"] == os.environ["no_proxy"] == "example.com"
