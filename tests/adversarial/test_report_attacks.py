"""The CI reports under attack: every string from a model, a command or a results folder is hostile.

A model, a command it runs, or a shard's results folder tries to make a CI reader mis-read the
reports: move mikepenz's annotation, break the XML, smuggle a workflow command into the job's
log, leak a secret past a cut, or make `mm-batch merge` crash (exit 4) or merge what it should
refuse. Every attack here is a plain test: the holes the first attack found are closed, and
these tests keep them closed.
"""

from __future__ import annotations

import json
import os
import re
import resource
import shutil
import subprocess
import sys
import threading
import xml.etree.ElementTree as ET
from collections.abc import Callable, Iterator
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any

import pytest

from mm_batch.cli import main
from mm_batch.report.summary import summary_markdown
from mm_batch.run.records import RunResult
from mm_batch.testing.fake_openai import (
    FakeOpenAI,
    HttpFailure,
    Script,
    by_prompt,
    first_user_message,
    text,
    tool_call,
    turn,
)
from tests.consumers.readers import mikepenz_position
from tests.helpers import (
    FLAKY_TASKS,
    Cli,
    CliResult,
    Fake,
    check_json,
    check_report,
    model_args,
    write,
)
from tests.report.github_markdown import cells, render, seen
from tests.report.pty_session import pty_run, slow_suite

if TYPE_CHECKING:
    from _typeshed import TraceFunction

SECRET = "rt-secret-Z9q8w7e6r5t4"  # 22 characters, none of them in any other text here

# --- what the GitHub Actions runner reads in a line of a step's output ----------------------------

# The commands the runner registers (its command extensions plus stop-commands).
_REGISTERED = {
    "set-env",
    "set-output",
    "save-state",
    "add-mask",
    "add-path",
    "add-matcher",
    "remove-matcher",
    "debug",
    "warning",
    "error",
    "notice",
    "group",
    "endgroup",
    "echo",
    "stop-commands",
}


def runner_lines(output: str) -> list[str]:
    """The runner reads a step's stdout and stderr a line at a time; .NET's ReadLine ends a
    line at CR, LF or CR LF."""
    return re.split(r"\r\n|\r|\n", output)


def runner_command(line: str) -> str | None:
    """The workflow command the runner takes from one line, if any (actions/runner,
    ActionCommand.TryParseV2 then ActionCommand.TryParse, as ActionCommandManager tries them):
    `::name ...::data` at the start once leading blanks are trimmed, else the legacy
    `##[name ...]data` found ANYWHERE in the line (IndexOf, not StartsWith)."""
    stripped = line.lstrip()
    if stripped.startswith("::"):
        end = stripped.find("::", 2)
        if end >= 0:
            name = stripped[2:end].split(" ", 1)[0].lower()
            if name in _REGISTERED:
                return name
    start = line.find("##[")
    if start >= 0:
        close = line.find("]", start)
        if close >= 0:
            name = line[start + 3 : close].split(" ", 1)[0].lower()
            if name in _REGISTERED:
                return name
    return None


def commands_in(output: str) -> list[tuple[str, str]]:
    """Every (command, line) the runner would act on in this output."""
    found = []
    for line in runner_lines(output):
        name = runner_command(line)
        if name is not None:
            found.append((name, line))
    return found


def test_the_runner_model_reads_legacy_commands_anywhere_in_a_line() -> None:
    """The rule the GitHub tests below rely on, on the runner's own shapes."""
    assert runner_command("::error file=a,line=1::x") == "error"
    assert runner_command("   ::add-mask::x") == "add-mask"
    assert runner_command("[1/1] failed t: ##[stop-commands]tok") == "stop-commands"
    assert runner_command("FAILED t - why ##[error file=x.py]boom") == "error"
    assert runner_command("[1/1] failed t: ::error::x") is None  # V2 only at the start
    assert runner_command("##[unknown]x") is None
    assert runner_lines("a\rb\r\nc\nd") == ["a", "b", "c", "d"]


# --- a project whose tool and check print what an attacker chose ----------------------------------

AGENT = """
yolo: true
tools:
  - name: leak
    description: Fails loudly.
    parameters: {}
    command: ["/bin/sh", "./leak.sh"]
    env: {RT_API_TOKEN: "${RT_API_TOKEN}"}
  - name: ok
    description: Works.
    parameters: {}
    command: ["true"]
"""

