"""junit.xml: valid against the common JUnit XSD, and read back by junitparser as CI would."""

from __future__ import annotations

import socket
import xml.etree.ElementTree as ET
from datetime import UTC, datetime
from pathlib import Path

import pytest
from junitparser import Error, Failure, JUnitXml

from mm_batch.testing.fake_openai import (
    HttpFailure,
    by_prompt,
    text,
    tool_call,
)
from tests.helpers import FLAKY_TASKS, OK_AGENT, Cli, Fake, check_report, flaky_script, model_args


def test_report_is_valid_and_readable(
    cli: Cli,
    fake_model: Fake,
    release_example: Path,
    tmp_path: Path,
) -> None:
    nasty = "control \x01\x1b[31m chars <&> ]]> \ud7ff"
    fake = fake_model(
        by_prompt(
            {
                "Release version 1.4.2 to the beta channel.": [
                    tool_call("release", {"version": "1.4.2", "channel": "beta"}),
                    text("Done."),
                ],
                "Publie la version 1.4.2 sur le canal beta.": [
                    tool_call("release", {"version": "1.4.2", "channel": "stable"}),
                    text(nasty),
                ],
            }
        )
    )
    out = tmp_path / "out"
    result = cli(
        "run",
        release_example / "tasks.yaml",
        *model_args(fake),
        "--model",
        "hosted_vllm/other.v2",
        "--out",
        out,
        "--filter",
        "release-*",
    )
    assert result.code == 1
    check_report(out / "junit.xml")
    xml = JUnitXml.fromfile(str(out / "junit.xml"))
    suites = list(xml)
    assert [s.name for s in suites] == ["tasks[hosted_vllm/fake]", "tasks[hosted_vllm/other.v2]"]
    cases = {(c.classname, c.name): c for s in suites for c in s}
    assert set(cases) == {
        ("tasks.hosted_vllm_fake", "release-en"),
        ("tasks.hosted_vllm_fake", "release-fr"),
        ("tasks.hosted_vllm_other_v2", "release-en"),
        ("tasks.hosted_vllm_other_v2", "release-fr"),
    }
    passed = cases[("tasks.hosted_vllm_fake", "release-en")]
    assert passed.is_passed and "[ran] release" in (passed.system_out or "")
    failed = cases[("tasks.hosted_vllm_fake", "release-fr")]
    (failure,) = failed.result
    assert isinstance(failure, Failure)
    assert "refused: release with version=1.4.2, channel=stable" in (failure.message or "")
    assert "expected release" in (failure.text or "")
    properties = {p.name: p.value for p in suites[0].properties()}  # type: ignore[no-untyped-call]
    assert properties["mm_batch_version"]
    assert properties["litellm_version"] == "1.110.2"
    assert any(name.startswith("sha256:") for name in properties)
    # A testcase carries only name, classname and time.
    assert set(passed._elem.attrib) == {"name", "classname", "time"}


def test_errors_are_error_elements(
    cli: Cli,
    release_example: Path,
    tmp_path: Path,
) -> None:
    out = tmp_path / "out"
    cli(
        "run",
        release_example / "tasks.yaml",
        "--model",
        "hosted_vllm/down",
        "--model-option",
        "api_base=http://127.0.0.1:9/v1",
        "--out",
        out,
        "--filter",
        "status-en",
        "--repeat",
        "2",
    )
    check_report(out / "junit.xml")
    cases = [c for s in JUnitXml.fromfile(str(out / "junit.xml")) for c in s]
    assert [c.name for c in cases] == ["status-en#1", "status-en#2"]
    assert all(isinstance(c.result[0], Error) for c in cases)


AGENT = """\
yolo: true
tools:
  - name: publish
    description: Publish the package.
    parameters: {}
    command: ["./publish.sh"]
    env: {PUBLISH_TOKEN: "${PUBLISH_TOKEN}"}
"""

QUOTA = 'echo "quota exceeded for key $PUBLISH_TOKEN" >&2\nexit 1\n'


TASKS = """\
agent: agent.yaml
tasks:
  - id: publish
    prompt: Publish the package.
    expect:
      calls: [{tool: publish}]
      exit_code: 0

  - id: greet
    prompt: Say hello.
"""


@pytest.fixture(autouse=True)
def publish_token(monkeypatch: pytest.MonkeyPatch) -> None:
    """The secret the publish tool gets: the reports must show it masked."""
    monkeypatch.setenv("PUBLISH_TOKEN", "s3cr3t-token-value")


def _project(tmp_path: Path, publish: str = QUOTA) -> Path:
    project = tmp_path / "project"
    project.mkdir()
    (project / "agent.yaml").write_text(AGENT)
    (project / "tasks.yaml").write_text(TASKS)
    script = project / "publish.sh"
    script.write_text("#!/bin/sh\n" + publish)
    script.chmod(0o755)
    return project / "tasks.yaml"


def _testcases(junit: Path) -> dict[str, ET.Element]:
    return {c.get("name", ""): c for c in ET.parse(junit).getroot().iter("testcase")}


