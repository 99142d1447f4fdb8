"""summary.md as GitHub renders it (cmark-gfm, GitHub's C library, with its extensions), and
what a reader sees of its table cells."""

from __future__ import annotations

from html.parser import HTMLParser

import cmarkgfm
from cmarkgfm.cmark import Options

from mm_batch.report.summary import WORD_JOINER


def render(markdown: str) -> str:
    """summary.md as GitHub renders it: GFM with its extensions, raw HTML let through."""
    # UNSAFE keeps raw HTML in the output rather than dropping it, so that any HTML the
    # summary let through would be seen here; GitHub's own sanitizer is not counted on.
    page = cmarkgfm.github_flavored_markdown_to_html(markdown, options=Options.CMARK_OPT_UNSAFE)
    return str(page)


class Cells(HTMLParser):
    """The tags inside table cells, and each cell's text."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.cells: list[str] = []
        self.tags_in_cells: list[str] = []
        self._in_cell = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag in ("td", "th"):
            self._in_cell = True
            self.cells.append("")
        elif self._in_cell:
            self.tags_in_cells.append(tag)

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.handle_starttag(tag, attrs)

    def handle_endtag(self, tag: str) -> None:
        if tag in ("td", "th"):
            self._in_cell = False

    def handle_data(self, data: str) -> None:
        if self._in_cell:
            self.cells[-1] += data

    def handle_comment(self, data: str) -> None:
        if self._in_cell:
            self.tags_in_cells.append("!--")


def cells(markdown: str) -> Cells:
    parser = Cells()
    parser.feed(render(markdown))
    parser.close()
    return parser


def seen(cell_text: str) -> str:
    """What a reader sees: the word joiner after an `@` is invisible."""
    return cell_text.replace(WORD_JOINER, "")
