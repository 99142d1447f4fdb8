"""Ollama's own chat API as litellm's `ollama_chat/` provider speaks it (`POST /api/chat`, not
streamed; a key as `Authorization: Bearer` where the server sits behind one, as ollama.com's).

A turn's tool calls come with their arguments as a JSON object and no id, its thinking (a
`think` model's) in `thinking`, its end in `done_reason`, its token counts in
`prompt_eval_count` and `eval_count`. Like the real server (a Go struct), the fake refuses
(400) a history whose tool call's arguments are not an object, and a `tool` message that does
not follow an assistant turn with tool calls.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from mm_batch.jsontypes import JsonObject, JsonValue
from mm_batch.testing.http_server import RawReply, json_reply
from tests.providers.wire import Request, Respond, Turn


def ollama_error(status: int, message: str, headers: Mapping[str, str] | None = None) -> RawReply:
    """An error as Ollama answers it: one string."""
    return json_reply(status, {"error": message}, headers)


def ollama_history_problem(messages: Sequence[Mapping[str, Any]]) -> str | None:
    """What Ollama would refuse in the history (its own words)."""
    for index, message in enumerate(messages):
        for call in message.get("tool_calls") or []:
            if not isinstance((call.get("function") or {}).get("arguments"), dict):
                return (
                    "json: cannot unmarshal string into Go struct field "
                    "ToolCallFunction.messages.tool_calls.function.arguments of type "
                    "api.ToolCallFunctionArguments"
                )
        if message.get("role") == "tool":
            before = [m for m in messages[:index] if m.get("role") != "tool"]
            if not before or not before[-1].get("tool_calls"):
                return f"messages[{index}]: a tool message must follow a tool call"
    return None


def ollama(turns: Sequence[Turn], *, key: str) -> Respond:
    """`/api/chat` playing `turns` in order, one per assistant turn already in the history."""

    def respond(request: Request) -> RawReply:
        if request.path != "/api/chat":
            return ollama_error(404, "404 page not found")
        if request.header("Authorization") != f"Bearer {key}":
            return ollama_error(401, "unauthorized")
        if request.body.get("stream") is not False:
            return ollama_error(400, "this fake answers only stream: false")
        messages = request.body.get("messages") or []
        problem = ollama_history_problem(messages)
        if problem is not None:
            return ollama_error(400, problem)
        n = sum(1 for m in messages if m.get("role") == "assistant")
        turn = turns[n]
        message: JsonObject = {"role": "assistant", "content": turn.text}
        if turn.thinking is not None:
            message["thinking"] = turn.thinking.text
        calls: list[JsonValue] = [
            {"function": {"index": i, "name": name, "arguments": dict(arguments)}}
            for i, (name, arguments) in enumerate(turn.calls)
        ]
        if calls:
            message["tool_calls"] = calls
        return json_reply(
            200,
            {
                "model": request.body.get("model"),
                "created_at": "2026-01-01T00:00:00.000000Z",
                "message": message,
                "done": True,
                "done_reason": "stop",
                "total_duration": 5_000_000,
                "prompt_eval_count": 12,
                "eval_count": 7,
            },
        )

    return respond
