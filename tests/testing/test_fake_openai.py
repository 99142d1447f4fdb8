"""The fake model keeps connections alive, as real providers do, and drops them when it stops."""

from __future__ import annotations

import http.client
import json
import threading
import time
from collections.abc import Iterator
from types import SimpleNamespace
from urllib.parse import urlsplit

import pytest

from mm_batch.testing import fake_openai
from mm_batch.testing.fake_openai import (
    Delayed,
    FakeOpenAI,
    Finished,
    HttpFailure,
    RawReply,
    Reply,
    text,
)
from tests.helpers import wait_for

BODY = json.dumps({"model": "fake", "messages": [{"role": "user", "content": "go"}]})


def _post(connection: http.client.HTTPConnection) -> dict[str, object]:
    connection.request("POST", "/v1/chat/completions", BODY, {"Content-Type": "application/json"})
    response = connection.getresponse()
    assert response.status == 200
    return dict(json.loads(response.read()))


def test_one_connection_serves_many_requests_until_the_server_stops() -> None:
    fake = FakeOpenAI(lambda _request: text("ok")).__enter__()
    address = urlsplit(fake.url)
    assert address.hostname is not None and address.port is not None
    connection = http.client.HTTPConnection(address.hostname, address.port, timeout=5)
    try:
        _post(connection)
        sock = connection.sock
        second = _post(connection)
        assert connection.sock is sock  # the same socket: kept alive
        assert second["choices"] == [{"index": 0, "message": text("ok"), "finish_reason": "stop"}]
        assert len(fake.requests) == 2
        fake.__exit__(None, None, None)
        with pytest.raises((http.client.HTTPException, OSError)):
            _post(connection)
        assert len(fake.requests) == 2
    finally:
        connection.close()


def _raw_post(fake: FakeOpenAI, timeout: float = 5) -> tuple[int, dict[str, str], bytes]:
    address = urlsplit(fake.url)
    assert address.hostname is not None and address.port is not None
    connection = http.client.HTTPConnection(address.hostname, address.port, timeout=timeout)
    try:
        connection.request(
            "POST", "/v1/chat/completions", BODY, {"Content-Type": "application/json"}
        )
        response = connection.getresponse()
        return response.status, dict(response.getheaders()), response.read()
    finally:
        connection.close()


def test_raw_replies_send_exactly_their_bytes_status_and_headers() -> None:
    reply = RawReply(b"\xff<not json>", 502, {"Retry-After": "7", "X-Any": "y"})
    with FakeOpenAI(lambda _r: reply) as fake:
        status, headers, body = _raw_post(fake)
    assert (status, body) == (502, b"\xff<not json>")
    assert headers["Retry-After"] == "7" and headers["X-Any"] == "y"
    assert headers["Content-Length"] == str(len(body))


def test_failures_carry_headers_and_finished_replies_their_finish_reason() -> None:
    replies: Iterator[Reply] = iter(
        [HttpFailure(429, "slow", {"Retry-After": "3"}), Finished(text("cu"), "length")]
    )
    with FakeOpenAI(lambda _r: next(replies)) as fake:
        status, headers, body = _raw_post(fake)
        assert status == 429 and headers["Retry-After"] == "3"
        assert json.loads(body)["error"]["message"] == "slow"
        status, _, body = _raw_post(fake)
    assert status == 200
    assert json.loads(body)["choices"][0] == {
        "index": 0,
        "message": text("cu"),
        "finish_reason": "length",
    }


def test_delayed_replies_wait_for_that_request_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """A `Delayed` reply pauses its own request for its seconds, and no other: the next
    request, sent while the delayed one waits, is answered meanwhile. The fake's sleep is held
    until the test lets it go, so that what waited is seen, not timed."""
    pauses: list[float] = []
    resume = threading.Event()

    def pause(seconds: float) -> None:
        pauses.append(seconds)
        resume.wait(120)

    monkeypatch.setattr(fake_openai, "time", SimpleNamespace(sleep=pause, time=time.time))
    replies: Iterator[Reply] = iter([Delayed(text("slow"), 0.5), text("fast")])
    answered: list[str] = []

    def post(fake: FakeOpenAI, timeout: float = 5) -> None:
        status, _, body = _raw_post(fake, timeout)
        assert status == 200
        answered.append(json.loads(body)["choices"][0]["message"]["content"])

    with FakeOpenAI(lambda _r: next(replies)) as fake:
        slow = threading.Thread(target=post, args=(fake, 120), daemon=True)  # held meanwhile
        try:
            slow.start()
            wait_for(lambda: pauses != [], "the delayed reply pauses")
            post(fake)
            assert (answered, pauses) == (["fast"], [0.5])  # the slow one still waits
        finally:
            resume.set()
            slow.join(30)
    assert (answered, pauses) == (["fast", "slow"], [0.5])