# What a hostile command prints: a fake task line for mikepenz, XML breakers, escape sequences,
# workflow commands of both syntaxes, invalid UTF-8.
HOSTILE_OUTPUT = (
    r"printf 'task defined at other.yaml:1\n at tasks.yaml:999\n]]> <![CDATA[ &amp; </failure>\n'"
    "\n"
    r"printf '\001\033[2J\033]0;title\007 \377\376 ::error file=evil.py,line=1::x\n'"
    "\n"
    r"printf '::add-mask::abc\n::stop-commands::tok\n##[error]legacy\n'"
)


def _project(directory: Path, leak: str, check: str = "exit 0", tasks: str | None = None) -> Path:
    write(directory, "agent.yaml", AGENT)
    script = write(directory, "leak.sh", leak + "\n")
    script.chmod(0o755)
    default = f"""
        agent: agent.yaml
        tasks:
          - id: hostile
            prompt: Be hostile.
            expect:
              calls: [{{tool: leak}}]
              exit_code: 0
              check: ["/bin/sh", "-c", {json.dumps(check)}]
        """
    return write(directory, "tasks.yaml", tasks or default)


def _item_line(tasks: Path, task: str) -> int:
    lines = tasks.read_text().splitlines()
    return next(n for n, line in enumerate(lines, 1) if line.strip() == f"- id: {task}")


def test_hostile_stderr_check_output_and_answer_cannot_move_the_annotation_or_break_the_xml(
    cli: Cli, fake_model: Fake, tmp_path: Path
) -> None:
    """mikepenz takes the LAST `<file>:<line>` of the failure's text: what a command or a model
    wrote comes before mm-batch's own `task defined at`, whatever it holds."""
    tasks = _project(
        tmp_path,
        HOSTILE_OUTPUT.replace("\n", " >&2\n") + " >&2\nexit 7",
        check=HOSTILE_OUTPUT + "\nexit 1",
    )
    answer = "]]> \ud800 lone \udfff \x1b[2J\x00 task defined at other.yaml:1\n tasks.yaml:999"
    fake = fake_model(
        by_prompt(
            {
                "Be hostile.": [
                    tool_call("leak", {"note": "\ud800 ]]> \x1b"}),  # invalid: listed, not run
                    tool_call("leak", {}),
                    text(answer),
                ]
            }
        )
    )
    out = tmp_path / "out"
    result = cli("run", tasks, *model_args(fake), "--out", out, cwd=tmp_path)
    assert result.code == 1, result.err
    check_report(out / "junit.xml")  # the project's XSD, the shared one where present
    raw = (out / "junit.xml").read_text(encoding="utf-8")
    assert "\x1b" not in raw and "\x00" not in raw and "\x01" not in raw
    (suite,) = ET.parse(out / "junit.xml").getroot().iter("testsuite")
    (case,) = suite.iter("testcase")
    failure = case.find("failure")
    assert failure is not None and failure.text is not None
    # The command's stderr and the check's output are in the text (GitLab and dorny read only it),
    # "]]>" shown as itself, and the task's own line last.
    assert "]]> <![CDATA[ &amp; </failure>" in failure.text
    assert failure.text.count("task defined at other.yaml:1") >= 1
    line = _item_line(tasks, "hostile")
    assert failure.text.endswith(f"task defined at tasks.yaml:{line}")
    assert mikepenz_position(suite.get("file"), None, case.get("classname", ""), failure.text) == (
        "tasks.yaml",
        line,
    )
    assert "]]>" in (case.findtext("system-out") or "")


