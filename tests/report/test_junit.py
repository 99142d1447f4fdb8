"""junit.xml: valid against the common JUnit XSD, and read back by junitparser as CI would."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from junitparser import Error, Failure, JUnitXml

from mm_batch.testing.fake_openai import FakeOpenAI, Script, by_prompt, text, tool_call
from tests.conftest import CliResult, check_report, model_args


def test_report_is_valid_and_readable(
    cli: Callable[..., CliResult],
    fake_model: Callable[[Script], FakeOpenAI],
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
    cli: Callable[..., CliResult],
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
