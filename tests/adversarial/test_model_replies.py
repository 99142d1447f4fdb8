"""A hostile or broken model cannot crash a run, outlive its deadline, or smuggle in a value.

The client cases drive `LiteLLMClient` through real litellm against the fake server's raw
replies; the end-to-end cases run `mm-batch run` and assert the verdict, the records, the exit
code, that the reports were written, and that no traceback reached the terminal.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime
from pathlib import Path
from typing import Any

import pytest

from mm_batch.config.secrets import NO_SECRETS
from mm_batch.effects.litellm import LiteLLMClient
from mm_batch.effects.model_calls import SHARED_BACKOFF
from mm_batch.run.ports import ModelDeadlineError, ModelError, ModelReply
from mm_batch.testing.fake_openai import (
    FakeOpenAI,
    Finished,
    HttpFailure,
    RawReply,
    Reply,
    Script,
    text,
    tool_call,
)
from tests.helpers import (
    Cli,
    CliResult,
    Fake,
    HeldReply,
    check_report,
    model_args,
    read_calls,
    write,
)

MESSAGES = [{"role": "user", "content": "go"}]


def completion(**fields: Any) -> bytes:
    return json.dumps(
        {"id": "c", "object": "chat.completion", "created": 1, "model": "fake", **fields}
    ).encode()


def choice(message: Any, finish: str = "stop") -> list[dict[str, Any]]:
    return [{"index": 0, "message": message, "finish_reason": finish}]


def calling(function: dict[str, Any]) -> bytes:
    call = {"id": "a", "type": "function", "function": function}
    return completion(choices=choice({"role": "assistant", "content": None, "tool_calls": [call]}))


def client(
    fake: FakeOpenAI, timeout: float = 30.0, sleep: Callable[[float], None] = time.sleep
) -> LiteLLMClient:
    return LiteLLMClient(
        "hosted_vllm/fake",
        {"api_base": fake.url},
        masker=NO_SECRETS,
        timeout=timeout,
        backoff_s=0.01,
        sleep=sleep,
    )


def recording(slept: list[float]) -> Callable[[float], None]:
    """A client's sleep that notes each wait it was asked for, then waits."""

    def sleep(seconds: float) -> None:
        slept.append(seconds)
        time.sleep(seconds)

    return sleep


def complete(fake: Fake, reply: Reply, deadline_s: float = 30.0) -> ModelReply:
    return client(fake(lambda _r: reply)).complete(MESSAGES, [], deadline_s)


# -- the client: every hostile reply is a ModelError with a reason, or a valid ModelReply --------

MALFORMED = {
    "empty choices": completion(choices=[]),
    "choices null": completion(choices=None),
    "no choices": completion(),
    "not JSON": b"<html>upstream says hi</html>",
    "empty body": b"",
    "a JSON list": b"[1, 2]",
    "message null": completion(choices=choice(None)),
    "a choice that is a string": completion(choices=["x"]),
    "content a number": completion(choices=choice({"role": "assistant", "content": 5})),
    "tool_calls a string": completion(
        choices=choice({"role": "assistant", "content": None, "tool_calls": "zz"})
    ),
    "a tool name that is a number": calling({"name": 123, "arguments": "{}"}),
}


@pytest.mark.parametrize("name", list(MALFORMED))
def test_a_malformed_reply_is_a_model_error_with_the_reason_and_no_retry(
    fake_model: Fake, name: str
) -> None:
    fake = fake_model(lambda _r: RawReply(MALFORMED[name]))
    with pytest.raises(ModelError) as caught:
        client(fake).complete(MESSAGES, [], 30)
    assert type(caught.value) is ModelError
    assert str(caught.value).startswith("the model sent a malformed response"), caught.value
    assert "Traceback" not in str(caught.value) and len(str(caught.value)) < 400
    assert len(fake.requests) == 1  # a broken answer is named, not asked again


