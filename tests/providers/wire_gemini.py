"""The Gemini API (Google AI Studio) as it answers `generateContent`, for litellm's real code
path (`gemini/<model>` with `api_base`: `POST <api_base>/models/<model>:generateContent`, the
key in `x-goog-api-key`).

Requests may spell a field as protobuf's JSON mapping allows, in lowerCamelCase or as the proto
field (`functionCall` or `function_call`: litellm sends the latter); the fake reads both.

A thinking model signs its function calls: the first `functionCall` part of each model turn
carries a `thoughtSignature`, and, like Gemini 3, the fake refuses (400) a later request whose
copy of that turn lost the signature or changed it; it refuses too a function-call turn not
answered, in the next turn, by as many `functionResponse` parts, of the same names.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from mm_batch.jsontypes import JsonObject, JsonValue
from mm_batch.testing.http_server import RawReply, json_reply
from tests.providers.wire import Request, Respond, Turn

_STATUS = {
    400: "INVALID_ARGUMENT",
    403: "PERMISSION_DENIED",
    404: "NOT_FOUND",
    429: "RESOURCE_EXHAUSTED",
    500: "INTERNAL",
}


def gemini_error(
    status: int,
    message: str,
    details: Sequence[JsonValue] = (),
    headers: Mapping[str, str] | None = None,
) -> RawReply:
    """An error as Google's APIs answer it (`google.rpc.Status`)."""
    error: JsonObject = {
        "code": status,
        "message": message,
        "status": _STATUS.get(status, "UNKNOWN"),
        "details": list(details),
    }
    return json_reply(status, {"error": error}, headers)


def gemini_key_refused() -> RawReply:
    """What the Gemini API answers a key it does not know: a 400, not a 401."""
    info: JsonObject = {
        "@type": "type.googleapis.com/google.rpc.ErrorInfo",
        "reason": "API_KEY_INVALID",
        "domain": "googleapis.com",
        "metadata": {"service": "generativelanguage.googleapis.com"},
    }
    return gemini_error(400, "API key not valid. Please pass a valid API key.", [info])


def retry_info(seconds: int) -> JsonObject:
    """The detail of a 429 that says how long to wait."""
    return {"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": f"{seconds}s"}


def _snake(name: str) -> str:
    return "".join(f"_{c.lower()}" if c.isupper() else c for c in name)


def gemini_field(part: Mapping[str, Any], name: str) -> Any:
    """A field of a request's part by its lowerCamelCase name, however the request spelt it."""
    return part.get(name, part.get(_snake(name)))


def gemini_history_problem(
    contents: Sequence[Mapping[str, Any]], turns: Sequence[Turn]
) -> str | None:
    """What Gemini would refuse in the history (its own words)."""
    models = [(i, c) for i, c in enumerate(contents) if c.get("role") == "model"]
    for n, (index, content) in enumerate(models):
        parts = content.get("parts") or []
        called = [p for p in parts if gemini_field(p, "functionCall") is not None]
        names = [gemini_field(p, "functionCall").get("name") for p in called]
        sent = turns[n]
        if called and sent.thinking is not None:
            signature = gemini_field(called[0], "thoughtSignature")
            if signature is None:
                name = names[0]
                return (
                    "Function call is missing a thought_signature in functionCall parts. This "
                    "is required for tools to work correctly, and missing thought_signature may "
                    "lead to degraded model performance. Additional data, function call "
                    f"`default_api:{name}` , position {index + 1}. Please refer to "
                    "https://ai.google.dev/gemini-api/docs/thought-signatures for more details."
                )
            if signature != sent.thinking.signature:
                return "Corrupted thought signature."
        if not called:
            continue
        following = contents[index + 1] if index + 1 < len(contents) else {}
        answers = [gemini_field(p, "functionResponse") for p in following.get("parts") or []]
        if [a.get("name") for a in answers if a is not None] != names:
            return (
                "Please ensure that the number of function response parts is equal to the number "
                "of function call parts of the function call turn."
            )
    return None


def gemini(turns: Sequence[Turn], *, key: str) -> Respond:
    """`generateContent` playing `turns` in order, one per model turn already in the history;
    a turn's thinking becomes the thought signature of its first function call."""

    def respond(request: Request) -> RawReply:
        if not request.path.endswith(":generateContent"):
            return gemini_error(404, f"no route {request.path}")
        if request.header("x-goog-api-key") != key:
            return gemini_key_refused()
        contents = request.body.get("contents") or []
        problem = gemini_history_problem(contents, turns)
        if problem is not None:
            return gemini_error(400, problem)
        n = sum(1 for c in contents if c.get("role") == "model")
        turn = turns[n]
        parts: list[JsonValue] = []
        if turn.text:
            parts.append({"text": turn.text})
        for i, (name, arguments) in enumerate(turn.calls):
            part: JsonObject = {"functionCall": {"name": name, "args": dict(arguments)}}
            if i == 0 and turn.thinking is not None:
                part["thoughtSignature"] = turn.thinking.signature
            parts.append(part)
        return json_reply(
            200,
            {
                "candidates": [
                    {
                        "content": {"role": "model", "parts": parts},
                        "finishReason": "STOP",
                        "index": 0,
                    }
                ],
                "usageMetadata": {
                    "promptTokenCount": 12,
                    "candidatesTokenCount": 7,
                    "totalTokenCount": 19,
                },
                "modelVersion": request.path.rsplit("/", 1)[-1].split(":")[0],
                "responseId": f"resp-{n}",
            },
        )

    return respond