def test_a_failure_says_why_first_then_the_checks_the_stderr_and_the_task_line(
    cli: Cli,
    fake_model: Fake,
    tmp_path: Path,
) -> None:
    tasks = _project(tmp_path)
    fake = fake_model(
        by_prompt(
            {
                "Publish the package.": [tool_call("publish", {}), text("Published.")],
                "Say hello.": [text("Hello.")],
            }
        )
    )
    out = tmp_path / "out"
    before = datetime.now(UTC).replace(microsecond=0)  # the timestamp has whole seconds
    result = cli("run", tasks, *model_args(fake), "--out", out, cwd=tmp_path)
    after = datetime.now(UTC)
    assert result.code == 1, result.err
    check_report(out / "junit.xml")
    root = ET.parse(out / "junit.xml").getroot()
    (suite,) = root.iter("testsuite")
    assert suite.get("file") == "project/tasks.yaml"
    assert suite.get("hostname") == socket.gethostname()
    stamp = datetime.fromisoformat(suite.get("timestamp", "").replace("Z", "+00:00"))
    assert before <= stamp <= after  # when this run began
    cases = _testcases(out / "junit.xml")
    failure = cases["publish"].find("failure")
    assert failure is not None and failure.text is not None
    reason = failure.get("message", "")
    assert reason.startswith("exit_code: ")
    assert failure.text.startswith(f"failed: {reason}\n\n")
    assert "[ok] calls[0]: " in failure.text and "[FAILED] exit_code: " in failure.text
    assert failure.text.endswith("task defined at project/tasks.yaml:3")
    out_text = cases["publish"].findtext("system-out") or ""
    assert "-> exit 1\n    stderr:\n      quota exceeded for key ***" in out_text
    assert "s3cr3t" not in (out / "junit.xml").read_text()
    assert cases["greet"].find("failure") is None and cases["greet"].find("error") is None


def test_an_unreachable_model_says_it_could_not_be_judged(
    cli: Cli,
    fake_model: Fake,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    tasks = _project(tmp_path)
    # On GitHub, paths are relative to the checkout, whatever the working directory.
    monkeypatch.setenv("GITHUB_WORKSPACE", str(tasks.parent))
    fake = fake_model(lambda request: HttpFailure(401, "invalid api key"))
    out = tmp_path / "out"
    assert cli("run", tasks, *model_args(fake), "--out", out, "--filter", "greet").code == 3
    check_report(out / "junit.xml")
    assert next(ET.parse(out / "junit.xml").getroot().iter("testsuite")).get("file") == "tasks.yaml"
    error = _testcases(out / "junit.xml")["greet"].find("error")
    assert error is not None and error.text is not None
    assert "401" in error.get("message", "")
    assert error.text.startswith(f"could not be judged: {error.get('message')}")
    assert error.text.endswith("task defined at tasks.yaml:9")


def test_a_long_stderr_shows_its_last_2048_characters(
    cli: Cli,
    fake_model: Fake,
    tmp_path: Path,
) -> None:
    tasks = _project(
        tmp_path, "head -c 5000 /dev/zero | tr '\\0' a >&2\necho the-real-cause >&2\nexit 3\n"
    )
    fake = fake_model(by_prompt({"Publish the package.": [tool_call("publish", {}), text("ok")]}))
    out = tmp_path / "out"
    cli("run", tasks, *model_args(fake), "--out", out, "--filter", "publish")
    shown = _testcases(out / "junit.xml")["publish"].findtext("system-out") or ""
    assert "stderr, last 2048 characters:" in shown
    tail = shown.split("stderr, last 2048 characters:\n", 1)[1].split("\n\nfinal answer:")[0]
    assert tail.endswith("the-real-cause")
    assert 2000 < tail.count("a") < 2048
    assert "-> exit 3" in shown


def test_a_tolerated_failing_repeat_is_a_flaky_pass_and_the_report_agrees_with_exit_0(
    cli: Cli,
    fake_model: Fake,
    tmp_path: Path,
) -> None:
    (tmp_path / "agent.yaml").write_text(OK_AGENT)
    (tmp_path / "tasks.yaml").write_text(FLAKY_TASKS)
    fake = fake_model(flaky_script(2))
    out = tmp_path / "out"
    result = cli("run", tmp_path / "tasks.yaml", *model_args(fake), "--out", out)
    assert result.code == 0, result.err
    check_report(out / "junit.xml")
    root = ET.parse(out / "junit.xml").getroot()
    assert (root.get("tests"), root.get("failures"), root.get("errors")) == ("3", "0", "0")
    cases = _testcases(out / "junit.xml")
    assert [c.find("flakyFailure") is not None for c in cases.values()] == [False, True, False]
    flaky = cases["publish#2"].find("flakyFailure")
    assert flaky is not None and flaky.get("type") == "failed"
    assert flaky.get("message", "").startswith("calls[0]: expected ok")
    assert (flaky.text or "").startswith(f"failed: {flaky.get('message')}")
    assert flaky.findtext("stackTrace") == flaky.text


def test_below_the_pass_rate_every_failing_repeat_is_a_failure(
    cli: Cli,
    fake_model: Fake,
    tmp_path: Path,
) -> None:
    (tmp_path / "agent.yaml").write_text(OK_AGENT)
    (tmp_path / "tasks.yaml").write_text(FLAKY_TASKS.replace("0.6", "0.9"))
    fake = fake_model(flaky_script(2))
    out = tmp_path / "out"
    assert cli("run", tmp_path / "tasks.yaml", *model_args(fake), "--out", out).code == 1
    root = ET.parse(out / "junit.xml").getroot()
    assert root.get("failures") == "1"
    assert not list(root.iter("flakyFailure"))
