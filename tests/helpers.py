"""What the tests share: the fixtures' types, project and model helpers, report checks.

A plain module: tests import from here, never from a test module or a conftest.py. A helper that
serves one family of tests lives beside it in a support module (`tests/run/scripted.py`,
`tests/providers/wire.py`, `tests/config/corpus.py`, `tests/consumers/shapes.py`, ...).
"""

from __future__ import annotations

import functools
import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
import threading
import time
import xml.etree.ElementTree as ET
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from html.parser import HTMLParser
from pathlib import Path
from typing import Any, Protocol

import pytest

from mm_batch import schemas
from mm_batch.config.local_catalog import LocalModel
from mm_batch.effects import litellm as litellm_effects
from mm_batch.effects.gguf import gguf_path
from mm_batch.schemas import SchemaName
from mm_batch.testing.fake_openai import (
    FakeOpenAI,
    Reply,
    Script,
    first_user_message,
    text,
    tool_call,
    turn,
)
from mm_batch.tools import text_calls

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "release"
JUNIT_XSD = ROOT.parent / "shared" / "data" / "junit-10.xsd"
STANDIN_LLAMA = ROOT / "tests" / "effects" / "standin_llama.py"
# .ci/run sets these: there the live suite (the real small model) and the comparison with a
# source build of llama.cpp must run, never skip.
LIVE_REQUIRED = os.environ.get("MM_BATCH_REQUIRE_LIVE") == "1"
SOURCE_BUILD_REQUIRED = os.environ.get("MM_BATCH_REQUIRE_SOURCE_BUILD") == "1"


# --- the fixtures' types (tests/conftest.py) -------------------------------------------------


@dataclass
class CliResult:
    code: int
    out: str
    err: str


class Cli(Protocol):
    """The `cli` fixture: mm-batch run in-process with these arguments, as from the shell."""

    def __call__(self, *args: str | Path, cwd: Path | None = None) -> CliResult: ...


class Fake(Protocol):
    """The `fake_model` fixture: a fake OpenAI-compatible server that plays `script`, each
    answer `latency_s` late; stopped when the test ends."""

    def __call__(self, script: Script, latency_s: float = 0.0) -> FakeOpenAI: ...


# --- projects ----------------------------------------------------------------------------


def write(directory: Path, name: str, text: str) -> Path:
    path = directory / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text).lstrip("\n"), encoding="utf-8")
    return path


def standin_llama(tmp_path: Path, model: LocalModel | None = None) -> dict[str, str]:
    """The environment that serves local models by the tests' stand-in llama-server
    (`tests/effects/standin_llama.py`, which notes its requests in `tmp_path`) instead of the
    local extra's server: MM_BATCH_LLAMA_SERVER names it, as a user names a build of their own.
    With `model`, the cache (MM_BATCH_CACHE, under `tmp_path`) holds a sparse file of its size
    marked verified, all that mm-batch checks of an assembled model."""
    binary = tmp_path / "llama-server"
    binary.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{STANDIN_LLAMA}" "$@"\n')
    binary.chmod(0o755)
    cache = tmp_path / "mm-batch-cache"
    if model is not None:
        gguf = cache / "models" / gguf_path(model).name
        gguf.parent.mkdir(parents=True, exist_ok=True)
        with gguf.open("wb") as sparse:
            sparse.truncate(model.size)
        gguf.with_suffix(".verified").write_text(model.sha256 + "\n")
    return {
        "MM_BATCH_LLAMA_SERVER": str(binary),
        "MM_BATCH_CACHE": str(cache),
        "LLAMA_STANDIN_DIR": str(tmp_path),
    }


def yolo_agent(
    name: str, description: str, command: str = '["true"]', parameters: str = "{}"
) -> str:
    """An agent.yaml with one tool the model may call without asking (`command` and
    `parameters` in YAML); more tools may be appended at the same indentation."""
    return (
        "yolo: true\n"
        "tools:\n"
        f"  - name: {name}\n"
        f"    description: {description}\n"
        f"    parameters: {parameters}\n"
        f"    command: {command}\n"
    )


# One tool, `ok`, that always succeeds.
OK_AGENT = yolo_agent("ok", "Do it.")

# A program that prints its argv (after argv[0]) as JSON: what really reached the process.
ARGV_PRINTER = textwrap.dedent(
    """\
    #!/usr/bin/env python3
    import json, sys
    print(json.dumps(sys.argv[1:]))
    """
)


