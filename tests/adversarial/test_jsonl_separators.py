"""calls.jsonl that mm-batch's own tools can always read back (SPEC 7).

A model or a command may write any text: U+2028, U+2029, U+0085, the \\x1c-\\x1e separators,
\\v, \\f, \\r, a lone surrogate. Written with `ensure_ascii=False` and read with `splitlines()`,
one such character split a record in two, and `merge`, `--rerun-failed` and report.html
refused the whole folder. Now every non-ASCII character is escaped and lines are split on
`\\n` only: a property over any text, then the attack end to end through the real CLI.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mm_batch.config.secrets import Masker
from mm_batch.report.calls_log import JsonlRecorder
from mm_batch.report.html import records_of
from mm_batch.report.readback import read_records
from mm_batch.run.records import (
    CallAsked,
    Check,
    ModelRecord,
    Record,
    Recorder,
    RunRecorder,
    TaskRecord,
    ToolRecord,
)
from mm_batch.testing.fake_openai import by_prompt, text, tool_call
from tests.helpers import Cli, Fake, model_args, write, yolo_agent

# Every character some reader takes for the end of a line (str.splitlines, JavaScript, YAML).
SEPARATORS = "\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029"
HOSTILE = "a\u2028b\u2029c\x85d\x1ce\x1df\x1eg\x0bh\x0ci\rj\nk \ud800 \udfff \U0001f600 é"

ANY_TEXT = st.one_of(
    # all of Unicode, lone surrogates included (JSON escapes them; Python keeps them in str)
    st.text(st.characters(exclude_categories=())),
    st.text(st.sampled_from([*SEPARATORS, "\ud800", "\udc00", "é", "x", '"', "\\"])),
)
RUN = "t[hosted_vllm/fake]#1"


def _records(content: str, stdout: str, stderr: str, argument: str) -> list[Record]:
    raw = json.dumps({"text": argument}, ensure_ascii=False)
    return [
        ModelRecord(0.5, 3, 2, "tool_calls", (CallAsked("echo", raw),), content, 1),
        ToolRecord(
            tool="echo",
            raw_arguments=raw,
            arguments={"text": argument, argument: argument},
            outcome="ran",
            started=True,
            where="host",
            argv=("echo", argument),
            exit_code=0,
            duration_s=0.25,
            stdout=stdout,
            stderr=stderr,
            stdout_bytes=len(stdout),
            stderr_bytes=len(stderr),
        ),
        TaskRecord("passed", content, (Check(argument, True, stdout),), 1.5, content),
    ]


def _log(records: list[Record], recorder: Recorder) -> None:
    run = RunRecorder(recorder, Masker(()), RUN, "t", "hosted_vllm/fake", 1)
    for record in records:
        run.emit(record)


@settings(max_examples=200, deadline=None)
@given(content=ANY_TEXT, stdout=ANY_TEXT, stderr=ANY_TEXT, argument=ANY_TEXT)
def test_any_text_survives_the_log_and_every_reader(
    tmp_path_factory: pytest.TempPathFactory, content: str, stdout: str, stderr: str, argument: str
) -> None:
    records = _records(content, stdout, stderr, argument)
    path = tmp_path_factory.mktemp("log") / "calls.jsonl"
    recorder = JsonlRecorder(path.open("a", encoding="utf-8"))
    _log(records, recorder)
    recorder.close()
    data = path.read_bytes()
    # One record a line for every reader: no byte any of them splits on but the line's end.
    assert data.isascii()
    assert len(data.decode().splitlines()) == len(records)
    # merge and --rerun-failed read the file, report.html the text as written: each record
    # as JSON has it (where a high and a low surrogate side by side are one character).
    expected = [_json_texts(r) for r in records]
    assert [r.record for r in read_records(path, {RUN})] == expected
    assert [r.record for r in records_of(recorder.text())[RUN]] == expected
    # A copy (merge, --rerun-failed) is the line as written.
    assert "".join(r.line() for r in read_records(path, {RUN})) == data.decode()


def _json_text(text: str) -> str:
    return str(json.loads(json.dumps(text)))


def _json_texts(record: Record) -> Record:
    """The record with each text as JSON reads it back: a high and a low surrogate side by
    side are one character."""
    if isinstance(record, ModelRecord):
        calls = tuple(CallAsked(c.name, _json_text(c.arguments or "")) for c in record.tool_calls)
        return replace(record, content=_json_text(record.content or ""), tool_calls=calls)
    if isinstance(record, ToolRecord):
        arguments = json.loads(json.dumps(record.arguments))
        argv = tuple(_json_text(a) for a in record.argv or ())
        return replace(
            record,
            arguments=arguments,
            argv=argv,
            raw_arguments=_json_text(record.raw_arguments or ""),
            stdout=_json_text(record.stdout or ""),
            stderr=_json_text(record.stderr or ""),
        )
    checks = tuple(Check(_json_text(c.name), c.ok, _json_text(c.detail)) for c in record.checks)
    text = _json_text(record.reason)
    return replace(record, reason=text, answer=text, checks=checks)


def test_an_older_log_with_raw_separators_reads_back(tmp_path: Path) -> None:
    """A results folder of an mm-batch that did not escape: JSON allows U+2028 raw in a
    string, so split on `\\n` only, each of its lines is still one record."""
    hostile = HOSTILE.replace("\ud800", "").replace("\udfff", "")
    records = _records(hostile, "x", "y", "z")
    lines: list[str] = []
    _log(records, _ListRecorder(lines))
    path = tmp_path / "calls.jsonl"
    path.write_text("".join(lines))
    assert [r.record for r in read_records(path, {RUN})] == records
    assert [r.record for r in records_of(path.read_text())[RUN]] == records


class _ListRecorder:
    """Writes each record as an mm-batch that did not escape wrote it: raw non-ASCII."""

    def __init__(self, lines: list[str]) -> None:
        self.lines = lines

    def write(self, record: Mapping[str, object]) -> None:
        self.lines.append(json.dumps(record, ensure_ascii=False) + "\n")


# -- end to end: run, merge, --rerun-failed and report.html on a hostile run's results -------

AGENT = yolo_agent(
    "echo",
    "Print a text, on stdout and stderr.",
    '["python3", "./echo.py", "{{text}}"]',
    "{text: {type: string}}",
)
ECHO = "import sys\nprint(sys.argv[1])\nprint(sys.argv[1], file=sys.stderr)\n"
TASKS = """
    agent: agent.yaml
    tasks:
      - id: hostile
        prompt: hostile
        expect:
          answer_contains: ["never said"]
      - id: plain
        prompt: plain
