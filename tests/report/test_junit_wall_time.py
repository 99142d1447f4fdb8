"""A JUnit <testsuite>'s time is the wall time of its runs (first start to last end): runs in
parallel overlap, and the sum of their times is no time anyone waited (SPEC 7)."""

from __future__ import annotations

import threading
import xml.etree.ElementTree as ET
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mm_batch.config.load import load_tasks
from mm_batch.config.secrets import Masker
from mm_batch.plan import Overrides, make_plan
from mm_batch.report.junit import junit_xml
from mm_batch.run.records import RunResult
from mm_batch.testing.fake_openai import Reply, text, tool_call, turn
from tests.helpers import (
    Cli,
    Fake,
    HeldReply,
    check_report,
    model_args,
    read_calls,
    write,
    yolo_agent,
)

RUNS = 4
AGENT = yolo_agent("wait", "Wait for the others.")
TASKS = f"""\
agent: agent.yaml
jobs: {RUNS}
tasks:
""" + "".join(f"  - {{id: t{i}, prompt: wait}}\n" for i in range(RUNS))


def _suites(junit: Path) -> list[ET.Element]:
    return ET.parse(junit).getroot().findall("testsuite")


def _moment(ts: str) -> float:
    """A record's `ts` (RFC 3339, UTC) in seconds since the epoch."""
    return datetime.fromisoformat(ts.replace("Z", "+00:00")).timestamp()


def test_a_suite_of_parallel_runs_takes_its_wall_time(
    cli: Cli, fake_model: Fake, tmp_path: Path
) -> None:
    """Every run's first reply is held until all the runs (jobs 4) have asked for theirs, so the
    runs overlap whatever the machine's load: the suite's time is the span from the first start
    to the last end that the runs' own records give, not the sum of the runs' times."""
    write(tmp_path, "agent.yaml", AGENT)
    write(tmp_path, "tasks.yaml", TASKS)
    lock = threading.Lock()
    asked = 0
    with HeldReply(tool_call("wait", {})) as first:

        def script(request: dict[str, Any]) -> Reply:
            nonlocal asked
            if turn(request) > 0:
                return text("ok")
            with lock:
                asked += 1
                if asked == RUNS:
                    first.release()
            return first(request)

        fake = fake_model(script)
        out = tmp_path / "out"
        result = cli("run", tmp_path / "tasks.yaml", *model_args(fake), "--out", out)
    assert result.code == 0, result.err
    assert asked == first.given == RUNS
    check_report(out / "junit.xml")
    ran = [r for r in read_calls(out) if r["kind"] == "task"]
    ends = [_moment(r["ts"]) for r in ran]
    starts = [end - r["duration_s"] for r, end in zip(ran, ends, strict=True)]
    # As held: every run started before any ended (each asked before any first reply came).
    assert max(starts) < min(ends), (starts, ends)
    span = max(ends) - min(starts)
    (suite,) = _suites(out / "junit.xml")
    cases = [float(c.get("time") or 0) for c in suite.findall("testcase")]
    durations = sorted(r["duration_s"] for r in ran)
    assert all(abs(c - d) < 0.001 for c, d in zip(sorted(cases), durations, strict=True))
    # The span, to the report's rounding (3 decimals; the records' microseconds), not the sum.
    assert abs(float(suite.get("time") or 0) - span) < 0.001, (suite.get("time"), span, cases)
    root = ET.parse(out / "junit.xml").getroot()
    assert abs(float(root.get("time") or 0) - span) < 0.001, (root.get("time"), span)


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
