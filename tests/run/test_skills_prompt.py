"""What makes a skill findable: the catalogue says when and how to read each skill, read_skill's
description says when to call it, and a call of a skill's name as a tool is answered with the
exact read_skill call to make instead. Over a scripted model: what the model is sent."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from mm_batch.config.load import load_agent_file
from mm_batch.config.secrets import Masker
from mm_batch.plan import Overrides
from mm_batch.run.ports import ModelReply
from mm_batch.run.toolbox import PreparedCall, Toolbox, skill_answer
from tests.helpers import write
from tests.run.scripted import answer, calls, run_tasks

SKILLS = {
    "release": ("Release a version to a channel.", ["publish", "version"]),
    "status": ("Report the status of a service.", []),
}
TASKS = """
agent: agent.yaml
tasks:
  - {id: t, prompt: Release 1.4.2 to beta., max_turns: 4}
"""


RESCUE = Overrides(models=("scripted/model",), model_options={"recover_text_tool_calls": True})


def skill_agent(tmp_path: Path, builtins: str = "[bash, read_skill]") -> Path:
    write(tmp_path, "agent.yaml", f"system: You are ACME's assistant.\nbuiltins: {builtins}\n")
    with (tmp_path / "agent.yaml").open("a") as agent:
        agent.write("yolo: true\nskills: [skills/]\n")
    for name, (description, keywords) in SKILLS.items():
        front = f"name: {name}\ndescription: {description}\nkeywords: {json.dumps(keywords)}"
        body = f"Run ./{name}.sh with bash."
        write(tmp_path, f"skills/{name}/SKILL.md", f"---\n{front}\n---\n{body}\n")
    return write(tmp_path, "tasks.yaml", TASKS)


def read_skill_calls(text: str) -> list[dict[str, Any]]:
    """Every JSON object in `text` that is a read_skill call, decoded."""
    found = []
    for match in re.finditer(r'\{"name": "read_skill".*?\}\}', text):
        data = json.loads(match.group(0))
        if data.get("name") == "read_skill":
            found.append(data)
    return found


def test_the_catalogue_says_when_to_read_a_skill_and_gives_each_skills_call(
    tmp_path: Path,
) -> None:
    out = run_tasks(skill_agent(tmp_path), [answer("ok")])
    system = out.client.requests[0][0]
    assert system["role"] == "system"
    prompt = system["content"]
    assert prompt.startswith("You are ACME's assistant.\n\n")
    catalogue = prompt.split("\n\n", 1)[1]
    assert "Before you act on a request" in catalogue
    assert "not tools" in catalogue  # the failure it prevents: a skill's name called as a tool
    assert "command to run with bash" in catalogue
    lines = {line.split(":", 1)[0]: line for line in catalogue.splitlines() if line[:2] == "- "}
    assert set(lines) == {"- release", "- status"}
    assert lines["- release"].startswith(
        "- release: Release a version to a channel. (keywords: publish, version)"
    )
    assert lines["- status"].startswith("- status: Report the status of a service.")
    for name in SKILLS:
        # The exact call, as JSON the model can copy, on the skill's own line.
        assert read_skill_calls(lines[f"- {name}"]) == [
            {"name": "read_skill", "arguments": {"name": name}}
        ]


def test_without_bash_the_catalogue_does_not_send_the_model_to_bash(tmp_path: Path) -> None:
    out = run_tasks(skill_agent(tmp_path, "[read_skill]"), [answer("ok")])
    catalogue = out.client.requests[0][0]["content"].split("\n\n", 1)[1]
    assert "Before you act on a request" in catalogue
    assert "bash" not in catalogue


def test_read_skill_says_when_to_call_it(tmp_path: Path) -> None:
    skill_agent(tmp_path)
    box = Toolbox(load_agent_file(tmp_path / "agent.yaml"))
    schemas: list[dict[str, Any]] = box.schemas(Masker([]))  # JSON, read loosely
    (schema,) = [s for s in schemas if s["function"]["name"] == "read_skill"]
    description = schema["function"]["description"]
    assert "before you act" in description.lower()
    assert "name of the skill" in description
    parameter = schema["function"]["parameters"]["properties"]["name"]["description"]
    assert "release, status" in parameter


def test_a_skill_called_as_a_tool_is_answered_with_the_read_skill_call_to_make(
    tmp_path: Path,
) -> None:
    tasks = skill_agent(tmp_path)
    steps = [
        calls(("release", '{"version": "1.4.2", "channel": "beta"}')),
        calls(("read_skill", '{"name": "release"}')),
        answer("done"),
    ]
    out = run_tasks(tasks, steps)
    reply = out.client.requests[1][-1]
    assert reply["role"] == "tool"
    assert reply["content"].startswith("There is no tool named 'release'.")
    assert "'release' is a skill, not a tool" in reply["content"]
    assert read_skill_calls(reply["content"]) == [
        {"name": "read_skill", "arguments": {"name": "release"}}
    ]
    first, second = out.records.of("tool")
    assert first["outcome"] == "invalid" and first["started"] is False
    # Following the answer works: the skill is read.
    assert second["tool"] == "read_skill" and second["outcome"] == "ran"
    assert out.client.requests[2][-1]["content"] == skill_answer(
        "Run ./release.sh with bash.", bash=True
    )


def test_the_skill_is_matched_whatever_the_case_of_the_call(tmp_path: Path) -> None:
    out = run_tasks(skill_agent(tmp_path), [calls(("Status", "{}")), answer("done")])
    content = out.client.requests[1][-1]["content"]
    assert read_skill_calls(content) == [{"name": "read_skill", "arguments": {"name": "status"}}]


def test_an_unknown_tool_that_is_no_skill_gets_no_read_skill_hint(tmp_path: Path) -> None:
    out = run_tasks(skill_agent(tmp_path), [calls(("deploy", "{}")), answer("done")])
    content = out.client.requests[1][-1]["content"]
    assert content == "There is no tool named 'deploy'. The tools are: bash, read_skill."


def test_without_read_skill_a_skill_name_gets_no_hint_to_call_it(tmp_path: Path) -> None:
    out = run_tasks(skill_agent(tmp_path, "[bash]"), [calls(("release", "{}")), answer("done")])
    content = out.client.requests[1][-1]["content"]
    assert content == "There is no tool named 'release'. The tools are: bash."
    assert "Skills" not in out.client.requests[0][0]["content"]


def test_a_call_written_as_text_may_name_a_skill_only_when_read_skill_is_on(
    tmp_path: Path,
) -> None:
    skill_agent(tmp_path)
    box = Toolbox(load_agent_file(tmp_path / "agent.yaml"))
    assert box.text_call_names == ["bash", "read_skill", "release", "status"]
    assert box.names == ["bash", "read_skill"]  # what the model is told exists is unchanged
    skill_agent(tmp_path, "[bash]")
    assert Toolbox(load_agent_file(tmp_path / "agent.yaml")).text_call_names == ["bash"]


def test_the_skill_answer_ends_with_what_to_do_for_this_request() -> None:
    body = "Run ./release.sh VERSION with bash.\n"
    assert skill_answer(body, bash=True) == (
        "Run ./release.sh VERSION with bash.\n\nFor this request: call bash now with its "
        "command, the request's values in place of the words in capitals."
    )
    assert "bash" not in skill_answer("Page the SRE.", bash=False).split("\n\n")[1]


def test_a_skill_written_as_a_text_call_runs_nothing_and_is_answered_with_read_skill(
    tmp_path: Path,
) -> None:
    """Taking a skill's name as a text call must never make it a command: the script a skill
    names, which would leave a marker, does not run; the model is told to read the skill."""
    tasks = skill_agent(tmp_path)
    marker = tmp_path / "RAN"
    script = write(tmp_path, "release.sh", f"#!/bin/sh\ntouch {marker}\n")
    script.chmod(0o755)
    text_call = '{"name": "release", "arguments": {"version": "1.4.2", "channel": "beta"}}'
    steps = [ModelReply(text_call, (), "stop", 1, 1, 0), answer("done")]
    out = run_tasks(tasks, steps, overrides=RESCUE)
    (record,) = out.records.of("tool")
    assert record["tool"] == "release" and record["recovered_from_text"] is True
    assert record["outcome"] == "invalid" and record["started"] is False
    assert not marker.exists()
    reply = out.client.requests[1][-1]
    assert reply["role"] == "user" and "'release' is a skill, not a tool" in reply["content"]
    assert read_skill_calls(reply["content"]) == [
        {"name": "read_skill", "arguments": {"name": "release"}}
    ]
    # Nothing ran: no closing line invites the model to stop there.
    assert reply["content"].endswith("It tells you which command to run with bash.")


def test_a_skill_name_is_never_held_as_a_copied_example(tmp_path: Path) -> None:
    # read_skill lists the skills' names in its parameter's description, as allowed values.
    skill_agent(tmp_path)
    toolbox = Toolbox(load_agent_file(tmp_path / "agent.yaml"))
    prepared = toolbox.prepare(
        "read_skill", '{"name": "status"}', said="Nothing said.", masker=Masker([])
    )
    assert isinstance(prepared, PreparedCall) and prepared.arguments == {"name": "status"}
