"""Skills and read_skill, built-in bash under consent, hooks, and MCP tools of a real server."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from jsonschema import Draft202012Validator

from mm_batch.run.toolbox import skill_answer
from mm_batch.testing.fake_openai import FakeOpenAI, by_prompt, text, tool_call
from tests.helpers import Cli, CliResult, Fake, model_args, read_calls, write
from tests.mcp_server import catalog_server, project_server, serve


def run(cli: Cli, directory: Path, fake: FakeOpenAI, *extra: str) -> tuple[CliResult, list[Any]]:
    out = directory / "out"
    result = cli("run", directory / "tasks.yaml", *model_args(fake), "--out", out, *extra)
    return result, read_calls(out)


def tools_of(records: list[dict[str, Any]], task: str | None = None) -> list[dict[str, Any]]:
    return [r for r in records if r["kind"] == "tool" and task in (None, r["task"])]


# -- skills -----------------------------------------------------------------------------------


def _skills(directory: Path) -> None:
    write(
        directory,
        "skills/deploy/SKILL.md",
        """
        ---
        name: deploy
        description: How ACME deploys a release.
        keywords: [release, ship]
        ---
        Call the release tool with the version and the beta channel first.
    """,
    )
    write(
        directory,
        "skills/oncall/SKILL.md",
        """
        ---
        name: oncall
        description: Who to page.
        ---
        Page the SRE on duty.
    """,
    )


def test_skills_are_listed_and_read(cli: Cli, fake_model: Fake, tmp_path: Path) -> None:
    _skills(tmp_path)
    write(
        tmp_path,
        "agent.yaml",
        """
        system: You are ACME's assistant.
        builtins: [read_skill]
        skills: [skills/]
    """,
    )
    write(
        tmp_path,
        "tasks.yaml",
        """
        agent: agent.yaml
        tasks:
          - {id: found, prompt: deploy, expect: {calls: [{tool: read_skill, args: {name: deploy}}]}}
          - {id: missing, prompt: unknown, expect: {answer_contains: [sorry]}}
    """,
    )
    fake = fake_model(
        by_prompt(
            {
                "deploy": [tool_call("read_skill", {"name": "deploy"}), text("ok")],
                "unknown": [tool_call("read_skill", {"name": "nope"}), text("sorry")],
            }
        )
    )
    result, records = run(cli, tmp_path, fake)
    assert result.code == 0, result.err
    system = fake.requests[0]["messages"][0]["content"]
    assert system.startswith("You are ACME's assistant.\n\nSkills are instructions, not tools")
    assert "- deploy: How ACME deploys a release. (keywords: release, ship)" in system
    assert "- oncall: Who to page." in system
    found = tools_of(records, "found")[0]
    assert found["outcome"] == "ran" and found["where"] == "skill"
    body = "Call the release tool with the version and the beta channel first."
    served = skill_answer(body, bash=False)  # the body, then what to do with it
    assert any(m.get("content") == served for r in fake.requests for m in r["messages"])
    missing = tools_of(records, "missing")[0]
    assert missing["outcome"] == "invalid" and missing["reason"] == "no skill named 'nope'"


def test_bad_skill_file_names_its_file_and_line(cli: Cli, tmp_path: Path) -> None:
    write(tmp_path, "skills/x/SKILL.md", "---\nname: x\ndescription: yes\ncolour: red\n---\nbody\n")
    write(tmp_path, "agent.yaml", "builtins: [read_skill]\nskills: [skills/, nowhere/]\n")
    write(tmp_path, "tasks.yaml", "agent: agent.yaml\ntasks: [{id: a, prompt: p}]\n")
    result = cli("validate", "tasks.yaml", cwd=tmp_path)
    assert result.code == 2
    assert result.err.splitlines()[:3] == [
        "agent.yaml:2: skills[1]: skills folder not found: nowhere/",
        "skills/x/SKILL.md:3: description: 'yes' is read as a boolean in YAML 1.1; quote it to "
        'mean the string: "yes"',
        "skills/x/SKILL.md:4: colour: unknown key 'colour' (known keys: description, keywords, "
        "name)",
    ]


# -- bash -------------------------------------------------------------------------------------

HOSTILE = ["ls x; rm -rf ~", "ls x && rm -rf ~", "ls x | sh", "ls $(id)", "ls `id`", "ls x\nid"]


def test_bash_runs_under_the_allowlist(cli: Cli, fake_model: Fake, tmp_path: Path) -> None:
    write(
        tmp_path,
        "agent.yaml",
        """
        builtins: [bash]
        allow:
          - bash: "echo exact; echo rule"
          - bash: "ls *"
    """,
    )
    write(
        tmp_path,
        "tasks.yaml",
        """
        agent: agent.yaml
        tasks: [{id: b, prompt: go, expect: {refused: [bash]}}]
    """,
    )
    script = [
        tool_call("bash", {"command": "echo exact; echo rule"}),
        tool_call("bash", {"command": "ls -d ."}),
    ]
    script += [tool_call("bash", {"command": c}) for c in HOSTILE]
    fake = fake_model(by_prompt({"go": [*script, text("done")]}))
    result, records = run(cli, tmp_path, fake)
    assert result.code == 0, result.err
    outcomes = [(r["outcome"], r["rule"]) for r in tools_of(records)]
    assert outcomes[:2] == [("ran", "allow[0]"), ("ran", "allow[1]")]
    assert outcomes[2:] == [("refused", None)] * len(HOSTILE)
    first = tools_of(records)[0]
    assert first["argv"] == ["bash", "-c", "echo exact; echo rule"]
    assert first["stdout"] == "exact\nrule\n"
    assert fake.requests[1]["messages"][-1]["content"].startswith(
        "$ bash -c 'echo exact; echo rule'\nexit code: 0"
    )


# -- hooks ------------------------------------------------------------------------------------


def _hooked(directory: Path, pre: str) -> None:
    write(directory, "hooks/pre.sh", pre)
    write(directory, "hooks/post.sh", "#!/bin/sh\ncat > post-input.json\n")
    for name in ("pre.sh", "post.sh"):
        (directory / "hooks" / name).chmod(0o755)
    write(
        directory,
        "agent.yaml",
        """
        yolo: true
        hooks:
          preToolCall: ["./hooks/pre.sh"]
          postToolCall: ["./hooks/post.sh"]
        tools:
          - name: release
            description: Release.
            parameters: {version: {type: string}}
            command: ["echo", "released", "{{version}}"]
    """,
    )
    write(
        directory,
        "tasks.yaml",
        """
        agent: agent.yaml
        tasks: [{id: h, prompt: go}]
    """,
    )


def test_hooks_see_the_call_and_may_let_it_run(cli: Cli, fake_model: Fake, tmp_path: Path) -> None:
    _hooked(tmp_path, "#!/bin/sh\ncat > pre-input.json\necho fine\n")
    fake = fake_model(by_prompt({"go": [tool_call("release", {"version": "1.4.2"}), text("ok")]}))
    result, records = run(cli, tmp_path, fake)
    assert result.code == 0, result.err
    assert json.loads((tmp_path / "pre-input.json").read_text()) == {
        "tool": "release",
        "arguments": {"version": "1.4.2"},
        "argv": ["echo", "released", "1.4.2"],
    }
    post = json.loads((tmp_path / "post-input.json").read_text())
    assert (post["outcome"], post["exit_code"], post["stdout"]) == ("ran", 0, "released 1.4.2\n")
    record = tools_of(records)[0]
    assert record["outcome"] == "ran"
    assert record["hooks"]["preToolCall"]["exit_code"] == 0
    assert record["hooks"]["preToolCall"]["stdout"] == "fine"
    assert record["hooks"]["postToolCall"]["exit_code"] == 0


@pytest.mark.parametrize(
    ("pre", "reason"),
    [
        ("#!/bin/sh\necho 'no releases on Friday'\nexit 1\n", "no releases on Friday"),
        ("#!/bin/sh\nexit 3\n", "refused by the preToolCall hook (exit 3)"),
        ("#!/bin/sh\nkill -SEGV $$\n", "refused by the preToolCall hook (exit 139)"),
        ("#!/no/such/interpreter\n", "refused by the preToolCall hook: it could not run: "),
    ],
)
def test_a_failing_pre_hook_refuses_the_call(
    pre: str, reason: str, cli: Cli, fake_model: Fake, tmp_path: Path
) -> None:
    _hooked(tmp_path, pre)
    fake = fake_model(by_prompt({"go": [tool_call("release", {"version": "1.4.2"}), text("ok")]}))
    result, records = run(cli, tmp_path, fake)
    assert result.code == 1  # an unexpected refusal fails the task
    record = tools_of(records)[0]
    assert record["outcome"] == "refused" and record["reason"].startswith(reason)
    assert fake.requests[1]["messages"][-1]["content"].startswith(reason)
    assert not (tmp_path / "post-input.json").exists()


# -- MCP --------------------------------------------------------------------------------------


@pytest.fixture
def mcp_url() -> Iterator[tuple[str, Any]]:
    server = project_server()
    with serve(server) as url:
        yield url, server


def _mcp_agent(directory: Path, url: str, extra: str = "") -> None:
    write(
        directory,
        "agent.yaml",
        f"""
        mcp: [{{name: proj, url: "{url}"}}]
        allow:
          - tool: proj_release
            args: {{channel: beta}}
          - tool: proj_scale
          - tool: proj_broken
          - tool: proj_slow
          - tool: proj_status
        tools:
          - name: proj_status
            description: The declared one.
            command: ["echo", "declared"]
        {extra}
    """,
    )


def test_mcp_tools_listed_called_and_judged(
    cli: Cli, fake_model: Fake, tmp_path: Path, mcp_url: tuple[str, Any]
) -> None:
    url, server = mcp_url
    _mcp_agent(tmp_path, url)
    write(
        tmp_path,
        "tasks.yaml",
        """
        agent: agent.yaml
        tasks:
          - id: release
            prompt: release
            expect:
              calls: [{tool: proj_release, args: {version: "1.4.2", channel: beta}, times: 1}]
              refused: [proj_release]
          - {id: scale, prompt: scale, expect: {calls: [{tool: proj_scale, args: {replicas: 3}}]}}
          - {id: broken, prompt: broken}
          - {id: clash, prompt: clash, expect: {calls: [{tool: proj_status}]}}
    """,
    )
    fake = fake_model(
        by_prompt(
            {
                "release": [
                    tool_call("proj_release", {"version": "1.4.2 1.4.2, channel beta"}),
                    tool_call("proj_release", {"version": "1.4.2", "channel": "stable"}),
                    tool_call("proj_release", {"version": "1.4.2", "channel": "beta"}),
                    text("done"),
                ],
                "scale": [tool_call("proj_scale", {"replicas": "3"}), text("done")],
                "broken": [tool_call("proj_broken", {}), text("it failed")],
                "clash": [tool_call("proj_status", {}), text("done")],
            }
        )
    )
    result, records = run(cli, tmp_path, fake, "--jobs", "1")
    assert result.code == 0, result.err
    assert (
        result.err.count(
            "MCP tool proj_status of server proj has the name of a declared "
            "tool; the declared tool wins"
        )
        == 1
    )
    sent = {t["function"]["name"]: t["function"] for t in fake.requests[0]["tools"]}
    assert set(sent) == {"proj_status", "proj_release", "proj_scale", "proj_broken", "proj_slow"}
    assert sent["proj_release"]["description"].startswith(
        "MCP tool from server proj: Release a version of the product to a channel."
    )
    assert sent["proj_status"]["description"].startswith("The declared one.")
    release = tools_of(records, "release")
    assert [r["outcome"] for r in release] == ["invalid", "refused", "ran"]
    assert "You sent: " in fake.requests[1]["messages"][-1]["content"]
    assert release[2]["where"] == "mcp:proj" and release[2]["stdout"] == "released 1.4.2 to beta"
    assert tools_of(records, "scale")[0]["arguments"] == {"replicas": 3, "dry_run": False}
    broken = tools_of(records, "broken")[0]
    assert broken["outcome"] == "error" and "the MCP tool answered an error" in broken["reason"]
    assert tools_of(records, "clash")[0]["stdout"] == "declared\n"
    # Only valid, consented calls reached the server.
    assert server.calls == [
        ("release", {"version": "1.4.2", "channel": "beta"}),
        ("scale", {"replicas": 3, "dry_run": False}),
    ]


def _refs(node: object) -> list[str]:
    if isinstance(node, dict):
        return [v for k, v in node.items() if k == "$ref"] + _refs(list(node.values()))
    return [r for item in node for r in _refs(item)] if isinstance(node, list) else []


def test_an_mcp_array_parameter_is_sent_as_json_schema_and_judged_as_an_array(
    cli: Cli, fake_model: Fake, tmp_path: Path
) -> None:
    """An array parameter reaches the model as JSON Schema (a provider refuses a tool whose
    schema is not), and a task's expected list for it is the array, in order."""
    server: Any = catalog_server()  # with the calls it got (`calls`)
    with serve(server) as url:
        write(tmp_path, "agent.yaml", f'yolo: true\nmcp: [{{name: cat, url: "{url}"}}]\n')
        expect = "{calls: [{tool: cat_tag, args: {names: [web, db]}}]}"
        tasks = "".join(
            f"  - {{id: {name}, prompt: {name}, expect: {expect}}}\n"
            for name in ("tag", "swap", "one", "text", "scalar")
        )
        none = "{calls: [{tool: cat_tag, args: {names: []}}]}"
        tasks += f"  - {{id: none, prompt: none, expect: {none}}}\n"
        write(tmp_path, "tasks.yaml", f"agent: agent.yaml\ntasks:\n{tasks}")
        label = {"key": "tier", "value": "front"}
        fake = fake_model(
            by_prompt(
                {
                    "tag": [
                        tool_call("cat_tag", {"names": ["web", "db"], "labels": [label]}),
                        text("ok"),
                    ],
                    "swap": [tool_call("cat_tag", {"names": ["db", "web"]}), text("ok")],
                    "one": [tool_call("cat_tag", {"names": ["web"]}), text("ok")],
                    # the text of an array, as small models write one: read as the server would
                    "text": [tool_call("cat_tag", {"names": '["web", "db"]'}), text("ok")],
                    # one of the expected values, but no array: answered, never run
                    "scalar": [tool_call("cat_tag", {"names": "web"}), text("ok")],
                    "none": [tool_call("cat_tag", {"names": []}), text("ok")],
                }
            )
        )
        result, records = run(cli, tmp_path, fake, "--jobs", "1")
    assert result.code == 1, result.err
    [tool] = fake.requests[0]["tools"]
    parameters = tool["function"]["parameters"]
    Draft202012Validator.check_schema(parameters)
    names = parameters["properties"]["names"]
    assert (names["type"], names["items"]) == ("array", {"type": "string"})
    assert "- names (array, required)" in tool["function"]["description"]
    assert _refs(parameters) == [], "a reference to $defs the parameters do not hold"
    labels = json.dumps(parameters["properties"]["labels"])
    assert '"key"' in labels and '"value"' in labels  # the nested model, written out
    status = {r["task"]: r["status"] for r in records if r["kind"] == "task"}
    assert status == {
        **{"tag": "passed", "swap": "failed", "one": "failed"},
        **{"text": "passed", "scalar": "failed", "none": "passed"},
    }
    assert server.calls[0] == ("tag", {"names": ["web", "db"], "labels": [label]})
    assert tools_of(records, "text")[0]["arguments"] == {"names": ["web", "db"]}
    [scalar] = tools_of(records, "scalar")
    assert (scalar["outcome"], scalar["started"]) == ("invalid", False)
    assert "expected a JSON array" in scalar["reason"]
    assert [names for _, call in server.calls if (names := call["names"]) == "web"] == []


