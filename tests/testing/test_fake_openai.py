"""The fake model keeps connections alive, as real providers do, and drops them when it stops."""

from __future__ import annotations

import http.client
import json
from urllib.parse import urlsplit

import pytest

from mm_batch.testing.fake_openai import FakeOpenAI, text

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
