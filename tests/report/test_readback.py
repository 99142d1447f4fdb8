"""A results folder read back into the typed records the run writes (report/readback.py).

Each kind of file round trips (written by the writers, read back equal), every error names the
file and the field's path, and the reader agrees with the shipped schemas: what it refuses for a
wrong value, `summary.schema.json` refuses too.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mm_batch.config.secrets import Masker
from mm_batch.jsontypes import JsonObject, JsonValue
from mm_batch.report.calls_log import JsonlRecorder
from mm_batch.report.junit import junit_part
from mm_batch.report.readback import (
    ResultsError,
    Summary,
    read_junit,
    read_records,
    read_summary,
    summary_of,
)
from mm_batch.report.summary import Coverage, ProvenanceValue, summary_json
from mm_batch.run.records import (
    CallAsked,
    Check,
    HookRecord,
    ModelRecord,
    Record,
    RunRecorder,
    RunResult,
    TaskRecord,
    ToolRecord,
)
from mm_batch.testing.fake_openai import text, tool_call, turn
from tests.helpers import OK_AGENT, Cli, Fake, json_validator, model_args, write

MODEL = "hosted_vllm/fake"
RESULTS = (
    RunResult(f"a[{MODEL}]#1", "a", MODEL, 1, "passed", "", (), 1.25, None, (), line=3, index=0),
    RunResult(
        f"b[{MODEL}]#1",
        "b",
        MODEL,
        1,
        "failed",
        "expected a call of deploy",
        (),
        2.5,
        None,
        (),
        line=7,
        index=1,
        rerun=True,
        prompt_tokens=120,
        completion_tokens=30,
        cost_usd=0.00042,
    ),
)
PROVENANCE: dict[str, ProvenanceValue] = {
    "mm_batch_version": "0.1.0",
    "litellm_version": "1.0",
    "python_version": "3.12.0",
    "models": MODEL,
    "seeds": "none",
    "started_at": "2026-01-01T00:00:00Z",
    "sha256:tasks.yaml": "0" * 64,
}


def _summary_document() -> JsonObject:
    text_ = summary_json("tasks", 0.5, RESULTS, PROVENANCE, 1, Coverage("1/2", 4))
    document: JsonObject = json.loads(text_)
    return document


def _folder(tmp_path: Path, summary: JsonValue) -> Path:
    folder = tmp_path / "results"
    folder.mkdir(exist_ok=True)
    (folder / "summary.json").write_text(json.dumps(summary))
    for name in ("calls.jsonl", "junit.xml"):
        (folder / name).touch()
    return folder


# -- summary.json ----------------------------------------------------------------------------


def test_a_summary_reads_back_as_written() -> None:
    summary = summary_of(_summary_document())
    assert summary == Summary("tasks", PROVENANCE, "1/2", 4, 0.5, RESULTS)


def test_what_an_older_mm_batch_did_not_write_reads_as_unknown() -> None:
    document = _summary_document()
    for key in ("plan", "provenance", "suite", "min_pass_rate", "models", "tasks", "exit_code"):
        del document[key]
    for run in _runs(document):
        for key in ("rerun", "prompt_tokens", "completion_tokens", "cost_usd"):
            del run[key]
    summary = summary_of(document)
    assert (summary.suite, summary.provenance, summary.min_pass_rate) == ("", {}, 1.0)
    assert (summary.shard, summary.whole_runs) == (None, None)
    usage = [(r.rerun, r.prompt_tokens, r.completion_tokens, r.cost_usd) for r in summary.runs]
    assert usage == [(False, None, None, None)] * 2


def _runs(document: JsonObject) -> list[JsonObject]:
    runs = document["runs"]
    assert isinstance(runs, list)
    return [run for run in runs if isinstance(run, dict)]


RANGE = "expected a number from 0 to"
WRONG_FIELDS: list[tuple[tuple[str | int, ...], JsonValue, str]] = [
    (("runs", 1, "duration_s"), "x", f'runs[1].duration_s: {RANGE} 1209600, got "x"'),
    (("runs", 0, "duration_s"), -1, f"runs[0].duration_s: {RANGE} 1209600, got -1"),
    (("runs", 1, "cost_usd"), True, f"runs[1].cost_usd: {RANGE} 1000000000, got true"),
    (("runs", 0, "repeat"), 0, "runs[0].repeat: expected an integer ≥ 1, got 0"),
    (
        ("runs", 0, "status"),
        "skipped",
        'runs[0].status: expected one of passed, failed, error, got "skipped"',
    ),
    (
        ("runs", 0, "run"),
        "other[m]#1",
        f'runs[0].run: expected "a[{MODEL}]#1" (its task, model and repeat), got "other[m]#1"',
    ),
    (("runs", 0, "colour"), "red", "runs[0].colour: no such field"),
    (("plan", "whole_runs"), 1.5, "plan.whole_runs: expected an integer ≥ 0, got 1.5"),
    (("plan", "shard"), 3, "plan.shard: expected a string, got 3"),
    (
        ("provenance", "models"),
        ["a"],
        "provenance.models: expected a string, a number, true, false or null, got a list",
    ),
    (("models", 0, "mean_s"), None, "models[0].mean_s: expected a number ≥ 0, got null"),
    (("tasks", 0, "pass_rate"), 2, f"tasks[0].pass_rate: {RANGE} 1, got 2"),
    (("exit_code",), 5, "exit_code: expected one of 0, 1, 2, 3, 4, 130, got 5"),
    (("min_pass_rate",), "1", f'min_pass_rate: {RANGE} 1, got "1"'),
]


@pytest.mark.parametrize(("where", "value", "said"), WRONG_FIELDS)
def test_a_wrong_field_is_named_by_file_and_path(
    tmp_path: Path, where: tuple[str | int, ...], value: JsonValue, said: str
) -> None:
    document = _summary_document()
    _set(document, where, value)
    folder = _folder(tmp_path, document)
    with pytest.raises(ResultsError) as caught:
        read_summary(folder)
    assert str(caught.value) == f"{folder / 'summary.json'}: not an mm-batch summary: {said}"


def test_a_missing_field_is_named() -> None:
    document = _summary_document()
    del _runs(document)[1]["index"]
    with pytest.raises(ValueError, match=r"^runs\[1\]\.index: missing$"):
        summary_of(document)


def _set(document: JsonObject, where: tuple[str | int, ...], value: JsonValue) -> None:
    """Put `value` at a path of the document: keys of objects, indexes of lists."""
    target: JsonValue = document
    *steps, last = where
    for step in steps:
        if isinstance(target, dict):
            target = target[str(step)]
        elif isinstance(target, list):
            target = target[int(step)]
    if isinstance(target, dict):
        target[str(last)] = value
    elif isinstance(target, list):
        target[int(last)] = value


# Values of the wrong JSON type for each field of a run, and out of range where it has one.
_NOT_A_NUMBER: st.SearchStrategy[JsonValue] = st.one_of(
    st.text(max_size=5), st.booleans(), st.none(), st.just([]), st.just({})
)
_NOT_A_STRING: st.SearchStrategy[JsonValue] = st.one_of(
    st.integers(), st.booleans(), st.none(), st.just([1]), st.just({"a": 1})
)
_NOT_A_STATUS = st.text(max_size=8).filter(lambda s: s not in ("passed", "failed", "error"))
_NOT_WHOLE = st.floats(0.5, 9.5).filter(lambda f: f != int(f))
_WRONG: dict[str, st.SearchStrategy[JsonValue]] = {
    "run": _NOT_A_STRING,
    "task": _NOT_A_STRING,
    "model": _NOT_A_STRING,
    "reason": _NOT_A_STRING,
    "status": st.one_of(_NOT_A_STRING, _NOT_A_STATUS),
    "duration_s": st.one_of(_NOT_A_NUMBER, st.floats(max_value=-0.001)),
    "repeat": st.one_of(_NOT_A_NUMBER, st.integers(max_value=0), _NOT_WHOLE),
    "line": st.one_of(_NOT_A_NUMBER, st.integers(max_value=0)),
    "index": st.one_of(_NOT_A_NUMBER, st.integers(max_value=-1)),
    "rerun": st.one_of(st.integers(), st.text(max_size=3), st.none()),
    "prompt_tokens": st.one_of(st.text(max_size=3), st.booleans(), st.integers(max_value=-1)),
    "cost_usd": st.one_of(st.text(max_size=3), st.booleans(), st.floats(max_value=-0.001)),
}


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), run=st.integers(0, 1), field=st.sampled_from(sorted(_WRONG)))
def test_every_wrong_value_is_refused_by_the_reader_and_the_schema_alike(
    data: st.DataObject, run: int, field: str
) -> None:
    value = data.draw(_WRONG[field], label="value")
    document = _summary_document()
    _set(document, ("runs", run, field), value)
    assert not json_validator("summary.schema.json").is_valid(document)
    with pytest.raises(ValueError) as caught:
        summary_of(document)
    # A wrong task or model shows first as a run id that is not theirs.
    named = "run" if field in ("task", "model") and isinstance(value, str) else field
    assert str(caught.value).startswith(f"runs[{run}].{named}: ")


def test_what_the_writer_writes_the_schema_and_the_reader_take() -> None:
    document = _summary_document()
    assert json_validator("summary.schema.json").is_valid(document)
    summary_of(document)


# -- calls.jsonl -----------------------------------------------------------------------------

ASKED = (CallAsked("deploy", '{"to": "beta"}'),)
RECORDS: tuple[Record, ...] = (
    ModelRecord(0.75, 10, 4, "tool_calls", ASKED, None, 2, 0.001),
    ToolRecord(
        tool="deploy",
        raw_arguments='{"to": "beta"}',
        arguments={"to": "beta", "n": [1, {"x": None}]},
        outcome="ran",
        started=True,
        where="docker:tiny",
        rule="allow[0]",
        argv=("./deploy.sh", "beta"),
        exit_code=0,
        duration_s=0.125,
        stdout="ok\n",
        stderr="",
        stdout_bytes=3,
        stderr_bytes=0,
        hooks={"preToolCall": HookRecord(("./check.sh",), 0, "", "", False, None)},
    ),
    ToolRecord(
        tool="rm",
        raw_arguments="{}",
        arguments=None,
        outcome="refused",
        started=False,
        where="host",
        reason="no allow rule matches",
    ),
    ModelRecord(0.5, None, None, "stop", (), "Done.", 1, cached=True),
    TaskRecord(
        "failed",
        "a check failed",
        (Check("calls", False, "no deploy"),),
        2.5,
        "Done.",
        "Deploy.",
        traceback="here",
    ),
)
RUN = f"t[{MODEL}]#2"


def _write_log(path: Path) -> list[str]:
    recorder = JsonlRecorder(path.open("a", encoding="utf-8"))
    run = RunRecorder(recorder, Masker(()), RUN, "t", MODEL, 2)
    for record in RECORDS:
        run.emit(record)
    recorder.close()
    return path.read_text().splitlines(keepends=True)


def test_calls_read_back_as_written(tmp_path: Path) -> None:
    path = tmp_path / "calls.jsonl"
    lines = _write_log(path)
    read = read_records(path, {RUN})
    assert [r.record for r in read] == list(RECORDS)
    assert {(r.run, r.task, r.model, r.repeat) for r in read} == {(RUN, "t", MODEL, 2)}
    assert [r.seq for r in read] == [1, 2, 3, 4, 5]
    # A copy into another calls.jsonl (merge, --rerun-failed) is the line as written.
    assert [r.line() for r in read] == lines


WRONG_RECORDS: list[tuple[JsonObject, str]] = [
    ({"latency_s": "x"}, 'latency_s: expected a number ≥ 0, got "x"'),
    (
        {"tool_calls": [{"name": 1, "arguments": None}]},
        "tool_calls[0].name: expected a string, got 1",
    ),
    ({"attempts": 0}, "attempts: expected an integer ≥ 1, got 0"),
    ({"kind": "thought"}, 'kind: expected one of tool, model, task, got "thought"'),
    ({"seq": None}, "seq: expected an integer ≥ 1, got null"),
    ({"mood": "fine"}, "mood: no such field"),
]


@pytest.mark.parametrize(("change", "said"), WRONG_RECORDS)
def test_a_wrong_record_is_named_by_file_line_and_path(
    tmp_path: Path, change: JsonObject, said: str
) -> None:
    path = tmp_path / "calls.jsonl"
    lines = _write_log(path)
    record = json.loads(lines[0])
    record.update(change)
    lines[0] = json.dumps(record) + "\n"
    path.write_text("".join(lines))
    with pytest.raises(ResultsError) as caught:
        read_records(path, {RUN})
    assert str(caught.value) == f"{path}:1: not an mm-batch record: {said}"


def test_a_wrong_hook_is_named_by_its_path(tmp_path: Path) -> None:
    path = tmp_path / "calls.jsonl"
    lines = _write_log(path)
    lines[1] = lines[1].replace('"timed_out": false', '"timed_out": "no"')
    path.write_text("".join(lines))
    with pytest.raises(ResultsError) as caught:
        read_records(path, {RUN})
    said = 'hooks.preToolCall.timed_out: expected true or false, got "no"'
    assert str(caught.value) == f"{path}:2: not an mm-batch record: {said}"


# -- a whole folder: summary.json, junit.xml and calls.jsonl, as a run wrote them -------------

TASKS = """\
agent: agent.yaml
tasks:
  - id: alpha
    prompt: Do alpha.
    expect: {calls: [{tool: ok}]}
  - id: beta
    prompt: Do beta.
    expect: {calls: [{tool: ok}]}