def test_mcp_timeout_is_answered(
    cli: Cli, fake_model: Fake, tmp_path: Path, mcp_url: tuple[str, Any]
) -> None:
    _mcp_agent(tmp_path, mcp_url[0])
    write(tmp_path, "tasks.yaml", "agent: agent.yaml\ntasks: [{id: s, prompt: slow, timeout: 2}]\n")
    fake = fake_model(by_prompt({"slow": [tool_call("proj_slow", {}), text("done")]}))
    result, records = run(cli, tmp_path, fake)
    assert result.code == 1
    (record,) = tools_of(records)
    assert record["outcome"] == "error" and "did not answer within" in record["reason"]
    assert records[-1]["reason"].startswith("task timeout (2 s) reached: tool proj_slow running")


def test_unreachable_mcp_server_is_a_clear_task_error(
    cli: Cli, fake_model: Fake, tmp_path: Path
) -> None:
    _mcp_agent(tmp_path, "http://127.0.0.1:9/mcp")
    write(tmp_path, "tasks.yaml", "agent: agent.yaml\ntasks: [{id: u, prompt: x}]\n")
    fake = fake_model(by_prompt({}))
    result, records = run(cli, tmp_path, fake)
    assert result.code == 3
    assert records[-1]["status"] == "error"
    assert records[-1]["reason"].startswith(
        "MCP server proj (http://127.0.0.1:9/mcp) is unreachable: "
    )
    assert fake.requests == []