"""


def test_a_hostile_run_merges_reruns_and_reports(
    cli: Cli, fake_model: Fake, tmp_path: Path
) -> None:
    said = HOSTILE.replace("\ud800", "").replace("\udfff", "").replace("\n", " ")
    fake = fake_model(
        by_prompt(
            {
                "hostile": [tool_call("echo", {"text": said}), text(f"answer: {HOSTILE}")],
                "plain": [text("fine")],
            }
        )
    )
    write(tmp_path, "agent.yaml", AGENT)
    write(tmp_path, "echo.py", ECHO)
    tasks = write(tmp_path, "tasks.yaml", TASKS)
    out = tmp_path / "out"
    first = cli("run", tasks, *model_args(fake), "--out", out)
    assert first.code == 1, first.err
    log = (out / "calls.jsonl").read_bytes()
    assert log.isascii() and len(log.decode().splitlines()) == log.count(b"\n")
    tool = next(json.loads(line) for line in log.splitlines() if b'"kind": "tool"' in line)
    assert tool["stdout"] == said + "\n" and tool["stderr"] == said + "\n"

    merged = cli("merge", out, "--out", tmp_path / "merged")
    assert merged.code == 0, merged.err
    assert (tmp_path / "merged" / "calls.jsonl").read_bytes() == log
    page = (tmp_path / "merged" / "report.html").read_text()
    assert "answer: a" in page and "never said" in page

    again = cli("run", tasks, *model_args(fake), "--out", tmp_path / "again", "--rerun-failed", out)
    assert again.code == 1, again.err
    records = [
        json.loads(line)
        for line in (tmp_path / "again" / "calls.jsonl").read_text().split("\n")
        if line
    ]
    finals = {r["task"]: r for r in records if r["kind"] == "task"}
    assert finals["hostile"]["rerun"] is True and finals["plain"]["status"] == "passed"
    assert "answer: a" in (tmp_path / "again" / "report.html").read_text()
