"""`mm-batch compare`: the Fisher exact test, and regressions told from noise end to end."""

from __future__ import annotations

import json
import math
from fractions import Fraction
from pathlib import Path
from typing import Any

import cmarkgfm
import pytest
from hypothesis import given
from hypothesis import strategies as st

from mm_batch.report.compare import compare, compare_markdown, fisher_drop_p
from mm_batch.report.readback import Summary
from mm_batch.run.records import RunResult, Status
from mm_batch.testing.fake_openai import (
    FakeOpenAI,
    Script,
    first_user_message,
    text,
    tool_call,
    turn,
)
from tests.helpers import OK_AGENT, Cli, Fake, model_args


@pytest.mark.parametrize(
    ("base", "head", "expected"),
    [
        # Fisher's lady tasting tea: 3 of 4 right against 1 of 4; R's fisher.test gives 0.2429.
        ((3, 4), (1, 4), Fraction(17, 70)),
        # Every run passed, then none did: only the most extreme table, 1 / C(10, 5).
        ((5, 5), (0, 5), Fraction(1, 252)),
        # 10/10 then 5/10: the one table with 5 passes left, C(15,5) C(5,5) / C(20,10).
        ((10, 10), (5, 10), Fraction(3003, 184756)),
        # 3/3 then 2/3: half of all tables with these margins have 2 passes or fewer.
        ((3, 3), (2, 3), Fraction(1, 2)),
        # One run a side can never show a regression at 0.05.
        ((1, 1), (0, 1), Fraction(1, 2)),
        # Nothing lower than what was seen, whatever the margins: the tail is everything.
        ((0, 4), (4, 4), Fraction(1)),
    ],
)
def test_the_one_sided_p_value_matches_known_tables(
    base: tuple[int, int], head: tuple[int, int], expected: Fraction
) -> None:
    assert fisher_drop_p(*base, *head) == pytest.approx(float(expected), rel=1e-12)


@st.composite
def tables(draw: st.DrawFn) -> tuple[int, int, int, int]:
    base_runs = draw(st.integers(1, 40))
    head_runs = draw(st.integers(1, 40))
    return (
        draw(st.integers(0, base_runs)),
        base_runs,
        draw(st.integers(0, head_runs)),
        head_runs,
    )


@given(tables())
def test_the_p_value_is_the_cumulative_hypergeometric_distribution(
    table: tuple[int, int, int, int],
) -> None:
    base_passed, base_runs, head_passed, head_runs = table
    p = fisher_drop_p(*table)
    assert 0 < p <= 1
    # All of HEAD's runs passing is as high as HEAD can go: the whole distribution.
    assert fisher_drop_p(base_passed, base_runs, head_runs, head_runs) == pytest.approx(1.0)
    if head_passed > 0 and base_passed < base_runs:
        # One pass moved from HEAD to BASE keeps the margins: the two p-values differ by
        # exactly the probability of this table.
        passes = base_passed + head_passed
        fails = base_runs + head_runs - passes
        point = Fraction(
            math.comb(passes, head_passed) * math.comb(fails, head_runs - head_passed),
            math.comb(base_runs + head_runs, head_runs),
        )
        lower = fisher_drop_p(base_passed + 1, base_runs, head_passed - 1, head_runs)
        assert p - lower == pytest.approx(float(point), abs=1e-12)


def test_impossible_tables_are_refused() -> None:
    with pytest.raises(ValueError):
        fisher_drop_p(4, 3, 0, 3)


_STATUS: dict[str, Status] = {"passed": "passed", "failed": "failed", "error": "error"}


def _summary(runs: list[tuple[str, str, str]], **provenance: str) -> Summary:
    results = tuple(
        RunResult(f"{t}[{m}]#{i}", t, m, i, _STATUS[s], "", (), 1.0, None, (), line=1, index=i)
        for i, (t, m, s) in enumerate(runs, 1)
    )
    return Summary("tasks", provenance, None, len(results), 1.0, results)


