"""The local models' own client against litellm's, over real HTTP: for the same scripted
replies the same records, for the same turn the same request body, the same retries of the
same failures, the same deadline, and one response cache both read and write.

Both clients ask the same fake OpenAI-compatible server (`mm_batch.testing.fake_openai`), the
way llama-server is asked: litellm as `hosted_vllm/<name>` with `api_base`, `LlamaClient` with
the server's URL and `<name>`.
"""

from __future__ import annotations

import dataclasses
import json
from collections import deque
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mm_batch.config.model import CacheMode, CacheSettings
from mm_batch.config.secrets import Masker
from mm_batch.effects.cache import CachedClient, CacheFolder, CacheUse, ResponseStore, open_folder
from mm_batch.effects.litellm import LiteLLMClient
from mm_batch.effects.llama_client import LlamaClient
from mm_batch.effects.model_calls import Retries, TurnClient
from mm_batch.run.ports import ModelClient, ModelError
from mm_batch.testing.fake_openai import (
    Delayed,
    FakeOpenAI,
    Finished,
    HttpFailure,
    RawReply,
    Reply,
    text,
    tool_call,
)

NAME = "qwen2.5-coder-0.5b"
SECRET = "sk-local-secret-123456"
MASKER = Masker([SECRET])
MESSAGES = [{"role": "user", "content": "go"}]
BACKOFF_S = 0.01
EXAMPLES = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


class Queue:
    """A script answering each request with the next reply, or "done" once they ran out."""

    def __init__(self) -> None:
        self.replies: deque[Reply] = deque()

    def __call__(self, _request: dict[str, Any]) -> Reply:
        return self.replies.popleft() if self.replies else text("done")


@dataclasses.dataclass
class Pair:
    """litellm's client and the native one, of one fake server; the sleeps each asked for."""

    fake: FakeOpenAI
    queue: Queue
    litellm: LiteLLMClient
    native: LlamaClient
    sleeps: dict[str, list[float]]


def _pair(fake: FakeOpenAI, queue: Queue, options: dict[str, Any], timeout: float) -> Pair:
    sleeps: dict[str, list[float]] = {"litellm": [], "native": []}
    return Pair(
        fake,
        queue,
        LiteLLMClient(
            f"hosted_vllm/{NAME}",
            {**options, "api_base": fake.url},
            masker=MASKER,
            timeout=timeout,
            backoff_s=BACKOFF_S,
            sleep=sleeps["litellm"].append,
        ),
        LlamaClient(
            fake.url,
            NAME,
            {**options, "api_base": fake.url},
            masker=MASKER,
            timeout=timeout,
            retries=Retries(backoff_s=BACKOFF_S, sleep=sleeps["native"].append),
        ),
        sleeps,
    )


@pytest.fixture
def pair() -> Iterator[Pair]:
    queue = Queue()
    with FakeOpenAI(queue) as fake:
        yield _pair(fake, queue, {"max_tokens": 512}, 30.0)


@pytest.fixture(scope="module")
def shared() -> Iterator[Pair]:
    """One server for the properties' many examples (hypothesis wants no function fixture)."""
    queue = Queue()
    with FakeOpenAI(queue) as fake:
        yield _pair(fake, queue, {"max_tokens": 512}, 30.0)


def _outcome(
    client: ModelClient, messages: list[dict[str, Any]] = MESSAGES, deadline: float = 30.0
) -> tuple[Any, ...]:
    """A reply without its latency, or an error's class and what its reason says first."""
    try:
        reply = client.complete(messages, [], deadline)
    except ModelError as exc:
        return ("error", type(exc).__name__, str(exc).split(":")[0])
    return ("reply", dataclasses.replace(reply, latency_s=0.0))


def _both(pair: Pair, *replies: Reply, deadline: float = 30.0) -> tuple[Any, Any]:
    """Each client's outcome for the same replies, asked one after the other."""
    outcomes = []
    for client in (pair.litellm, pair.native):
        pair.queue.replies = deque(replies)
        outcomes.append(_outcome(client, deadline=deadline))
    return outcomes[0], outcomes[1]


# -- replies: the same records ---------------------------------------------------------------

