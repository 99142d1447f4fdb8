"""mm-batch run, end to end: the CLI, the real litellm path, a scripted fake model, real scripts."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from mm_batch.testing.fake_openai import FakeOpenAI, HttpFailure, by_prompt, text, tool_call
from tests.helpers import (
    GOOD,
    RELEASE_EN,
    STATUS_EN,
    Cli,
    CliResult,
    Fake,
    model_args,
    read_calls,
    received,
    write,
)


def run_release(cli: Cli, example: Path, fake: FakeOpenAI, out: Path, *extra: str) -> CliResult:
    """mm-batch run of the release example on the fake model."""
    return cli("run", example / "tasks.yaml", *model_args(fake), "--out", out, *extra)


def tool_records(out: Path, run_prefix: str = "") -> list[dict[str, Any]]:
    return [r for r in read_calls(out) if r["kind"] == "tool" and r["run"].startswith(run_prefix)]


def test_release_example_passes_and_writes_the_outputs(
    cli: Cli, fake_model: Fake, release_example: Path, tmp_path: Path
) -> None:
    fake = fake_model(by_prompt(GOOD))
    out = tmp_path / "out"
    result = run_release(cli, release_example, fake, out)
    assert result.code == 0, result.err
    assert sorted(p.name for p in out.iterdir()) == [
        "calls.jsonl",
        "junit.xml",
        "report.html",
        "summary.json",
        "summary.md",
    ]
    assert sorted(received(release_example)) == sorted(
        ["release [1.4.2] [--channel=beta]"] * 2
        + ["pkgtest [greet]"] * 2
        + ["status [billing]"] * 2
    )
    records = read_calls(out)
    tasks = [r for r in records if r["kind"] == "task"]
    assert len(tasks) == 6 and {r["status"] for r in tasks} == {"passed"}
    summary = json.loads((out / "summary.json").read_text())
    assert summary["models"][0] == {
        "model": "hosted_vllm/fake",
        "runs": 6,
        "passed": 6,
        "failed": 0,
        "errors": 0,
        "mean_s": summary["models"][0]["mean_s"],
        "prompt_tokens": 10 * len(fake.requests),  # the fake's usage: 10 and 5 tokens a turn
        "completion_tokens": 5 * len(fake.requests),
        "cost_usd": None,  # litellm knows no price for hosted_vllm/fake
    }
    assert "| hosted_vllm/fake | 6/6 |" in (out / "summary.md").read_text()
    # The tools and the closing sentence reached the model through litellm.
    sent = fake.requests[0]["tools"]
    assert [t["function"]["name"] for t in sent] == ["release", "pkgtest", "status"]
    assert sent[0]["function"]["description"].endswith("Give each parameter as its own field.")


def test_record_fields(cli: Cli, fake_model: Fake, release_example: Path, tmp_path: Path) -> None:
    fake = fake_model(by_prompt(GOOD))
    out = tmp_path / "out"
    run_release(cli, release_example, fake, out, "--filter", "release-en")
    records = read_calls(out)
    assert [r["kind"] for r in records] == ["model", "tool", "model", "task"]
    assert [r["seq"] for r in records] == [1, 2, 3, 4]
    for r in records:
        assert r["run"] == "release-en[hosted_vllm/fake]#1"
        assert (r["task"], r["model"], r["repeat"]) == ("release-en", "hosted_vllm/fake", 1)
        assert len(r["ts"]) == 27 and r["ts"].endswith("Z") and r["ts"][19] == "."
    model, tool, _, task = records
    assert {
        "latency_s",
        "prompt_tokens",
        "completion_tokens",
        "finish_reason",
        "tool_calls",
    } <= set(model)
    assert tool["outcome"] == "ran" and tool["rule"] == "allow[0]"
    assert tool["argv"] == ["./release.sh", "1.4.2", "--channel=beta"]
    assert tool["arguments"] == {"version": "1.4.2", "channel": "beta"}
    assert tool["where"] == "host" and tool["exit_code"] == 0
    assert tool["stdout"] == "Released version 1.4.2 (beta channel).\n"
    assert tool["truncated"] is False and tool["recovered_from_text"] is False
    assert task["status"] == "passed"
    assert task["checks"][0]["check"] == "calls[0]" and task["checks"][0]["ok"] is True
    # The model saw the echo and the exit code.
    answer = fake.requests[1]["messages"][-1]
    assert answer["role"] == "tool"
    assert answer["content"].startswith("$ ./release.sh 1.4.2 --channel=beta\nexit code: 0\n")


def test_packed_call_is_quoted_back_and_the_retry_runs(
    cli: Cli, fake_model: Fake, release_example: Path, tmp_path: Path
) -> None:
    packed = '{"version": "1.4.2 1.4.2, channel beta"}'
    fake = fake_model(
        by_prompt(
            {
                RELEASE_EN: [
                    tool_call("release", packed),
                    tool_call("release", {"version": "1.4.2", "channel": "beta"}),
                    text("Released."),
                ]
            }
        )
    )
    out = tmp_path / "out"
    result = run_release(cli, release_example, fake, out, "--filter", "release-en")
    assert result.code == 0, result.err
    first, second = tool_records(out)
    assert (first["outcome"], first["raw_arguments"]) == ("invalid", packed)
    assert second["outcome"] == "ran"
    answer = fake.requests[1]["messages"][-1]["content"]
    assert f"You sent: {packed}" in answer
    assert "channel: missing (required)" in answer
    assert "- channel (string, required, one of: beta, stable)" in answer
    # The model's turn stays in the history as it was.
    assert fake.requests[1]["messages"][-2]["tool_calls"][0]["function"]["arguments"] == packed
    assert received(release_example) == ["release [1.4.2] [--channel=beta]"]


def _typed_agent(directory: Path, printer: Path) -> None:
    write(
        directory,
        "agent.yaml",
        f"""
        yolo: true
        tools:
          - name: scale
            description: Scale a service.
            parameters:
              replicas: {{type: integer}}
              dry_run: {{type: boolean}}
              name: {{type: string, required: false}}
            command: ["{printer}", "{{{{replicas}}}}", "--dry-run={{{{dry_run}}}}", "{{{{name}}}}"]
    """,
    )
    write(
        directory,
        "tasks.yaml",
        """
        agent: agent.yaml
        tasks:
          - id: coerce
            prompt: coerce
            expect:
              calls: [{tool: scale, args: {replicas: 3, dry_run: true}, times: 1}]
          - id: guess
            prompt: guess
            expect:
              calls: [{tool: scale, times: 0}]
          - id: hostile
            prompt: hostile
    """,
    )


def test_lenient_coercion_and_refused_guesses(
    cli: Cli, fake_model: Fake, tmp_path: Path, argv_printer: Path
) -> None:
    _typed_agent(tmp_path, argv_printer)
    fake = fake_model(
        by_prompt(
            {
                "coerce": [tool_call("scale", {"replicas": "3", "dry_run": "true"}), text("ok")],
                "guess": [
                    tool_call("scale", {"replicas": "three", "dry_run": "yes"}),
                    text("gave up"),
                ],
                "hostile": [
                    tool_call(
                        "scale", {"replicas": 1, "dry_run": False, "name": "1.4.2; rm -rf ~"}
                    ),
                    text("ok"),
                ],
            }
        )
    )
    out = tmp_path / "out"
    result = cli("run", tmp_path / "tasks.yaml", *model_args(fake), "--out", out)
    assert result.code == 0, result.err
    coerce = tool_records(out, "coerce")[0]
    assert coerce["arguments"] == {"replicas": 3, "dry_run": True}
    assert json.loads(coerce["stdout"]) == ["3", "--dry-run=true"]
    guess = tool_records(out, "guess")[0]
    assert guess["outcome"] == "invalid"
    assert guess["reason"] == (
        'replicas: expected an integer, got "three"; dry_run: expected true or false, got "yes"'
    )
    hostile = tool_records(out, "hostile")[0]
    assert json.loads(hostile["stdout"]) == ["1", "--dry-run=false", "1.4.2; rm -rf ~"]


def test_refusal_is_answered_recorded_and_fails_the_task(
    cli: Cli, fake_model: Fake, release_example: Path, tmp_path: Path
) -> None:
    fake = fake_model(
        by_prompt(
            {
                RELEASE_EN: [
                    tool_call("release", {"version": "1.4.2", "channel": "stable"}),
                    text("Refused, sorry."),
                ]
            }
        )
    )
    out = tmp_path / "out"
    result = run_release(cli, release_example, fake, out, "--filter", "release-en")
    assert result.code == 1
    (record,) = tool_records(out)
    assert record["outcome"] == "refused" and record["rule"] is None
    reason = "refused: release with version=1.4.2, channel=stable is not on this run's allowlist"
    assert record["reason"] == reason
    assert fake.requests[1]["messages"][-1]["content"] == reason
    assert received(release_example) == []
    # With --yolo the same call runs.
    fake.requests.clear()
    result = run_release(cli, release_example, fake, out, "--filter", "release-en", "--yolo")
    assert tool_records(out)[0]["outcome"] == "ran"
    assert received(release_example) == ["release [1.4.2] [--channel=stable]"]


def test_loop_detector_stops_the_third_identical_call(
    cli: Cli, fake_model: Fake, release_example: Path, tmp_path: Path
) -> None:
    fake = fake_model(by_prompt({STATUS_EN: [tool_call("status", '{"service":"billing"}')] * 5}))
    out = tmp_path / "out"
    result = run_release(cli, release_example, fake, out, "--filter", "status-en")
    assert result.code == 1
    # The 2nd, right after the 1st succeeded, is answered and not run (README: repeats).
    assert [r["outcome"] for r in tool_records(out)] == ["ran", "invalid", "loop"]
    assert len(received(release_example)) == 1
    task = read_calls(out)[-1]
    assert task["status"] == "failed" and task["reason"] == (
        "loop detector: status asked for 3 times in a row with the same arguments"
    )


def test_max_turns_fails_the_run(cli: Cli, fake_model: Fake, tmp_path: Path) -> None:
    write(
        tmp_path,
        "agent.yaml",
        """
        yolo: true
        tools: [{name: ping, description: Ping., command: ["true"],
                 parameters: {n: {type: integer}}}]
    """,
    )
    write(tmp_path, "tasks.yaml", "agent: agent.yaml\ntasks: [{id: t, prompt: go, max_turns: 3}]\n")
    counter = iter(range(100))
    fake = fake_model(lambda _r: tool_call("ping", {"n": next(counter)}))
    out = tmp_path / "out"
    assert cli("run", tmp_path / "tasks.yaml", *model_args(fake), "--out", out).code == 1
    assert len(fake.requests) == 3
    assert read_calls(out)[-1]["reason"] == "max_turns (3) reached without a final answer"


def test_unreachable_model_is_an_error_and_the_batch_goes_on(
    cli: Cli, release_example: Path, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    result = cli(
        "run",
        release_example / "tasks.yaml",
        "--model",
        "hosted_vllm/fake",
        "--model-option",
        "api_base=http://127.0.0.1:9/v1",
        "--out",
        out,
        "--filter",
        "status-*",
    )
    assert result.code == 3
    tasks = [r for r in read_calls(out) if r["kind"] == "task"]
    assert len(tasks) == 2 and {t["status"] for t in tasks} == {"error"}
    assert "could not be reached after 3 tries" in tasks[0]["reason"]
    # No server answered: no HTTP status is made up (litellm's error carries a 500).
    assert "HTTP" not in tasks[0]["reason"].split("tries: ")[1].split(":")[0]
    assert "Traceback" not in result.err


def test_garbage_from_the_model_is_answered(
    cli: Cli, fake_model: Fake, release_example: Path, tmp_path: Path
) -> None:
    fake = fake_model(
        by_prompt(
            {
                STATUS_EN: [
                    tool_call("status", "{{{"),
                    tool_call("no_such_tool", "{}"),
                    tool_call("status", "[]"),
                    tool_call("status", {"service": "billing"}),
                    text("ok"),
                ]
            }
        )
    )
    out = tmp_path / "out"
    result = run_release(cli, release_example, fake, out, "--filter", "status-en")
    assert result.code == 0, result.err
    assert [r["outcome"] for r in tool_records(out)] == ["invalid", "invalid", "invalid", "ran"]
    # Invalid JSON never goes back into the history.
    assert fake.requests[1]["messages"][2]["tool_calls"][0]["function"]["arguments"] == "{}"
    assert "no tool named 'no_such_tool'" in fake.requests[2]["messages"][-1]["content"]


def test_transient_errors_are_retried_without_rerunning_tools(
    cli: Cli, fake_model: Fake, release_example: Path, tmp_path: Path
) -> None:
    failures = iter([HttpFailure(429), HttpFailure(503)])
    script = by_prompt(GOOD)

    def flaky(request: dict[str, Any]) -> Any:
        if len(request["messages"]) > 2:  # fail the second turn twice, after the tool ran
            failure = next(failures, None)
            if failure is not None:
                return failure
        return script(request)

    fake = fake_model(flaky)
    out = tmp_path / "out"
    result = run_release(cli, release_example, fake, out, "--filter", "release-en")
    assert result.code == 0, result.err
    assert len(fake.requests) == 4
    assert received(release_example) == ["release [1.4.2] [--channel=beta]"]
    assert [r["attempts"] for r in read_calls(out) if r["kind"] == "model"] == [1, 3]


def test_client_errors_are_not_retried(
    cli: Cli, fake_model: Fake, release_example: Path, tmp_path: Path
) -> None:
    fake = fake_model(lambda _r: HttpFailure(400, "bad request"))
    out = tmp_path / "out"
    result = run_release(cli, release_example, fake, out, "--filter", "status-en")
    assert result.code == 3
    assert len(fake.requests) == 1
    assert "the model refused the request" in read_calls(out)[-1]["reason"]


def test_secrets_are_masked_everywhere(
    cli: Cli, fake_model: Fake, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    secret = "tok-9f8e7d6c5b4a"
    monkeypatch.setenv("MM_TEST_DEPLOY_TOKEN", secret)
    write(
        tmp_path,
        "agent.yaml",
        """
        yolo: true
        tools:
          - name: leak
            description: Print the token.
            command: ["/bin/sh", "-c", "echo token=$DEPLOY_TOKEN"]
            env: {DEPLOY_TOKEN: "${MM_TEST_DEPLOY_TOKEN}"}
    """,
    )
    write(
        tmp_path,
        "tasks.yaml",
        """
        agent: agent.yaml
        tasks: [{id: t, prompt: leak it, expect: {answer_contains: [nothing]}}]
    """,
    )
    fake = fake_model(by_prompt({"leak it": [tool_call("leak", {}), text(f"it is {secret}")]}))
    out = tmp_path / "out"
    cli("run", tmp_path / "tasks.yaml", *model_args(fake), "--out", out)
    assert fake.requests[1]["messages"][-1]["content"].endswith("token=***")
    for name in ("calls.jsonl", "junit.xml", "summary.md", "summary.json"):
        content = (out / name).read_text()
        assert secret not in content, name
    assert "token=***" in (out / "calls.jsonl").read_text()


def test_check_command_judges_the_run(cli: Cli, fake_model: Fake, tmp_path: Path) -> None:
    write(
        tmp_path,
        "agent.yaml",
        """
        yolo: true
        tools: [{name: touch, description: Create the marker., command: ["touch", "marker"]}]
    """,
    )
    write(
        tmp_path,
        "tasks.yaml",
        """
        agent: agent.yaml
        tasks:
          - {id: made, prompt: make, expect: {check: ["test", "-f", "marker"]}}
          - {id: other, prompt: skip, expect: {check: ["test", "-f", "other-marker"]}}
    """,
    )
    fake = fake_model(by_prompt({"make": [tool_call("touch", {}), text("made")]}))
    out = tmp_path / "out"
    assert cli("run", tmp_path / "tasks.yaml", *model_args(fake), "--out", out).code == 1
    verdicts = {r["task"]: r["status"] for r in read_calls(out) if r["kind"] == "task"}
    assert verdicts == {"made": "passed", "other": "failed"}


def test_repeats_and_min_pass_rate(
    cli: Cli, fake_model: Fake, release_example: Path, tmp_path: Path
) -> None:
    answers = iter([True, False, True, True])

    def alternating(request: dict[str, Any]) -> Any:
        if len(request["messages"]) > 2:
            return text("done")
        good = next(answers)
        return tool_call("status", {"service": "billing" if good else "payroll"})

    fake = fake_model(alternating)
    out = tmp_path / "out"
    args: tuple[str | Path, ...] = (
        "run",
        release_example / "tasks.yaml",
        *model_args(fake),
        "--out",
        out,
        "--filter",
        "status-en",
        "--repeat",
        "4",
        "--jobs",
        "1",
    )
    (release_example / "tasks.yaml").write_text(
        (release_example / "tasks.yaml").read_text().replace("jobs: 2", "min_pass_rate: 0.75")
    )
    assert cli(*args).code == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["tasks"][0]["pass_rate"] == 0.75
    (release_example / "tasks.yaml").write_text(
        (release_example / "tasks.yaml")
        .read_text()
        .replace("min_pass_rate: 0.75", "min_pass_rate: 1.0")
    )
    answers = iter([True, False, True, True])
    assert cli(*args).code == 1


def test_usage_errors_exit_2(cli: Cli, release_example: Path, tmp_path: Path) -> None:
    result = cli("run", release_example / "tasks.yaml", "--filter", "nothing-*", "--model", "x/y")
    assert result.code == 2 and "--filter 'nothing-*' matches no task id" in result.err
    assert cli("run", release_example / "tasks.yaml", "--shard", "3/2").code == 2
    assert cli("run", tmp_path / "missing.yaml").code == 2
    # An --out that cannot hold results is said before anything runs, and creates nothing.
    (tmp_path / "a-file").write_text("")
    out = tmp_path / "a-file" / "results"
    result = cli("run", release_example / "tasks.yaml", "--model", "x/y", "--out", out)
    assert result.code == 2
    assert result.err.endswith(
        f"--out {out}: results cannot be written there (Not a directory); nothing ran\n"
    )
    fresh = tmp_path / "new" / "results"
    assert cli("merge", tmp_path, "--out", fresh).code == 2  # not results: nothing created
    assert not (tmp_path / "new").exists()


def test_output_is_cut_for_the_model_and_bounded_in_the_log(
    cli: Cli, fake_model: Fake, tmp_path: Path
) -> None:
    write(
        tmp_path,
        "agent.yaml",
        """
        yolo: true
        tools:
          - name: chatty
            description: Print a lot.
            command: ["python3", "-c", "import sys; sys.stdout.write('y' * 100000)"]
          - name: flood
            description: Print far too much.
            command:
              - python3
              - -c
              - "import sys\\nfor _ in range(40): sys.stdout.write('z' * 1048576)"
    """,
    )
    write(tmp_path, "tasks.yaml", "agent: agent.yaml\ntasks: [{id: t, prompt: talk}]\n")
    fake = fake_model(
        by_prompt({"talk": [tool_call("chatty", {}), tool_call("flood", {}), text("ok")]})
    )
    out = tmp_path / "out"
    assert cli("run", tmp_path / "tasks.yaml", *model_args(fake), "--out", out).code == 0
    chatty, flood = tool_records(out)
    assert len(chatty["stdout"]) == 100000 and chatty["truncated"] is False
    assert len(flood["stdout"]) == 1048576 and flood["truncated"] is True
    assert flood["stdout_bytes"] == 40 * 1048576
    seen = fake.requests[1]["messages"][-1]["content"]
    assert "\nstdout:\n" + "y" * 16 * 1024 + "\n[..." in seen
    assert seen.endswith(f"[... {100000 - 16384} more bytes of stdout cut; 100000 in all ...]")


def test_mcp_without_its_extra_is_refused_not_ignored(
    cli: Cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The extra cannot be uninstalled from under the test run: its absence is simulated here.
    monkeypatch.setattr("mm_batch.commands.run.mcp_installed", lambda: False)
    write(tmp_path, "agent.yaml", "mcp: [{name: proj, url: 'http://127.0.0.1:9/mcp'}]\n")
    write(tmp_path, "tasks.yaml", "agent: agent.yaml\ntasks: [{id: a, prompt: p}]\n")
    result = cli(
        "run", tmp_path / "tasks.yaml", "--model", "hosted_vllm/x", "--out", tmp_path / "out"
    )
    assert result.code == 2
    assert result.err == (
        "mm-batch: the agent uses MCP servers, which need the mcp extra: "
        "pip install 'mm-batch[mcp]'; nothing ran\n"
    )
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("recover", [True, False])
def test_tool_calls_written_as_text_are_rescued_when_asked(
    recover: bool, cli: Cli, fake_model: Fake, release_example: Path, tmp_path: Path
) -> None:
    written = '```json\n{"name": "status", "arguments": {"service": "billing"}}\n```'
    fake = fake_model(by_prompt({STATUS_EN: [text(written), text("Billing is running.")]}))
    out = tmp_path / "out"
    option = f"recover_text_tool_calls={'true' if recover else 'false'}"
    result = run_release(
        cli, release_example, fake, out, "--filter", "status-en", "--model-option", option
    )
    assert result.code == (0 if recover else 1), result.err
    records = tool_records(out)
    if not recover:
        assert records == [] and received(release_example) == []
        return
    (record,) = records
    assert record["recovered_from_text"] is True and record["outcome"] == "ran"
    assert received(release_example) == ["status [billing]"]
    history = fake.requests[1]["messages"]
    assert history[-2] == {"role": "assistant", "content": written}  # kept as it was
    assert history[-1]["role"] == "user"
    assert history[-1]["content"].startswith("The status call was answered:\n$ ./status.sh")
    # recover_text_tool_calls is mm-batch's own option: never passed on to the model.
    assert "recover_text_tool_calls" not in fake.requests[0]
