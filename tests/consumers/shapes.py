"""The project's reports in the five shapes a CI page must show right, made by real `mm-batch
run` (and `merge`) invocations over the fake OpenAI server, and what each must show.

What a report must show is worked out here from the files this module writes and from the
runs' own records (calls.jsonl), never from junit.xml: the consumers' readings are then checked
against it.
"""

from __future__ import annotations

import io
import json
import re
import threading
from collections.abc import Sequence
from contextlib import redirect_stderr, redirect_stdout
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import pytest

from mm_batch.cli import main
from mm_batch.testing.fake_openai import FakeOpenAI, HttpFailure, Reply, by_prompt, text, tool_call

# A model name with a `.` and a `/`: the classname shows it as `hosted_vllm_acme_coder-7b`.
MODEL = "hosted_vllm/acme.coder-7b"
MODEL_CLASS = "hosted_vllm_acme_coder-7b"
QUOTA = "error: quota exceeded for project acme (0 of 3 deploys left this hour)"
UNKNOWN = "status: unknown service payroll"

AGENT = """\
yolo: true
tools:
  - name: status
    description: Report the status of one service.
    parameters:
      service: {type: string, description: "The service name, e.g. billing."}
    command: ["./status.sh", "{{service}}"]
  - name: deploy
    description: Deploy a version of the product.
    parameters:
      version: {type: string, description: "The version, e.g. 2.0."}
    command: ["./deploy.sh", "{{version}}"]
"""

STATUS_SH = f"""\
#!/bin/sh
case "$1" in
  billing|search|mail) echo "Service $1: running, 3 instances healthy." ;;
  *) echo "looking up $1"; echo "{UNKNOWN.replace("payroll", "$1")}" >&2; exit 2 ;;
esac
"""

DEPLOY_SH = f"""\
#!/bin/sh
echo "deploying version $1"
echo "{QUOTA}" >&2
exit 1
"""

BILLING = "What is the status of the billing service?"
SEARCH = "What is the status of the search service?"
MAIL = "What is the status of the mail service?"
DEPLOY_2 = "Deploy version 2.0."
DEPLOY_3 = "Deploy version 3.0."
HELLO = "Say hello."


def _status(service: str) -> list[Reply]:
    return [tool_call("status", {"service": service}), text(f"{service} is running.")]


CONVERSATIONS: dict[str, list[Reply]] = {
    BILLING: _status("billing"),
    SEARCH: _status("search"),
    MAIL: _status("mail"),
    DEPLOY_2: [tool_call("deploy", {"version": "2.0"}), text("The deploy did not go through.")],
    DEPLOY_3: [tool_call("deploy", {"version": "3.0"}), text("The deploy did not go through.")],
    HELLO: [text("hello")],
}


def _task(task_id: str, prompt: str, expect: str) -> str:
    return f"  - id: {task_id}\n    prompt: {json.dumps(prompt)}\n    expect:\n{expect}"


STATUS_OK = "      calls: [{tool: status, args: {service: %s}}]\n      exit_code: 0\n"
DEPLOYED = (
    '      calls: [{tool: deploy, args: {version: "%s"}, times: 1}]\n'
    "      exit_code: 0\n"
    "      answer_contains: [deployed]\n"
)
HELLO_OK = "      answer_contains: [hello]\n"

TASKS = {
    "pass": "tasks:\n"
    + _task("billing-status", BILLING, STATUS_OK % "billing")
    + _task("hello", HELLO, HELLO_OK),
    "fail": "# A deploy that the tool refuses: its stderr must reach the CI page.\ntasks:\n"
    + _task("billing-status", BILLING, STATUS_OK % "billing")
    + _task("deploy", DEPLOY_2, DEPLOYED % "2.0"),
    "error": "tasks:\n" + _task("billing-status", BILLING, STATUS_OK % "billing"),
    "flaky": "repeat: 3\nmin_pass_rate: 0.6\njobs: 1\ntasks:\n"
    + _task("billing-status", BILLING, STATUS_OK % "billing"),
    "sharded": "tasks:\n"
    + _task("billing-status", BILLING, STATUS_OK % "billing")
    + _task("deploy-2", DEPLOY_2, DEPLOYED % "2.0")
    + _task("search-status", SEARCH, STATUS_OK % "search")
    + _task("deploy-3", DEPLOY_3, DEPLOYED % "3.0")
    + _task("mail-status", MAIL, STATUS_OK % "mail")
    + _task("hello", HELLO, HELLO_OK),
}

Kind = Literal["failure", "error", "flakyFailure"]