"""


def test_a_results_folder_reads_back_whole(cli: Cli, fake_model: Fake, tmp_path: Path) -> None:
    fake = fake_model(lambda request: text("Done.") if turn(request) else tool_call("ok", {}))
    write(tmp_path, "agent.yaml", OK_AGENT)
    tasks = write(tmp_path, "tasks.yaml", TASKS)
    out = tmp_path / "out"
    assert cli("run", tasks, *model_args(fake), "--out", out).code == 0
    summary = read_summary(out)
    assert [(r.task, r.status, r.index) for r in summary.runs] == [
        ("alpha", "passed", 0),
        ("beta", "passed", 1),
    ]
    assert summary.whole_runs == 2 and summary.shard is None
    part = junit_part(read_junit(out / "junit.xml"), summary.runs, summary.suite, out)
    assert [(suite, run.run_id) for suite, run, _ in part.cases] == [
        (f"tasks[{MODEL}]", r.run_id) for r in summary.runs
    ]
    records = read_records(out / "calls.jsonl", {r.run_id for r in summary.runs})
    kinds = [type(r.record).__name__ for r in records if r.run == summary.runs[0].run_id]
    assert kinds == ["ModelRecord", "ToolRecord", "ModelRecord", "TaskRecord"]
    # Copied line by line, the log is the file as the run wrote it.
    assert "".join(r.line() for r in records) == (out / "calls.jsonl").read_text()


def test_a_small_results_file_is_read_without_asking_for_the_whole_limit(tmp_path: Path) -> None:
    """Reading asks for memory as the file comes, not for the 1 GiB a results file may hold:
    under a 512 MiB address space a small file still reads."""
    small = tmp_path / "summary.json"
    small.write_text('{"suite": "tasks"}', encoding="utf-8")
    script = (
        "import resource, sys\n"
        "from mm_batch.report.readback import read_text\n"
        "resource.setrlimit(resource.RLIMIT_AS, (512 * 1024**2, resource.RLIM_INFINITY))\n"
        "print(read_text(__import__('pathlib').Path(sys.argv[1])))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script, str(small)],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == '{"suite": "tasks"}'