def test_only_a_significant_drop_is_a_regression_and_new_and_vanished_tasks_are_listed() -> None:
    base = _summary(
        [("a", "m", "passed")] * 6
        + [("b", "m", "passed")] * 3
        + [("c", "m", "failed")] * 3
        + [("gone", "m", "passed")],
        mm_batch_version="1.0",
        started_at="yesterday",
    )
    head = _summary(
        [("a", "m", "failed")] * 5
        + [("a", "m", "error")]
        + [("b", "m", "passed")] * 2
        + [("b", "m", "failed")]
        + [("c", "m", "passed")] * 3
        + [("fresh", "m", "passed")],
        mm_batch_version="1.1",
        started_at="today",
    )
    rows = {r.task: r for r in compare(base, head).rows}
    assert rows["a"].regression and rows["a"].p_value == pytest.approx(1 / 924)
    assert not rows["b"].regression  # 3/3 -> 2/3 is noise
    assert not rows["c"].regression and rows["c"].change == 1.0  # a rise is never one
    assert rows["gone"].vanished and not rows["gone"].regression
    assert rows["fresh"].new and rows["fresh"].p_value is None
    differences = compare(base, head).provenance
    assert [(d.key, d.base, d.head) for d in differences] == [("mm_batch_version", "1.0", "1.1")]


def _render(markdown: str) -> str:
    return str(cmarkgfm.github_flavored_markdown_to_html(markdown))


def test_compare_md_shows_hostile_model_names_as_text() -> None:
    model = (
        "hosted_vllm/<img src=x onerror=alert(1)> [click](https://evil.example) ops@evil.example"
    )
    base = _summary([("a", model, "passed")] * 5, models=model)
    head = _summary([("a", model, "failed")] * 5, models="other")
    html = _render(compare_markdown(compare(base, head)))
    for made in ("<img", "<a ", "href"):
        assert made not in html
    assert "REGRESSION" in html


def _script(fail_publish: bool) -> Script:
    def script(request: dict[str, Any]) -> Any:
        if turn(request) > 0:
            return text("Done.")
        if fail_publish and first_user_message(request) == "Publish.":
            return text("I will not.")
        return tool_call("ok", {})

    return script


TASKS = """\
agent: agent.yaml
repeat: 6
jobs: 2
tasks:
  - id: publish
    prompt: Publish.
    expect:
      calls: [{tool: ok}]
  - id: second
    prompt: Check.
    expect:
      calls: [{tool: ok}]
"""


def _results(cli: Cli, fake: FakeOpenAI, tmp_path: Path, name: str) -> Path:
    (tmp_path / "agent.yaml").write_text(OK_AGENT)
    tasks = tmp_path / "tasks.yaml"
    tasks.write_text(TASKS)
    out = tmp_path / name
    cli("run", tasks, *model_args(fake), "--out", out)
    return out


def test_compare_exits_1_on_a_regression_and_writes_its_reports(
    cli: Cli, fake_model: Fake, tmp_path: Path
) -> None:
    base = _results(cli, fake_model(_script(False)), tmp_path, "base")
    head = _results(cli, fake_model(_script(True)), tmp_path, "head")
    out = tmp_path / "cmp"
    result = cli("compare", base, head, "--out", out)
    assert result.code == 1, result.err
    assert "REGRESSION" in result.err
    data = json.loads((out / "compare.json").read_text())
    rows = {r["task"]: r for r in data["rows"]}
    assert rows["publish"]["base"] == {"passed": 6, "runs": 6}
    assert rows["publish"]["head"] == {"passed": 0, "runs": 6}
    assert rows["publish"]["regression"] is True
    assert rows["publish"]["p_value"] == pytest.approx(1 / 924)
    assert rows["second"]["regression"] is False and rows["second"]["p_value"] == 1.0
    assert "publish" in (out / "compare.md").read_text()
    # The same folders the other way round: a rise is no regression.
    assert cli("compare", head, base, "--out", out).code == 0


def test_compare_refuses_unusable_folders_with_exit_2(
    cli: Cli, fake_model: Fake, tmp_path: Path
) -> None:
    base = _results(cli, fake_model(_script(False)), tmp_path, "base")
    damaged = tmp_path / "damaged"
    damaged.mkdir()
    for name in ("calls.jsonl", "junit.xml"):
        (damaged / name).write_text((base / name).read_text())
    (damaged / "summary.json").write_text('{"runs": [{"run": 1}]}')
    result = cli("compare", base, damaged, "--out", tmp_path / "cmp")
    assert result.code == 2
    wrong = "runs[0].run: expected a string, got 1"
    assert f"summary.json: not an mm-batch summary: {wrong}; nothing compared" in result.err
    assert not (tmp_path / "cmp").exists()
    assert cli("compare", base, base, "--alpha", "1.5", "--out", tmp_path / "c").code == 2
