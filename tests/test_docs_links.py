"""The README and docs/ as a reader follows them: every relative link leads somewhere.

A relative link must name a file that exists; a `#fragment` must name a heading of that file
under both GitHub's and MkDocs' anchor rules (the README is read on GitHub, docs/ is built as a
site); a link from docs/ stays inside docs/ (a site cannot link out of its own folder). The
command-line reference is what docs/gen_cli.py writes from the click commands now, and names
every command and option the CLI has.
"""

from __future__ import annotations

import importlib.util
import re
import tempfile
import unicodedata
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from urllib.parse import unquote

import click
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mm_batch.cli import cli

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
README_MAX_LINES = 450  # the README is a user guide; the rest lives in docs/

_FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})")
_CODE_SPAN = re.compile(r"(`+)(?!`)(.+?)(?<!`)\1(?!`)")
_INLINE_LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]*)>?(?:\s+\"[^\"]*\")?\s*\)")
_REFERENCE_DEF = re.compile(r"^ {0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s|$)")
_HEADING = re.compile(r"^ {0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:|^//")


@dataclass(frozen=True)
class Broken:
    source: Path
    line: int
    target: str
    why: str

    def __str__(self) -> str:
        return f"{self.source.relative_to(ROOT)}:{self.line}: {self.target}: {self.why}"


def _prose_lines(text: str, *, keep_code: bool = False) -> Iterator[tuple[int, str]]:
    """Each line outside fenced code blocks, numbered from 1, its code spans blanked out unless
    `keep_code` (a heading renders the text of its code spans)."""
    fence: str | None = None
    for number, line in enumerate(text.splitlines(), start=1):
        opened = _FENCE.match(line)
        if fence is not None:
            if opened and opened.group(1)[0] == fence[0] and len(opened.group(1)) >= len(fence):
                fence = None
            continue
        if opened:
            fence = opened.group(1)
            continue
        yield number, line if keep_code else _CODE_SPAN.sub("", line)


def links(text: str) -> Iterator[tuple[int, str]]:
    """(line, target) of every inline link, image and reference definition in prose."""
    for number, line in _prose_lines(text):
        for match in _INLINE_LINK.finditer(line):
            yield number, match.group(1)
        definition = _REFERENCE_DEF.match(line)
        if definition:
            yield number, definition.group(1)


def _heading_text(raw: str) -> str:
    """A heading as rendered: code spans keep their text, links their label, no emphasis."""
    text = _CODE_SPAN.sub(lambda m: m.group(2).strip(), raw)
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", text)
    return text.replace("*", "")


def github_slug(text: str) -> str:
    """GitHub's heading anchor: lower case, punctuation dropped, each space a hyphen."""
    return re.sub(r"[^\w\- ]", "", text.lower()).replace(" ", "-")


def mkdocs_slug(text: str) -> str:
    """Python-Markdown's `toc` slugify, which MkDocs uses."""
    ascii_text = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode("ascii")
    return re.sub(r"[-\s]+", "-", re.sub(r"[^\w\s-]", "", ascii_text).strip().lower())


def anchors(text: str) -> tuple[set[str], set[str]]:
    """The heading anchors of a markdown text: (GitHub's, MkDocs')."""
    github: set[str] = set()
    mkdocs: set[str] = set()
    for _, line in _prose_lines(text, keep_code=True):
        heading = _HEADING.match(line)
        if heading:
            rendered = _heading_text(heading.group(2))
            github.add(github_slug(rendered))
            mkdocs.add(mkdocs_slug(rendered))
    return github, mkdocs


def broken_links(source: Path, root: Path, site: Path | None) -> list[Broken]:
    """What is wrong with the relative links of `source`: a missing file or heading, a link
    out of `root`, or (for a page of the site folder `site`) a link out of that folder."""
    found: list[Broken] = []
    for line, target in links(source.read_text(encoding="utf-8")):
        if not target or _SCHEME.match(target):
            continue
        path_part, _, fragment = target.partition("#")
        linked = (source.parent / unquote(path_part)).resolve() if path_part else source
        if not linked.is_relative_to(root):
            found.append(Broken(source, line, target, "leaves the repository"))
            continue
        if site is not None and source.is_relative_to(site) and not linked.is_relative_to(site):
            found.append(Broken(source, line, target, f"leaves {site.name}/, which is a site"))
            continue
        if not linked.is_file():
            found.append(Broken(source, line, target, "no such file"))
            continue
        if fragment and linked.suffix == ".md":
            github, mkdocs = anchors(linked.read_text(encoding="utf-8"))
            if fragment not in github or fragment not in mkdocs:
                found.append(Broken(source, line, target, "no such heading"))
    return found


def _pages() -> list[Path]:
    return [ROOT / "README.md", *sorted(DOCS.rglob("*.md"))]


def test_every_relative_link_of_the_readme_and_docs_resolves() -> None:
    broken = [b for page in _pages() for b in broken_links(page, ROOT, None)]
    assert not broken, "\n".join(map(str, broken))


def test_links_of_docs_pages_stay_inside_docs() -> None:
    """docs/ is built as a site (mkdocs --strict): a link out of it is a broken link there.
    Name a repository file outside docs/ as `code`, or link the README to it."""
    broken = [b for page in _pages() for b in broken_links(page, ROOT, DOCS)]
    assert not broken, "\n".join(map(str, broken))


