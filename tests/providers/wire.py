"""Small local servers speaking providers' own wire formats, for litellm's real code path.

Each fake plays a scripted conversation (`Turn`s) in its provider's format and, like the real
service, refuses (400) a request that breaks the provider's rules for the history: an
Anthropic request whose assistant turn lost its signed thinking block, a Bedrock one that lost
its `reasoningContent`, a Gemini one that lost a thought signature. Every request is kept, with
its path and headers, so that a test reads what really went over the wire.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from mm_batch.jsontypes import JsonObject, JsonValue
from mm_batch.testing.http_server import JsonHttpServer, RawReply, json_reply


@dataclass(frozen=True)
class Thinking:
    """A reasoning block as a provider signs it."""

    text: str
    signature: str


@dataclass(frozen=True)
class Turn:
    """One scripted model turn: optional thinking, text, tool calls (name, arguments)."""

    text: str = ""
    calls: Sequence[tuple[str, Mapping[str, Any]]] = ()
    thinking: Thinking | None = None


@dataclass(frozen=True)
class Request:
    """A request as the fake got it, its body read by key."""

    path: str
    headers: Mapping[str, str]
    body: dict[str, Any]

    def header(self, name: str) -> str | None:
        """A header's value, its name matched as HTTP does (in any case)."""
        wanted = name.lower()
        return next((v for k, v in self.headers.items() if k.lower() == wanted), None)


Respond = Callable[[Request], RawReply]


def failing_first(replies: Sequence[RawReply], then: Respond) -> Respond:
    """Answer the first requests with `replies` (a provider's errors), each once, in order;
    every later one as `then` does."""
    left = list(replies)

    def respond(request: Request) -> RawReply:
        return left.pop(0) if left else then(request)

    return respond


class WireServer(JsonHttpServer[Request]):
    """Serve `respond` on a free loopback port; use as a context manager."""

    def __init__(self, respond: Respond) -> None:
        super().__init__(lambda got: Request(got.path, got.headers, got.body), respond)


# -- Anthropic Messages API ------------------------------------------------------------------


def anthropic_history_problem(body: Mapping[str, Any], turns: Sequence[Turn]) -> str | None:
    """What Anthropic would refuse in the history: each earlier assistant turn must be sent back
    with the exact thinking block it came with (when thinking is on), and each tool_use must be
    answered by a tool_result of the same id in the next user message."""
    thinking_on = (body.get("thinking") or {}).get("type") == "enabled"
    assistants = [
        (i, m) for i, m in enumerate(body.get("messages", [])) if m.get("role") == "assistant"
    ]
    for n, (index, message) in enumerate(assistants):
        content = message.get("content")
        blocks = content if isinstance(content, list) else [{"type": "text", "text": content}]
        sent = turns[n]
        if thinking_on and sent.thinking is not None:
            expected = {
                "type": "thinking",
                "thinking": sent.thinking.text,
                "signature": sent.thinking.signature,
            }
            if not blocks or blocks[0] != expected:
                return (
                    f"messages.{index}.content.0.type: Expected `thinking` or "
                    "`redacted_thinking`, but found "
                    f"`{blocks[0].get('type') if blocks else 'nothing'}`. When `thinking` is "
                    "enabled, a final `assistant` message must start with a thinking block "
                    "(preceeding the lastmost set of `tool_use` and `tool_result` blocks)."
                )
        used = [str(b["id"]) for b in blocks if b.get("type") == "tool_use"]
        if used:
            following = body["messages"][index + 1] if index + 1 < len(body["messages"]) else {}
            answered = [
                str(b.get("tool_use_id"))
                for b in following.get("content") or []
                if isinstance(b, dict) and b.get("type") == "tool_result"
            ]
            if sorted(answered) != sorted(used):
                return f"messages.{index + 1}: tool_use ids {used} found without tool_result"
    return None


def anthropic_error(
    status: int, message: str, headers: Mapping[str, str] | None = None
) -> RawReply:
    """An error as the Messages API answers it (`rate_limit_error`, `api_error`, ...)."""
    kind = {400: "invalid_request_error", 401: "authentication_error", 429: "rate_limit_error"}
    error: JsonObject = {"type": kind.get(status, "api_error"), "message": message}
    return json_reply(status, {"type": "error", "error": error}, headers)


