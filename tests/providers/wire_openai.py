"""Chat Completions as OpenAI, Azure OpenAI and vLLM serve it, for litellm's real code path.

One server, three doors: OpenAI (`POST /v1/chat/completions`, `Authorization: Bearer`), an
Azure deployment (`POST /openai/deployments/<name>/chat/completions?api-version=...`, the key in
`api-key`) and vLLM's OpenAI-compatible server (`hosted_vllm/`, `Authorization: Bearer` where it
was started with `--api-key`, and a reasoning parser's `reasoning_content`). Like the real
services it refuses (400) a history OpenAI refuses: a tool call whose arguments are not a JSON
string, an assistant turn with tool calls not answered by one `tool` message per call id, a
`tool` message that answers no call.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from mm_batch.jsontypes import JsonObject, JsonValue
from mm_batch.testing.http_server import RawReply, json_reply
from tests.providers.wire import Request, Respond, Turn


def openai_error(
    status: int, message: str, code: str | None = None, headers: Mapping[str, str] | None = None
) -> RawReply:
    """An error as OpenAI (and Azure, and vLLM) answer it."""
    kind = {400: "invalid_request_error", 401: "invalid_request_error", 429: "requests"}
    error: JsonObject = {
        "message": message,
        "type": kind.get(status, "server_error"),
        "param": None,
        "code": code,
    }
    return json_reply(status, {"error": error}, headers)


def redacted(key: str) -> str:
    """A key as OpenAI's 401 quotes it: its first 8 and last 4 characters."""
    return f"{key[:8]}{'*' * 20}{key[-4:]}"


@dataclass(frozen=True)
class Door:
    """Where a Chat Completions server is asked, how it wants the key, and how it refuses a
    wrong one (given the key it got)."""

    path: str  # with its query, as the request line has it
    key_header: str
    key_prefix: str  # "Bearer " where the header is Authorization
    refuse: Callable[[str], RawReply]


def openai_door() -> Door:
    def refuse(got: str) -> RawReply:
        return openai_error(
            401,
            f"Incorrect API key provided: {redacted(got)}. You can find your API key at "
            "https://platform.openai.com/account/api-keys.",
            "invalid_api_key",
        )

    return Door("/v1/chat/completions", "Authorization", "Bearer ", refuse)


def azure_door(deployment: str, api_version: str) -> Door:
    def refuse(_got: str) -> RawReply:
        error: JsonObject = {
            "code": "401",
            "message": "Access denied due to invalid subscription key or wrong API endpoint. "
            "Make sure to provide a valid key for an active subscription and use a correct "
            "regional API endpoint for your resource.",
        }
        return json_reply(401, {"error": error})

    path = f"/openai/deployments/{deployment}/chat/completions?api-version={api_version}"
    return Door(path, "api-key", "", refuse)


def vllm_door() -> Door:
    """vLLM started with `--api-key`: its middleware's 401."""
    return Door(
        "/v1/chat/completions",
        "Authorization",
        "Bearer ",
        lambda _got: json_reply(401, {"error": "Unauthorized"}),
    )


def chat_history_problem(messages: Sequence[Mapping[str, Any]]) -> str | None:
    """What OpenAI would refuse in the history (its own words)."""
    for index, message in enumerate(messages):
        role = message.get("role")
        if role == "tool":
            before = messages[:index]
            asked = {
                str(c.get("id"))
                for m in before
                if m.get("role") == "assistant"
                for c in m.get("tool_calls") or []
            }
            if message.get("tool_call_id") not in asked:
                return (
                    f"Invalid parameter: messages with role 'tool' must be a response to a "
                    f"preceeding message with 'tool_calls'. (messages.[{index}].role)"
                )
        if role != "assistant" or not message.get("tool_calls"):
            continue
        ids = []
        for n, call in enumerate(message["tool_calls"]):
            arguments = (call.get("function") or {}).get("arguments")
            if not isinstance(arguments, str):
                return (
                    f"Invalid type for 'messages[{index}].tool_calls[{n}].function.arguments': "
                    f"expected a string, but got {type(arguments).__name__} instead."
                )
            ids.append(str(call.get("id")))
        following = messages[index + 1 : index + 1 + len(ids)]
        answered = [str(m.get("tool_call_id")) for m in following if m.get("role") == "tool"]
        missing = [i for i in ids if i not in answered]
        if missing:
            return (
                "An assistant message with 'tool_calls' must be followed by tool messages "
                "responding to each 'tool_call_id'. The following tool_call_ids did not have "
                f"response messages: {', '.join(missing)} (messages.[{index + 1}].role)"
            )
    return None


def chat_completions(
    turns: Sequence[Turn], *, door: Door, key: str, reasoning: bool = False
) -> Respond:
    """A Chat Completions server at `door` playing `turns` in order, one per assistant turn
    already in the history. `reasoning`: a reasoning model behind vLLM's parser, whose turns
    say their thinking in `reasoning_content`."""

    def respond(request: Request) -> RawReply:
        if request.path != door.path:
            return openai_error(404, f"Resource not found: {request.path}", "404")
        got = request.header(door.key_header) or ""
        if got != door.key_prefix + key:
            return door.refuse(got.removeprefix(door.key_prefix))
        messages = request.body.get("messages") or []
        problem = chat_history_problem(messages)
        if problem is not None:
            return openai_error(400, problem)
        n = sum(1 for m in messages if m.get("role") == "assistant")
        turn = turns[n]
        message: JsonObject = {"role": "assistant", "content": turn.text or None}
        if reasoning and turn.thinking is not None:
            message["reasoning_content"] = turn.thinking.text
        calls: list[JsonValue] = [
            {
                "id": f"call_{n}_{i}",
                "type": "function",
                "function": {"name": name, "arguments": json.dumps(dict(arguments))},
            }
            for i, (name, arguments) in enumerate(turn.calls)
        ]
        if calls:
            message["tool_calls"] = calls
        return json_reply(
            200,
            {
                "id": f"chatcmpl-{n}",
                "object": "chat.completion",
                "created": 1767225600,
                "model": request.body.get("model"),
                "choices": [
                    {
                        "index": 0,
                        "message": message,
                        "finish_reason": "tool_calls" if calls else "stop",
                    }
                ],
                "usage": {"prompt_tokens": 12, "completion_tokens": 7, "total_tokens": 19},
            },
        )

    return respond