@dataclass(frozen=True)
class Failing:
    """One run that did not pass, and what a CI user must be shown about it."""

    case: str  # the test case's name: the task id, `#r` with repeats
    task: str
    model: str
    kind: Kind
    reason: str  # as mm-batch recorded it (calls.jsonl)
    checks: tuple[tuple[str, str], ...]  # each check's name and detail, as recorded
    stderr: str | None  # a line the failing command printed on stderr, if a command failed
    line: int  # the task's line in the tasks file, counted here from the file written


@dataclass(frozen=True)
class Shape:
    """One results folder and what its junit.xml must say."""

    name: str
    folder: Path
    code: int  # the exit code of `mm-batch run` (of the shards' runs, for a merge)
    tasks_file: str  # as the report names it: relative to the working directory
    order: tuple[str, ...]  # the test cases' names in plan order
    failing: tuple[Failing, ...]

    @property
    def junit(self) -> Path:
        return self.folder / "junit.xml"

    @property
    def counts(self) -> dict[str, int]:
        """tests / failures / errors / skipped, as they must be read."""
        kinds = [f.kind for f in self.failing]
        return {
            "tests": len(self.order),
            "failures": kinds.count("failure"),
            "errors": kinds.count("error"),
            "skipped": 0,
        }


@dataclass(frozen=True)
class Reports:
    passing: Shape
    failing: Shape
    error: Shape
    flaky: Shape
    merged: Shape

    def all(self) -> tuple[Shape, ...]:
        return (self.passing, self.failing, self.error, self.flaky, self.merged)


def task_line(tasks: Path, task_id: str) -> int:
    """The 1-based line of the task's `- id:` item, read from the file itself."""
    lines = tasks.read_text(encoding="utf-8").splitlines()
    return next(n for n, line in enumerate(lines, 1) if line.strip() == f"- id: {task_id}")


# What the runs must not inherit from a CI that runs this suite: GitHub's annotations and step
# summary, and a workspace that would change the `file` the report names.
_NOT_INHERITED = ("GITHUB_ACTIONS", "GITHUB_STEP_SUMMARY", "GITHUB_WORKSPACE")


def mm_batch(args: Sequence[str | Path], cwd: Path) -> tuple[int, str, str]:
    """mm-batch in this process, from `cwd`, as a user would run it from the shell."""
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(cwd)
        for name in _NOT_INHERITED:
            patch.delenv(name, raising=False)
        out, err = io.StringIO(), io.StringIO()
        with redirect_stdout(out), redirect_stderr(err):
            code = main([str(a) for a in args])
    return code, out.getvalue(), err.getvalue()


def _records(folder: Path) -> list[dict[str, Any]]:
    lines = (folder / "calls.jsonl").read_text(encoding="utf-8").splitlines()
    return [json.loads(line) for line in lines]


def _failing(folder: Path, tasks: Path, flaky: bool = False) -> tuple[Failing, ...]:
    """The runs of this folder that did not pass, from their own records."""
    records = _records(folder)
    found = []
    for task in (r for r in records if r["kind"] == "task" and r["status"] != "passed"):
        stderr = [
            r["stderr"]
            for r in records
            if r["run"] == task["run"]
            and r["kind"] == "tool"
            and r.get("exit_code") not in (0, None)
        ]
        plain: Kind = "failure" if task["status"] == "failed" else "error"
        found.append(
            Failing(
                case=task["task"] if not flaky else f"{task['task']}#{task['repeat']}",
                task=task["task"],
                model=task["model"],
                kind="flakyFailure" if flaky and plain == "failure" else plain,
                reason=task["reason"],
                checks=tuple((c["check"], c["detail"]) for c in task["checks"]),
                stderr=stderr[0].strip().splitlines()[-1] if stderr else None,
                line=task_line(tasks, task["task"]),
            )
        )
    return tuple(sorted(found, key=lambda f: f.case))


def _write_project(root: Path) -> Path:
    """The agent, its tools and every tasks file, in a `suite/` folder under `root`."""
    suite = root / "suite"
    suite.mkdir(parents=True)
    (suite / "agent.yaml").write_text(AGENT, encoding="utf-8")
    for name, script in (("status.sh", STATUS_SH), ("deploy.sh", DEPLOY_SH)):
        (suite / name).write_text(script, encoding="utf-8")
        (suite / name).chmod(0o755)
    for name, body in TASKS.items():
        (suite / f"{name}.yaml").write_text("agent: agent.yaml\n" + body, encoding="utf-8")
    return suite


