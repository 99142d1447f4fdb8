"""xunit-viewer (npm) renders the project's reports into one HTML page; headless Chromium runs
its scripts, offline, and the page it draws must count what mm-batch meant and show, for every
run that did not pass, the task, the model, the reason, the checks, the stderr and the line.

Installed by `npm ci --prefix tests/consumers` (the version is pinned in package-lock.json) and
Debian's `chromium`; on a clone without them these tests skip, saying so, unless
MM_BATCH_REQUIRE_CONSUMERS=1.
"""

from __future__ import annotations

import functools
import re
import shutil
import subprocess
import tempfile
from collections.abc import Iterable
from pathlib import Path

import pytest

from tests.consumers.shapes import Reports, Shape, assert_shows
from tests.helpers import chromium, dom, draw, require

HERE = Path(__file__).resolve().parent
VIEWER = HERE / "node_modules" / ".bin" / "xunit-viewer"
SHAPES = ("passing", "failing", "error", "flaky", "merged")


@pytest.fixture(scope="module")
def browser() -> str:
    require("xunit-viewer (npm)", VIEWER.exists(), "npm ci --prefix tests/consumers")
    require("node", shutil.which("node") is not None, "apt-get install nodejs npm")
    found = chromium()
    require("Chromium", found is not None, "apt-get install chromium")
    assert found is not None
    return found


@functools.cache
def _rendered(junit: Path, browser: str) -> tuple[str, str]:
    """xunit-viewer's page for one report, and the DOM Chromium drew from it (network off)."""
    work = Path(tempfile.mkdtemp(prefix="xunit-viewer-"))
    page = work / "report.html"
    subprocess.run(
        [str(VIEWER), "-r", str(junit), "-o", str(page)],
        check=True,
        capture_output=True,
        timeout=120,
    )
    # Headless Chromium dumps the page unrendered, budget or not, in about a third of its
    # draws here (measured: 5 of 12 with a fresh profile each): up to 8 draws.
    for budget_ms in (15000, 30000, *[60000] * 6):
        drawn = draw(browser, page.as_uri(), work / "profile", budget_ms).stdout
        tree = dom(drawn)
        # Drawn once the suite is there and no card still waits to come into view (a loaded
        # machine can end the virtual time budget before the page's scripts are done).
        if tree.find_all("div", "card", "suite") and not tree.find_all(
            "div", "renderIfVisible-placeholder"
        ):
            break
    written = page.read_text(encoding="utf-8")
    shutil.rmtree(work, ignore_errors=True)
    return written, drawn


def test_the_page_needs_no_network(browser: str, reports: Reports) -> None:
    """Everything the page runs and draws is inside it: no script, style or font from a CDN.
    (Its favicon and og:image point at the project's site: a browser tab icon, nothing more.)"""
    page, _ = _rendered(reports.failing.junit, browser)
    html = dom(page)
    assert not [s.attrs["src"] for s in html.find_all("script") if "src" in s.attrs]
    external = [
        link.attrs
        for link in html.find_all("link")
        if re.match(r"(https?:)?//", link.attrs.get("href", ""))
    ]
    assert all(attrs.get("rel") == "shortcut icon" for attrs in external), external
    assert not re.search(r"@import\s+url\(\s*['\"]?(https?:)?//", page)
    assert not re.search(r"url\(\s*['\"]?https?://[^)]*\.(woff2?|ttf|css)", page)


_STATUS = re.compile(r"is-(passed|failure|error|skipped|unknown|flakyFailure)$")


@pytest.mark.parametrize("name", SHAPES)
def test_xunit_viewer_draws_the_counts_and_the_reasons(
    browser: str, reports: Reports, name: str
) -> None:
    shape: Shape = getattr(reports, name)
    page, drawn = _rendered(shape.junit, browser)
    tree = dom(drawn)
    suites = tree.find_all("div", "card", "suite")
    assert len(suites) == 1, "one testsuite per tasks file and model"
    suite_title = suites[0].find_all("p", "card-header-title")[0].text()
    cards = suites[0].find_all("div", "test", "card")
    names = [
        card.find_all("p", "card-header-title")[0].find_all("span")[-1].text() for card in cards
    ]
    assert sorted(names) == sorted(shape.order), "every test case drawn, once"
    status = {
        n: next(m.group(1) for c in card.classes if (m := _STATUS.match(c)))
        for n, card in zip(names, cards, strict=True)
    }
    failing = {f.case: f for f in shape.failing}
    expected = {
        n: {"failure": "failure", "error": "error"}.get(failing[n].kind, "passed")
        if n in failing
        else "passed"
        for n in shape.order
    }
    assert status == expected
    # xunit-viewer's own summary of the report, in the page it wrote.
    description = dom(page).find_all("meta")
    summary = next(m.attrs["content"] for m in description if m.attrs.get("name") == "description")
    counted = {kind: int(n) for n, kind in re.findall(r"(\d+) (\w+)", summary)}
    assert counted == {k: v for k, v in _tally(expected.values()).items() if v}
    for card_name, card in zip(names, cards, strict=True):
        if card_name in failing and failing[card_name].kind != "flakyFailure":
            shown = f"{suite_title}\n{card.text()}"
            assert_shows("xunit-viewer", shown, failing[card_name], shape.tasks_file)


def _tally(statuses: Iterable[str]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for status in statuses:
        counts[status] = counts.get(status, 0) + 1
    return counts


def test_a_missing_consumer_skips_on_a_clone_and_fails_in_ci(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("MM_BATCH_REQUIRE_CONSUMERS", raising=False)
    with pytest.raises(pytest.skip.Exception, match="install it with: npm ci --prefix"):
        require("xunit-viewer (npm)", False, "npm ci --prefix tests/consumers")
    monkeypatch.setenv("MM_BATCH_REQUIRE_CONSUMERS", "1")
    with pytest.raises(pytest.fail.Exception, match="MM_BATCH_REQUIRE_CONSUMERS=1"):
        require("Chromium", False, "apt-get install chromium")
    require("Chromium", True, "apt-get install chromium")  # present: nothing happens
