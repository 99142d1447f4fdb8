"""What a run's headline reason says: its first cause, and what was in flight when it ended."""

from __future__ import annotations

from pathlib import Path

from tests.conftest import write
from tests.run.scripted import calls, run_tasks

ALLOWLIST_AGENT = """
yolo: false
allow:
  - tool: deploy
    args: {env: staging}
tools:
  - name: deploy
    description: Deploy.
    parameters:
      env: {type: string}
    command: ["./deploy.sh", "{{env}}"]
"""


def test_a_refusal_then_the_loop_it_led_to_reports_the_refusal_first(tmp_path: Path) -> None:
    write(tmp_path, "agent.yaml", ALLOWLIST_AGENT)
    write(tmp_path, "deploy.sh", "#!/bin/sh\ntouch deployed\n").chmod(0o755)
    tasks = write(tmp_path, "tasks.yaml", "agent: agent.yaml\ntasks:\n  - {id: t, prompt: go}\n")
    prod = calls(("deploy", '{"env": "prod"}'))
    out = run_tasks(tasks, [prod, prod, prod])
    assert out.result.status == "failed"
    assert out.result.reason.startswith(
        "no_unexpected_refusal: refused: deploy with env=prod is not on this run's allowlist"
    ), out.result.reason
    assert out.result.reason.endswith(
        "; then loop detector: deploy asked for 3 times in a row with the same arguments"
    )
    assert not (tmp_path / "deployed").exists()