ARGUMENTS = st.one_of(
    st.text(max_size=30),
    st.dictionaries(
        st.text(max_size=6), st.one_of(st.integers(), st.text(max_size=6), st.none()), max_size=3
    ),
)
CALLS = st.lists(
    st.tuples(st.text(min_size=1, max_size=10), ARGUMENTS).map(
        lambda c: {
            "id": f"call_{abs(hash(c[0])) % 1000}",
            "type": "function",
            "function": {"name": c[0], "arguments": c[1]},
        }
    ),
    max_size=2,
)
# What llama-server says (OpenAI's words), none, and words it might add; other providers' own
# words for a normal end (`eos`, `end_turn`) are litellm's to translate, and never come here.
FINISHES = st.sampled_from(
    [None, "stop", "length", "tool_calls", "content_filter", "model_length", "abort", ""]
)
USAGE = st.one_of(
    st.none(),
    st.fixed_dictionaries(
        {"prompt_tokens": st.integers(0, 10**7), "completion_tokens": st.integers(0, 10**7)}
    ),
)


@st.composite
def completions(draw: st.DrawFn) -> bytes:
    message: dict[str, Any] = {"role": "assistant", "content": draw(st.none() | st.text())}
    calls = draw(CALLS)
    if calls:
        message["tool_calls"] = calls
    choice = {"index": 0, "message": message, "finish_reason": draw(FINISHES)}
    body: dict[str, Any] = {"id": "x", "object": "chat.completion", "created": 1, "model": NAME}
    body["choices"] = [choice]
    usage = draw(USAGE)
    if usage is not None:
        body["usage"] = usage
    return json.dumps(body).encode()


@EXAMPLES
@given(body=completions())
def test_the_same_reply_gives_the_same_record(shared: Pair, body: bytes) -> None:
    litellm, native = _both(shared, RawReply(body))
    assert native == litellm
    assert native[0] == "reply"


# Replies a broken or hostile server sends: each is read alike, or refused alike.
ODD: dict[str, dict[str, Any]] = {
    "empty choices": {"choices": []},
    "choices null": {"choices": None},
    "no choices": {},
    "message null": {"choices": [{"index": 0, "message": None, "finish_reason": "stop"}]},
    "a choice that is a string": {"choices": ["x"]},
    "content a number": {"choices": [{"message": {"role": "assistant", "content": 5}}]},
    "content a list": {"choices": [{"message": {"role": "assistant", "content": [{"a": 1}]}}]},
    "tool_calls a string": {"choices": [{"message": {"role": "assistant", "tool_calls": "zz"}}]},
    "a call that is a string": {
        "choices": [{"message": {"role": "assistant", "tool_calls": ["x"]}}]
    },
    "a call without function": {
        "choices": [{"message": {"role": "assistant", "tool_calls": [{"id": "a"}]}}]
    },
    "a name that is a number": {
        "choices": [
            {
                "message": {
                    "role": "assistant",
                    "tool_calls": [{"id": "a", "function": {"name": 1, "arguments": "{}"}}],
                }
            }
        ]
    },
    "arguments a number": {
        "choices": [
            {
                "message": {
                    "role": "assistant",
                    "tool_calls": [{"id": "a", "function": {"name": "t", "arguments": 5}}],
                }
            }
        ]
    },
    "arguments null": {
        "choices": [
            {
                "message": {
                    "role": "assistant",
                    "tool_calls": [{"id": "a", "function": {"name": "t", "arguments": None}}],
                }
            }
        ]
    },
    "a stop with a call": {
        "choices": [
            {
                "finish_reason": "stop",
                "message": {
                    "role": "assistant",
                    "tool_calls": [{"id": "a", "function": {"name": "t", "arguments": "{}"}}],
                },
            }
        ]
    },
    "usage a string": {"choices": [{"message": {"content": "hi"}}], "usage": "x"},
    "no role": {"choices": [{"message": {"content": "hi"}, "finish_reason": "stop"}]},
    "a second choice that is broken": {
        "choices": [{"message": {"role": "assistant", "content": "a"}}, "x"]
    },
}
RAW = {"not JSON": b"<html>upstream says hi</html>", "empty body": b"", "a JSON list": b"[1, 2]"}


@pytest.mark.parametrize("name", [*ODD, *RAW])
def test_an_odd_reply_is_read_or_refused_alike(pair: Pair, name: str) -> None:
    body = (
        RAW[name]
        if name in RAW
        else json.dumps({"object": "chat.completion", **ODD[name]}).encode()
    )
    litellm, native = _both(pair, RawReply(body))
    assert native == litellm
    assert len(pair.fake.requests) == 2  # neither asked again


# -- requests: the same body -----------------------------------------------------------------