# --- the release example (examples/release) ----------------------------------------------

RELEASE_EN = "Release version 1.4.2 to the beta channel."
RELEASE_FR = "Publie la version 1.4.2 sur le canal beta."
PKGTEST_EN = "Run the tests of the greet package."
PKGTEST_FR = "Lance les tests du paquet greet."
STATUS_EN = "What is the status of the billing service?"
STATUS_FR = "Quel est l'état du service billing ?"

# The replies that pass every task of the example, by prompt.
GOOD: dict[str, list[Reply]] = {
    RELEASE_EN: [tool_call("release", {"version": "1.4.2", "channel": "beta"}), text("Done.")],
    RELEASE_FR: [tool_call("release", {"version": "1.4.2", "channel": "beta"}), text("Fait.")],
    PKGTEST_EN: [tool_call("pkgtest", {"package": "greet"}), text("Passed.")],
    PKGTEST_FR: [tool_call("pkgtest", {"package": "greet"}), text("Réussi.")],
    STATUS_EN: [tool_call("status", {"service": "billing"}), text("Running.")],
    STATUS_FR: [tool_call("status", {"service": "billing"}), text("En marche.")],
}


def received(example: Path) -> list[str]:
    """The calls the example's scripts logged (calls-received.log), in order."""
    log = example / "calls-received.log"
    return log.read_text().splitlines() if log.exists() else []


# --- a repeated task that fails once -------------------------------------------------------

FLAKY_TASKS = """\
agent: agent.yaml
repeat: 3
min_pass_rate: 0.6
jobs: 1
tasks:
  - id: publish
    prompt: Publish.
    expect:
      calls: [{tool: ok}]
"""


def flaky_script(fail_conversation: int) -> Script:
    """Each new conversation of "Publish" runs `ok` except the n-th, which answers at once."""
    lock = threading.Lock()
    seen = {"publish": 0}

    def script(request: dict[str, Any]) -> Any:
        if turn(request) > 0:
            return text("Done.")
        with lock:
            seen["publish"] += 1
            bad = seen["publish"] == fail_conversation
        return text("I will not.") if bad else tool_call("ok", {})

    return script


# --- models --------------------------------------------------------------------------------


def model_args(server: FakeOpenAI) -> list[str]:
    return ["--model", "hosted_vllm/fake", "--model-option", f"api_base={server.url}"]


PRICED_MODEL = "openai/gpt-4o-mini"  # in litellm's bundled price map


def priced_model_args(server: FakeOpenAI, model: str = PRICED_MODEL) -> list[str]:
    """The options that send `model` (one litellm prices, by default) to the fake server;
    litellm's OpenAI client wants a key, which the fake server never reads."""
    return [
        "--model",
        model,
        "--model-option",
        f"api_base={server.url}",
        "--model-option",
        "api_key=not-a-real-key",
    ]


def turn_usd() -> float:
    """One fake turn (10 prompt, 5 completion tokens) at litellm's bundled prices."""
    price = litellm_effects.load_litellm().model_cost["gpt-4o-mini"]
    return float(10 * price["input_cost_per_token"] + 5 * price["output_cost_per_token"])


def prompts_asked(fake: FakeOpenAI) -> list[str]:
    """The prompts of the conversations the server saw, in order."""
    return [first_user_message(r) for r in fake.requests if turn(r) == 0]


# --- reading a results folder -------------------------------------------------------------


def read_calls(out: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (out / "calls.jsonl").read_text().splitlines()]


def case_verdicts(out: Path) -> dict[str, str]:
    """Each test case of out/junit.xml by name: its verdict's tag, or "passed"."""
    return {
        c.get("name", ""): next((e.tag for e in c if e.tag != "system-out"), "passed")
        for c in ET.parse(out / "junit.xml").getroot().iter("testcase")
    }


# --- checking reports against the schemas ----------------------------------------------------


def _truthy(value: str | None) -> bool:
    return (value or "").strip().lower() in ("true", "1", "yes")


@functools.cache
def _xsd(path: Path) -> Any:
    import xmlschema

    return xmlschema.XMLSchema(str(path))