def test_odd_but_readable_replies_are_valid_replies(fake_model: Fake) -> None:
    no_content = complete(fake_model, RawReply(completion(choices=choice({"role": "assistant"}))))
    assert no_content.text is None and no_content.tool_calls == ()
    nameless = complete(fake_model, RawReply(calling({"arguments": "{}"})))
    assert [(c.name, c.raw_arguments) for c in nameless.tool_calls] == [("", "{}")]
    as_object = complete(fake_model, RawReply(calling({"name": "t", "arguments": {"a": 1}})))
    assert json.loads(as_object.tool_calls[0].raw_arguments or "") == {"a": 1}
    null_args = complete(fake_model, RawReply(calling({"name": "t", "arguments": None})))
    assert null_args.tool_calls[0].raw_arguments in ("", None)


def test_lone_surrogates_are_kept_as_sent(fake_model: Fake) -> None:
    reply = complete(fake_model, tool_call("t", '{"v": "\ud800"}'))
    assert reply.tool_calls[0].raw_arguments == '{"v": "\ud800"}'
    assert complete(fake_model, text("a\udfffb")).text == "a\udfffb"


def test_ten_mib_content_and_finish_reason_length_come_back_as_sent(fake_model: Fake) -> None:
    reply = complete(fake_model, Finished(text("x" * (10 << 20)), "length"))
    assert reply.finish_reason == "length" and len(reply.text or "") == 10 << 20


# -- the client: the task deadline bounds every call, retry and wait ---------------------------


def test_a_slow_model_ends_at_the_deadline_as_a_deadline_error(fake_model: Fake) -> None:
    with HeldReply(text("late")) as late:
        fake = fake_model(late)
        with pytest.raises(ModelDeadlineError):
            client(fake).complete(MESSAGES, [], 1.0)
        assert late.given == 0  # ended at the deadline, not when the model answered


def test_each_try_is_cut_at_the_model_timeout_and_the_retries_give_up(fake_model: Fake) -> None:
    with HeldReply(text("late")) as late:
        fake = fake_model(late)
        with pytest.raises(ModelError) as caught:
            client(fake, timeout=0.3).complete(MESSAGES, [], 20)
        assert type(caught.value) is ModelError  # gave up on its own before the deadline: error
        assert "could not be reached after 3 tries" in str(caught.value)
        assert len(fake.requests) == 3 and late.given == 0  # each try cut, none answered


def test_retry_after_in_seconds_is_waited(fake_model: Fake) -> None:
    replies: Iterator[Reply] = iter([HttpFailure(503, "busy", {"Retry-After": "1"}), text("ok")])
    fake = fake_model(lambda _r: next(replies))
    slept: list[float] = []
    assert client(fake, sleep=recording(slept)).complete(MESSAGES, [], 30).text == "ok"
    assert slept == [1.0]  # the backoff alone would be 0.01 s


def test_retry_after_as_an_http_date_is_waited(
    fake_model: Fake, monkeypatch: pytest.MonkeyPatch
) -> None:
    now = datetime(2026, 5, 1, 12, 0, 0, tzinfo=UTC)  # the client's date, as the test sets it
    when = format_datetime(now + timedelta(seconds=2), usegmt=True)
    replies: Iterator[Reply] = iter(
        [HttpFailure(429, "slow down", {"Retry-After": when}), text("ok")]
    )
    fake = fake_model(lambda _r: next(replies))
    paused: list[float] = []
    pause = SHARED_BACKOFF.pause

    def noted(key: str, seconds: float, asked: str = "") -> None:
        paused.append(seconds)
        pause(key, seconds, asked)

    monkeypatch.setattr(SHARED_BACKOFF, "pause", noted)
    slept: list[float] = []
    asking = client(fake, sleep=recording(slept))
    asking.retries = replace(asking.retries, now=lambda: now)
    assert asking.complete(MESSAGES, [], 30).text == "ok"
    assert paused == [2.0]  # a 429 pauses every run of the model: the date less the client's now
    (waited,) = slept  # this run then waited out what was left of that pause
    assert waited <= paused[0]


@pytest.mark.parametrize("retry_after", ["60", "9" * 5000])
def test_a_wait_past_the_deadline_ends_at_once(fake_model: Fake, retry_after: str) -> None:
    fake = fake_model(lambda _r: HttpFailure(503, "busy", {"Retry-After": retry_after}))
    slept: list[float] = []
    with pytest.raises(ModelDeadlineError):
        client(fake, sleep=recording(slept)).complete(MESSAGES, [], 10)
    assert slept == [] and len(fake.requests) == 1  # no wait begun that the deadline cuts


