"""What a run is handed through its context: the MCP client's tagged answers, and the sink that
the batch's warnings go to (once per batch, not once per process)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from mm_batch.config.model import McpServerSpec
from mm_batch.jsontypes import JsonObject
from mm_batch.run.ports import McpAnswer, McpErrorAnswer, McpResult, McpTool
from tests.helpers import write
from tests.run.scripted import calls, run_tasks

AGENT = """
yolo: true
mcp: [{name: proj, url: "http://127.0.0.1:9/mcp"}]
tools:
  - name: proj_status
    description: The declared one.
    command: ["echo", "declared"]
"""
TASKS = """
agent: agent.yaml
tasks:
  - {id: one, prompt: one}
  - {id: two, prompt: two}
"""
CLASH = (
    "mm-batch: warning: MCP tool proj_status of server proj has the name of a declared tool; "
    "the declared tool wins"
)


@dataclass
class FakeMcp:
    """A server `proj` offering `status` (shadowed by the declared proj_status) and `deploy`,
    which answers with `answer`."""

    answer: McpResult = field(default_factory=lambda: McpAnswer("deployed"))
    called: list[tuple[str, JsonObject]] = field(default_factory=list)

    def list_tools(self, server: McpServerSpec, timeout: float = 30.0) -> list[McpTool]:
        schema: JsonObject = {"type": "object", "properties": {"env": {"type": "string"}}}
        return [
            McpTool(server.name, "status", "Status.", {}),
            McpTool(server.name, "deploy", "Deploy.", schema),
        ]

    def call_tool(
        self, server: McpServerSpec, name: str, arguments: JsonObject, timeout: float
    ) -> McpResult:
        self.called.append((name, arguments))
        return self.answer


def _tasks(tmp_path: Path, tasks: str = TASKS) -> Path:
    write(tmp_path, "agent.yaml", AGENT)
    return write(tmp_path, "tasks.yaml", tasks)


def test_a_warning_is_said_once_a_batch_to_the_sink_given(tmp_path: Path) -> None:
    tasks = _tasks(tmp_path)
    for _batch in range(2):
        said: list[str] = []
        run_tasks(tasks, [], mcp=FakeMcp(), warn=said.append)
        assert said == [CLASH]  # two runs meet it; the next batch says it again


def test_an_mcp_answer_runs_and_an_error_answer_is_an_error_outcome(tmp_path: Path) -> None:
    tasks = _tasks(tmp_path, "agent: agent.yaml\ntasks: [{id: one, prompt: one}]\n")
    step = calls(("proj_deploy", '{"env": "prod"}'))
    ok = FakeMcp()
    out = run_tasks(tasks, [step], mcp=ok)
    assert ok.called == [("deploy", {"env": "prod"})]
    (ran,) = out.records.of("tool")
    assert (ran["outcome"], ran["where"], ran["stdout"]) == ("ran", "mcp:proj", "deployed")
    assert out.result.status == "passed"
    out = run_tasks(tasks, [step], mcp=FakeMcp(McpErrorAnswer("no such env")))
    (failed,) = out.records.of("tool")
    assert failed["outcome"] == "error"
    assert failed["reason"] == "the MCP tool answered an error: no such env"