@functools.cache
def json_validator(name: SchemaName) -> Any:
    """A validator of one of the project's JSON Schemas (draft 2020-12), formats checked."""
    import jsonschema

    schema = json.loads(schemas.path(name).read_text(encoding="utf-8"))
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(
        schema, format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER
    )


def check_json(name: SchemaName, document: object, where: str) -> None:
    """Fail with every schema error of `document`, each with its JSON path."""
    errors = sorted(json_validator(name).iter_errors(document), key=lambda e: list(e.path))
    if errors:
        shown = "\n".join(f"  {e.json_path}: {e.message[:300]}" for e in errors[:20])
        pytest.fail(f"{where} is not valid against {name}:\n{shown}", pytrace=False)


def check_junit(
    path: Path, shared_xsd: Path = JUNIT_XSD, environ: Mapping[str, str] = os.environ
) -> None:
    """junit.xml against the project's XSD always, and against the common JUnit XSD of the
    shared documents where they lie beside the checkout; under CI=true they must be there."""
    _xsd(schemas.path("junit.xsd")).validate(str(path))
    if shared_xsd.exists():
        _xsd(shared_xsd).validate(str(path))
    elif _truthy(environ.get("CI")):
        pytest.fail(
            f"CI=true but the common JUnit XSD is not at {shared_xsd}: CI must check the "
            "reports against it (check out the shared documents beside the project)",
            pytrace=False,
        )
    # What an XSD 1.0 cannot say: the counts agree, one verdict a test case, SPEC 7's attributes.
    root = ET.parse(path).getroot()
    totals = {"tests": 0, "failures": 0, "errors": 0}
    for suite in root:
        cases = suite.findall("testcase")
        verdicts = [[r.tag for r in c if r.tag in _VERDICTS] for c in cases]
        assert all(len(v) <= 1 for v in verdicts), f"{path}: a test case with {verdicts}"
        counts = {
            "tests": len(cases),
            "failures": sum(v == ["failure"] for v in verdicts),
            "errors": sum(v == ["error"] for v in verdicts),
        }
        assert {k: int(suite.attrib[k]) for k in counts} == counts, f"{path}: {suite.attrib}"
        skipped = sum(v == ["skipped"] for v in verdicts)
        assert int(suite.get("skipped", "0")) == skipped, f"{path}: {suite.attrib}"
        assert set(suite.attrib) >= _SUITE_ATTRIBUTES, f"{path}: {suite.attrib}"
        assert _RFC3339.fullmatch(suite.attrib["timestamp"]), f"{path}: {suite.attrib}"
        for key in totals:
            totals[key] += counts[key]
        for case in cases:
            assert set(case.attrib) == {"name", "classname", "time"}, case.attrib
    for key, value in totals.items():
        assert int(root.get(key, "-1")) == value, f"{path}: testsuites {key}={root.get(key)}"


_VERDICTS = ("failure", "error", "skipped", "flakyFailure", "flakyError")
# SPEC 7: each <testsuite> carries the tasks file, when it ran and where.
_SUITE_ATTRIBUTES = {"name", "tests", "failures", "errors", "time", "file", "timestamp", "hostname"}
_RFC3339 = re.compile(
    r"[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}(\.[0-9]+)?(Z|[+-][0-9]{2}:[0-9]{2})"
)


def check_report(path: Path) -> None:
    """Validate a results folder by its junit.xml: the JUnit report (see `check_junit`), and
    summary.json and every calls.jsonl record beside it against the project's JSON Schemas."""
    check_junit(path)
    folder = path.parent
    summary = json.loads((folder / "summary.json").read_text(encoding="utf-8"))
    check_json("summary.schema.json", summary, str(folder / "summary.json"))
    cases = ET.parse(path).getroot().iter("testcase")
    assert len(summary["runs"]) == sum(1 for _ in cases), "summary.json and junit.xml disagree"
    last: dict[str, dict[str, Any]] = {}
    lines = (folder / "calls.jsonl").read_text(encoding="utf-8").splitlines()
    for number, line in enumerate(lines, 1):
        record = json.loads(line)
        where = f"{folder / 'calls.jsonl'}:{number}"
        check_json("calls.schema.json", record, where)
        before = last.get(record["run"])
        # Each run's records count from 1 without a gap, and its task record comes last.
        assert record["seq"] == (before["seq"] + 1 if before else 1), f"{where}: seq"
        assert before is None or before["kind"] != "task", f"{where}: a record after the verdict"
        last[record["run"]] = record