def _flaky_script() -> Any:
    """The second run of three asks for the wrong service; the others for the right one."""
    lock = threading.Lock()
    starts = [0]
    good = by_prompt(CONVERSATIONS)
    wrong = by_prompt({BILLING: _status("payroll")})

    def script(request: dict[str, Any]) -> Reply:
        first_turn = not any(m.get("role") == "assistant" for m in request.get("messages", []))
        with lock:
            if first_turn:
                starts[0] += 1
            bad = starts[0] == 2
        return wrong(request) if bad else good(request)

    return script


def _order(tasks: Path, repeats: int = 1) -> tuple[str, ...]:
    ids = re.findall(r"^  - id: (\S+)$", tasks.read_text(encoding="utf-8"), flags=re.M)
    if repeats == 1:
        return tuple(ids)
    return tuple(f"{i}#{r}" for i in ids for r in range(1, repeats + 1))


def build(root: Path) -> Reports:
    """Run every shape once; `root` is the working directory, as a CI job's checkout."""
    suite = _write_project(root)
    shapes: dict[str, Shape] = {}

    def model_args(server: FakeOpenAI) -> list[str]:
        return ["--model", MODEL, "--model-option", f"api_base={server.url}"]

    def run(name: str, server: FakeOpenAI, *extra: str, folder: str | None = None) -> int:
        out = root / "results" / (folder or name)
        code, _out, err = mm_batch(
            ["run", f"suite/{name}.yaml", *model_args(server), "--out", out, *extra], root
        )
        assert (out / "junit.xml").is_file(), f"mm-batch run {name} wrote no junit.xml: {err}"
        return code

    with FakeOpenAI(by_prompt(CONVERSATIONS)) as good:
        for name in ("pass", "fail"):
            code = run(name, good)
            tasks = suite / f"{name}.yaml"
            shapes[name] = Shape(
                name,
                root / "results" / name,
                code,
                f"suite/{name}.yaml",
                _order(tasks),
                _failing(root / "results" / name, tasks),
            )
        shard_codes = [
            run("sharded", good, "--shard", f"{k}/3", folder=f"shard-{k}") for k in (1, 2, 3)
        ]
    with FakeOpenAI(lambda _request: HttpFailure(401, "Incorrect API key provided")) as refusing:
        code = run("error", refusing)
        shapes["error"] = Shape(
            "error",
            root / "results" / "error",
            code,
            "suite/error.yaml",
            _order(suite / "error.yaml"),
            _failing(root / "results" / "error", suite / "error.yaml"),
        )
    with FakeOpenAI(_flaky_script()) as flaky:
        code = run("flaky", flaky)
        shapes["flaky"] = Shape(
            "flaky",
            root / "results" / "flaky",
            code,
            "suite/flaky.yaml",
            _order(suite / "flaky.yaml", repeats=3),
            _failing(root / "results" / "flaky", suite / "flaky.yaml", flaky=True),
        )
    merged = root / "results" / "merged"
    shards = [root / "results" / f"shard-{k}" for k in (1, 2, 3)]
    code, _out, err = mm_batch(["merge", *shards, "--out", merged], root)
    assert code == 0, f"mm-batch merge failed: {err}"
    failing = tuple(f for shard in shards for f in _failing(shard, suite / "sharded.yaml"))
    shapes["merged"] = Shape(
        "merged",
        merged,
        max(shard_codes),
        "suite/sharded.yaml",
        _order(suite / "sharded.yaml"),
        tuple(sorted(failing, key=lambda f: f.case)),
    )
    return Reports(
        shapes["pass"], shapes["fail"], shapes["error"], shapes["flaky"], shapes["merged"]
    )


def missing_from(shown: str, failing: Failing, tasks_file: str) -> list[str]:
    """What a CI user must see of a run that did not pass and that `shown` lacks: the task, the
    model (as given, or as its classname spells it), the reason, every check, the stderr of the
    command that failed, and the task's line."""
    wanted = {
        f"the task ({failing.case})": failing.case in shown,
        f"the model ({failing.model})": failing.model in shown or MODEL_CLASS in shown,
        f"the reason ({failing.reason!r})": failing.reason in shown,
        f"the task's line ({tasks_file}:{failing.line})": (
            f"task defined at {tasks_file}:{failing.line}" in shown
        ),
    }
    for name, detail in failing.checks:
        wanted[f"the check {name} ({detail!r})"] = name in shown and detail in shown
    if failing.stderr is not None:
        wanted[f"the command's stderr ({failing.stderr!r})"] = failing.stderr in shown
    return [what for what, ok in wanted.items() if not ok]


def assert_shows(consumer: str, shown: str, failing: Failing, tasks_file: str) -> None:
    missing = missing_from(shown, failing, tasks_file)
    assert not missing, (
        f"{consumer} does not show {'; '.join(missing)} for {failing.case}; it shows:\n{shown}"
    )