def test_the_shared_429_pause_past_the_deadline_ends_the_other_runs_at_once(
    fake_model: Fake,
) -> None:
    answers: Iterator[Reply] = iter([HttpFailure(429, "slow down", {"Retry-After": "2"})])
    fake = fake_model(lambda _r: next(answers, text("ok")))
    slept: list[float] = []
    first, second = client(fake), client(fake, sleep=recording(slept))
    replies: list[ModelReply] = []
    waiting = threading.Thread(target=lambda: replies.append(first.complete(MESSAGES, [], 30)))
    waiting.start()
    while not fake.requests:
        time.sleep(0.01)
    time.sleep(0.2)  # the first run now waits out the pause of 2 s, for every run of the model
    with pytest.raises(ModelDeadlineError):
        second.complete(MESSAGES, [], 1)
    assert slept == []  # ended at once: it did not wait out the pause
    waiting.join()
    assert replies[0].text == "ok" and len(fake.requests) == 2  # the second never asked


# -- end to end: verdict, records, exit code, reports, no traceback -----------------------------

AGENT = """
yolo: true
tools:
  - name: mark
    description: Leave a marker.
    parameters:
      v: {type: string}
      n: {type: integer, required: false}
      x: {type: number, required: false}
    command: ["./mark.sh", "{{v}}", "{{n}}", "--x={{x}}"]
"""
MARK = '#!/bin/sh\ntouch "marker"\n'


def project(tmp_path: Path, expect: str = "", timeout: int = 30) -> Path:
    write(tmp_path, "agent.yaml", AGENT)
    write(tmp_path, "mark.sh", MARK).chmod(0o755)
    body = f"""
agent: agent.yaml
tasks:
  - id: t
    prompt: go
    timeout: {timeout}
{expect}"""
    return write(tmp_path, "tasks.yaml", body)


def run(cli: Cli, tasks: Path, fake: FakeOpenAI) -> tuple[CliResult, list[dict[str, Any]]]:
    out = tasks.parent / "out"
    result = cli("run", tasks, *model_args(fake), "--out", out)
    assert "Traceback" not in result.err, result.err
    assert {p.name for p in out.iterdir()} >= {"calls.jsonl", "junit.xml", "summary.json"}
    return result, read_calls(out)


def scripted(*replies: Reply) -> Script:
    def script(request: dict[str, Any]) -> Reply:
        turn = sum(1 for m in request["messages"] if m["role"] == "assistant")
        return replies[min(turn, len(replies) - 1)]

    return script


def test_a_broken_reply_is_an_error_exit_3(cli: Cli, fake_model: Fake, tmp_path: Path) -> None:
    tasks = project(tmp_path)
    result, records = run(cli, tasks, fake_model(scripted(RawReply(completion(choices=[])))))
    assert result.code == 3
    assert records[-1]["status"] == "error"
    assert records[-1]["reason"].startswith("the model sent a malformed response")


@pytest.mark.parametrize("count", [-5, 10**40])
def test_a_hostile_token_count_is_unknown_and_the_folder_stays_valid_and_mergeable(
    cli: Cli, fake_model: Fake, tmp_path: Path, count: object
) -> None:
    usage = {"prompt_tokens": count, "completion_tokens": count, "total_tokens": count}
    answer = completion(choices=choice(text("Done.")), usage=usage)
    tasks = project(tmp_path)
    result, records = run(cli, tasks, fake_model(scripted(RawReply(answer))))
    assert result.code == 0, result.err
    model = [r for r in records if r["kind"] == "model"]
    assert [(r["prompt_tokens"], r["completion_tokens"]) for r in model] == [(None, None)]
    check_report(tmp_path / "out" / "junit.xml")  # summary.json's counts: whole numbers >= 0
    merged = cli("merge", tmp_path / "out", "--out", tmp_path / "merged")
    assert merged.code == 0, merged.err


