"""A results folder tampered with after a real run: what `merge`, `--rerun-failed` and `compare`
read back refuses it with exit 2 and a message naming the file and the field's path, never a
traceback, a verdict the folder's own files contradict, or a number JSON cannot hold.
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Callable
from functools import partial
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mm_batch.jsontypes import JsonObject, JsonValue
from mm_batch.report.jsonfields import FieldError, check_tree, parse
from mm_batch.testing.fake_openai import Reply, first_user_message, text, tool_call, turn
from tests.helpers import OK_AGENT, Cli, CliResult, Fake, model_args, write

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
SECRET = "sk-planted-5f0c1e9a"


def _script(request: JsonObject) -> Reply:
    """alpha calls its tool and passes; beta answers without one and fails."""
    if turn(request) or first_user_message(request) == "Do beta.":
        return text("Done.")
    return tool_call("ok", {})


@pytest.fixture
def results(cli: Cli, fake_model: Fake, tmp_path: Path) -> tuple[Path, list[str]]:
    """A results folder as `mm-batch run` wrote it (alpha passed, beta failed), and the
    options that run the same tasks against the same fake model."""
    write(tmp_path, "agent.yaml", OK_AGENT)
    tasks = write(tmp_path, "tasks.yaml", TASKS)
    run = [str(tasks), *model_args(fake_model(_script))]
    out = tmp_path / "results"
    assert cli("run", *run, "--out", out).code == 1
    return out, run


def _lines(folder: Path) -> list[JsonObject]:
    return [json.loads(line) for line in (folder / "calls.jsonl").read_text().splitlines()]


def _write_lines(folder: Path, records: list[JsonObject]) -> None:
    (folder / "calls.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))


def _edit(folder: Path, name: str, change: Callable[[str], str]) -> None:
    path = folder / name
    path.write_text(change(path.read_text(encoding="utf-8")), encoding="utf-8")


def _refused(result: CliResult) -> str:
    assert "Traceback" not in result.err and "internal error" not in result.err, result.err
    assert result.code == 2, result.err
    return result.err


def _merged(cli: Cli, folder: Path) -> CliResult:
    return cli("merge", folder, "--out", folder.parent / "merged")


# -- numbers JSON cannot hold, and keys given twice: one rule for every field ------------------


@pytest.mark.parametrize("number", ["NaN", "Infinity", "-Infinity", "1e999"])
def test_a_number_json_cannot_hold_is_refused_wherever_it_stands(
    cli: Cli, results: tuple[Path, list[str]], number: str
) -> None:
    """provenance takes any scalar, and a tool record's arguments any object: a NaN there was
    copied into the merged summary.json (exit 4 on writing it) or calls.jsonl (which then no
    strict JSON reader takes)."""
    folder, _ = results
    _edit(folder, "summary.json", lambda t: t.replace('"seeds": "none"', f'"seeds": {number}'))
    err = _refused(_merged(cli, folder))
    assert f"{folder / 'summary.json'}: not an mm-batch summary: provenance.seeds: " in err
    assert "expected a finite number" in err

    _edit(folder, "summary.json", lambda t: t.replace(f'"seeds": {number}', '"seeds": "none"'))
    records = _lines(folder)
    tool = next(i for i, r in enumerate(records) if r["kind"] == "tool")
    _edit(
        folder,
        "calls.jsonl",
        lambda t: t.replace('"arguments": {}', f'"arguments": {{"n": [1, {number}]}}', 1),
    )
    err = _refused(_merged(cli, folder))
    said = f"{folder / 'calls.jsonl'}:{tool + 1}: not an mm-batch record: arguments.n[1]: "
    assert said in err and "expected a finite number" in err


def test_a_key_given_twice_is_refused(cli: Cli, results: tuple[Path, list[str]]) -> None:
    """Readers disagree on which of two values of one key counts (Python's json the last,
    others the first): a summary saying `failed` and then `passed` is no summary."""
    folder, _ = results
    twice = '"status": "failed", "status": "passed"'
    _edit(folder, "summary.json", lambda t: t.replace('"status": "failed"', twice, 1))
    err = _refused(_merged(cli, folder))
    assert f'{folder / "summary.json"}: not valid JSON (the key "status" twice in one' in err
    assert _refused(cli("compare", folder, folder, "--out", folder.parent / "c"))


_SCALARS = st.none() | st.booleans() | st.integers() | st.text(max_size=5)


@given(
    tree=st.recursive(
        _SCALARS,
        lambda inner: (
            st.lists(inner, max_size=3)
            | st.dictionaries(st.text("ab_", min_size=1, max_size=3), inner)
        ),
        max_leaves=12,
    ),
    bad=st.sampled_from([math.nan, math.inf, -math.inf]),
    seed=st.randoms(use_true_random=False),
)
def test_a_number_that_is_not_finite_is_named_by_its_path(
    tree: JsonValue, bad: float, seed: random.Random
) -> None:
    """Wherever a NaN or an infinity stands in any JSON tree, the walk names its path."""
    check_tree(tree, 64)  # finite everywhere: accepted
    places: list[tuple[Callable[[JsonValue], None], str]] = []
    stack: list[tuple[JsonValue, str]] = [(tree, "")]
    while stack:
        value, path = stack.pop()
        if isinstance(value, dict):
            for key, child in value.items():
                at = f"{path}.{key}" if path else key
                places.append((partial(value.__setitem__, key), at))
                stack.append((child, at))
        elif isinstance(value, list):
            for i, child in enumerate(value):
                places.append((partial(value.__setitem__, i), f"{path}[{i}]"))
                stack.append((child, f"{path}[{i}]"))
    if not places:
        return
    put, path = seed.choice(places)
    put(bad)
    with pytest.raises(FieldError) as caught:
        check_tree(tree, 64)
    assert str(caught.value).startswith(f"{path}: expected a finite number")


def test_parse_keeps_what_json_holds() -> None:
    assert parse('{"a": [1, 2.5, "x", null, true], "b": {}}') == {
        "a": [1, 2.5, "x", None, True],
        "b": {},
    }
    with pytest.raises(ValueError, match='the key "a" twice'):
        parse('{"a": 1, "b": {"a": 2}, "a": 3}')


# -- one folder's files agree with one another ---------------------------------------------


def _drop_beta(folder: Path) -> None:
    """beta's run taken out of all three files, as if the plan never had it."""
    summary = json.loads((folder / "summary.json").read_text())
    summary["runs"] = [r for r in summary["runs"] if r["task"] != "beta"]
    (folder / "summary.json").write_text(json.dumps(summary))
    _write_lines(folder, [r for r in _lines(folder) if r["task"] != "beta"])
    _edit(
        folder,
        "junit.xml",
        lambda t: (
            t[: t.index('<testcase name="beta"')]
            + t[t.index("</testcase>", t.index('<testcase name="beta"')) + 11 :]
        ),
    )


