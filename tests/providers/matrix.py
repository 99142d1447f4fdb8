"""The providers of the conformance matrix (tests/providers/test_conformance.py): how mm-batch
reaches each through litellm (model string, key in the environment, model options), the local
server that speaks its wire format, its errors, and what its second request must carry."""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from mm_batch.testing.http_server import RawReply
from tests.providers.wire import (
    Request,
    Respond,
    Thinking,
    Turn,
    anthropic,
    anthropic_error,
    bedrock,
    bedrock_error,
)
from tests.providers.wire_gemini import gemini, gemini_error, gemini_field, retry_info
from tests.providers.wire_ollama import ollama, ollama_error
from tests.providers.wire_openai import (
    azure_door,
    chat_completions,
    openai_door,
    openai_error,
    vllm_door,
)

THINKING = Thinking("The user wants 1.4.2 released: call release.", "EqQBCkgIARABGAIiQL+sig==")
SCRIPT = (
    Turn("I will release it.", calls=(("release", {"version": "1.4.2"}),), thinking=THINKING),
    Turn("Released 1.4.2."),
)
WRONG_KEY = "not-the-key-the-server-knows"
# Keys as random as real ones: the masker masks a word of a provider's error that begins or
# ends as a key does (`azure-...` would mask `AzureException`).
OPENAI_KEY = "sk-proj-Xq7Tz3Lm9Rb2Wc5Yd8Vf1Ng4Hk6Jp0"
ANTHROPIC_KEY = "sk-ant-api03-Qm4Zr8Tx2Lw6Yb9Vc3Nd7Kf1Hj5Pg0"
GEMINI_KEY = "AIzaSyD3mK8qR2tW6yB9vC4nF7hJ1pL5xZ0sA2e"
AZURE_KEY = "3f9c2e7d1b8a4c6e9f0d2b5a7c1e8f4d"
OLLAMA_KEY = "9e2b6a8d3f5c0e1a.Zr8Tx2Lw6Yb9Vc3Nq4Km7"
VLLM_KEY = "token-Lw6Yb9Vc3Nd7Kf1Hj5Pg0Qm4Zr8Tx2"
DEPLOYMENT, API_VERSION = "acme-prod-chat", "2024-10-21"
ACCESS_KEY_ID = "AKIA5QX3ZR7T2LM9WB4K"
THINK = "{thinking: {type: enabled, budget_tokens: 1024}}"
Error = Callable[[int, str, Mapping[str, str]], RawReply]
Body = dict[str, Any]


@dataclass(frozen=True)
class Provider:
    """One provider as the matrix runs it."""

    model: str
    env: Mapping[str, str]  # the key (and what else the provider reads), as CI gives it
    key: str  # the credential of `env` the server checks
    serve: Callable[[str], Respond]  # the provider's server, knowing this credential
    options: Callable[[str], Sequence[str]]  # --model-option values, given the server's URL
    error: Error  # a 429 or a 500 in the provider's own shape
    second: Callable[[Request], None]  # what the second request must carry
    refused: int  # the status the provider answers a key it does not know with
    path: str  # where the provider is asked (with the query)
    auth: tuple[str, str]  # the header that carries the key, and how its value begins
    agent_options: str = "{}"

    @property
    def secrets(self) -> list[str]:
        """What must show nowhere: every value of `env` whose name says it is a key."""
        return [v for k, v in self.env.items() if "KEY" in k]


def _in(message: Mapping[str, Any], *, role: str) -> bool:
    return message.get("role") == role


def _tool_result(text: object) -> None:
    assert "released 1.4.2" in json.dumps(text), text


# -- what each provider's second request carries --------------------------------------------


def _openai_history(request: Request) -> Body:
    """An OpenAI history: the assistant's call (arguments a JSON string), then its tool reply."""
    messages = request.body["messages"]
    index = next(i for i, m in enumerate(messages) if _in(m, role="assistant"))
    assistant, answer = messages[index], messages[index + 1]
    call = assistant["tool_calls"][0]
    assert call["id"] == "call_0_0" and call["type"] == "function", call
    assert call["function"]["name"] == "release"
    assert json.loads(call["function"]["arguments"]) == {"version": "1.4.2"}
    assert answer["role"] == "tool" and answer["tool_call_id"] == "call_0_0", answer
    _tool_result(answer["content"])
    return dict(assistant)