def test_an_answer_cut_by_the_token_limit_fails_exit_1(
    cli: Cli, fake_model: Fake, tmp_path: Path
) -> None:
    tasks = project(tmp_path)
    result, records = run(cli, tasks, fake_model(scripted(Finished(text("Rel"), "length"))))
    assert result.code == 1
    assert records[-1]["status"] == "failed" and "token limit" in records[-1]["reason"]


def test_a_model_slower_than_the_task_timeout_fails_within_it(
    cli: Cli, fake_model: Fake, tmp_path: Path
) -> None:
    tasks = project(tmp_path, timeout=2)
    with HeldReply(text("late")) as late:
        result, records = run(cli, tasks, fake_model(late))
        assert late.given == 0  # the run ended at its timeout, not when the model answered
    assert result.code == 1
    assert records[-1]["status"] == "failed" and "timeout" in records[-1]["reason"]


def test_retries_past_the_task_timeout_fail_as_a_timeout(
    cli: Cli, fake_model: Fake, tmp_path: Path
) -> None:
    tasks = project(tmp_path, timeout=3)
    fake = fake_model(scripted(HttpFailure(503, "busy", {"Retry-After": "4"})))
    result, records = run(cli, tasks, fake)
    # No wait is begun that the deadline would cut (test_a_wait_past_the_deadline_ends_at_once).
    assert result.code == 1
    assert records[-1]["status"] == "failed" and "timeout" in records[-1]["reason"]
    assert len(fake.requests) == 1


HOSTILE_ARGUMENTS = {
    "a 5000-digit integer": ('{"v": "a", "n": ' + "9" * 5000 + "}", "integer of 5000 digits"),
    "a 4301-digit string integer": ('{"v": "a", "n": "' + "9" * 4301 + '"}', "over 30 digits"),
    "1e400": ('{"v": "a", "x": 1e400}', "finite number"),
    "NaN": ('{"v": "a", "x": NaN}', "finite number"),
    "a lone surrogate": ('{"v": "\\ud800"}', "cannot be encoded"),
    "a raw lone surrogate": ('{"v": "\ud800"}', "cannot be encoded"),
    "a NUL": ('{"v": "a\\u0000b"}', "NUL byte"),
    "an option": ('{"v": "--exec=touch marker"}', "begins with '-'"),
    "a negative number as an option": (
        '{"v": "a", "n": -1}',
        "n: the value \"-1\" begins with '-'",
    ),
    "over 64 KiB": (json.dumps({"v": "x" * (65 * 1024)}), "over 64 KiB"),
    "deep nesting": ('{"v": ' + "[" * 100_000 + "]" * 100_000 + "}", "not valid JSON"),
}


def test_no_value_the_model_sends_runs_or_ends_the_run(
    cli: Cli, fake_model: Fake, tmp_path: Path
) -> None:
    """Every hostile call is answered as invalid; the run goes on and passes."""
    replies = [tool_call("mark", raw) for raw, _ in HOSTILE_ARGUMENTS.values()]
    tasks = project(tmp_path, expect="    expect:\n      no_calls: [mark]")
    result, records = run(cli, tasks, fake_model(scripted(*replies, text("I give up."))))
    assert result.code == 0, records[-1]
    assert not (tmp_path / "marker").exists()
    tools = [r for r in records if r["kind"] == "tool"]
    assert len(tools) == len(HOSTILE_ARGUMENTS)
    for record, (name, (_, reason)) in zip(tools, HOSTILE_ARGUMENTS.items(), strict=True):
        assert record["outcome"] == "invalid" and not record["started"], name
        assert reason in record["reason"], (name, record["reason"])
    assert records[-1]["status"] == "passed"


def test_lone_surrogates_in_the_answer_pass_and_the_log_stays_json(
    cli: Cli, fake_model: Fake, tmp_path: Path
) -> None:
    tasks = project(tmp_path, expect="    expect:\n      answer_contains: [done]")
    result, records = run(cli, tasks, fake_model(scripted(text("done \ud800 \udfff"))))
    assert result.code == 0, records[-1]
    assert records[-1]["status"] == "passed" and "done" in records[-1]["answer"]
