"""The local models' client: mm-batch's own llama-server, asked on its OpenAI-compatible
`/chat/completions` endpoint with the standard library's HTTP client. litellm is never imported
for it (its import was most of a local run's start-up and memory), yet a turn is asked, retried,
bounded and recorded as `LiteLLMClient` does it (`effects.model_calls` is that shared part), and
the server is sent the request litellm sent it, with the slot the run holds (`id_slot`,
llama-server's own field).

With a `CallGrammar` (mm-batch's own server), a turn that offers tools is asked natively
instead: the prompt rendered by the model's own template with the tools as it lists them
(`/apply-template`), then a completion (`/completion`) bound by a grammar that admits a plain
answer or one compact call of a declared tool (`tools.call_grammar`); its text is read back as
the chat endpoint's, for the loop's text rescue to take the call.
"""

from __future__ import annotations

import http.client
import json
import time
import urllib.parse
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from mm_batch.config.model import OWN_MODEL_OPTIONS, ToolSpec
from mm_batch.config.secrets import Masker
from mm_batch.effects.model_calls import (
    DEFAULT_RETRIES,
    Messages,
    Retries,
    ToolSchemas,
    ask,
    completion_problem,
    field,
    read_reply,
    text_of,
)
from mm_batch.plan import DEFAULT_MODEL_TIMEOUT_S
from mm_batch.run.ports import ModelError, ModelReply
from mm_batch.tools.call_grammar import (
    CALL_END,
    LEVELS,
    Level,
    call_grammar,
    forced_rest,
    tool_shapes,
)

# Far above any completion (a 1 MiB answer is cut in the records anyway): a bigger body is not
# read into memory, it is a malformed reply.
MAX_REPLY_BYTES = 32 * 1024 * 1024
# Options that say how litellm reaches a provider, not what is asked: litellm sends none of them
# in the request body, nor does this client. `extra_body`'s keys are sent as body keys.
_TRANSPORT_OPTIONS = frozenset(
    {
        *("api_base", "base_url", "api_key", "api_version", "base_model"),
        *("custom_llm_provider", "drop_params", "extra_headers", "num_retries", "timeout"),
    }
)
_NO_USAGE = {"prompt_tokens": 0, "completion_tokens": 0}
# What a server's error says is cut here before it is masked, folded and cut again.
_ERROR_TEXT_BYTES = 4096


class ServerStatusError(Exception):
    """The server answered with an HTTP status other than 200."""

    def __init__(self, status_code: int, message: str, headers: Mapping[str, str]) -> None:
        super().__init__(message)
        self.status_code = status_code
        self.headers = headers  # Retry-After is read from here


class ServerUnreachableError(ConnectionError):
    """No answer came: the connection was refused, reset or closed before the reply ended."""


class MalformedReplyError(Exception):
    """A 200 whose body is not a chat completion's JSON."""

    status_code = 200


def request_body(
    model: str, messages: Messages, tools: ToolSchemas, options: Mapping[str, object]
) -> dict[str, object]:
    """The body litellm sends an OpenAI-compatible server (`hosted_vllm/`) for the same turn:
    the model's name, the messages without their null fields, the options (those of
    `extra_body` among them), and the tools when there are any."""
    body: dict[str, object] = {
        "model": model,
        "messages": [{k: v for k, v in m.items() if v is not None} for m in messages],
    }
    body.update(
        (k, v)
        for k, v in options.items()
        if k not in _TRANSPORT_OPTIONS and k != "extra_body" and v is not None
    )
    extra = options.get("extra_body")
    if isinstance(extra, Mapping):
        body.update(extra)
    if tools:
        body["tools"] = tools
    return body


def _error_text(data: bytes) -> str:
    """What a server's error body says: its `error.message` (OpenAI's and llama-server's
    shape), else the body's text."""
    raw = data[:_ERROR_TEXT_BYTES].decode("utf-8", "replace")
    try:
        message = field(field(json.loads(data), "error"), "message")
    except (ValueError, RecursionError):
        message = None
    return message if isinstance(message, str) else raw


