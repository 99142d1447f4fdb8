"""A JUnit <testsuite>'s time is the wall time of its runs (first start to last end): runs in
parallel overlap, and the sum of their times is no time anyone waited (SPEC 7)."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mm_batch.config.load import load_tasks
from mm_batch.config.secrets import Masker
from mm_batch.plan import Overrides, make_plan
from mm_batch.report.junit import junit_xml
from mm_batch.run.records import RunResult
from mm_batch.testing.fake_openai import text, tool_call, turn
from tests.helpers import Cli, Fake, check_report, model_args, write, yolo_agent

AGENT = yolo_agent("wait", "Wait a while.", '["sleep", "0.6"]')
TASKS = """\
agent: agent.yaml
jobs: 4
tasks:
  - {id: a, prompt: wait}
  - {id: b, prompt: wait}
  - {id: c, prompt: wait}
  - {id: d, prompt: wait}
"""


def _suites(junit: Path) -> list[ET.Element]:
    return ET.parse(junit).getroot().findall("testsuite")


def test_a_suite_of_parallel_runs_takes_its_wall_time(
    cli: Cli, fake_model: Fake, tmp_path: Path
) -> None:
    write(tmp_path, "agent.yaml", AGENT)
    write(tmp_path, "tasks.yaml", TASKS)
    fake = fake_model(lambda request: tool_call("wait", {}) if turn(request) == 0 else text("ok"))
    out = tmp_path / "out"
    result = cli("run", tmp_path / "tasks.yaml", *model_args(fake), "--out", out)
    assert result.code == 0, result.err
    check_report(out / "junit.xml")
    (suite,) = _suites(out / "junit.xml")
    runs = [float(c.get("time") or 0) for c in suite.findall("testcase")]
    assert min(runs) >= 0.6
    wall = float(suite.get("time") or 0)
    assert max(runs) <= wall < sum(runs) * 0.75, (wall, runs)


def _results(durations: list[float]) -> list[RunResult]:
    return [
        RunResult(f"t{i}[m]#1", f"t{i}", "m", 1, "passed", "", (), d, None, (), index=i)
        for i, d in enumerate(durations)
    ]


@settings(max_examples=100, deadline=None)
@given(
    st.lists(
        st.tuples(st.floats(0, 1000), st.floats(0, 600)),  # start, duration
        min_size=1,
        max_size=6,
    )
)
def test_the_suite_time_is_first_start_to_last_end(
    tmp_path_factory: pytest.TempPathFactory, spans: list[tuple[float, float]]
) -> None:
    folder = tmp_path_factory.mktemp("wall")
    write(folder, "agent.yaml", "yolo: true\n")
    tasks = "agent: agent.yaml\ntasks:\n" + "".join(
        f"  - {{id: t{i}, prompt: p}}\n" for i in range(len(spans))
    )
    plan = make_plan(load_tasks(write(folder, "tasks.yaml", tasks)), Overrides(models=("m",)))
    results = _results([d for _, d in spans])
    ends = {r.run_id: 1.7e9 + start + d for r, (start, d) in zip(results, spans, strict=True)}
    xml = junit_xml(plan, results, {}, Masker([]), ends=ends)
    root = ET.fromstring(xml)
    (suite,) = root.findall("testsuite")
    wall = max(s + d for s, d in spans) - min(s for s, _ in spans)
    assert abs(float(suite.get("time") or 0) - wall) < 0.002
    assert abs(float(root.get("time") or 0) - wall) < 0.002