def test_expecting_a_tool_the_server_lacks_is_an_error(
    cli: Cli, fake_model: Fake, tmp_path: Path, mcp_url: tuple[str, Any]
) -> None:
    _mcp_agent(tmp_path, mcp_url[0])
    write(
        tmp_path,
        "tasks.yaml",
        """
        agent: agent.yaml
        tasks: [{id: e, prompt: x, expect: {calls: [{tool: proj_deploy}]}}]
    """,
    )
    result, records = run(cli, tmp_path, fake_model(by_prompt({})))
    assert result.code == 3
    assert records[-1]["reason"] == "expect names proj_deploy, which no MCP server offers"


def test_expecting_an_argument_the_server_does_not_list_is_an_error(
    cli: Cli, fake_model: Fake, tmp_path: Path, mcp_url: tuple[str, Any]
) -> None:
    """A misspelt argument would make a negative check pass for ever: `times: 0` of a call
    that can never match. The model is never asked."""
    _mcp_agent(tmp_path, mcp_url[0])
    write(
        tmp_path,
        "tasks.yaml",
        """
        agent: agent.yaml
        tasks:
          - {id: e, prompt: x, expect: {calls: [{tool: proj_scale, args: {replica: 3}, times: 0}]}}
    """,
    )
    fake = fake_model(by_prompt({"x": [tool_call("proj_scale", {"replicas": 3}), text("done")]}))
    result, records = run(cli, tmp_path, fake)
    assert result.code == 3
    assert records[-1]["reason"] == (
        "expect gives proj_scale replica, which its server does not list "
        "(it lists: dry_run, replicas)"
    )
    assert fake.requests == []