# --- processes -----------------------------------------------------------------------------


def run_until_marker(
    tasks: Path, server: FakeOpenAI, out: Path, marker: Path, *options: str
) -> subprocess.Popen[bytes]:
    """Start `mm-batch run` (with `options`) as its own process; return once a tool has created
    the marker."""
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "mm_batch",
            "run",
            str(tasks),
            *model_args(server),
            "--out",
            str(out),
            *options,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        cwd=tasks.parent,
    )
    deadline = time.monotonic() + 60
    while not marker.exists():
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "the tool never started"
        time.sleep(0.05)
    return proc


def live_members(pgid: int) -> list[int]:
    """Processes of the group that still run (a zombie waiting for its reaper does not)."""
    listing = subprocess.run(
        ["ps", "-e", "-o", "pid=,pgid=,stat="], capture_output=True, text=True, check=True
    ).stdout
    return [
        int(pid)
        for pid, group, state in (line.split()[:3] for line in listing.splitlines())
        if int(group) == pgid and not state.startswith("Z")
    ]


# --- programs a test needs installed -------------------------------------------------------


def consumers_required() -> bool:
    """MM_BATCH_REQUIRE_CONSUMERS=1 (CI): a consumer that is missing is a failure, not a skip."""
    return os.environ.get("MM_BATCH_REQUIRE_CONSUMERS", "").strip() in ("1", "true", "yes")


def require(what: str, found: bool, how: str) -> None:
    """Skip when a consumer is not installed (a fresh clone), fail under
    MM_BATCH_REQUIRE_CONSUMERS=1 (CI, where it must have been installed)."""
    if found:
        return
    message = f"{what} is not installed; install it with: {how}"
    if consumers_required():
        pytest.fail(f"{message} (MM_BATCH_REQUIRE_CONSUMERS=1: it must run)", pytrace=False)
    pytest.skip(message)


# --- a page as headless Chromium draws it ------------------------------------------------------

_VOID = {
    "area",
    "base",
    "br",
    "col",
    "embed",
    "hr",
    "img",
    "input",
    "link",
    "meta",
    "source",
    "wbr",
}


@dataclass
class Node:
    tag: str
    attrs: dict[str, str]
    children: list[Node | str] = field(default_factory=list)

    @property
    def classes(self) -> set[str]:
        return set(self.attrs.get("class", "").split())

    def text(self) -> str:
        if self.tag in ("script", "style"):
            return ""
        return "".join(c if isinstance(c, str) else c.text() for c in self.children)

    def find_all(self, tag: str, *classes: str) -> list[Node]:
        found = []
        for child in self.children:
            if isinstance(child, Node):
                if child.tag == tag and set(classes) <= child.classes:
                    found.append(child)
                found.extend(child.find_all(tag, *classes))
        return found


