"""pipelines/ and the GitLab component (templates/): linted, valid against their platforms'
published schemas, set up as documented (a pinned mm-batch, current actions, caches that a new
pull request restores, no run after a cancel, no executor held by a waiting Jenkins build, the
API key from each CI's secret store, annotations that name the model), their inputs mapped to
options mm-batch has, and the GitHub workflows and the component's jobs really work. The action
(action.yml) and the workflow that gates through it: tests/test_action.py."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import textwrap
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from mm_batch import __version__
from mm_batch.cli import cli as mm_batch_cli
from mm_batch.config.local_catalog import CATALOG
from mm_batch.effects import gguf
from mm_batch.testing.fake_openai import by_prompt, text
from tests.docker_support import REQUIRED as DOCKER_REQUIRED
from tests.helpers import GOOD, ROOT, STATUS_EN, Fake
from tests.pipelines_support import (
    ACTION,
    BIN,
    COMPONENT,
    CURRENT_MAJOR,
    GHA_EXPRESSION,
    GIVEN,
    KEY,
    OWN_ACTION,
    PIPELINES,
    action_inputs,
    actionlint_cmd,
    check_jsonschema_bin,
    check_mapped_argv,
    fake_mm_batch,
    hosted_repo,
    mapped_options,
    options_of,
    outputs,
    parsed_run,
    run_step,
    shellcheck_bin,
)

GITHUB = sorted(p.relative_to(PIPELINES).as_posix() for p in (PIPELINES / "github").glob("*.yml"))
GITLAB = sorted(
    p.relative_to(PIPELINES).as_posix() for p in (PIPELINES / "gitlab").glob("*gitlab-ci.yml")
)
JENKINS = sorted(
    p.relative_to(PIPELINES).as_posix() for p in (PIPELINES / "jenkins").glob("Jenkinsfile*")
)
# The workflows that install the local extra and assemble the local model: they need the caches.
LOCAL = ["github/mm-batch.yml", "github/mm-batch-status-cron.yml"]
HOSTED = {
    "github": "github/mm-batch-hosted.yml",
    "gitlab": "gitlab/mm-batch-hosted.gitlab-ci.yml",
    "jenkins": "jenkins/Jenkinsfile.hosted",
}
# Where a copied pipeline gets mm-batch: its repository at the release tag of this version
# (OWNER: the user's source of mm-batch). "." would install the user's own project.
PINNED_PACKAGE = re.compile(
    r"mm-batch(\[local\])? @ git\+https://github\.com/OWNER/mm-batch@v(?P<version>[0-9.]+)"
)


def test_the_file_lists_cover_every_pipeline() -> None:
    files = {
        p.relative_to(PIPELINES).as_posix()
        for p in PIPELINES.rglob("*")
        if p.is_file() and p.name != "README.md"
    }
    assert files == {*GITHUB, *GITLAB, *JENKINS}
    assert set(LOCAL) | set(HOSTED.values()) <= files


# -- the script blocks of every pipeline, as each CI hands them to its shell ----------------------

# A Jenkinsfile's sh steps: sh '...', sh '''...''', sh "...", sh """...""", sh(script: ...).
JENKINS_SH = re.compile(
    r"\bsh\s*\(?\s*(?:script\s*:\s*)?('''|\"\"\"|'|\")(?P<body>.*?)(?<!\\)\1", re.S
)


@dataclass(frozen=True)
class Block:
    where: str
    script: str


def load(path: str) -> Any:
    return yaml.safe_load((PIPELINES / path).read_text())


# -- the GitLab component as GitLab includes it ----------------------------------------------------

INPUT_REFERENCE = re.compile(r"\$\[\[\s*inputs\.([\w-]+)\s*\]\]")


def component_parts(text_: str | None = None) -> tuple[dict[str, Any], str]:
    """The component's header (`spec:`) and the text of its body, which `---` separates."""
    header, separator, body = (COMPONENT.read_text() if text_ is None else text_).partition(
        "\n---\n"
    )
    assert separator, "a component's spec and its jobs are two YAML documents"
    return yaml.safe_load(header), body


def component_text(values: Mapping[str, object]) -> str:
    """The body with each `$[[ inputs.NAME ]]` replaced by the value given, else the input's
    default; an input with neither is missing, as GitLab says at include time."""
    inputs = component_parts()[0]["spec"]["inputs"]

    def fill(match: re.Match[str]) -> str:
        name = match.group(1)
        assert name in inputs, f"$[[ inputs.{name} ]] is not declared in spec:inputs"
        if name in values:
            return str(values[name])
        assert "default" in inputs[name], f"the input {name} is required"
        return str(inputs[name]["default"])

    return INPUT_REFERENCE.sub(fill, component_parts()[1])


def component_jobs(values: Mapping[str, object]) -> dict[str, dict[str, Any]]:
    """The component's jobs with the inputs filled in and `extends:` resolved as GitLab does
    (hashes merged key by key, anything else replaced)."""
    jobs: dict[str, dict[str, Any]] = yaml.safe_load(component_text(values))
    resolved = {}
    for name, job in jobs.items():
        base = jobs[job["extends"]] if "extends" in job else {}
        merged = {**base, **{k: v for k, v in job.items() if k != "extends"}}
        for key in ("variables",):
            if key in base or key in job:
                merged[key] = {**base.get(key, {}), **job.get(key, {})}
        resolved[name] = merged
    return resolved


def component_session(job: Mapping[str, Any]) -> list[str]:
    return [*job.get("before_script", []), *job["script"]]


def github_blocks(path: str) -> list[Block]:
    """Every `run:` step; a ${{ }} expression becomes a placeholder word, as GitHub fills it in."""
    workflow = load(path)
    return [
        Block(f"{path}: {job_id} step {i + 1}", GHA_EXPRESSION.sub("GHA_EXPRESSION", step["run"]))
        for job_id, job in workflow["jobs"].items()
        for i, step in enumerate(job["steps"])
        if "run" in step
    ]