def post_json(url: urllib.parse.SplitResult, body: bytes, timeout: float) -> object:
    """POST a JSON body, and the JSON of a 200's reply; raises `ServerStatusError`,
    `ServerUnreachableError`, `TimeoutError` (transient or not by `model_errors.is_transient`)
    or `MalformedReplyError`. No proxy of the environment stands in between."""
    kind = http.client.HTTPSConnection if url.scheme == "https" else http.client.HTTPConnection
    connection = kind(url.hostname or "127.0.0.1", url.port, timeout=timeout)
    try:
        connection.request(
            "POST",
            url.path or "/",
            body,
            {"Content-Type": "application/json", "Accept": "application/json"},
        )
        response = connection.getresponse()
        data = response.read(MAX_REPLY_BYTES + 1)
    except TimeoutError:
        raise
    except (OSError, http.client.HTTPException) as exc:
        raise ServerUnreachableError(f"{type(exc).__name__}: {exc}") from exc
    finally:
        connection.close()
    if response.status != 200:
        headers = {k.lower(): v for k, v in response.getheaders()}
        raise ServerStatusError(response.status, _error_text(data), headers)
    if len(data) > MAX_REPLY_BYTES:
        raise MalformedReplyError(f"a reply larger than {MAX_REPLY_BYTES >> 20} MiB")
    try:
        return json.loads(data)
    except (ValueError, RecursionError) as exc:  # not JSON, not UTF-8, too deep, too many digits
        raise MalformedReplyError(f"a reply that is not JSON ({type(exc).__name__})") from exc


def native_finish(choice: object) -> str | None:
    """The finish reason as the server sent it, read as litellm reads an OpenAI-compatible
    server's: none at all is a stop (as OpenAI's API says), and a stop with tool calls is
    "tool_calls"."""
    given = field(choice, "finish_reason")
    reason = "stop" if given is None else text_of(given) or str(given)
    if reason == "stop" and field(field(choice, "message"), "tool_calls"):
        return "tool_calls"
    return reason


def unpriced(_prompt_tokens: int | None, _completion_tokens: int | None) -> float | None:
    """A local model's turn has no price (litellm knows none for it either)."""
    return None


def reply_of(response: object, latency_s: float, attempts: int, *, cached: bool) -> ModelReply:
    """A completion's JSON as a `ModelReply`; one that is not a completion is a `ModelError`."""
    problem = completion_problem(response)
    if problem is not None:
        raise ModelError(f"the model sent a malformed response: {problem}")
    if isinstance(response, dict) and response.get("usage") is None:
        response = {**response, "usage": _NO_USAGE}  # litellm counts a turn without usage as 0
    return read_reply(
        response, latency_s, attempts, finish=native_finish, cost=unpriced, cached=cached
    )


# The native completion's stop types (llama-server's words) as the chat endpoint says them.
_NATIVE_FINISH = {"limit": "length"}
# Chat options and their names in the native request; the rest go as they are (`temperature`,
# `seed`, `top_p`, `stop`...: the same names).
_NATIVE_NAMES = {"max_tokens": "n_predict", "max_completion_tokens": "n_predict"}


# The model option that binds a local model's calls by a grammar: a level, true for
# `DEFAULT_LEVEL`, false, or `auto` (the default): `DEFAULT_LEVEL` unless the agent offers the
# `bash` built-in (docs/design-choices.md says why). Read here, never sent.
GRAMMAR_OPTION = "call_grammar"
DEFAULT_LEVEL: Level = "types"


@dataclass(frozen=True)
class CallGrammar:
    """How a turn with tools is bound: how much of the declared tools the grammar holds to
    (`tools.call_grammar.Level`), and the declared tools (their required-ness and allowed
    values, which the schemas sent never carry)."""

    level: Level
    declared: Sequence[ToolSpec] = ()
    also: Sequence[str] = ()  # names the rescue takes that are no tool (skills'): any arguments