CALL_IN_HISTORY = st.builds(
    lambda i, name, args: {
        "id": f"call_{i}",
        "type": "function",
        "function": {"name": name, "arguments": args},
    },
    st.integers(0, 9),
    st.text(min_size=1, max_size=8),
    st.text(max_size=20),
)
MESSAGE = st.one_of(
    st.builds(lambda c: {"role": "user", "content": c}, st.text(max_size=40)),
    st.builds(
        lambda c, calls: {"role": "assistant", "content": c, "tool_calls": calls or None},
        st.none() | st.text(max_size=40),
        st.lists(CALL_IN_HISTORY, max_size=2),
    ),
    st.builds(
        lambda i, c: {"role": "tool", "tool_call_id": f"call_{i}", "content": c},
        st.integers(0, 9),
        st.text(max_size=40),
    ),
)
TOOL = st.builds(
    lambda name, description, params: {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {
                "type": "object",
                "properties": {p: {"type": t, "description": d} for p, (t, d) in params.items()},
                "required": sorted(params)[:1],
            },
        },
    },
    st.from_regex(r"[a-z_]{1,10}", fullmatch=True),
    st.text(max_size=30),
    st.dictionaries(
        st.from_regex(r"[a-z_]{1,8}", fullmatch=True),
        st.tuples(st.sampled_from(["string", "integer", "boolean"]), st.text(max_size=10)),
        max_size=3,
    ),
)
OPTIONS = st.fixed_dictionaries(
    {},
    optional={
        "temperature": st.sampled_from([0, 0.2, 1.0]),
        "seed": st.integers(0, 2**31),
        "top_p": st.sampled_from([0.5, 0.9]),
        "max_tokens": st.integers(1, 4096),
        "stop": st.lists(st.text(min_size=1, max_size=4), max_size=2),
        "top_k": st.integers(1, 50),
        "extra_body": st.fixed_dictionaries({"grammar": st.text(max_size=20)}),
        "timeout": st.just(60),
        "max_parallel": st.just(2),
    },
)


@EXAMPLES
@given(
    history=st.lists(MESSAGE, max_size=4),
    tools=st.lists(TOOL, max_size=2),
    options=OPTIONS,
)
def test_the_same_turn_sends_the_same_body(
    shared: Pair,
    history: list[dict[str, Any]],
    tools: list[dict[str, Any]],
    options: dict[str, Any],
) -> None:
    messages = [{"role": "system", "content": "You run tools."}, *MESSAGES, *history]
    pair = _pair(shared.fake, shared.queue, options, 30.0)
    pair.litellm.complete(messages, tools, 30)
    pair.native.complete(messages, tools, 30)
    by_litellm, native = shared.fake.requests[-2:]
    assert native == by_litellm


# -- failures: the same retries, reasons and deadline ----------------------------------------


def _multiples(sleeps: list[float]) -> list[int]:
    """Each backoff in units of the first one (the jitter adds up to a quarter)."""
    return [int(s / BACKOFF_S) for s in sleeps]


def test_5xx_is_retried_alike_and_answers(pair: Pair) -> None:
    litellm, native = _both(pair, HttpFailure(500), HttpFailure(503), text("ok"))
    assert native == litellm
    assert native[1].attempts == 3 and native[1].text == "ok"
    assert _multiples(pair.sleeps["native"]) == _multiples(pair.sleeps["litellm"]) == [1, 2]


def test_5xx_three_times_is_the_same_error(pair: Pair) -> None:
    litellm, native = _both(pair, *[HttpFailure(502, f"bad gateway {SECRET}")] * 3)
    assert (
        native == litellm == ("error", "ModelError", "the model could not be reached after 3 tries")
    )
    assert len(pair.fake.requests) == 6


def test_429_waits_what_retry_after_asks_alike(pair: Pair) -> None:
    limited = HttpFailure(429, "slow down", {"Retry-After": "2"})
    litellm, native = _both(pair, limited, text("ok"))
    assert native == litellm and native[1].attempts == 2
    # Each waited the 2 s asked (the shared pause, slept before the next try), not its backoff.
    for sleeps in pair.sleeps.values():
        assert len(sleeps) == 1 and 1.5 < sleeps[0] <= 2.0


