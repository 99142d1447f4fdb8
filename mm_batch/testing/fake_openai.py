"""A scripted fake model: a real HTTP server speaking the OpenAI chat-completions API.

It records every request it receives. A script maps each request to a reply; `by_prompt`
scripts conversations by their first user message and turn number, so parallel runs are
deterministic. Useful to test a pipeline offline, without any model. A reply is an assistant
message, an `HttpFailure`, a `Finished` message (any `finish_reason`), a `RawReply` (any bytes,
status and headers: what a hostile or broken provider sends), or one of these `Delayed`.
"""

from __future__ import annotations

import itertools
import json
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from mm_batch.jsontypes import JsonObject, JsonValue
from mm_batch.testing.http_server import JsonHttpServer, RawReply, json_reply

__all__ = [
    "Delayed",
    "FakeOpenAI",
    "Finished",
    "HttpFailure",
    "RawReply",
    "Reply",
    "Script",
    "by_prompt",
    "first_user_message",
    "messages",
    "text",
    "tool_call",
    "turn",
]


@dataclass(frozen=True)
class HttpFailure:
    """Answer a request with an HTTP error instead of a completion."""

    status: int
    message: str = "scripted failure"
    headers: Mapping[str, str] = field(default_factory=dict)  # e.g. {"Retry-After": "4"}


@dataclass(frozen=True)
class Finished:
    """A completion whose choice ends with this `finish_reason` (e.g. "length")."""

    message: JsonObject
    finish_reason: str | None


@dataclass(frozen=True)
class Delayed:
    """Send this reply after a pause, for this request only."""

    reply: Reply
    seconds: float


Reply = JsonObject | HttpFailure | RawReply | Finished | Delayed
Script = Callable[[JsonObject], Reply]
_ids = itertools.count(1)


def text(content: str) -> JsonObject:
    """An assistant message with a final answer."""
    return {"role": "assistant", "content": content}


def tool_call(
    name: str, arguments: str | Mapping[str, object], *more: tuple[str, str | Mapping[str, object]]
) -> dict[str, Any]:
    """An assistant message asking for one tool call (or several, with `more`); a test may
    edit it into what a hostile model sends."""
    calls = [(name, arguments), *more]
    return {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": f"call_{next(_ids)}",
                "type": "function",
                "function": {
                    "name": n,
                    "arguments": a if isinstance(a, str) else json.dumps(a),
                },
            }
            for n, a in calls
        ],
    }


def messages(request: Mapping[str, JsonValue]) -> list[JsonObject]:
    """The messages of a chat-completions request."""
    sent = request.get("messages")
    return [m for m in sent if isinstance(m, dict)] if isinstance(sent, list) else []


def first_user_message(request: Mapping[str, JsonValue]) -> str:
    return next((str(m.get("content")) for m in messages(request) if m.get("role") == "user"), "")


def turn(request: Mapping[str, JsonValue]) -> int:
    """0 for the first model turn of a conversation, 1 for the next, and so on."""
    return sum(1 for m in messages(request) if m.get("role") == "assistant")


def by_prompt(conversations: Mapping[str, Sequence[Reply]], default: Reply | None = None) -> Script:
    """Reply with the n-th scripted message of the conversation that starts with this prompt."""

    def script(request: JsonObject) -> Reply:
        replies = conversations.get(first_user_message(request))
        n = turn(request)
        if replies is None or n >= len(replies):
            return default if default is not None else text("done")
        return replies[n]

    return script


class FakeOpenAI(JsonHttpServer[dict[str, Any]]):
    """Serve chat completions on a free loopback port; use as a context manager. `requests`
    holds the bodies as litellm sent them, for tests to read by key wherever they look."""

    def __init__(self, script: Script, latency_s: float = 0.0) -> None:
        super().__init__(lambda request: request.body, self._reply)
        self.script = script
        self.latency_s = latency_s

    @property
    def url(self) -> str:
        return f"{super().url}/v1"

    def _reply(self, body: JsonObject) -> RawReply:
        if self.latency_s:
            time.sleep(self.latency_s)
        reply = self.script(body)
        while isinstance(reply, Delayed):
            time.sleep(reply.seconds)
            reply = reply.reply
        if isinstance(reply, RawReply):
            return reply
        if isinstance(reply, HttpFailure):
            error: JsonObject = {"message": reply.message, "type": "scripted", "code": reply.status}
            return json_reply(reply.status, {"error": error}, reply.headers)
        if isinstance(reply, Finished):
            message, finish = reply.message, reply.finish_reason
        else:
            message = reply
            finish = "tool_calls" if reply.get("tool_calls") else "stop"
        completion: JsonObject = {
            "id": f"chatcmpl-{next(_ids)}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": body.get("model", "fake"),
            "choices": [{"index": 0, "message": message, "finish_reason": finish}],
            "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15},
        }
        return json_reply(200, completion)