def gitlab_blocks(path: str) -> list[Block]:
    """Each job's before_script and script, one shell session; after_script, another."""
    blocks = []
    for name, job in load(path).items():
        if not isinstance(job, dict) or "script" not in job:
            continue
        session = [*job.get("before_script", []), *job["script"]]
        blocks.append(Block(f"{path}: {name}", "\n".join(session)))
        if job.get("after_script"):
            blocks.append(Block(f"{path}: {name} after_script", "\n".join(job["after_script"])))
    return blocks


def groovy_code(text_: str) -> str:
    """The Jenkinsfile without its // comments: a // at a line's start or after a space (the
    only // inside its strings is a URL's, after a colon)."""
    return re.sub(r"(?:^|(?<=\s))//[^\n]*", "", text_, flags=re.M)


def jenkins_blocks(path: str) -> list[Block]:
    blocks = []
    for match in JENKINS_SH.finditer(groovy_code((PIPELINES / path).read_text())):
        body = match.group("body")
        if match.group(1).startswith('"'):  # a GString: Groovy fills ${...} in, \$ is a $
            body = re.sub(r"(?<!\\)\$\{[^}]*\}", "GROOVY_VALUE", body).replace("\\$", "$")
        blocks.append(
            Block(f"{path}: sh at {match.start()}", textwrap.dedent(body.replace("\\\\", "\\")))
        )
    return blocks


def action_blocks() -> list[Block]:
    """The action's `run:` steps (its inputs reach them through `env:` only)."""
    return [
        Block(f"action.yml: step {i + 1}", GHA_EXPRESSION.sub("GHA_EXPRESSION", step["run"]))
        for i, step in enumerate(yaml.safe_load(ACTION.read_text())["runs"]["steps"])
        if "run" in step
    ]


def component_blocks() -> list[Block]:
    """Each job of the component as GitLab runs it: before_script and script, one session."""
    jobs = component_jobs({"tasks": "tasks.yaml"})
    return [
        Block(f"templates/mm-batch.yml: {name}", "\n".join(component_session(job)))
        for name, job in jobs.items()
        if not name.startswith(".")
    ]


def all_blocks() -> Iterator[Block]:
    for path in GITHUB:
        yield from github_blocks(path)
    for path in GITLAB:
        yield from gitlab_blocks(path)
    for path in JENKINS:
        yield from jenkins_blocks(path)
    yield from action_blocks()
    yield from component_blocks()


def test_every_script_block_is_found() -> None:
    """The extraction misses none: as many blocks as the files have run steps, scripts, sh steps."""
    for path in GITHUB:
        text_ = (PIPELINES / path).read_text()
        runs = re.findall(r"^\s*(?:- )?run:[ \t]*\S", text_, re.M)
        assert len(github_blocks(path)) == len(runs), path
        assert runs or f"uses: {OWN_ACTION}@" in text_, path  # the action's own are below
    for path in GITLAB:
        scripts = re.findall(r"^\s*script:", (PIPELINES / path).read_text(), re.M)
        assert len(gitlab_blocks(path)) == len(scripts) > 0, path
    for path in JENKINS:
        steps = re.findall(r"\bsh\s*[('\"]", groovy_code((PIPELINES / path).read_text()))
        assert len(jenkins_blocks(path)) == len(steps) > 0, path
        assert all(b.script.strip() for b in jenkins_blocks(path)), path
    runs = re.findall(r"^\s*(?:- )?run:[ \t]*\S", ACTION.read_text(), re.M)
    assert len(action_blocks()) == len(runs) > 0
    scripts = re.findall(r"^\s*script:", COMPONENT.read_text(), re.M)
    assert len(component_blocks()) == len(scripts) > 0


# SC1091: `. .venv/bin/activate` sources a file the step itself creates; nothing to follow here.
SHELLCHECK_EXCLUDED = "SC1091"


def shellcheck(script: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [shellcheck_bin(), "-s", "bash", "-e", SHELLCHECK_EXCLUDED, "-f", "gcc", "-"],
        input=script,
        capture_output=True,
        text=True,
        check=False,
    )


@pytest.mark.parametrize("block", list(all_blocks()), ids=lambda b: b.where)
def test_every_script_block_passes_shellcheck(block: Block) -> None:
    done = shellcheck(block.script)
    assert done.returncode == 0, f"{block.where}:\n{block.script}\n{done.stdout}{done.stderr}"


def test_shellcheck_flags_a_broken_block() -> None:
    done = shellcheck('for f in $(ls *.txt); do cat $f; done\n[ "$x" = 1 ] || exit $code\n')
    assert done.returncode == 1
    assert "SC2045" in done.stdout and "SC2086" in done.stdout