def anthropic(turns: Sequence[Turn], *, key: str) -> Respond:
    """A Messages API (`POST /v1/messages`) playing `turns` in order, one per assistant turn
    already in the history; it checks the key as Anthropic does (`x-api-key`)."""

    def respond(request: Request) -> RawReply:
        if request.path != "/v1/messages":
            return anthropic_error(404, f"no route {request.path}")
        got = request.header("x-api-key")
        if got != key:
            return anthropic_error(401, f"invalid x-api-key: {got}")
        problem = anthropic_history_problem(request.body, turns)
        if problem is not None:
            return anthropic_error(400, problem)
        n = sum(1 for m in request.body.get("messages", []) if m.get("role") == "assistant")
        turn = turns[n]
        content: list[JsonValue] = []
        thinking_on = (request.body.get("thinking") or {}).get("type") == "enabled"
        if turn.thinking is not None and thinking_on:
            content.append(
                {
                    "type": "thinking",
                    "thinking": turn.thinking.text,
                    "signature": turn.thinking.signature,
                }
            )
        if turn.text:
            content.append({"type": "text", "text": turn.text})
        for i, (name, arguments) in enumerate(turn.calls):
            content.append(
                {"type": "tool_use", "id": f"toolu_{n}_{i}", "name": name, "input": dict(arguments)}
            )
        return json_reply(
            200,
            {
                "id": f"msg_{n}",
                "type": "message",
                "role": "assistant",
                "model": request.body.get("model"),
                "content": content,
                "stop_reason": "tool_use" if turn.calls else "end_turn",
                "stop_sequence": None,
                "usage": {"input_tokens": 12, "output_tokens": 7},
            },
        )

    return respond


# -- Bedrock Converse API --------------------------------------------------------------------


def bedrock_history_problem(body: Mapping[str, Any], turns: Sequence[Turn]) -> str | None:
    """What Bedrock would refuse: an earlier assistant turn of a reasoning model sent back
    without its exact `reasoningContent` block (text and signature) first."""
    thinking_on = "thinking" in json.dumps(body.get("additionalModelRequestFields") or {})
    assistants = [m for m in body.get("messages", []) if m.get("role") == "assistant"]
    for n, message in enumerate(assistants):
        sent = turns[n]
        if not thinking_on or sent.thinking is None:
            continue
        expected = {
            "reasoningContent": {
                "reasoningText": {"text": sent.thinking.text, "signature": sent.thinking.signature}
            }
        }
        content = message.get("content") or []
        if not content or content[0] != expected:
            return (
                "The model returned the following errors: messages.1.content.0.type: Expected "
                "`thinking` or `redacted_thinking`, but found `text`."
            )
    return None


_BEDROCK_ERRORS = {
    400: "ValidationException",
    403: "UnrecognizedClientException",
    429: "ThrottlingException",
    500: "InternalServerException",
}


def bedrock_error(status: int, message: str, headers: Mapping[str, str] | None = None) -> RawReply:
    """An error as the Bedrock runtime answers it: the message in the body, its kind in
    `x-amzn-ErrorType`."""
    kind = _BEDROCK_ERRORS.get(status, "InternalServerException")
    return json_reply(status, {"message": message}, {"x-amzn-ErrorType": kind, **(headers or {})})


def bedrock(turns: Sequence[Turn], *, access_key: str | None = None) -> Respond:
    """A Bedrock runtime (`POST /model/<id>/converse`) playing `turns` in order; it takes only
    requests signed with SigV4 (by `access_key`, when given)."""

    def respond(request: Request) -> RawReply:
        if not request.path.endswith("/converse"):
            return json_reply(404, {"message": f"no route {request.path}"})
        signed = request.header("Authorization") or ""
        if not signed.startswith("AWS4-HMAC-SHA256"):
            return bedrock_error(403, "Missing Authentication Token")
        if access_key is not None and f"Credential={access_key}/" not in signed:
            return bedrock_error(403, "The security token included in the request is invalid.")
        problem = bedrock_history_problem(request.body, turns)
        if problem is not None:
            return bedrock_error(400, problem)
        n = sum(1 for m in request.body.get("messages", []) if m.get("role") == "assistant")
        turn = turns[n]
        content: list[JsonValue] = []
        if turn.thinking is not None:
            text, signature = turn.thinking.text, turn.thinking.signature
            content.append(
                {"reasoningContent": {"reasoningText": {"text": text, "signature": signature}}}
            )
        if turn.text:
            content.append({"text": turn.text})
        for i, (name, arguments) in enumerate(turn.calls):
            content.append(
                {
                    "toolUse": {
                        "toolUseId": f"tooluse_{n}_{i}",
                        "name": name,
                        "input": dict(arguments),
                    }
                }
            )
        return json_reply(
            200,
            {
                "output": {"message": {"role": "assistant", "content": content}},
                "stopReason": "tool_use" if turn.calls else "end_turn",
                "usage": {"inputTokens": 12, "outputTokens": 7, "totalTokens": 19},
                "metrics": {"latencyMs": 5},
            },
        )

    return respond