def test_an_unsharded_folder_missing_a_run_of_its_plan_is_refused(
    cli: Cli, results: tuple[Path, list[str]]
) -> None:
    """The failed run taken out of all three files made an unsharded folder that merged to a
    pass (`as one run it would exit 0`): an unsharded plan's runs are all there."""
    folder, _ = results
    _drop_beta(folder)
    err = _refused(_merged(cli, folder))
    assert f"{folder / 'summary.json'}: not an mm-batch summary: runs: 1 run(s)" in err
    assert "plan.whole_runs says 2" in err


def test_a_task_record_that_contradicts_the_summary_is_refused(
    cli: Cli, results: tuple[Path, list[str]]
) -> None:
    folder, _ = results
    records = _lines(folder)
    index = next(i for i, r in enumerate(records) if r["kind"] == "task" and r["task"] == "beta")
    records[index]["status"] = "passed"
    _write_lines(folder, records)
    err = _refused(_merged(cli, folder))
    assert f"{folder / 'calls.jsonl'}:{index + 1}: " in err
    assert "status: passed, but summary.json says failed" in err


def test_a_second_task_record_of_one_run_is_refused(
    cli: Cli, results: tuple[Path, list[str]]
) -> None:
    folder, _ = results
    records = _lines(folder)
    task = next(r for r in records if r["kind"] == "task")
    _write_lines(folder, [*records, task])
    err = _refused(_merged(cli, folder))
    assert f"{folder / 'calls.jsonl'}:{len(records) + 1}: a second task record of the run" in err


def test_a_record_whose_run_is_not_its_task_model_and_repeat_is_refused(
    cli: Cli, results: tuple[Path, list[str]]
) -> None:
    folder, _ = results
    records = _lines(folder)
    records[0]["task"] = "gamma"
    _write_lines(folder, records)
    err = _refused(_merged(cli, folder))
    assert f"{folder / 'calls.jsonl'}:1: not an mm-batch record: run: expected " in err


def test_a_rerun_keeps_no_pass_that_its_records_contradict(
    cli: Cli, fake_model: Fake, results: tuple[Path, list[str]]
) -> None:
    """beta flipped to a pass in summary.json and junit.xml, its task record still failed: kept
    as it was, it would have made the rerun's folder pass without running it again."""
    folder, run = results
    _edit(
        folder,
        "summary.json",
        lambda t: t.replace('"status": "failed"', '"status": "passed"').replace(
            '"passed": 1', '"passed": 2'
        ),
    )
    junit = (folder / "junit.xml").read_text()
    start = junit.index("<failure")
    _edit(folder, "junit.xml", lambda t: t[:start] + t[t.index("</failure>") + 10 :])
    out = folder.parent / "again"
    result = cli(
        "run", *run, "--model-option", f"api_key={SECRET}", "--rerun-failed", folder, "--out", out
    )
    err = _refused(result)
    assert "status: failed, but summary.json says passed" in err and "nothing ran" in err
    assert SECRET not in result.err + result.out


def test_a_run_listed_twice_is_refused_by_compare_too(
    cli: Cli, results: tuple[Path, list[str]]
) -> None:
    """compare counted a run listed twice twice: a head that copied its passing run hid a drop
    in its pass rate. No summary lists a run twice."""
    folder, _ = results
    summary = json.loads((folder / "summary.json").read_text())
    summary["runs"].append(summary["runs"][0])
    summary["plan"]["whole_runs"] = 3
    (folder / "summary.json").write_text(json.dumps(summary))
    err = _refused(cli("compare", folder, folder, "--out", folder.parent / "c"))
    said = "not an mm-batch summary: runs[2]: alpha[hosted_vllm/fake]#1 again (it is runs[0] too)"
    assert f"{folder / 'summary.json'}: {said}" in err


def test_a_min_pass_rate_its_junit_was_not_written_under_is_refused(
    cli: Cli, results: tuple[Path, list[str]]
) -> None:
    """min_pass_rate set to 0 in summary.json alone merged beta's failure into a flaky pass
    (`as one run it would exit 0`) while the folder's junit.xml showed it failed."""
    folder, _ = results
    _edit(folder, "summary.json", lambda t: t.replace('"min_pass_rate": 1.0', '"min_pass_rate": 0'))
    err = _refused(_merged(cli, folder))
    said = "the test case of beta[hosted_vllm/fake]#1 is not flaky, but min_pass_rate 0 in"
    assert f"{folder / 'junit.xml'}: {said}" in err