def _openai_second(request: Request) -> None:
    assistant = _openai_history(request)
    assert set(assistant) <= {"role", "content", "tool_calls"}, assistant  # no foreign parts


def _vllm_second(request: Request) -> None:
    """The reasoning parser's text goes back with the turn (a gpt-oss chat template needs it
    with a tool call)."""
    assistant = _openai_history(request)
    assert assistant["reasoning_content"] == THINKING.text, assistant


def _anthropic_second(request: Request, *, thinking: bool) -> None:
    messages = request.body["messages"]
    assistant, answer = messages[1], messages[2]
    kinds = [b["type"] for b in assistant["content"]]
    if thinking:
        assert request.body["thinking"]["type"] == "enabled"
        assert assistant["content"][0] == {
            "type": "thinking",
            "thinking": THINKING.text,
            "signature": THINKING.signature,
        }
        assert kinds == ["thinking", "text", "tool_use"], kinds
    else:
        assert "thinking" not in request.body
        assert kinds == ["text", "tool_use"], kinds
    result = next(b for b in answer["content"] if b["type"] == "tool_result")
    assert result["tool_use_id"] == assistant["content"][-1]["id"]
    _tool_result(result["content"])


def _bedrock_second(request: Request) -> None:
    messages = request.body["messages"]
    assistant, answer = messages[1], messages[2]
    assert assistant["content"][0] == {
        "reasoningContent": {
            "reasoningText": {"text": THINKING.text, "signature": THINKING.signature}
        }
    }
    used = next(b["toolUse"] for b in assistant["content"] if "toolUse" in b)
    result = next(b["toolResult"] for b in answer["content"] if "toolResult" in b)
    assert result["toolUseId"] == used["toolUseId"]
    _tool_result(result["content"])


def _gemini_second(request: Request) -> None:
    contents = request.body["contents"]
    index = next(i for i, c in enumerate(contents) if c["role"] == "model")
    called = next(p for p in contents[index]["parts"] if gemini_field(p, "functionCall"))
    assert gemini_field(called, "functionCall") == {"name": "release", "args": {"version": "1.4.2"}}
    # Kept as it came, not a placeholder signature.
    assert gemini_field(called, "thoughtSignature") == THINKING.signature
    answer = gemini_field(contents[index + 1]["parts"][0], "functionResponse")
    assert isinstance(answer, dict)
    assert answer["name"] == "release"
    _tool_result(answer["response"])


def _ollama_second(request: Request) -> None:
    messages = request.body["messages"]
    index = next(i for i, m in enumerate(messages) if _in(m, role="assistant"))
    assistant, answer = messages[index], messages[index + 1]
    assert assistant["tool_calls"][0]["function"] == {
        "name": "release",
        "arguments": {"version": "1.4.2"},  # an object, as Ollama's Go server reads it
    }
    assert assistant["thinking"] == THINKING.text
    assert answer["role"] == "tool"
    _tool_result(answer["content"])


def _azure_second(request: Request) -> None:
    assert request.header("api-key") is not None and request.header("Authorization") is None
    _openai_second(request)


# -- the providers --------------------------------------------------------------------------


def _openai_failure(status: int, message: str, headers: Mapping[str, str]) -> RawReply:
    return openai_error(status, message, "rate_limit_exceeded" if status == 429 else None, headers)


def _gemini_failure(status: int, message: str, headers: Mapping[str, str]) -> RawReply:
    """Google's APIs say the wait in the body (`google.rpc.RetryInfo`), not in `Retry-After`."""
    asked = headers.get("Retry-After")
    details = [retry_info(int(asked))] if asked is not None else []
    rest = {k: v for k, v in headers.items() if k != "Retry-After"}
    return gemini_error(status, message, details, rest)


