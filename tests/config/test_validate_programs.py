"""`validate` looks for each tool's program on this machine: a script of the agent's folder
that is missing or not executable, a program not on the PATH where the tools run on the host,
are errors; for a docker sandbox, whose image may hold what the host lacks, a warning."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.helpers import Cli, write


def agent(program: str, sandbox: str = "host") -> str:
    return f"""\
sandbox: {{kind: {sandbox}}}
tools:
  - name: deploy
    description: Deploy.
    command: ["{program}"]
"""


def project(tmp_path: Path, program: str, sandbox: str = "host") -> Path:
    write(tmp_path, "agent.yaml", agent(program, sandbox))
    return write(tmp_path, "tasks.yaml", "agent: agent.yaml\ntasks: [{id: a, prompt: p}]\n")


def test_a_missing_script_is_an_error_at_its_line(cli: Cli, tmp_path: Path) -> None:
    project(tmp_path, "./deploy.sh")
    result = cli("validate", "tasks.yaml", cwd=tmp_path)
    assert result.code == 2
    assert result.err.splitlines() == [
        f"agent.yaml:5: tools[0].command[0]: the program ./deploy.sh is not there "
        f"({tmp_path.resolve() / 'deploy.sh'})",
        "mm-batch: 1 configuration error(s); nothing ran",
    ]


@pytest.mark.parametrize("sandbox", ["host", "docker"])
def test_a_script_that_is_not_executable_is_an_error(
    cli: Cli, tmp_path: Path, sandbox: str
) -> None:
    project(tmp_path, "./deploy.sh", sandbox)
    write(tmp_path, "deploy.sh", "#!/bin/sh\n").chmod(0o644)
    result = cli("validate", "agent.yaml", cwd=tmp_path)
    assert result.code == 2
    script = tmp_path.resolve() / "deploy.sh"
    assert (
        f"agent.yaml:5: tools[0].command[0]: the program ./deploy.sh is not executable: "
        f"chmod +x {script}"
    ) in result.err
    script.chmod(0o755)
    assert cli("validate", "agent.yaml", cwd=tmp_path).code == 0


def test_a_program_not_on_the_path_is_an_error_on_the_host(cli: Cli, tmp_path: Path) -> None:
    project(tmp_path, "no-such-program-mm-batch")
    result = cli("validate", "tasks.yaml", cwd=tmp_path)
    assert result.code == 2
    assert (
        "agent.yaml:5: tools[0].command[0]: the program no-such-program-mm-batch is not on this "
        "machine's PATH, where the tools run (sandbox: host)"
    ) in result.err


def test_for_docker_a_program_the_host_lacks_is_a_warning(cli: Cli, tmp_path: Path) -> None:
    project(tmp_path, "no-such-program-mm-batch", "docker")
    result = cli("validate", "tasks.yaml", cwd=tmp_path)
    assert result.code == 0, result.err
    assert result.err == (
        "agent.yaml:5: tools[0].command[0]: warning: the program no-such-program-mm-batch is not "
        "on this machine's PATH: the sandbox image must have it\n"
    )
    project(tmp_path, "/opt/image-only/deploy", "docker")
    result = cli("validate", "tasks.yaml", cwd=tmp_path)
    assert result.code == 0 and "the sandbox image must have it" in result.err


def test_programs_that_are_there_pass(cli: Cli, tmp_path: Path) -> None:
    project(tmp_path, "sh")
    assert cli("validate", "tasks.yaml", cwd=tmp_path).code == 0
    project(tmp_path, "/bin/sh")
    assert cli("validate", "tasks.yaml", cwd=tmp_path).code == 0


def test_run_warns_of_a_missing_script_and_still_answers_each_call(
    cli: Cli, tmp_path: Path
) -> None:
    """`run` is not stricter than it was: the warning comes before anything runs."""
    project(tmp_path, "./deploy.sh")
    result = cli("plan", "tasks.yaml", "--model", "hosted_vllm/m", cwd=tmp_path)
    assert result.code == 0
    assert "warning: the program ./deploy.sh is not there" in result.err


def test_the_tools_path_is_where_a_host_program_is_looked_for(cli: Cli, tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    write(bin_dir, "deploy-tool", "#!/bin/sh\n").chmod(0o755)
    write(
        tmp_path,
        "agent.yaml",
        f"""\
tools:
  - name: deploy
    description: Deploy.
    command: ["deploy-tool"]
    env: {{PATH: "{bin_dir}{os.pathsep}/usr/bin:/bin"}}
""",
    )
    assert cli("validate", "agent.yaml", cwd=tmp_path).code == 0