@pytest.mark.parametrize("path", GITHUB)
def test_actionlint_finds_nothing(path: str) -> None:
    done = subprocess.run(
        [*actionlint_cmd(), str(PIPELINES / path)], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "1 file(s), 0 problem(s)" in done.stderr


def test_actionlint_flags_a_broken_workflow(tmp_path: Path) -> None:
    broken = tmp_path / "broken.yml"
    broken.write_text(
        "on: push\njobs:\n  a:\n    runs-on: ubuntu-latest\n    steps:\n"
        "      - run: echo ${{ matrix.nope }}\n"
        "      - uses: actions/checkout@v4\n        with: {nonsense: 1}\n"
    )
    done = subprocess.run(
        [*actionlint_cmd(), str(broken)], capture_output=True, text=True, check=False
    )
    assert done.returncode == 1, done.stderr
    problems = [json.loads(line) for line in done.stdout.splitlines()]
    assert [p["line"] for p in problems] == [6, 8]
    assert '"nope" is not defined' in problems[0]["message"]
    assert 'input "nonsense" is not defined' in problems[1]["message"]


@pytest.mark.parametrize(
    ("path", "schema"),
    [*((p, "vendor.github-workflows") for p in GITHUB), *((p, "vendor.gitlab-ci") for p in GITLAB)],
)
def test_valid_against_the_published_schema(path: str, schema: str) -> None:
    done = subprocess.run(
        [check_jsonschema_bin(), "--builtin-schema", schema, str(PIPELINES / path)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.parametrize("path", [*GITHUB, *GITLAB, *JENKINS])
def test_every_mm_batch_command_they_use_exists(path: str) -> None:
    text_ = (PIPELINES / path).read_text()
    uses = re.findall(r"mm-batch (run|merge|validate|plan|compare) ([^\n|;]*)", text_)
    assert uses or f"uses: {OWN_ACTION}@" in text_, "the pipeline runs mm-batch"
    for command, rest in uses:
        for option in re.findall(r"(--[a-z-]+)", rest):
            assert option in options_of(command), f"{path}: mm-batch {command} has no {option}"


# -- GitHub: current actions, caches a new pull request restores, no run after a cancel ----------


def triggers(workflow: dict[Any, Any]) -> dict[str, Any]:
    on = workflow[True] if True in workflow else workflow["on"]  # YAML 1.1 reads `on` as true
    return {k: v for k, v in on.items()} if isinstance(on, dict) else {e: None for e in on}


def steps(workflow: dict[str, Any]) -> Iterator[dict[str, Any]]:
    for job in workflow["jobs"].values():
        yield from job["steps"]


@pytest.mark.parametrize("path", GITHUB)
def test_every_action_is_at_its_current_major(path: str) -> None:
    used = [s["uses"] for s in steps(load(path)) if "uses" in s]
    assert used
    for uses in used:
        name, _, version = uses.partition("@")
        if name == OWN_ACTION:  # mm-batch's own action: at this version's release tag
            assert version == f"v{__version__}", f"{path}: {uses}"
            continue
        assert name in CURRENT_MAJOR, f"{path}: {uses} is not reviewed here"
        major = re.fullmatch(r"v(\d+)(?:\.\d+)*", version)
        assert major is not None, f"{path}: {uses}"
        assert int(major.group(1)) >= CURRENT_MAJOR[name], f"{path}: {uses} is outdated"


@pytest.mark.parametrize("path", GITHUB)
def test_nothing_runs_after_a_cancel(path: str) -> None:
    """`always()` runs even in a cancelled workflow; `!cancelled()` does not."""
    workflow = load(path)
    assert "always()" not in (PIPELINES / path).read_text()
    conditions = [
        item["if"]
        for job in workflow["jobs"].values()
        for item in [job, *job["steps"]]
        if "if" in item
    ]
    # The reports are kept when a task failed: by the action, else by the workflow's own steps.
    uses_action = any(s.get("uses", "").startswith(f"{OWN_ACTION}@") for s in steps(workflow))
    assert conditions or uses_action, "the reports are kept when a task failed"
    # A further condition may narrow a step (`!cancelled() && github.event_name == 'push'`),
    # never drop the guard.
    assert all(c.startswith("${{ !cancelled()") for c in conditions), conditions


def test_the_report_job_waits_for_every_shard_but_not_for_a_cancel() -> None:
    report = load("github/mm-batch.yml")["jobs"]["report"]
    assert report["needs"] == "run"
    assert report["if"] == "${{ !cancelled() }}"


def cache_steps(workflow: dict[str, Any]) -> dict[str, dict[str, str]]:
    """The actions/cache steps by path."""
    return {
        s["with"]["path"]: s["with"]
        for s in steps(workflow)
        if s.get("uses", "").startswith("actions/cache@")
    }


@pytest.mark.parametrize("path", LOCAL)
def test_a_new_pull_request_restores_the_caches(path: str) -> None:
    """The default branch saves them (a push to it, a schedule), and restore-keys find them."""
    workflow = load(path)
    on = triggers(workflow)
    assert "schedule" in on or "main" in (on.get("push") or {}).get("branches", [])
    caches = cache_steps(workflow)
    assert set(caches) == {"~/.cache/pip", "~/.cache/mm-batch/models"}
    for spec in caches.values():
        restore = spec["restore-keys"].strip().splitlines()
        assert restore, spec
        assert all(spec["key"].startswith(prefix) and prefix.endswith("-") for prefix in restore)


@pytest.mark.parametrize("path", LOCAL)
def test_the_pip_cache_is_keyed_by_what_pip_downloads(path: str) -> None:
    """pip's cache holds downloaded wheels (the prebuilt server, the models' packages): every key
    names the runner's OS, CPU and Python those wheels are for, the full key what is installed;
    nothing is compiled, so no key holds build flags."""
    workflow = load(path)
    pip = cache_steps(workflow)["~/.cache/pip"]
    for key in [pip["key"], *pip["restore-keys"].strip().splitlines()]:
        for part in ("${{ runner.os }}", "${{ runner.arch }}", "steps.python.outputs"):
            assert part in key, (part, key)
        assert "build" not in key, key
    assert "${{ steps.keys.outputs.package }}" in pip["key"]
    assert "hashFiles('pyproject.toml')" in pip["key"]
    keys_step = next(s for s in steps(workflow) if s.get("id") == "keys")
    assert '"$MM_BATCH_PACKAGE"' in keys_step["run"]


# Set by nothing a user copies: the local extra installs llama.cpp's server prebuilt.
BUILD_VARIABLES = ("CMAKE_ARGS", "LLAMA_CPP_BUILD_JOBS")


@pytest.mark.parametrize(
    "path",
    [*(PIPELINES / p for p in [*GITHUB, *GITLAB, *JENKINS]), COMPONENT],
    ids=lambda p: p.relative_to(ROOT).as_posix(),
)
def test_no_pipeline_sets_build_flags(path: Path) -> None:
    text_ = path.read_text()
    assert [name for name in BUILD_VARIABLES if name in text_] == [], path


def test_the_model_cache_is_where_mm_batch_assembles_the_model(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("MM_BATCH_CACHE", raising=False)
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    for path in LOCAL:
        cached = next(p for p in cache_steps(load(path)) if "mm-batch" in p)
        for model in CATALOG.values():
            assert gguf.gguf_path(model).parent == Path(cached.replace("~", str(tmp_path), 1))
    gitlab = load("gitlab/.gitlab-ci.yml")
    monkeypatch.setenv("MM_BATCH_CACHE", gitlab["variables"]["MM_BATCH_CACHE"])
    folders = {p for c in gitlab["mm-batch"]["cache"] for p in c["paths"]}
    assert folders == {".cache/pip", ".cache/mm-batch/models"}
    for model in CATALOG.values():
        assert gguf.gguf_path(model).parent == Path("$CI_PROJECT_DIR/.cache/mm-batch/models")


def test_gitlab_and_jenkins_install_with_the_pip_cache_they_keep(tmp_path: Path) -> None:
    """pip, as each job sets it up before installing, uses the cache folder that outlives the
    job: GitLab's cache of the project folder's .cache/pip, the Jenkins agent's ~/.cache/pip."""
    project = tmp_path / "project"
    home = tmp_path / "home"
    project.mkdir()
    home.mkdir()
    gitlab = load("gitlab/.gitlab-ci.yml")
    variables = {
        k: v.replace("$CI_PROJECT_DIR", str(project)) for k, v in gitlab["variables"].items()
    }
    cached = [project / p for c in gitlab["mm-batch"]["cache"] for p in c["paths"]]
    scripts = {
        "gitlab": "\n".join(b.script for b in gitlab_blocks("gitlab/.gitlab-ci.yml")),
        "jenkins": "\n".join(b.script for b in jenkins_blocks("jenkins/Jenkinsfile")),
    }
    kept = {"gitlab": project / ".cache" / "pip", "jenkins": home / ".cache" / "pip"}
    for ci, script in scripts.items():
        lines = script.strip().splitlines()
        install = next(i for i, line in enumerate(lines) if "pip install" in line)
        setup = "\n".join([*lines[:install], "python3 -m pip cache dir"])
        env = {"PATH": f"{BIN}:{os.environ['PATH']}", "HOME": str(home), "PIP_NO_INPUT": "1"}
        if ci == "gitlab":
            env.update(variables)
        done = run_step(setup, project, env)
        assert done.returncode == 0, (ci, done.stderr)
        assert Path(done.stdout.strip().splitlines()[-1]) == kept[ci], (ci, done.stdout)
    assert kept["gitlab"] in cached


# -- Jenkins: no executor held while the shards wait for one, no schedule unless asked -----------


def test_jenkins_gives_each_shard_its_own_agent() -> None:
    code = groovy_code((PIPELINES / "jenkins" / "Jenkinsfile").read_text())
    assert re.search(r"^pipeline\s*\{\s*agent\s+none\b", code, re.M)
    assert not re.search(r"\bnode\s*[({]", code), "no node {} inside the pipeline"
    matrix = re.search(r"matrix\s*\{(?P<body>.*?)\bstages\s*\{", code, re.S)
    assert matrix is not None and re.search(r"\bagent\s+(any|\{)", matrix.group("body"))
    axis = re.search(r"name\s+'SHARD'\s*values\s+(?P<values>[^\n]*)", code)
    assert axis is not None
    values = re.findall(r"'(\d+)'", axis.group("values"))
    shards = re.search(r"SHARDS\s*=\s*'(\d+)'", code)
    assert shards is not None and values == [str(k) for k in range(1, int(shards.group(1)) + 1)]
    report = code[code.index("stage('report')") :]
    assert re.match(r"stage\('report'\)\s*\{\s*agent\s+(any|\{)", report)


def test_jenkins_schedules_nothing_unless_asked() -> None:
    text_ = (PIPELINES / "jenkins" / "Jenkinsfile").read_text()
    assert "triggers" not in groovy_code(text_) and "cron(" not in groovy_code(text_)
    assert "// triggers { cron('H * * * *') }" in text_  # the line to uncomment


# -- the hosted-model examples: the key from each CI's secret store, never echoed -----------------

ECHOED = re.compile(rf"\b(echo|printf|set\s+-x|env|printenv)\b[^\n]*\$\{{?{KEY}\b|\bset\s+-x\b")


def test_no_script_shows_the_key() -> None:
    for block in all_blocks():
        assert not ECHOED.search(block.script), block.where
    assert ECHOED.search(f'echo "key: ${KEY}"') and ECHOED.search("set -x")


def test_github_takes_the_key_from_its_secrets_into_one_step() -> None:
    path = HOSTED["github"]
    workflow = load(path)
    assert KEY not in workflow.get("env", {})
    holders = [s for s in steps(workflow) if KEY in s.get("env", {})]
    assert [s["env"][KEY] for s in holders] == [f"${{{{ secrets.{KEY} }}}}"]
    # No other expression reads a secret (nor the whole store, as toJSON(secrets) would).
    assert len(re.findall(r"\$\{\{[^}]*\bsecrets\b", (PIPELINES / path).read_text())) == 1
    assert all("secrets." not in s.get("run", "") for s in steps(workflow))
    assert "mm-batch run" in holders[0]["run"]


def test_gitlab_takes_the_key_from_a_masked_variable_set_outside_the_file() -> None:
    path = HOSTED["gitlab"]
    pipeline = load(path)
    defined = [pipeline.get("variables", {})] + [
        job.get("variables", {}) for job in pipeline.values() if isinstance(job, dict)
    ]
    assert all(KEY not in variables for variables in defined)
    (block,) = gitlab_blocks(path)
    assert f"${{{KEY}:-}}" in block.script and "mm-batch run" in block.script
    assert "Mask variable" in (PIPELINES / path).read_text()


def test_jenkins_binds_the_key_from_its_credentials_for_one_stage() -> None:
    code = groovy_code((PIPELINES / HOSTED["jenkins"]).read_text())
    binding = re.search(rf"environment\s*\{{\s*{KEY}\s*=\s*credentials\('([\w.-]+)'\)\s*\}}", code)
    assert binding is not None
    pipeline_env = re.search(
        r"^pipeline\s*\{\s*agent\s+any\s*environment\s*\{(.*?)\}", code, re.S | re.M
    )
    assert pipeline_env is not None and KEY not in pipeline_env.group(1)
    # Single-quoted sh strings only: Groovy never writes the key into a script's text.
    quotes = [m.group(1) for m in JENKINS_SH.finditer(code)]
    assert quotes and all(q in ("'", "'''") for q in quotes)


# -- the GitHub workflows, run step by step as written ------------------------------------------


def expression(value: str, context: Mapping[str, str]) -> str:
    """The ${{ }} expressions these workflows put in a step (a matrix value, a secret)."""

    def fill(match: re.Match[str]) -> str:
        name = match.group(0)[3:-2].strip()
        assert name in context, f"no value for ${{{{ {name} }}}} here"
        return context[name]

    return GHA_EXPRESSION.sub(fill, value)


def shell_steps(
    job: dict[str, Any], context: Mapping[str, str]
) -> list[tuple[str, dict[str, str]]]:
    """The job's run steps but the installs (this suite runs in mm-batch's own virtualenv)."""
    return [
        (
            expression(s["run"], context),
            {k: expression(str(v), context) for k, v in s.get("env", {}).items()},
        )
        for s in job["steps"]
        if "run" in s and not s["run"].startswith("pip install")
    ]


def github_env(workflow: dict[str, Any], tmp_path: Path, **more: str) -> dict[str, str]:
    env = {
        **os.environ,
        **workflow["env"],
        "PATH": f"{BIN}:{os.environ['PATH']}",
        "GITHUB_STEP_SUMMARY": str(tmp_path / "sum.md"),
        "GITHUB_OUTPUT": str(tmp_path / "output"),
        **more,
    }
    env.pop("GITHUB_ACTIONS", None)
    return env


MIKEPENZ = "mikepenz/action-junit-report@"
# The annotation title every workflow gives mikepenz: the suite's name holds the model.
TITLE_TEMPLATE = "{{SUITE_NAME}}: {{TEST_NAME}}"


def mikepenz_titles(junit: Path, template: str | None) -> list[str]:
    """The titles mikepenz/action-junit-report (v5 and later: `createTestCaseAnnotation` in
    src/testParser.ts) gives the failed test cases. With `check_title_template`, the first
    {{FILE_NAME}}, {{SUITE_NAME}} (the <testsuite>'s name), {{TEST_NAME}} and {{CLASS_NAME}}
    (the classname's last dot-part) are filled in; without, `<file>.<test name>`, the file
    being the classname's last dot-part where the test case names none."""
    import xml.etree.ElementTree as ET

    titles = []
    for suite in ET.parse(junit).getroot().iter("testsuite"):
        for case in suite.findall("testcase"):
            if case.find("failure") is None and case.find("error") is None:
                continue
            name = case.get("name", "")
            class_part = (case.get("classname") or name).split(".")[-1]
            file_name = case.get("file") or class_part
            if template is None:
                titles.append(f"{file_name}.{name}" if file_name != name else name)
                continue
            titles.append(
                template.replace("{{FILE_NAME}}", file_name if file_name != name else "", 1)
                .replace("{{SUITE_NAME}}", suite.get("name", ""), 1)
                .replace("{{TEST_NAME}}", name, 1)
                .replace("{{CLASS_NAME}}", class_part, 1)
            )
    return titles


@pytest.mark.parametrize("path", GITHUB)
def test_every_junit_annotation_names_the_model(path: str) -> None:
    publishers = [s for s in steps(load(path)) if s.get("uses", "").startswith(MIKEPENZ)]
    for step in publishers:
        assert step["with"].get("check_title_template") == TITLE_TEMPLATE, path


def test_the_github_workflow_runs_as_documented(fake_model: Fake, tmp_path: Path) -> None:
    """Its run steps, as written, on a repository holding a tasks file (one task fails)."""
    replies = dict(GOOD)
    replies[STATUS_EN] = [GOOD[STATUS_EN][1]]  # answers without running anything: fails
    fake = fake_model(by_prompt(replies))
    repo = tmp_path / "repo"
    shutil.copytree(
        ROOT / "examples" / "release",
        repo / "examples" / "release",
        ignore=shutil.ignore_patterns("calls-received.log"),
    )
    agent = repo / "examples" / "release" / "agent.yaml"
    agent.write_text(
        agent.read_text() + "model: hosted_vllm/fake\n"
        'model_options: {api_base: "${FAKE_MODEL_URL}"}\n'
    )
    workflow = load("github/mm-batch.yml")
    env = github_env(workflow, tmp_path, FAKE_MODEL_URL=fake.url)

    def sh(script: str, step_env: Mapping[str, str]) -> int:
        done = run_step(script, repo, {**env, **step_env})
        return done.returncode

    run_job, report_job = workflow["jobs"]["run"], workflow["jobs"]["report"]
    installs = [
        s["run"]
        for job in (run_job, report_job)
        for s in job["steps"]
        if s.get("run", "").startswith("pip install")
    ]
    assert installs == ['pip install "$MM_BATCH_PACKAGE"', 'pip install "$MM_BATCH_MERGE_PACKAGE"']
    merge_package = PINNED_PACKAGE.fullmatch(workflow["env"]["MM_BATCH_MERGE_PACKAGE"])
    assert merge_package is not None and merge_package.group(1) is None  # no extra for merging
    for shard in run_job["strategy"]["matrix"]["shard"]:
        for script, step_env in shell_steps(run_job, {"matrix.shard": str(shard)}):
            assert sh(script, step_env) == 0, script
        # upload-artifact + download-artifact with a pattern: one folder per artifact.
        shutil.move(str(repo / "results"), str(repo / "shards" / f"mm-batch-shard-{shard}"))
    # The cache keys: the package spec's hash, and the local models' file names (with checksums).
    keys = outputs(tmp_path / "output")
    package = hashlib.sha256(workflow["env"]["MM_BATCH_PACKAGE"].encode()).hexdigest()[:16]
    assert keys["package"] == package
    names = sorted(gguf.gguf_path(m).name for m in CATALOG.values())
    assert keys["key"] == hashlib.sha256("".join(f"{n}\n" for n in names).encode()).hexdigest()[:16]
    codes = [sh(script, step_env) for script, step_env in shell_steps(report_job, {})]
    assert codes[:-1] == [0] * (len(codes) - 1)
    assert codes[-1] == 1  # the batch's verdict: one task failed
    merged = repo / "merged"
    assert sorted(p.name for p in merged.iterdir()) == [
        "calls.jsonl",
        "junit.xml",
        "report.html",
        "summary.json",
        "summary.md",
    ]
    assert "| hosted_vllm/fake | 5/6 |" in (tmp_path / "sum.md").read_text()
    # The check run's annotations, titled as mikepenz/action-junit-report titles them: each
    # names the model that failed.
    (publish,) = [s for s in report_job["steps"] if s.get("uses", "").startswith(MIKEPENZ)]
    titles = mikepenz_titles(merged / "junit.xml", publish["with"].get("check_title_template"))
    assert titles == ["tasks[hosted_vllm/fake]: status-en"]
    # A shard that cannot run (a configuration error, exit 2) fails its own job; the report job
    # then names the shard whose results are missing rather than publish a partial report.
    shard_step, shard_env = shell_steps(run_job, {"matrix.shard": "2"})[-1]
    assert "mm-batch run" in shard_step
    broken = run_step(shard_step, repo, {**env, **shard_env, "MM_BATCH_TASKS": "missing.yaml"})
    assert broken.returncode == 2, broken.stderr
    shutil.rmtree(repo / "shards" / "mm-batch-shard-2")
    merge_step = next(s for s, _ in shell_steps(report_job, {}) if s.startswith("mm-batch merge"))
    merged_without = run_step(merge_step, repo, env)
    assert merged_without.returncode == 2
    assert "shard 2/4 missing: its runs would be absent" in merged_without.stderr


def test_the_hosted_github_workflow_keeps_the_key_secret(fake_model: Fake, tmp_path: Path) -> None:
    """The key from the secret store reaches mm-batch, never a report or the log; without it the
    run stops, saying which secret is missing."""
    key = "sk-test-" + hashlib.sha256(str(tmp_path).encode()).hexdigest()[:24]
    replies = dict(GOOD)
    replies[STATUS_EN] = [GOOD[STATUS_EN][0], text(f"Running. The key is {key}.")]  # a leak
    fake = fake_model(by_prompt(replies))
    repo = hosted_repo(tmp_path)
    workflow = load(HOSTED["github"])
    assert workflow["env"]["MM_BATCH_TASKS"] == "tasks.yaml"
    env = github_env(workflow, tmp_path, FAKE_MODEL_URL=fake.url, MM_BATCH_MODEL="hosted_vllm/fake")
    (job,) = workflow["jobs"].values()

    ((step, step_env),) = shell_steps(job, {f"secrets.{KEY}": key})
    done = run_step(step, repo, {**env, **step_env})
    assert done.returncode == 0, done.stdout + done.stderr
    results = repo / "results"
    assert sorted(p.name for p in results.iterdir()) == [
        "calls.jsonl",
        "junit.xml",
        "report.html",
        "summary.json",
        "summary.md",
    ]
    for report in results.iterdir():
        assert key not in report.read_text(), report.name
    assert "The key is ***." in (results / "calls.jsonl").read_text()
    assert key not in done.stdout + done.stderr

    shutil.rmtree(results)
    ((step, step_env),) = shell_steps(job, {f"secrets.{KEY}": ""})  # what GitHub gives a fork
    missing = run_step(step, repo, {**env, **step_env})
    assert missing.returncode == 2
    assert f"::error::the secret {KEY} is not set" in missing.stdout
    assert not results.exists()


# -- a pinned mm-batch, never the user's own project ---------------------------------------------

PACKAGE_SETTING = re.compile(r"MM_BATCH(?:_MERGE)?_PACKAGE['\"]?\s*[:=]\s*['\"]([^'\"]*)['\"]")


@pytest.mark.parametrize("path", [*GITHUB, *GITLAB, *JENKINS])
def test_every_pipeline_installs_a_pinned_mm_batch(path: str) -> None:
    """In a user's repository "." is the user's project: each pipeline installs mm-batch from
    its repository at this version's release tag, or runs the action of that tag."""
    text_ = (PIPELINES / path).read_text()
    packages = PACKAGE_SETTING.findall(text_)
    actions = re.findall(rf"uses: {OWN_ACTION}@(\S+)", text_)
    assert packages or actions, f"{path} says nowhere which mm-batch it installs"
    for package in packages:
        pinned = PINNED_PACKAGE.fullmatch(package)
        assert pinned is not None, f"{path}: {package!r} is not mm-batch at a release tag"
        assert pinned.group("version") == __version__, f"{path}: {package}"
    assert all(ref == f"v{__version__}" for ref in actions), (path, actions)


def test_the_component_installs_the_same_pinned_mm_batch() -> None:
    package = component_parts()[0]["spec"]["inputs"]["package"]["default"]
    pinned = PINNED_PACKAGE.fullmatch(package)
    assert pinned is not None and pinned.group("version") == __version__, package


def test_one_pipeline_shows_the_docker_sandbox() -> None:
    """The docker sandbox, with the image it needs pulled first (mm-batch never pulls one)."""
    workflow = load("github/mm-batch-docker.yml")
    (job,) = workflow["jobs"].values()
    (action,) = [s for s in job["steps"] if s.get("uses", "").startswith(f"{OWN_ACTION}@")]
    assert action["with"]["sandbox"] == "docker"
    pulls = [s["run"] for s in job["steps"] if "docker pull" in s.get("run", "")]
    assert pulls == ['docker pull "$MM_BATCH_SANDBOX_IMAGE"']
    assert job["steps"].index(action) > next(
        i for i, s in enumerate(job["steps"]) if "docker pull" in s.get("run", "")
    )
    assert action["with"]["sandbox-image"] == "${{ env.MM_BATCH_SANDBOX_IMAGE }}"


@pytest.mark.parametrize("path", GITHUB)
def test_the_action_is_given_only_inputs_it_has(path: str) -> None:
    inputs = yaml.safe_load(ACTION.read_text())["inputs"]
    required = {name for name, spec in inputs.items() if spec.get("required")}
    for step in steps(load(path)):
        if step.get("uses", "").startswith(f"{OWN_ACTION}@"):
            given = set(step.get("with", {}))
            assert given <= set(inputs), f"{path}: no such input {given - set(inputs)}"
            assert required <= given, f"{path}: {required - given} missing"


# -- the action and the component: inputs that are mm-batch options name them ---------------------

# The inputs that are no option of mm-batch: what to run, how to install and publish it.
ACTION_OWN_INPUTS = {
    "tasks",
    "args",
    "package",
    "extras",
    "python-version",
    "api-key-env",
    "cache",
    "compare-with",
    "comment",
    "upload",
    "artifact-name",
    "summary",
}
COMPONENT_OWN_INPUTS = {
    "tasks",
    "args",
    "package",
    "image",
    "shards",
    "api-key-variable",
    "stage",
    "job-name",
}


def component_inputs() -> dict[str, dict[str, Any]]:
    inputs: dict[str, dict[str, Any]] = component_parts()[0]["spec"]["inputs"]
    return inputs


def options_mm_batch_lacks(inputs: Mapping[str, Mapping[str, Any]]) -> list[str]:
    problems = []
    for name, (command, option) in mapped_options(inputs).items():
        if command not in mm_batch_cli.commands:
            problems.append(f"{name}: mm-batch has no command {command}")
        elif option not in options_of(command):
            problems.append(f"{name}: mm-batch {command} has no {option}")
    return problems


@pytest.mark.parametrize(
    ("inputs", "own"),
    [(action_inputs(), ACTION_OWN_INPUTS), (component_inputs(), COMPONENT_OWN_INPUTS)],
    ids=["action", "component"],
)
def test_every_input_is_an_option_mm_batch_has_or_its_own(
    inputs: dict[str, dict[str, Any]], own: set[str]
) -> None:
    assert options_mm_batch_lacks(inputs) == []
    assert set(inputs) - set(mapped_options(inputs)) == own
    assert all(str(spec.get("description", "")).strip() for spec in inputs.values())


def test_an_input_mapped_to_an_option_mm_batch_lacks_is_found() -> None:
    inputs = {
        **action_inputs(),
        "temperature": {"description": "Sampling temperature (mm-batch run --temperature)"},
        "old": {"description": "Gone (mm-batch launch --model)"},
    }
    assert options_mm_batch_lacks(inputs) == [
        "temperature: mm-batch run has no --temperature",
        "old: mm-batch has no command launch",
    ]


def test_the_action_and_the_component_have_the_same_options() -> None:
    """One set of mm-batch options on both ways in (the component merges into its `out`)."""
    action = {name: option for name, (_, option) in mapped_options(action_inputs()).items()}
    component = {name: option for name, (_, option) in mapped_options(component_inputs()).items()}
    assert action == component


def test_the_component_passes_each_input_as_its_option(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "tasks.yaml").write_text("tasks: []\n")
    folder, argv_file = fake_mm_batch(tmp_path)
    values = {"tasks": "tasks.yaml", "package": "", **GIVEN}
    job = component_jobs(values)["mm-batch"]
    env = gitlab_env(job, repo, {"ARGV_FILE": str(argv_file), "CI_NODE_INDEX": "2"})
    env["PATH"] = f"{folder}:{env['PATH']}"
    env["CI_NODE_TOTAL"] = "3"
    done = run_step("\n".join(component_session(job)), repo, env)
    assert done.returncode == 0, done.stdout + done.stderr
    argv = argv_file.read_text().split("\0")[:-1]
    assert argv[:2] == ["run", "tasks.yaml"]
    params = parsed_run(argv, repo)
    assert params["shard"] == "2/3" and params["out_dir"] == Path("shards/2")
    check_mapped_argv([a if a != "shards/2" else "results" for a in argv], component_inputs(), repo)


# -- the component: valid against GitLab's schema, and its jobs run as GitLab runs them -----------


def test_every_input_of_the_component_is_used_and_every_use_declared() -> None:
    spec, body = component_parts()
    assert set(spec) == {"spec"} and set(spec["spec"]) == {"inputs"}
    used = set(INPUT_REFERENCE.findall(body))
    assert used == set(component_inputs())


def gitlab_schema_check(document: object, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    path = tmp_path / "document.yml"
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    return subprocess.run(
        [check_jsonschema_bin(), "--builtin-schema", "vendor.gitlab-ci", str(path)],
        capture_output=True,
        text=True,
        check=False,
    )


@pytest.mark.parametrize("part", ["spec", "jobs-default", "jobs-4-shards"])
def test_the_component_is_valid_against_gitlab_schema(part: str, tmp_path: Path) -> None:
    """Its two documents as GitLab reads them: the `spec:` header, and the jobs with the inputs
    filled in (the defaults: one shard; and 4 shards)."""
    if part == "spec":
        document: object = component_parts()[0]
    else:
        values: dict[str, object] = {"tasks": "tasks.yaml"}
        if part == "jobs-4-shards":
            values["shards"] = 4
        document = yaml.safe_load(component_text(values))
    done = gitlab_schema_check(document, tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr


def test_gitlab_schema_flags_a_broken_component(tmp_path: Path) -> None:
    """The schema reads the header and the jobs, not only that they are YAML."""
    header = component_parts()[0]
    header["spec"]["inputs"]["shards"]["type"] = "integer"  # GitLab's word is number
    assert gitlab_schema_check(header, tmp_path).returncode == 1
    jobs = yaml.safe_load(component_text({"tasks": "tasks.yaml", "shards": 0}))
    assert gitlab_schema_check(jobs, tmp_path).returncode == 1  # parallel: 1 to 200


def test_the_component_publishes_the_merged_junit_report() -> None:
    jobs = component_jobs({"tasks": "tasks.yaml", "out": "merged", "shards": 4})
    shards, report = jobs["mm-batch"], jobs["mm-batch-report"]
    assert shards["parallel"] == 4
    assert report["needs"] == ["mm-batch"] and report["when"] == "always"
    assert report["artifacts"]["reports"]["junit"] == "merged/junit.xml"
    assert report["artifacts"]["when"] == "always"


def gitlab_env(job: Mapping[str, Any], repo: Path, more: Mapping[str, str]) -> dict[str, str]:
    """The job's variables ($CI_PROJECT_DIR and the like expanded) over a runner's environment."""
    env = {**os.environ, "PATH": f"{BIN}:{os.environ['PATH']}", "CI_PROJECT_DIR": str(repo)}
    env.pop("GITHUB_ACTIONS", None)
    env.pop("GITHUB_STEP_SUMMARY", None)
    for name, value in job.get("variables", {}).items():
        env[name] = re.sub(r"\$(\w+)", lambda m: env.get(m.group(1), ""), str(value))
    return {**env, **more}


def test_the_component_runs_as_documented(fake_model: Fake, tmp_path: Path) -> None:
    """Its jobs, as GitLab would run them with these inputs: 2 shards in an image that has
    mm-batch (package ""), then the merge, which fails with the batch's verdict."""
    replies = dict(GOOD)
    replies[STATUS_EN] = [GOOD[STATUS_EN][1]]  # answers without running anything: fails
    fake = fake_model(by_prompt(replies))
    repo = hosted_repo(tmp_path)
    values = {
        "tasks": "tasks.yaml",
        "model": "hosted_vllm/fake",
        "package": "",
        "shards": 2,
        "api-key-variable": KEY,
        "out": "merged",
    }
    jobs = component_jobs(values)
    shards, report = jobs["mm-batch"], jobs["mm-batch-report"]
    secret = {KEY: "sk-test-gitlab", "FAKE_MODEL_URL": fake.url}
    for index in (1, 2):
        env = gitlab_env(
            shards, repo, {**secret, "CI_NODE_INDEX": str(index), "CI_NODE_TOTAL": "2"}
        )
        done = run_step("\n".join(component_session(shards)), repo, env)
        assert done.returncode == 0, done.stdout + done.stderr
    merged = run_step("\n".join(component_session(report)), repo, gitlab_env(report, repo, {}))
    assert merged.returncode == 1, merged.stdout + merged.stderr
    junit = repo / report["artifacts"]["reports"]["junit"]
    assert junit.is_file()
    summary = json.loads((repo / "merged" / "summary.json").read_text())
    assert [(t["task"], t["status"]) for t in summary["tasks"] if t["status"] != "passed"] == [
        ("status-en", "failed")
    ]
    # Without the key: the shard stops before running anything, saying which variable.
    shutil.rmtree(repo / "shards")
    env = gitlab_env(shards, repo, {"FAKE_MODEL_URL": fake.url, "CI_NODE_INDEX": "1"})
    env.pop(KEY, None)
    missing = run_step("\n".join(component_session(shards)), repo, env)
    assert missing.returncode == 2
    assert f"the CI/CD variable {KEY} is not set" in missing.stderr
    assert not (repo / "shards").exists()


# -- the image with mm-batch in it (containers/mm-batch, built by containers/build.sh) ----------

MM_BATCH_IMAGE = "mm-batch/mm-batch:hosted"


@pytest.mark.docker
def test_the_mm_batch_image_runs_the_release_example(fake_model: Fake, tmp_path: Path) -> None:
    """`mm-batch run` inside the image, as a CI job would run it with the checkout mounted."""
    docker = shutil.which("docker")
    if (
        docker is None
        or subprocess.run(
            [docker, "image", "inspect", MM_BATCH_IMAGE], capture_output=True, check=False
        ).returncode
    ):
        missing = f"{MM_BATCH_IMAGE} is not built here (containers/build.sh mm-batch)"
        if DOCKER_REQUIRED:  # .ci/run builds it
            pytest.fail(missing)
        pytest.skip(missing)
    fake = fake_model(by_prompt(GOOD))
    repo = hosted_repo(tmp_path)
    done = subprocess.run(
        [
            docker, "run", "--rm", "--network", "host", "--user", f"{os.getuid()}:{os.getgid()}",
            "-v", f"{repo}:/builds/project", "-w", "/builds/project",
            "-e", f"FAKE_MODEL_URL={fake.url}", "-e", f"{KEY}=sk-test-image", "-e", "HOME=/tmp",
            MM_BATCH_IMAGE,
            "mm-batch", "run", "tasks.yaml", "--model", "hosted_vllm/fake", "--out", "results",
        ],
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert (repo / "results" / "junit.xml").is_file()
    assert "| hosted_vllm/fake | 6/6 |" in (repo / "results" / "summary.md").read_text()