class _Tree(HTMLParser):
    """The DOM as Chromium serialised it, as a tree of nodes."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.root = Node("#document", {})
        self._open = [self.root]

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        node = Node(tag, {k: v or "" for k, v in attrs})
        self._open[-1].children.append(node)
        if tag not in _VOID:
            self._open.append(node)

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self._open[-1].children.append(Node(tag, {k: v or "" for k, v in attrs}))

    def handle_endtag(self, tag: str) -> None:
        for depth in range(len(self._open) - 1, 0, -1):
            if self._open[depth].tag == tag:
                del self._open[depth:]
                return

    def handle_data(self, data: str) -> None:
        self._open[-1].children.append(data)


def dom(html: str) -> Node:
    tree = _Tree()
    tree.feed(html)
    tree.close()
    return tree.root


def chromium() -> str | None:
    return next(
        (
            found
            for name in ("chromium", "chromium-browser", "google-chrome")
            if (found := shutil.which(name))
        ),
        None,
    )


def draw(
    browser: str, address: str, profile: Path, budget_ms: int = 15000
) -> subprocess.CompletedProcess[str]:
    """The DOM headless Chromium draws from a page once its scripts ran, with no network (on
    stdout), and what the page logged to its console (on stderr)."""
    return subprocess.run(
        [
            browser,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--no-first-run",
            "--disable-background-networking",
            f"--user-data-dir={profile}",
            # Nothing may come from the network: a CDN the page needed would leave it blank.
            "--proxy-server=127.0.0.1:9",
            "--host-resolver-rules=MAP * ~NOTFOUND",
            # Tall enough that every test card is in view, so that it is drawn.
            "--window-size=1280,12000",
            f"--virtual-time-budget={budget_ms}",
            "--enable-logging=stderr",
            "--v=0",
            "--dump-dom",
            address,
        ],
        capture_output=True,
        text=True,
        timeout=180,
        check=True,
    )


# --- a model that has not answered yet -------------------------------------------------------


class HeldReply:
    """A script whose every answer is `reply`, held back until `release()` (at most `hold_s`):
    a call or a run that ended while `given` is 0 ended without waiting for the model. Use it as
    a context manager, so that the held requests are let go before the server stops."""

    def __init__(self, reply: Reply, hold_s: float = 120.0) -> None:
        self._reply = reply
        self._hold_s = hold_s
        self._released = threading.Event()
        self._lock = threading.Lock()
        self.given = 0

    def __call__(self, _request: dict[str, Any]) -> Reply:
        self._released.wait(self._hold_s)
        with self._lock:
            self.given += 1
        return self._reply

    def release(self) -> None:
        self._released.set()

    def __enter__(self) -> HeldReply:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.release()


# --- waiting, and work counted instead of timed ----------------------------------------------
# No test compares elapsed time to a bound (tests/test_test_layout.py checks it): a test asserts
# the order of events, or counts the work done; speed goals are benchmarks (benchmarks/).

# Added to a deadline the product promises (its own constant, read from the code), for a machine
# loaded with other work: the one way a wall-clock figure enters a test.
SLACK_S = 10.0


def wait_for(predicate: Callable[[], bool], what: str, give_up_after: float = 120.0) -> None:
    """Poll until `predicate()` holds, failing with `what` once `give_up_after` seconds passed.

    The give-up only turns a hang into a failure that says what never happened; it claims no
    speed, unless a test passes a deadline the product promises (its constant plus SLACK_S).
    """
    deadline = time.monotonic() + give_up_after
    while not predicate():
        if time.monotonic() > deadline:
            pytest.fail(f"gave up after {give_up_after:g} s waiting until {what}", pytrace=False)
        time.sleep(0.05)


class RescueMeter:
    """The text rescue's work (tools/text_calls.py) in characters, not seconds: those handed to
    the JSON decoder and those walked to skip a malformed value, against what its budget allows
    for the texts it was given (linear in them). Past that bound the next decode fails with an
    AssertionError, so that a quadratic rescue fails the test at once instead of running for
    hours; `over` then says by how much. Installed for the test through `monkeypatch`, on
    `recover_tool_calls` as the loop calls it and as the test module imports it."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        from mm_batch.run import loop

        self.texts: list[int] = []  # the length of each text rescued
        self.decoded = 0
        self.walked = 0
        self.over: str | None = None
        self._decoder = text_calls._DECODER
        self._span_end = text_calls._span_end
        self._recover = text_calls.recover_tool_calls
        monkeypatch.setattr(text_calls, "_DECODER", self)
        monkeypatch.setattr(text_calls, "_span_end", self._walk)
        monkeypatch.setattr(text_calls, "recover_tool_calls", self.recover_tool_calls)
        monkeypatch.setattr(loop, "recover_tool_calls", self.recover_tool_calls)

    @property
    def decode_bound(self) -> int:
        """The budget of each text, plus the one attempt that may begin before it runs out."""
        return sum(
            text_calls.BUDGET_PER_CHAR * n + text_calls.BUDGET_FLOOR + 2 * text_calls.CALL_LIMIT
            for n in self.texts
        )

    def recover_tool_calls(self, text: str, known: Collection[str]) -> list[text_calls.TextCall]:
        self.texts.append(len(text))
        return self._recover(text, known)

    def raw_decode(self, piece: str) -> tuple[object, int]:
        self.decoded += len(piece)
        if self.decoded > self.decode_bound:
            self.over = f"decoded {self.decoded} characters of texts of {self.texts}"
            raise AssertionError(self.over)
        return self._decoder.raw_decode(piece)

    def _walk(self, text: str, index: int) -> int:
        end = self._span_end(text, index)
        self.walked += end - index
        if self.walked > sum(self.texts):
            self.over = f"walked {self.walked} characters of texts of {self.texts}"
            raise AssertionError(self.over)
        return end
