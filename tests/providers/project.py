"""The project the provider tests run: one release task, on a provider's own model options."""

from __future__ import annotations

from pathlib import Path

from tests.helpers import write


def release_project(tmp_path: Path, options: str, timeout_s: int | None = None) -> Path:
    """One task that releases 1.4.2 with the `release` tool, its agent on these model options
    (and the task on this timeout, when given); the tasks file's path."""
    write(
        tmp_path,
        "agent.yaml",
        f"""
        yolo: true
        model_options: {options}
        tools:
          - name: release
            description: Release a version.
            parameters:
              version: {{type: string, description: "The version."}}
            command: ["echo", "released {{{{version}}}}"]
        """,
    )
    timeout = "" if timeout_s is None else f"timeout: {timeout_s}"
    return write(
        tmp_path,
        "tasks.yaml",
        f"""
        agent: agent.yaml
        tasks:
          - id: ship
            prompt: Release 1.4.2.
            {timeout}
            expect:
              calls: [{{tool: release, args: {{version: "1.4.2"}}, times: 1}}]
              exit_code: 0
        """,
    )