def grammar_of(
    options: Mapping[str, object],
    declared: Sequence[ToolSpec],
    *,
    rescue: bool,
    also: Sequence[str] = (),
    shell: bool = False,
) -> CallGrammar | None:
    """The grammar a local model's options ask for (true: `DEFAULT_LEVEL`; `auto`, the
    default: `DEFAULT_LEVEL` unless the agent offers the `bash` built-in, `shell`); None when
    they ask for none, or when calls written as text are not rescued (`rescue`): the
    grammar's calls are text, and the chat endpoint's native calls are the only ones then.
    Raises `ModelError` for a value that is no level."""
    value = options.get(GRAMMAR_OPTION, "auto")
    if value == "auto":
        value = False if shell else DEFAULT_LEVEL
    value = DEFAULT_LEVEL if value in (True, "true", "on") else value
    if value in (False, "off", "false"):
        return None
    level = next((level for level in LEVELS if level == value), None)
    if level is None:
        raise ModelError(
            f"model option {GRAMMAR_OPTION} must be auto, true, false or one of "
            f"{', '.join(LEVELS)}, got {str(value)[:40]!r}"
        )
    return CallGrammar(level, tuple(declared), tuple(also)) if rescue else None


def native_body(
    prompt: str, tools: ToolSchemas, grammar: CallGrammar, options: Mapping[str, object]
) -> dict[str, object]:
    """The `/completion` request of a turn: the rendered prompt, the grammar, the options."""
    body: dict[str, object] = {}
    for key, value in request_body("", [], [], options).items():
        if key not in ("model", "messages"):
            body[_NATIVE_NAMES.get(key, key)] = value
    shapes = tool_shapes(tools, grammar.declared)
    body.update(
        prompt=prompt,
        grammar=call_grammar(shapes, grammar.level, grammar.also).gbnf(),
        cache_prompt=True,
    )
    return body


def chat_completion_of(native: object) -> object:
    """A native completion's JSON as the chat endpoint's: its text as the message's content,
    its stop type as the finish reason, its token counts as the usage. Anything else is
    returned as it is, for `reply_of` to refuse."""
    content = field(native, "content")
    if not isinstance(native, dict) or not isinstance(content, str):
        return native
    stop = text_of(native.get("stop_type"))
    usage = {
        "prompt_tokens": native.get("tokens_evaluated"),
        "completion_tokens": native.get("tokens_predicted"),
    }
    choice = {
        "index": 0,
        "message": {"role": "assistant", "content": content},
        "finish_reason": _NATIVE_FINISH.get(stop or "", "stop"),
    }
    return {"object": "chat.completion", "choices": [choice], "usage": usage}


def _stops(given: object) -> list[object]:
    """The stop strings a model's options give (one string, or a list)."""
    if given is None:
        return []
    return list(given) if isinstance(given, list | tuple) else [given]


def _call_ended(native: object) -> object | None:
    """A completion cut where it wrote `CALL_END`, as the whole call it is (what the grammar
    forces after it added); None when what it wrote is no whole call."""
    content = field(native, "content")
    if (
        not isinstance(native, dict)
        or not isinstance(content, str)
        or native.get("stop_type") != "word"
        or native.get("stopping_word") != CALL_END
    ):
        return native  # not cut by the call's end: as it came
    text = content + CALL_END
    rest = forced_rest(text)
    if rest is None:
        return None
    return {**native, "content": text + rest, "stop_type": "eos", "stopping_word": ""}


def _spent_too(native: object, cut: object) -> object:
    """A completion asked again, counting the tokens the first ask generated too."""
    spent = field(cut, "tokens_predicted")
    again = field(native, "tokens_predicted")
    if isinstance(native, dict) and isinstance(spent, int) and isinstance(again, int):
        return {**native, "tokens_predicted": spent + again}
    return native