def test_a_secret_straddling_the_stderr_tail_cut_shows_no_suffix(
    cli: Cli, fake_model: Fake, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The 2,048-character tail starts after masking: cut first, the tail would begin with the
    secret's last 5 characters."""
    leak = (
        "head -c 3000 /dev/zero | tr '\\0' a >&2\n"
        'printf %s "$RT_API_TOKEN" >&2\n'
        "head -c 2043 /dev/zero | tr '\\0' b >&2\n"
        "exit 1"
    )
    tasks = _project(tmp_path, leak)
    fake = fake_model(by_prompt({"Be hostile.": [tool_call("leak", {}), text("done")]}))
    out = tmp_path / "out"
    assert cli("run", tasks, *model_args(fake), "--out", out, cwd=tmp_path).code == 1
    case = next(ET.parse(out / "junit.xml").getroot().iter("testcase"))
    shown = case.findtext("system-out") or ""
    assert "stderr, last 2048 characters:" in shown
    tail = shown.split("stderr, last 2048 characters:\n", 1)[1].split("\n\nfinal answer:")[0]
    assert tail.strip().endswith("b" * 100) and "***" in tail
    for name in ("junit.xml", "calls.jsonl", "summary.json", "summary.md"):
        written = (out / name).read_text(encoding="utf-8")
        leaked = [SECRET[k:] for k in range(len(SECRET) - 3) if SECRET[k:] in written]
        assert not leaked, (name, leaked)


def _flaky_leak_script() -> Script:
    """Every conversation calls `ok` but the 2nd, which calls `leak` (the secret on stderr)."""
    lock = threading.Lock()
    seen = [0]

    def script(request: dict[str, Any]) -> Any:
        if turn(request) > 0:
            return text("Done.")
        with lock:
            seen[0] += 1
            bad = seen[0] == 2
        return tool_call("leak" if bad else "ok", {})

    return script


def test_a_secret_in_a_flaky_failure_stays_masked_in_shards_and_after_merge(
    cli: Cli, fake_model: Fake, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    leak = 'printf "denied for %s\\n" "$RT_API_TOKEN" >&2\nexit 1'
    tasks = _project(tmp_path, leak, tasks=FLAKY_TASKS)
    whole = tmp_path / "whole"
    assert (
        cli("run", tasks, *model_args(fake_model(_flaky_leak_script())), "--out", whole).code == 0
    )
    flaky = list(ET.parse(whole / "junit.xml").getroot().iter("flakyFailure"))
    assert len(flaky) == 1
    assert "denied for ***" in (flaky[0].text or "")
    assert "denied for ***" in (flaky[0].findtext("stackTrace") or "")
    fake = fake_model(_flaky_leak_script())
    shards = [tmp_path / "s1", tmp_path / "s2"]
    for k, shard in enumerate(shards, 1):
        cli("run", tasks, *model_args(fake), "--shard", f"{k}/2", "--out", shard)
    merged = cli("merge", *shards, "--out", tmp_path / "merged")
    assert merged.code == 0, merged.err
    root = ET.parse(tmp_path / "merged" / "junit.xml").getroot()
    assert len(list(root.iter("flakyFailure"))) == 1
    for folder in (whole, *shards, tmp_path / "merged"):
        for path in folder.iterdir():
            assert SECRET not in path.read_text(encoding="utf-8"), path
    assert SECRET not in merged.err + merged.out


def test_a_model_name_cannot_split_the_annotation_or_add_one(
    cli: Cli, fake_model: Fake, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GITHUB_ACTIONS", "true")
    monkeypatch.delenv("GITHUB_STEP_SUMMARY", raising=False)
    tasks = _project(
        tmp_path,
        "exit 0",
        tasks="agent: agent.yaml\ntasks:\n  - id: t\n    prompt: p\n"
        "    expect: {answer_contains: [never]}\n",
    )
    fake = fake_model(lambda request: text("no"))
    model = "hosted_vllm/x,line=99,title=pwn:y\r\n::warning file=evil.py::z"
    result = cli(
        "run",
        tasks,
        "--model",
        model,
        "--model-option",
        f"api_base={fake.url}",
        "--out",
        tmp_path / "out",
        cwd=tmp_path,
    )
    assert result.code == 1, result.err
    assert [name for name, _ in commands_in(result.out + "\n" + result.err)] == ["error"]
    (line,) = result.out.splitlines()
    props = dict(p.split("=", 1) for p in line.split("::")[1].split(" ", 1)[1].split(","))
    assert props["file"] == "tasks.yaml" and props["line"] == "3"
    assert set(props) == {"file", "line", "title"}


def test_a_reason_cannot_smuggle_a_workflow_command_into_the_log(
    cli: Cli, fake_model: Fake, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GITHUB_ACTIONS", "true")
    monkeypatch.delenv("GITHUB_STEP_SUMMARY", raising=False)
    tasks = _project(
        tmp_path,
        "exit 0",
        tasks="""
agent: agent.yaml
tasks:
  - id: by-check
    prompt: check
    expect:
      check: ["/bin/sh", "-c", "echo '##[stop-commands]tok ##[error file=evil.py]x'; exit 1"]
  - id: by-provider
    prompt: provider
""",
    )

    def script(request: dict[str, Any]) -> Any:
        if first_user_message(request) == "provider":
            return HttpFailure(401, "quota ##[add-mask]tasks.yaml ##[warning]y")
        return text("done")

    fake = fake_model(script)
    result = cli("run", tasks, *model_args(fake), "--out", tmp_path / "out", cwd=tmp_path)
    assert result.code == 1, result.err
    assert "##[" in (tmp_path / "out" / "summary.json").read_text()  # the attack reached a reason
    # Only mm-batch's own annotations, one per failing task, are commands to the runner.
    assert commands_in(result.err) == []
    assert [name for name, _ in commands_in(result.out)] == ["error", "error"]


# --- the terminal ---------------------------------------------------------------------------------


def test_on_a_terminal_a_reason_cannot_rewrite_the_screen(fake_model: Fake, tmp_path: Path) -> None:
    """The only escape sequence on a terminal is the live line's own `\\r ESC[2K`."""
    paint = r"printf '\033[1A\033[2K\rPASSED everything\033]0;pwned\007\033[2J\233J'; exit 1"
    tasks = slow_suite(tmp_path, "sleep 0.2", check=paint)
    fake = fake_model(by_prompt({"slow": [tool_call("slow", {}), text("\x1b[2J\rall good")]}))
    code, chunks = pty_run(tasks, fake, tmp_path / "out", "xterm-256color")
    assert code == 1
    output = b"".join(c for _, c in chunks).decode(errors="replace")
    rest = output.replace("\r\x1b[2K", "").replace("\r\n", "\n")
    assert "\x1b" not in rest and "\r" not in rest and "\x9b" not in rest, repr(rest)
    assert "FAILED slow[hosted_vllm/fake]#1 - check: exited 1: \\x1b[1A\\x1b[2K" in rest


# --- summary.md on GitHub -------------------------------------------------------------------------


def _failing(count: int, reason: str) -> list[RunResult]:
    return [
        RunResult(
            f"task-{i:04d}[hosted_vllm/m]#1",
            f"task-{i:04d}",
            "hosted_vllm/m",
            1,
            "error",
            reason,
            (),
            1.0,
            None,
            (),
            3 + i,
            i,
        )
        for i in range(count)
    ]


def test_the_step_summary_of_a_large_failing_matrix_stays_under_githubs_limit() -> None:
    # 250 tasks x 4 models x 5 repeats, the provider down: what litellm says, cut to 300 as
    # mm-batch does.
    reason = (
        'the model could not be reached after 3 tries: litellm.APIConnectionError: {"error": '
        '{"message": "Connection refused [Errno 111] <http://127.0.0.1:9/v1>", "type": '
        '"connection_error", "code": 503}} ' * 3
    )[:300]
    markdown = summary_markdown("tasks", _failing(5000, reason), 1.0)
    assert "0/5000" in markdown
    assert len(markdown.encode("utf-8")) <= 1024 * 1024


# --- secrets where the reports name files ---------------------------------------------------------


def test_a_secret_in_the_tasks_file_path_is_masked_everywhere(
    cli: Cli, fake_model: Fake, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    secret = "acme-deploy-7731"
    project = tmp_path / "ws" / secret
    write(project, "agent.yaml", AGENT)
    write(
        project,
        f"{secret}.yaml",
        "agent: agent.yaml\ntasks:\n  - id: t\n    prompt: p\n    expect: {answer_contains: [x]}\n",
    )
    monkeypatch.setenv("DEPLOY_TOKEN", secret)
    monkeypatch.setenv("GITHUB_ACTIONS", "true")
    monkeypatch.setenv("GITHUB_WORKSPACE", str(tmp_path / "ws"))
    monkeypatch.delenv("GITHUB_STEP_SUMMARY", raising=False)
    fake = fake_model(lambda request: text("no"))
    out = tmp_path / "out"
    result = cli("run", project / f"{secret}.yaml", *model_args(fake), "--out", out, cwd=project)
    assert result.code == 1, result.err
    assert secret not in result.out + result.err
    for path in out.iterdir():
        assert secret not in path.read_text(encoding="utf-8"), path.name


# --- merge given hostile shards -------------------------------------------------------------------

SHARD_TASKS = """
agent: agent.yaml
min_pass_rate: 0.6
tasks:
  - id: publish
    prompt: Publish.
    expect:
      calls: [{tool: ok}]
  - id: second
    prompt: Second.
    expect:
      calls: [{tool: ok}]
"""


@pytest.fixture(scope="module")
def shard_pair(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two shards of one plan (publish fails, second passes), made once; tests copy them."""
    root = tmp_path_factory.mktemp("shards")
    write(root, "agent.yaml", AGENT)
    (root / "leak.sh").write_text("exit 0\n")
    tasks = write(root, "tasks.yaml", SHARD_TASKS)
    script = by_prompt({"Publish.": [text("no")], "Second.": [tool_call("ok", {}), text("ok")]})
    with FakeOpenAI(script) as fake, pytest.MonkeyPatch.context() as env:
        env.setenv("RT_API_TOKEN", SECRET)
        for k in (1, 2):
            main(
                [
                    "run",
                    str(tasks),
                    *model_args(fake),
                    "--shard",
                    f"{k}/2",
                    "--out",
                    str(root / f"s{k}"),
                ]
            )
    return root


@pytest.fixture
def shards(shard_pair: Path, tmp_path: Path) -> tuple[Path, Path]:
    copy = tmp_path / "shards"
    shutil.copytree(shard_pair, copy, symlinks=True)
    return copy / "s1", copy / "s2"


def _edit_summary(shard: Path, change: Callable[[dict[str, Any]], None]) -> None:
    path = shard / "summary.json"
    data = json.loads(path.read_text(encoding="utf-8"))
    change(data)
    path.write_text(json.dumps(data), encoding="utf-8")


def _edit_junit(shard: Path, change: Callable[[str], str]) -> None:
    path = shard / "junit.xml"
    path.write_text(change(path.read_text(encoding="utf-8")), encoding="utf-8")


def _strict_json(text: str) -> Any:
    """JSON as RFC 8259 has it: NaN and Infinity are not numbers a CI tool can read."""

    def refuse(constant: str) -> Any:
        raise ValueError(f"not JSON: {constant}")

    return json.loads(text, parse_constant=refuse)


def test_the_shards_merge_as_they_are(cli: Cli, shards: tuple[Path, Path], tmp_path: Path) -> None:
    """The baseline of the attacks below: untouched, the two shards merge."""
    result = cli("merge", *shards, "--out", tmp_path / "merged")
    assert result.code == 0, result.err
    check_report(tmp_path / "merged" / "junit.xml")


def _merge_refused(cli: Cli, shards: tuple[Path, Path], tmp_path: Path) -> CliResult:
    result = cli("merge", *shards, "--out", tmp_path / "merged")
    assert "Traceback" not in result.err and "internal error" not in result.err, result.err
    assert result.code == 2, result.err
    assert "nothing merged" in result.err
    assert not (tmp_path / "merged").exists()
    return result


def _deep_json(shard: Path) -> None:
    (shard / "summary.json").write_text("[" * 200_000 + "]" * 200_000)


def _deep_calls(shard: Path) -> None:
    with (shard / "calls.jsonl").open("a") as handle:
        handle.write("[" * 200_000 + "]" * 200_000 + "\n")


def _binary_calls(shard: Path) -> None:
    (shard / "calls.jsonl").write_bytes(b'{"run": "\xff\xfe"}\n')


def _deep_junit(shard: Path) -> None:
    _edit_junit(
        shard,
        lambda j: j.replace("<system-out>", "<system-out>" + "<x>" * 100_000 + "</x>" * 100_000, 1),
    )


def _summary(change: Callable[[dict[str, Any]], None]) -> Callable[[Path], None]:
    return lambda shard: _edit_summary(shard, change)


def _set_run(key: str, value: Any) -> Callable[[Path], None]:
    return _summary(lambda d: d["runs"][0].update({key: value}))


@pytest.mark.parametrize(
    "attack",
    [
        pytest.param(_summary(lambda d: d.update(plan=[1])), id="plan-not-an-object"),
        pytest.param(_summary(lambda d: d.update(provenance=None)), id="provenance-null"),
        pytest.param(_set_run("line", "6"), id="line-a-string"),
        pytest.param(_set_run("index", True), id="index-a-boolean"),
        pytest.param(_set_run("status", "skipped"), id="status-unknown"),
        pytest.param(_summary(lambda d: d["plan"].update(shard="0/2")), id="shard-zero"),
        pytest.param(_summary(lambda d: d.update(min_pass_rate="abc")), id="min-pass-rate-a-word"),
        pytest.param(_summary(lambda d: d.update(min_pass_rate=[1])), id="min-pass-rate-a-list"),
        pytest.param(_summary(lambda d: d["plan"].update(whole_runs=[2])), id="whole-runs-a-list"),
        pytest.param(_deep_json, id="summary-nested-200000-deep"),
        pytest.param(_deep_calls, id="calls-line-nested-200000-deep"),
        pytest.param(_binary_calls, id="calls-not-utf8"),
        pytest.param(_deep_junit, id="junit-testcase-nested-100000-deep"),
    ],
)
def test_a_damaged_shard_is_refused_with_exit_2_never_a_traceback(
    cli: Cli, shards: tuple[Path, Path], tmp_path: Path, attack: Callable[[Path], None]
) -> None:
    attack(shards[1])
    _merge_refused(cli, shards, tmp_path)


@pytest.mark.parametrize(
    "attack",
    [
        pytest.param(_set_run("duration_s", float("nan")), id="duration-nan"),
        pytest.param(_set_run("duration_s", float("inf")), id="duration-infinity"),
        pytest.param(_set_run("duration_s", -5.0), id="duration-negative"),
        pytest.param(_set_run("line", -5), id="line-negative"),
        pytest.param(_set_run("index", -1), id="index-negative"),
        pytest.param(_set_run("repeat", 0), id="repeat-zero"),
    ],
)
def test_a_run_out_of_range_is_refused_or_never_written(
    cli: Cli, shards: tuple[Path, Path], tmp_path: Path, attack: Callable[[Path], None]
) -> None:
    attack(shards[1])
    result = cli("merge", *shards, "--out", tmp_path / "merged")
    assert "Traceback" not in result.err, result.err
    if result.code != 2:
        summary = _strict_json((tmp_path / "merged" / "summary.json").read_text())
        check_json("summary.schema.json", summary, "merged summary.json")


class _TooMuchWork(BaseException):
    """Stops a command that ran more lines than allowed: no `except Exception` catches it."""


def _lines_run(cli: Cli, *args: str | Path, limit: int = 10**7) -> tuple[CliResult, int]:
    """`cli(*args)`, and the Python lines it ran: its work, counted the same under any load.
    Past `limit` lines the command is stopped, so that a loop over a huge number fails the
    test at once."""
    count = 0

    def tracer(_frame: FrameType, event: str, _arg: object) -> TraceFunction:
        nonlocal count
        if event == "line":
            count += 1
            if count > limit:
                raise _TooMuchWork(f"over {limit} lines run")
        return tracer

    threading.settrace(tracer)
    sys.settrace(tracer)
    try:
        result = cli(*args)
    finally:
        sys.settrace(None)
        threading.settrace(None)
    return result, count


def _claim(shards: tuple[Path, Path], total: int) -> None:
    for k, shard in enumerate(shards, 1):
        claim = f"{k}/{total}"
        _edit_summary(shard, lambda d: d["plan"].update(shard=claim))  # noqa: B023 (called at once)


def test_a_huge_shard_count_is_refused_in_bounded_time_and_memory(
    cli: Cli, shards: tuple[Path, Path], tmp_path: Path
) -> None:
    """Bounded by construction, not by a stopwatch: a count of shards over 9 digits is refused
    as it is read, and the largest one read runs the same Python lines as three shards do (no
    work grows with the count); the refusal holds under 2 GiB of address space.
    `python benchmarks/hostile_inputs.py` times it."""
    _claim(shards, 3)
    few, few_lines = _lines_run(cli, "merge", *shards, "--out", tmp_path / "m3")
    assert (few.code, few.err.count("shard 3/3 missing")) == (2, 1), few.err
    _claim(shards, 999_999_999)
    # The lines that name five missing shards instead of one, and none for the 999999992 others.
    most, most_lines = _lines_run(
        cli, "merge", *shards, "--out", tmp_path / "m", limit=few_lines + 1000
    )
    assert most.code == 2 and "and 999999992 more missing" in most.err, most.err
    assert most_lines <= few_lines + 200, (few_lines, most_lines)

    # A list of the missing shards would need 8 GiB; 2 GiB, as reading a results file back
    # reserves 1 GiB (its size limit) on the way (under 1 GiB it refuses to read the summary).
    def two_gibibytes() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))

    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "mm_batch",
            "merge",
            *map(str, shards),
            "--out",
            str(tmp_path / "m"),
        ],
        check=False,
        capture_output=True,
        text=True,
        preexec_fn=two_gibibytes,
        timeout=120,  # a give-up: a hang fails here instead of holding the suite
        env={k: v for k, v in os.environ.items() if not k.startswith("GITHUB_")},
    )
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "and 999999992 more missing" in proc.stderr and len(proc.stderr) < 2000
    _claim(shards, 1_000_000_000)
    over = cli("merge", *shards, "--out", tmp_path / "m")
    assert over.code == 2 and "plan.shard is not K/N: '1/1000000000'" in over.err, over.err


def test_billion_laughs_in_a_shard_is_refused_at_once(
    cli: Cli, shards: tuple[Path, Path], tmp_path: Path
) -> None:
    """At once by construction: the parser stops at its limit on entity amplification (expat's
    guard against this very attack), long before the thousand million laughs are expanded."""
    entities = '<!ENTITY a0 "lol">' + "".join(
        f'<!ENTITY a{i} "{f"&a{i - 1};" * 10}">' for i in range(1, 10)
    )
    (shards[1] / "junit.xml").write_text(
        f'<?xml version="1.0"?><!DOCTYPE t [{entities}]>'
        '<testsuites><testsuite name="&a9;"/></testsuites>'
    )
    result = _merge_refused(cli, shards, tmp_path)
    assert f"{shards[1] / 'junit.xml'}: not valid XML" in result.err
    assert "limit on input amplification factor (from DTD and entities) breached" in result.err


def test_an_external_entity_in_a_shard_is_never_read(
    cli: Cli, shards: tuple[Path, Path], tmp_path: Path
) -> None:
    secret_file = tmp_path / "private.txt"
    secret_file.write_text(SECRET)
    _edit_junit(
        shards[1],
        lambda j: j.replace(
            '<?xml version="1.0" encoding="utf-8"?>',
            f'<?xml version="1.0" encoding="utf-8"?><!DOCTYPE t [<!ENTITY x SYSTEM "file://{secret_file}">]>',
        ).replace("<system-out>", "<system-out>&x;", 1),
    )
    result = cli("merge", *shards, "--out", tmp_path / "merged")
    assert "Traceback" not in result.err
    merged = tmp_path / "merged"
    assert result.code == 2 or SECRET not in (merged / "junit.xml").read_text()
    assert SECRET not in result.err + result.out


def test_a_run_claimed_by_two_shards_is_refused(
    cli: Cli, shards: tuple[Path, Path], tmp_path: Path
) -> None:
    first = json.loads((shards[0] / "summary.json").read_text())["runs"][0]
    identity = {k: first[k] for k in ("run", "task", "model", "repeat")}
    _edit_summary(shards[1], lambda d: d["runs"][0].update(identity))
    result = _merge_refused(cli, shards, tmp_path)
    assert f"run {first['run']} is in both {shards[0]} and {shards[1]}" in result.err


def test_a_run_whose_id_disagrees_with_its_task_model_and_repeat_is_refused(
    cli: Cli, shards: tuple[Path, Path], tmp_path: Path
) -> None:
    """The id is what reports and reruns go by, the fields what junit.xml is checked by."""
    first = json.loads((shards[0] / "summary.json").read_text())["runs"][0]["run"]
    _edit_summary(shards[1], lambda d: d["runs"][0].update(run=first))
    result = _merge_refused(cli, shards, tmp_path)
    assert f"{shards[1] / 'summary.json'}: not an mm-batch summary" in result.err


def _case_of(shard: Path) -> str:
    junit = (shard / "junit.xml").read_text(encoding="utf-8")
    match = re.search(r"( *<testcase .*?</testcase>\n)", junit, re.S)
    assert match is not None
    return match.group(1)


def _duplicate_case(shards: tuple[Path, Path]) -> None:
    case = _case_of(shards[0])
    _edit_junit(shards[1], lambda j: j.replace("  </testsuite>", case + "  </testsuite>"))


def _drop_case(shards: tuple[Path, Path]) -> None:
    _edit_junit(shards[1], lambda j: re.sub(r" *<testcase .*?</testcase>\n", "", j, flags=re.S))


def _symlink_to_other_shard(shards: tuple[Path, Path]) -> None:
    (shards[1] / "junit.xml").unlink()
    (shards[1] / "junit.xml").symlink_to(shards[0] / "junit.xml")


def _verdict_flipped(shards: tuple[Path, Path]) -> None:
    """Shard 1's run failed in summary.json; its junit.xml says it passed."""
    _edit_junit(shards[0], lambda j: re.sub(r"<failure .*?</failure>\s*", "", j, flags=re.S))


def _place_attributes(shards: tuple[Path, Path]) -> None:
    """A testcase that names its own file and line: mikepenz prefers them to the testsuite's."""
    _edit_junit(shards[0], lambda j: j.replace("<testcase ", '<testcase file="evil.py" line="1" '))


@pytest.mark.parametrize(
    "attack",
    [
        pytest.param(_duplicate_case, id="a-testcase-twice"),
        pytest.param(_drop_case, id="a-run-without-testcase"),
        pytest.param(_symlink_to_other_shard, id="junit-symlinked-to-the-other-shard"),
        pytest.param(_verdict_flipped, id="junit-verdict-disagrees-with-summary"),
        pytest.param(_place_attributes, id="testcase-with-file-and-line"),
    ],
)
def test_a_merged_junit_agrees_with_the_merged_summary(
    cli: Cli, shards: tuple[Path, Path], tmp_path: Path, attack: Callable[[tuple[Path, Path]], None]
) -> None:
    attack(shards)
    result = cli("merge", *shards, "--out", tmp_path / "merged")
    assert "Traceback" not in result.err, result.err
    if result.code == 2:
        return  # refused, as it may be
    summary = json.loads((tmp_path / "merged" / "summary.json").read_text())
    cases = list(ET.parse(tmp_path / "merged" / "junit.xml").getroot().iter("testcase"))
    assert len(cases) == len(summary["runs"])
    tags = {"failed": "failure", "error": "error"}
    for run, case in zip(summary["runs"], cases, strict=True):
        assert case.get("name") == run["task"]
        assert set(case.attrib) == {"name", "classname", "time"}
        want = tags.get(run["status"])
        assert [c.tag for c in case if c.tag in ("failure", "error")] == ([want] if want else [])
    check_report(tmp_path / "merged" / "junit.xml")


def _hostile_case_name(shards: tuple[Path, Path]) -> None:
    injected = "x&#10;::error file=evil.py,line=1::injected&#13;##[add-mask]tasks"
    _edit_junit(shards[1], lambda j: j.replace('name="second"', f'name="{injected}"'))


def _hostile_run_id(shards: tuple[Path, Path]) -> None:
    run = "r\n::error file=evil.py,line=1::injected\r##[stop-commands]tok \x1b[2J"
    for shard in shards:
        _edit_summary(shard, lambda d: d["runs"][0].update(run=run))


@pytest.mark.parametrize(
    "attack",
    [
        pytest.param(_hostile_case_name, id="testcase-name"),
        pytest.param(_hostile_run_id, id="run-id-in-both-shards"),
    ],
)
def test_a_refusal_quotes_hostile_names_as_one_printable_line(
    cli: Cli, shards: tuple[Path, Path], tmp_path: Path, attack: Callable[[tuple[Path, Path]], None]
) -> None:
    attack(shards)
    result = _merge_refused(cli, shards, tmp_path)
    assert commands_in(result.err) == []
    assert len(result.err.splitlines()) == 1 and "\x1b" not in result.err


@pytest.fixture(autouse=True)
def _no_github(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The suite may itself run on GitHub Actions: only the tests that set it see it."""
    for name in ("GITHUB_ACTIONS", "GITHUB_STEP_SUMMARY", "GITHUB_WORKSPACE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("RT_API_TOKEN", SECRET)  # the leak tool's secret: reports show it masked
    yield


HOSTILE_REASON = (
    "[x](http://e.vil) <details>open</details> ![i](x) www.e.vil a@b.co ##[stop-commands]tok"
)


def test_a_shards_hostile_reason_renders_as_text_in_the_merged_summary(
    cli: Cli, shards: tuple[Path, Path], tmp_path: Path
) -> None:

    _edit_summary(shards[0], lambda d: d["runs"][0].update(reason=HOSTILE_REASON))
    result = cli("merge", *shards, "--out", tmp_path / "merged")
    assert result.code == 0, result.err
    markdown = (tmp_path / "merged" / "summary.md").read_text(encoding="utf-8")
    parsed = cells(markdown)
    assert parsed.tags_in_cells == [], render(markdown)
    assert HOSTILE_REASON in [seen(c) for c in parsed.cells]


def test_a_shards_reason_cannot_smuggle_a_workflow_command_into_the_merge_log(
    cli: Cli, shards: tuple[Path, Path], tmp_path: Path
) -> None:
    _edit_summary(shards[0], lambda d: d["runs"][0].update(reason=HOSTILE_REASON))
    result = cli("merge", *shards, "--out", tmp_path / "merged")
    assert result.code == 0, result.err
    assert "FAILED publish[hosted_vllm/fake]#1 - " in result.err
    assert commands_in(result.out + "\n" + result.err) == []
