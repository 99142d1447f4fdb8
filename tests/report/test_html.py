"""report.html: one self-contained page per results folder, drawn in a real headless Chromium.

The page must load with no network and no console error, show the right counts, list failing
runs first, filter by status, model and task, and show whatever a model or a command wrote as
text: a model's `<script>` stays text and never runs.
"""

from __future__ import annotations

import re
import shlex
import tempfile
from pathlib import Path
from typing import Any

import pytest

from mm_batch.testing.fake_openai import (
    first_user_message,
    text,
    tool_call,
    turn,
)
from tests.helpers import Cli, Fake, Node, chromium, dom, draw, model_args, require, yolo_agent

HOSTILE = "<script>document.title='pwned'</script><img src=x onerror=alert(1)>"

AGENT = yolo_agent("shout", "Print a line.", '["echo", "{{line}}"]', "{line: {type: string}}")

TASKS = """\
agent: agent.yaml
tasks:
  - id: quiet
    prompt: Say nothing.
  - id: loud
    prompt: Shout it.
    expect:
      answer_contains: [never said]
"""


def _script(request: dict[str, Any]) -> Any:
    if first_user_message(request) == "Say nothing.":
        return text("Nothing.")
    if turn(request) == 0:
        return tool_call("shout", {"line": HOSTILE})
    return text(f"Shouted {HOSTILE}")


@pytest.fixture
def results(cli: Cli, fake_model: Fake, tmp_path: Path) -> Path:
    (tmp_path / "agent.yaml").write_text(AGENT)
    (tmp_path / "tasks.yaml").write_text(TASKS)
    out = tmp_path / "out"
    fake = fake_model(_script)
    models = ["--model", "hosted_vllm/a", "--model", "hosted_vllm/b"]
    result = cli("run", tmp_path / "tasks.yaml", *model_args(fake)[2:], *models, "--out", out)
    assert result.code == 1, result.err
    return out


def _runs(tree: Node) -> list[Node]:
    return [d for d in tree.find_all("details") if "run" in d.classes]


def test_the_page_lists_failing_runs_first_with_everything_escaped(results: Path) -> None:
    page = (results / "report.html").read_text()
    tree = dom(page)
    runs = _runs(tree)
    assert [r.attrs["data-status"] for r in runs] == ["failed", "failed", "passed", "passed"]
    assert {r.attrs["data-model"] for r in runs} == {"hosted_vllm/a", "hosted_vllm/b"}
    loud = runs[0]
    shown = loud.text()
    assert "Shout it." in shown  # the prompt
    assert "answer_contains" in shown  # the check that was not met
    assert f"$ {shlex.join(['echo', HOSTILE])}" in shown  # the argv as it ran, shell-quoted
    assert f"{HOSTILE}\n" in shown  # its stdout, as text
    assert len(tree.find_all("script")) == 1  # only the page's own
    assert not tree.find_all("img")
    assert not re.search(r"<(script|link|img)[^>]+(src|href)=", page)  # nothing fetched


@pytest.fixture(scope="module")
def browser() -> str:
    found = chromium()
    require("Chromium", found is not None, "apt-get install chromium")
    assert found is not None
    return found


def _drawn(browser: str, page: Path, fragment: str = "") -> tuple[Node, str]:
    with tempfile.TemporaryDirectory(prefix="mm-batch-html-") as profile:
        drawn = draw(browser, page.as_uri() + fragment, Path(profile))
    return dom(drawn.stdout), drawn.stderr


def _by_id(tree: Node, name: str) -> str:
    found = [n for tag in ("span", "p") for n in tree.find_all(tag) if n.attrs.get("id") == name]
    assert len(found) == 1, name
    return found[0].text()


def test_chromium_draws_the_counts_and_runs_no_script_of_a_model(
    browser: str, results: Path
) -> None:
    tree, console = _drawn(browser, results / "report.html")
    assert (_by_id(tree, "n-runs"), _by_id(tree, "n-passed"), _by_id(tree, "n-failed")) == (
        "4",
        "2",
        "2",
    )
    # The page's own script ran (the policy allowed it by its hash): it counted what it shows.
    assert _by_id(tree, "shown") == "4"
    titles = tree.find_all("title")
    assert titles and "pwned" not in titles[0].text()
    assert not tree.find_all("img")
    assert HOSTILE in tree.text()
    assert "Uncaught" not in console and "Content Security Policy" not in console, console


def test_a_link_sets_the_filters(browser: str, results: Path) -> None:
    tree, _ = _drawn(browser, results / "report.html", "#status=failed&model=hosted_vllm/b")
    visible = [r for r in _runs(tree) if "hidden" not in r.classes]
    assert [(r.attrs["data-task"], r.attrs["data-model"]) for r in visible] == [
        ("loud", "hosted_vllm/b")
    ]
    assert _by_id(tree, "shown") == "1"
    tree, _ = _drawn(browser, results / "report.html", "#task=QUI")
    assert {r.attrs["data-task"] for r in _runs(tree) if "hidden" not in r.classes} == {"quiet"}


def test_merge_writes_the_page_of_every_shard_with_its_prompts(
    cli: Cli, fake_model: Fake, tmp_path: Path
) -> None:
    (tmp_path / "agent.yaml").write_text(AGENT)
    (tmp_path / "tasks.yaml").write_text(TASKS)
    fake = fake_model(_script)
    shards = []
    for k in (1, 2):
        shard = tmp_path / f"shard{k}"
        cli("run", tmp_path / "tasks.yaml", *model_args(fake), "--shard", f"{k}/2", "--out", shard)
        shards.append(shard)
    assert cli("merge", *shards, "--out", tmp_path / "merged").code == 0
    tree = dom((tmp_path / "merged" / "report.html").read_text())
    runs = _runs(tree)
    assert [r.attrs["data-task"] for r in runs] == ["loud", "quiet"]  # failing first
    assert "Shout it." in runs[0].text() and "Say nothing." in runs[1].text()
    assert _by_id(tree, "n-failed") == "1"


def test_a_secret_in_the_prompt_is_masked_in_the_task_record_and_the_page(
    cli: Cli, fake_model: Fake, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    secret = "tok-5521-prompt"
    monkeypatch.setenv("DEPLOY_TOKEN", secret)
    (tmp_path / "agent.yaml").write_text(AGENT)
    (tmp_path / "tasks.yaml").write_text(
        f"agent: agent.yaml\ntasks:\n  - id: t\n    prompt: Deploy with {secret}.\n"
    )
    out = tmp_path / "out"
    fake = fake_model(lambda request: text("Done."))
    assert cli("run", tmp_path / "tasks.yaml", *model_args(fake), "--out", out).code == 0
    for path in out.iterdir():
        assert secret not in path.read_text(encoding="utf-8"), path.name
    assert "Deploy with ***." in (out / "report.html").read_text()
    merged = tmp_path / "merged"
    assert cli("merge", out, "--out", merged).code == 0
    assert secret not in (merged / "report.html").read_text()