def test_the_docs_pages_are_found_and_hold_links() -> None:
    """The check above checks something: the pages exist and link to each other."""
    assert (DOCS / "index.md").is_file()
    assert sum(1 for page in _pages() for _ in links(page.read_text(encoding="utf-8"))) > 50


def test_the_readme_stays_a_user_guide() -> None:
    lines = (ROOT / "README.md").read_text(encoding="utf-8").count("\n")
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines; move detail to docs/"


def test_a_broken_link_anchor_or_escape_is_reported(tmp_path: Path) -> None:
    site = tmp_path / "docs"
    (site / "guides").mkdir(parents=True)
    (site / "guides" / "a.md").write_text("# A page\n\n## Second `part`: here\n")
    (tmp_path / "other.md").write_text("# Other\n")
    page = site / "index.md"
    page.write_text(
        "[ok](guides/a.md) [ok](guides/a.md#second-part-here) ![img](guides/a.md)\n"
        "[web](https://example.org/x) [self](#top)\n"
        "# Top\n"
        "`[in code](missing.md)`\n"
        "```\n[in a block](missing.md)\n```\n"
        "[gone](guides/missing.md)\n"
        "[heading](guides/a.md#no-such)\n"
        "[out of the site](../other.md)\n"
        "[out of the repo](../../x.md)\n"
        "[ref]: guides/nothing.md\n"
    )
    found = {(b.line, b.why) for b in broken_links(page, tmp_path, site)}
    assert found == {
        (8, "no such file"),
        (9, "no such heading"),
        (10, "leaves docs/, which is a site"),
        (11, "leaves the repository"),
        (12, "no such file"),
    }


_NAME = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789-_", min_size=1, max_size=12)


@settings(max_examples=100, deadline=None)
@given(
    present=st.sets(_NAME, min_size=1, max_size=5),
    absent=st.sets(_NAME, max_size=5),
    data=st.data(),
)
def test_exactly_the_links_to_missing_files_are_reported(
    present: set[str], absent: set[str], data: st.DataObject
) -> None:
    absent = absent - present
    targets = data.draw(st.permutations([f"{n}.md" for n in present | absent]))
    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder)
        for name in present:
            (root / f"{name}.md").write_text(f"# {name}\n")
        page = root / "page.md"
        page.write_text("".join(f"See [{t}]({t}) here.\n" for t in targets))
        reported = {b.target for b in broken_links(page, root, None)}
    assert reported == {f"{n}.md" for n in absent}


def test_heading_anchors_agree_with_both_renderers_on_plain_words() -> None:
    for heading, slug in [
        ("A value copied from a parameter's example", "a-value-copied-from-a-parameters-example"),
        ("Local models on `examples/release`", "local-models-on-examplesrelease"),
        ("Speculative decoding (not kept)", "speculative-decoding-not-kept"),
        ("`report.html`", "reporthtml"),
    ]:
        assert github_slug(_heading_text(heading)) == slug
        assert mkdocs_slug(_heading_text(heading)) == slug


def _commands() -> dict[str, click.Command]:
    assert isinstance(cli, click.Group)
    return dict(cli.commands)


def _generator() -> ModuleType:
    """docs/gen_cli.py, which writes the CLI reference's sections from the click commands."""
    spec = importlib.util.spec_from_file_location("gen_cli", DOCS / "gen_cli.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


CLI_PAGE = DOCS / "reference" / "cli.md"


def test_the_cli_reference_is_what_its_generator_writes_from_the_commands() -> None:
    render: Callable[[str], str] = _generator().render
    page = CLI_PAGE.read_text(encoding="utf-8")
    assert render(page) == page, "docs/reference/cli.md is stale: run python docs/gen_cli.py"


def test_the_generator_adds_a_missing_command_and_refuses_an_unknown_one() -> None:
    generator = _generator()
    render: Callable[[str], str] = generator.render
    written = render("# Command line\n\nBy hand.\n")
    assert written.startswith("# Command line\n\nBy hand.\n\n<!-- cli: mm-batch -->\n")
    for name in _commands():
        assert f"<!-- cli: mm-batch {name} -->\n\n## `mm-batch {name}`\n" in written
    kept = written.replace("<!-- /cli: mm-batch run -->\n", "<!-- /cli: mm-batch run -->\nNote.\n")
    assert render(kept) == kept, "the text between sections is kept as written"
    stale = written.replace("Run every task of", "Once ran every task of")
    assert render(stale) == written
    with pytest.raises(generator.StalePageError, match="mm-batch deploy"):
        render(written + "<!-- cli: mm-batch deploy -->\n<!-- /cli: mm-batch deploy -->\n")


def test_the_cli_reference_names_every_command_and_option() -> None:
    reference = CLI_PAGE.read_text(encoding="utf-8")
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    missing: list[str] = []
    for name, command in _commands().items():
        if f"## `mm-batch {name}`" not in reference:
            missing.append(f"cli.md: mm-batch {name}")
        if f"mm-batch {name}" not in readme:
            missing.append(f"README.md: mm-batch {name}")
        for param in command.params:
            if not isinstance(param, click.Option):
                continue
            for flag in [*param.opts, *param.secondary_opts]:
                if flag.startswith("--") and flag != "--help" and f"`{flag}" not in reference:
                    missing.append(f"cli.md: mm-batch {name} {flag}")
    assert not missing, "\n".join(missing)