def test_a_4xx_is_refused_at_once_alike_and_its_reason_is_masked(pair: Pair) -> None:
    failures: list[str] = []
    for client in (pair.litellm, pair.native):
        pair.queue.replies = deque([HttpFailure(400, f"bad key {SECRET}")])
        with pytest.raises(ModelError) as caught:
            client.complete(MESSAGES, [], 30)
        failures.append(str(caught.value))
    assert all(f.startswith("the model refused the request: ") for f in failures)
    assert all(SECRET not in f and "bad key" in f for f in failures)
    assert len(pair.fake.requests) == 2


def test_a_malformed_200_is_not_retried_alike(pair: Pair) -> None:
    litellm, native = _both(pair, RawReply(b"{not json"))
    assert native == litellm == ("error", "ModelError", "the model sent a malformed response")


def test_a_timeout_is_retried_alike() -> None:
    queue = Queue()
    with FakeOpenAI(queue) as fake:
        pair = _pair(fake, queue, {}, 0.3)  # each try is cut at 0.3 s
        litellm, native = _both(pair, Delayed(text("late"), 3), text("ok"))
    assert native == litellm and native[1].attempts == 2


def test_nothing_outlives_the_deadline_alike(pair: Pair) -> None:
    litellm, native = _both(pair, Delayed(text("late"), 30), deadline=0.5)
    assert (
        native
        == litellm
        == ("error", "ModelDeadlineError", "the task's deadline came before the model answered")
    )


def test_a_server_that_is_gone_is_the_same_error() -> None:
    queue = Queue()
    with FakeOpenAI(queue) as fake:
        pair = _pair(fake, queue, {}, 5.0)
    # The server is closed now: its port refuses every connection.
    litellm, native = _both(pair)
    assert (
        native == litellm == ("error", "ModelError", "the model could not be reached after 3 tries")
    )


# -- the response cache: one folder, one format, for both ------------------------------------


def _cached(client: TurnClient, folder: CacheFolder, mode: CacheMode, model: str) -> CachedClient:
    """The cache around a client, keyed as the wiring keys either: by the request litellm is
    given (`hosted_vllm/<name>`, its options less where it is sent)."""
    options = {"max_tokens": 512, "api_base": "http://127.0.0.1:9/v1"}
    return CachedClient(client, ResponseStore(folder, MASKER), CacheUse(mode), model, options)


def _native(pair: Pair, folder: CacheFolder, mode: CacheMode) -> CachedClient:
    return _cached(pair.native, folder, mode, f"hosted_vllm/{NAME}")


def test_one_cache_folder_serves_both_clients(pair: Pair, tmp_path: Path) -> None:
    folder = open_folder(CacheSettings(tmp_path / "cache"))
    turn = tool_call("release", {"version": "1.4.2"})
    pair.queue.replies = deque([turn])
    hosted = pair.litellm
    asked = _cached(hosted, folder, "readwrite", hosted.model).complete(MESSAGES, [], 30)
    assert not asked.cached  # litellm's client asked, and the entry is written
    replayed = _native(pair, folder, "read").complete(MESSAGES, [], 30)
    assert len(pair.fake.requests) == 1  # the native client read litellm's entry
    assert replayed.cached and replayed.cost_usd == 0.0
    fields = ("text", "tool_calls", "finish_reason", "prompt_tokens", "completion_tokens")
    assert [getattr(replayed, f) for f in fields] == [getattr(asked, f) for f in fields]

    other = [{"role": "user", "content": "another turn"}]
    pair.queue.replies = deque([Finished(text("cut"), "length")])
    written = _native(pair, folder, "write").complete(other, [], 30)  # native writes one
    assert not written.cached and len(pair.fake.requests) == 2
    read_back = _cached(hosted, folder, "read", hosted.model).complete(other, [], 30)
    assert len(pair.fake.requests) == 2  # litellm's client was not asked: the entry answered
    assert read_back.cached and (read_back.text, read_back.finish_reason) == ("cut", "length")


def test_read_mode_stores_nothing_and_write_mode_reads_nothing(pair: Pair, tmp_path: Path) -> None:
    folder = open_folder(CacheSettings(tmp_path / "cache"))
    pair.queue.replies = deque([text("first"), text("second"), text("third")])
    assert not _native(pair, folder, "read").complete(MESSAGES, [], 30).cached
    assert list(folder.path.glob("*.json")) == []
    assert _native(pair, folder, "write").complete(MESSAGES, [], 30).text == "second"
    assert _native(pair, folder, "write").complete(MESSAGES, [], 30).text == "third"
    hit = _native(pair, folder, "readwrite").complete(MESSAGES, [], 30)
    assert hit.cached and hit.text == "third" and len(pair.fake.requests) == 3
