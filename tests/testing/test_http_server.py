"""The server under the fakes: what it records, what it answers, and a body it cannot read."""

from __future__ import annotations

import http.client
import json
from urllib.parse import urlsplit

from mm_batch.jsontypes import JsonValue
from mm_batch.testing.http_server import JsonHttpServer, RawReply, Request, json_reply


def _post(url: str, path: str, body: bytes) -> tuple[int, dict[str, str], bytes]:
    address = urlsplit(url)
    assert address.hostname is not None and address.port is not None
    connection = http.client.HTTPConnection(address.hostname, address.port, timeout=5)
    try:
        connection.request("POST", path, body, {"Content-Type": "application/json", "X-K": "v"})
        response = connection.getresponse()
        return response.status, dict(response.getheaders()), response.read()
    finally:
        connection.close()


def _echo(request: Request) -> RawReply:
    got: JsonValue = {"path": request.path, "key": request.headers.get("X-K"), "body": request.body}
    return json_reply(201, got, {"X-Seen": "1"})


def test_each_request_is_read_recorded_and_answered_with_its_path_headers_and_body() -> None:
    with JsonHttpServer(lambda request: request, _echo) as server:
        status, headers, body = _post(server.url, "/a/b", b'{"n": 1}')
    assert (status, headers["X-Seen"], headers["Content-Type"]) == (201, "1", "application/json")
    assert headers["Content-Length"] == str(len(body))
    assert json.loads(body) == {"path": "/a/b", "key": "v", "body": {"n": 1}}
    assert [(r.path, r.body) for r in server.requests] == [("/a/b", {"n": 1})]


def test_a_body_that_is_no_json_object_is_refused_and_not_recorded() -> None:
    with JsonHttpServer(lambda request: request.body, lambda _body: RawReply(b"")) as server:
        answers = [_post(server.url, "/", sent) for sent in (b"{not json", b"[1, 2]", b"\xff")]
        status, _, body = _post(server.url, "/", b"")  # no body reads as {}
    assert [(s, json.loads(b)) for s, _, b in answers] == 3 * [
        (400, {"error": {"message": "invalid JSON body"}})
    ]
    assert (status, body) == (200, b"")
    assert server.requests == [{}]