ANTHROPIC = Provider(
    "anthropic/claude-sonnet-4-5",
    {"ANTHROPIC_API_KEY": ANTHROPIC_KEY},
    ANTHROPIC_KEY,
    lambda key: anthropic(SCRIPT, key=key),
    lambda url: [f"api_base={url}"],
    anthropic_error,
    functools.partial(_anthropic_second, thinking=False),
    refused=401,
    path="/v1/messages",
    auth=("x-api-key", ANTHROPIC_KEY),
)
GEMINI = Provider(
    "gemini/gemini-2.5-flash",
    {"GEMINI_API_KEY": GEMINI_KEY},
    GEMINI_KEY,
    lambda key: gemini(SCRIPT, key=key),
    lambda url: [f"api_base={url}/v1beta"],
    _gemini_failure,
    _gemini_second,
    # Gemini answers a key it does not know 400 API_KEY_INVALID: litellm says 401.
    refused=401,
    path="/v1beta/models/gemini-2.5-flash:generateContent",
    auth=("x-goog-api-key", GEMINI_KEY),
)
PROVIDERS = {
    "openai": Provider(
        "openai/gpt-4o-mini",
        {"OPENAI_API_KEY": OPENAI_KEY},
        OPENAI_KEY,
        lambda key: chat_completions(SCRIPT, door=openai_door(), key=key),
        lambda url: [f"api_base={url}/v1"],
        _openai_failure,
        _openai_second,
        refused=401,
        path="/v1/chat/completions",
        auth=("Authorization", f"Bearer {OPENAI_KEY}"),
    ),
    "anthropic": ANTHROPIC,
    "anthropic-thinking": replace(
        ANTHROPIC,
        second=functools.partial(_anthropic_second, thinking=True),
        agent_options=THINK,
    ),
    # litellm turns `reasoning_effort` into Claude's `thinking`: the block goes back the same.
    "anthropic-effort": replace(
        ANTHROPIC,
        second=functools.partial(_anthropic_second, thinking=True),
        agent_options="{reasoning_effort: low}",
    ),
    "gemini": GEMINI,
    # litellm keeps the signature in the call's id too, unless told not to: then only in the
    # provider fields mm-batch keeps.
    "gemini-fields": replace(GEMINI, agent_options="{thought_signature_in_tool_call_id: false}"),
    "azure": Provider(
        f"azure/{DEPLOYMENT}",
        {"AZURE_API_KEY": AZURE_KEY},
        AZURE_KEY,
        lambda key: chat_completions(SCRIPT, door=azure_door(DEPLOYMENT, API_VERSION), key=key),
        lambda url: [f"api_base={url}", f"api_version={API_VERSION}"],
        _openai_failure,
        _azure_second,
        refused=401,
        path=f"/openai/deployments/{DEPLOYMENT}/chat/completions?api-version={API_VERSION}",
        auth=("api-key", AZURE_KEY),
    ),
    "bedrock": Provider(
        "bedrock/us.anthropic.claude-sonnet-4-5-20250929-v1:0",
        {
            "AWS_ACCESS_KEY_ID": ACCESS_KEY_ID,
            "AWS_SECRET_ACCESS_KEY": "q8Zr3Tx7Lw2Yb6Vc9Nd4Kf1Hj5Pg0Mm3Sx8Qa2E",
            "AWS_REGION_NAME": "us-east-1",
        },
        ACCESS_KEY_ID,
        lambda key: bedrock(SCRIPT, access_key=key),
        lambda url: [f"aws_bedrock_runtime_endpoint={url}"],
        bedrock_error,
        _bedrock_second,
        refused=403,  # UnrecognizedClientException
        path="/model/us.anthropic.claude-sonnet-4-5-20250929-v1%3A0/converse",
        auth=("Authorization", f"AWS4-HMAC-SHA256 Credential={ACCESS_KEY_ID}/"),
        agent_options=THINK,
    ),
    "ollama": Provider(
        "ollama_chat/qwen3:8b",
        {"OLLAMA_API_KEY": OLLAMA_KEY},
        OLLAMA_KEY,
        lambda key: ollama(SCRIPT, key=key),
        lambda url: [f"api_base={url}"],
        ollama_error,
        _ollama_second,
        refused=401,
        path="/api/chat",
        auth=("Authorization", f"Bearer {OLLAMA_KEY}"),
    ),
    "vllm": Provider(
        "hosted_vllm/openai/gpt-oss-20b",
        {"HOSTED_VLLM_API_KEY": VLLM_KEY},
        VLLM_KEY,
        lambda key: chat_completions(SCRIPT, door=vllm_door(), key=key, reasoning=True),
        lambda url: [f"api_base={url}/v1"],
        _openai_failure,
        _vllm_second,
        refused=401,
        path="/v1/chat/completions",
        auth=("Authorization", f"Bearer {VLLM_KEY}"),
    ),
}