class LlamaClient:
    """Asks an OpenAI-compatible server (mm-batch's own llama-server) for a chat completion;
    retries transient errors with backoff, and only those. With `grammar`, a turn with tools
    is asked natively, bound by a grammar (see the module's docstring)."""

    def __init__(
        self,
        api_base: str,
        model: str,
        options: Mapping[str, object],
        *,
        masker: Masker,
        timeout: float = DEFAULT_MODEL_TIMEOUT_S,
        retries: Retries = DEFAULT_RETRIES,
        grammar: CallGrammar | None = None,
        slot: int | None = None,
    ) -> None:
        """`model`: the name the server is asked for (as litellm sends it: no provider);
        `slot`: the server's slot every request of this client asks for (None: any)."""
        self.url = urllib.parse.urlsplit(api_base.rstrip("/") + "/chat/completions")
        # llama-server's native endpoints are beside /v1, at the server's root.
        root = api_base.rstrip("/").removesuffix("/v1")
        self.template_url = urllib.parse.urlsplit(root + "/apply-template")
        self.completion_url = urllib.parse.urlsplit(root + "/completion")
        self.grammar = grammar
        self.model = model
        self.options = {
            k: v for k, v in options.items() if k not in OWN_MODEL_OPTIONS and k != GRAMMAR_OPTION
        }
        self.masker = masker  # a server's error may quote a secret: masked where it enters
        self.timeout = timeout
        self.retries = retries
        # llama-server's own field: not litellm's request, so not what a response cache keys.
        self._slot: dict[str, object] = {} if slot is None else {"id_slot": slot}

    def complete(self, messages: Messages, tools: ToolSchemas, timeout: float) -> ModelReply:
        """One model turn, retried on transient errors; nothing outlives `timeout` seconds."""
        started = time.monotonic()
        if tools and self.grammar is not None:
            return self._bound(messages, tools, started + timeout, started)
        chat = {**request_body(self.model, messages, tools, self.options), **self._slot}
        body = json.dumps(chat).encode()
        response, attempt = ask(
            lambda call_timeout: post_json(self.url, body, call_timeout),
            call_timeout=self.timeout,
            deadline=started + timeout,
            pause_key=self.url.geturl(),
            masker=self.masker,
            retries=self.retries,
        )
        return reply_of(response, time.monotonic() - started, attempt, cached=False)

    def prefill(self, messages: Messages, tools: ToolSchemas, timeout: float) -> bool:
        """Have the server compute the prompt of this turn into the client's slot, and
        generate nothing: one try, whether it worked (the turn itself, asked next, says what
        went wrong). The turn then finds its whole prompt in the slot."""
        try:
            if tools and self.grammar is not None:
                prompt = self._rendered(messages, tools, timeout)
                body = {"prompt": prompt, "n_predict": 0, "cache_prompt": True, **self._slot}
                post_json(self.completion_url, json.dumps(body).encode(), timeout)
            else:
                chat = request_body(self.model, messages, tools, self.options)
                chat.pop("max_completion_tokens", None)
                chat.update(max_tokens=0, **self._slot)
                post_json(self.url, json.dumps(chat).encode(), timeout)
        except (OSError, ServerStatusError, MalformedReplyError):
            return False
        return True

    def _rendered(self, messages: Messages, tools: ToolSchemas, timeout: float) -> str:
        """The turn's prompt, rendered by the model's own template with the tools."""
        chat = request_body(self.model, messages, tools, {})
        rendering = json.dumps({"messages": chat["messages"], "tools": tools}).encode()
        prompt = field(post_json(self.template_url, rendering, timeout), "prompt")
        if not isinstance(prompt, str):
            raise MalformedReplyError("a rendered prompt without its text")
        return prompt

    def _bound(
        self, messages: Messages, tools: ToolSchemas, deadline: float, started: float
    ) -> ModelReply:
        """A turn with tools, rendered by the server's template and bound by the grammar; both
        requests are one try, retried together."""
        assert self.grammar is not None
        grammar = self.grammar

        def send(call_timeout: float) -> object:
            prompt = self._rendered(messages, tools, call_timeout)
            body = {**native_body(prompt, tools, grammar, self.options), **self._slot}
            early = {**body, "stop": [*_stops(body.get("stop")), CALL_END]}
            cut = post_json(self.completion_url, json.dumps(early).encode(), call_timeout)
            whole = _call_ended(cut)
            if whole is not None:
                return whole
            # A `}}` that ended no call (inside a string, in an answer): asked again, whole.
            native = post_json(self.completion_url, json.dumps(body).encode(), call_timeout)
            return _spent_too(native, cut)

        response, attempt = ask(
            send,
            call_timeout=self.timeout,
            deadline=deadline,
            pause_key=self.url.geturl(),
            masker=self.masker,
            retries=self.retries,
        )
        completion = chat_completion_of(response)
        return reply_of(completion, time.monotonic() - started, attempt, cached=False)
