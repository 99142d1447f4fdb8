"""summary.md through GitHub's own renderer: what a model or a command wrote shows as text.

cmark-gfm (the `cmarkgfm` binding of GitHub's C library) with the extensions GitHub enables
renders the summary; nothing that came from a run may become a link, an autolink, an image or
any other element, and the text a reader sees is the text the run produced.
"""

from __future__ import annotations

import html
import re
import string
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mm_batch.report.summary import markdown_text, one_line, summary_markdown
from mm_batch.run.records import RunResult, Status
from mm_batch.testing.fake_openai import by_prompt, text, tool_call
from tests.helpers import Cli, Fake, model_args, write
from tests.report.github_markdown import cells, render, seen

HOSTILE = [
    "[x](http://e.vil)",
    "[x]: http://e.vil",
    "<details><summary>open</summary>hidden</details>",
    "<img src=x onerror=alert(1)>",
    "![i](http://e.vil/i.png)",
    "http://e.vil",
    "https://e.vil/path?q=1&r=2",
    "www.evil.com",
    "a@b.co",
    "mailto:a@b.co",
    "xmpp:a@b.co/x",
    "see foo.bar@ex.ample.com now",
    "@octocat",
    "`code` and ``more``",
    "a | b || c",
    "first line\nsecond line\r\nthird",
    "&lt;script&gt;alert(1)&lt;/script&gt;",
    "&amp; &#x3C;b&#x3E; &copy;",
    "<script>alert(1)</script>",
    "<http://e.vil>",
    "<a@b.co>",
    "*em* _em_ **strong** __strong__ ~~gone~~ ~one~",
    "- [ ] task",
    "1. item",
    "# heading",
    "> quote",
    "[^1] footnote",
    ":smile: $x^2$",
    "trailing backslash \\",
    "\\| escaped pipe \\[ \\<",
    "ends in a pipe |",
    "\x1b[31mred\x1b[0m \x00 \u202eevil",
    "snake_case_name and _leading and trailing_",
]


def one_cell(text: str) -> str:
    return f"| a |\n|---|\n| {markdown_text(text, limit=10_000)} |\n"


def _result(run_id: str, task: str, model: str, status: Status, reason: str) -> RunResult:
    return RunResult(run_id, task, model, 1, status, reason, (), 1.0, None, ())


@pytest.mark.parametrize("hostile", HOSTILE)
def test_hostile_text_in_a_cell_renders_as_that_text(hostile: str) -> None:
    parsed = cells(one_cell(hostile))
    assert parsed.tags_in_cells == [], render(one_cell(hostile))
    (cell,) = parsed.cells[1:]
    assert seen(cell) == one_line(hostile, limit=10_000)


def test_the_renderer_would_show_these_strings_live_unescaped() -> None:
    """The test can fail: raw, the same strings do become links, images and HTML."""
    raw = render("| a |\n|---|\n| [x](http://e.vil) www.evil.com a@b.co ![i](x) <details> |\n")
    assert raw.count("<a ") == 3 and "<img" in raw and "<details>" in raw


# Words that turn into markup, and the characters around them, mixed at random.
_PIECES = st.sampled_from(
    [
        "www.",
        "http://",
        "https://",
        "mailto:",
        "xmpp:",
        "@",
        "a@b.co",
        "e.vil",
        "](",
        "![",
        "<",
        "</",
        ">",
        "details",
        "img",
        "script",
        "&lt;",
        "&#64;",
        "&",
        ";",
        "\\",
        "|",
        "`",
        "``",
        "*",
        "**",
        "_",
        "~~",
        "$",
        ":",
        "\n",
        "\r",
        " ",
        "x",
        "1.",
        "- ",
        "[ ]",
        "[^1]",
        "a_b",
    ]
)
_HOSTILE_TEXT = st.lists(
    st.one_of(
        _PIECES,
        st.sampled_from(string.punctuation),
        st.characters(),  # lone surrogates and controls too: they are spelled out
    ),
    max_size=40,
).map("".join)


@settings(max_examples=600, deadline=None)
@given(_HOSTILE_TEXT)
def test_any_text_renders_as_itself_and_nothing_more(hostile: str) -> None:
    markdown = one_cell(hostile)
    parsed = cells(markdown)
    assert parsed.tags_in_cells == [], render(markdown)
    assert len(parsed.cells) == 2, render(markdown)  # one header cell, one body cell
    assert seen(parsed.cells[1]) == seen(one_line(hostile, limit=10_000))


def test_identifiers_stay_readable_in_the_file() -> None:
    assert markdown_text("hosted_vllm/fake") == "hosted_vllm/fake"
    assert markdown_text("release-en[hosted_vllm/fake]#1") == "release-en\\[hosted_vllm/fake\\]\\#1"


STATUSES: tuple[Status, ...] = ("failed", "error", "passed")


def test_summary_shows_every_field_as_text() -> None:
    hostile = "[x](http://e.vil) <details>www.evil.com a@b.co ![i](x)"
    results = [
        _result(f"t-{i}[{hostile}]#1", f"t-{i}", hostile, status, f"{hostile}\n| `why` |")
        for i, status in enumerate(STATUSES)
    ]
    markdown = summary_markdown(f"suite {hostile}", results)
    page = render(markdown)
    for tag in ("<a", "<img", "<details", "<script", "<code", "<em"):
        assert tag not in page, (tag, page)
    parsed = cells(markdown)
    body = [seen(c) for c in parsed.cells]
    assert body[7] == hostile  # the model cell of the per-model table (after 7 header cells)
    assert body.count(f"{hostile} | `why` |") == 2  # both reasons, newline flattened
    assert f"t-0[{hostile}]#1" in body and f"t-1[{hostile}]#1" in body
    heading = re.search(r"<h2>(.*?)</h2>", page)
    assert heading is not None
    assert seen(html.unescape(heading.group(1))) == f"mm-batch: suite {hostile}"


def test_tolerated_runs_are_said_to_be_tolerated() -> None:
    results = [
        _result("t[m]#1", "t", "m", "passed", ""),
        _result("t[m]#2", "t", "m", "failed", "no luck"),
        _result("u[m]#1", "u", "m", "failed", "broken"),
    ]
    rows = [seen(c) for c in cells(summary_markdown("s", results, min_pass_rate=0.5)).cells]
    assert rows[rows.index("t[m]#2") + 1] == "failed (tolerated)"
    assert rows[rows.index("u[m]#1") + 1] == "failed"


def test_step_summary_of_a_run_shows_model_text_as_text(
    cli: Cli, fake_model: Fake, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """End to end: a model's hostile arguments reach the reason, and the step summary."""
    write(
        tmp_path,
        "agent.yaml",
        """
        yolo: true
        tools:
          - name: say
            description: Say something.
            parameters:
              words: {type: string, description: What to say.}
            command: ["echo", "{{words}}"]
        """,
    )
    write(
        tmp_path,
        "tasks.yaml",
        """
        agent: agent.yaml
        tasks:
          - id: greet
            prompt: greet
            expect:
              calls: [{tool: say, args: {words: hello}}]
        """,
    )
    hostile = "[click](http://e.vil) <details><summary>x</summary>y</details> www.evil.com a@b.co"
    fake = fake_model(by_prompt({"greet": [tool_call("say", {"words": hostile}), text("ok")]}))
    step_summary = tmp_path / "step-summary.md"
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(step_summary))
    result = cli("run", tmp_path / "tasks.yaml", *model_args(fake), "--out", tmp_path / "out")
    assert result.code == 1, result.err
    for markdown in (step_summary.read_text(), (tmp_path / "out" / "summary.md").read_text()):
        page = render(markdown)
        for tag in ("<a", "<img", "<details", "<summary", "<script"):
            assert tag not in page, (tag, page)
        reasons = [seen(c) for c in cells(markdown).cells if "expected say" in c]
        assert len(reasons) == 1 and hostile in reasons[0]
