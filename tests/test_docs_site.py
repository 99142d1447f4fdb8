"""docs/ as the site users read: `mkdocs build --strict` passes, every page is in the nav, and
the built pages load nothing from the network.

The build needs mkdocs-material (the `docs` and `test` extras). Without it the build test skips,
saying so, unless MM_BATCH_REQUIRE_DOCS is set (as in .ci/run), where it fails.
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
CONFIG = ROOT / "mkdocs.yml"
# What a page would fetch from elsewhere: a stylesheet, a script, a font, an image.
_REMOTE = re.compile(r"<(?:link|script|img|iframe)\b[^>]*\b(?:href|src)=\"(?:https?:)?//", re.I)


def _nav_pages(entry: object) -> Iterator[str]:
    """Every page a nav entry names (a path, `Title: path`, or a section's list), in order."""
    if isinstance(entry, str):
        yield entry
    elif isinstance(entry, list):
        for item in entry:
            yield from _nav_pages(item)
    elif isinstance(entry, dict):
        for value in entry.values():
            yield from _nav_pages(value)


def _config() -> dict[str, object]:
    loaded = yaml.safe_load(CONFIG.read_text(encoding="utf-8"))
    assert isinstance(loaded, dict)
    return loaded


def test_every_page_of_docs_is_in_the_nav_and_every_nav_entry_is_a_page() -> None:
    """mkdocs only warns of a page left out of the nav when told to (validation.nav.
    omitted_files: warn, which --strict makes fatal): this holds without mkdocs installed."""
    nav = list(_nav_pages(_config()["nav"]))
    pages = sorted(p.relative_to(DOCS).as_posix() for p in DOCS.rglob("*.md"))
    assert sorted(set(nav)) == sorted(nav), "a page is twice in the nav"
    assert sorted(nav) == pages, (
        f"not in the nav: {sorted(set(pages) - set(nav))}; "
        f"in the nav, no such page: {sorted(set(nav) - set(pages))}"
    )


def test_the_config_fails_a_strict_build_on_what_a_reader_would_trip_on() -> None:
    """Left at their defaults some of these are only logged: each must be a warning, which
    --strict turns into a failed build. And no web font: the pages load nothing from elsewhere."""
    config = _config()
    validation = config["validation"]
    assert isinstance(validation, dict)
    assert validation["nav"] == {
        "omitted_files": "warn",
        "not_found": "warn",
        "absolute_links": "warn",
    }
    assert validation["links"] == {
        "not_found": "warn",
        "anchors": "warn",
        "absolute_links": "warn",
        "unrecognized_links": "warn",
    }
    theme = config["theme"]
    assert isinstance(theme, dict)
    assert theme["font"] is False
    assert "plugins" not in config, "a plugin may download at build time; the search is built in"


def _require_mkdocs() -> None:
    if importlib.util.find_spec("mkdocs") and importlib.util.find_spec("material"):
        return
    why = "mkdocs-material is not installed: pip install -e '.[docs]' (or '.[test]')"
    if os.environ.get("MM_BATCH_REQUIRE_DOCS"):
        pytest.fail(f"MM_BATCH_REQUIRE_DOCS is set, but {why}")
    pytest.skip(why)


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The site, built once with --strict: a broken link or anchor, a page missing from the
    nav or a nav entry to no page fails the build."""
    _require_mkdocs()
    built = tmp_path_factory.mktemp("site")
    # Nothing may be fetched: a proxy that no one listens on makes any attempt fail.
    dead = "http://127.0.0.1:9"
    env = {
        **os.environ,
        "NO_MKDOCS_2_WARNING": "1",
        "HTTP_PROXY": dead,
        "HTTPS_PROXY": dead,
        "http_proxy": dead,
        "https_proxy": dead,
        "NO_PROXY": "",
        "no_proxy": "",
    }
    build = ["build", "--strict", "--config-file", str(CONFIG), "--site-dir", str(built)]
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", *build],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, f"mkdocs build --strict failed:\n{result.stderr}"
    return built


def test_the_site_builds_strict_with_every_page(site: Path) -> None:
    for page in DOCS.rglob("*.md"):
        relative = page.relative_to(DOCS).with_suffix("")
        html = site / "index.html" if relative.name == "index" else site / relative / "index.html"
        assert html.is_file(), f"{page.relative_to(ROOT)} was not built"
    assert not list(site.rglob("*.py")), "the CLI reference's generator was published"


def test_the_built_pages_load_nothing_from_the_network(site: Path) -> None:
    """No Google Fonts, no CDN: the site reads offline, as report.html does."""
    remote = [
        f"{page.relative_to(site)}: {match.group(0)}"
        for page in site.rglob("*.html")
        for match in _REMOTE.finditer(page.read_text(encoding="utf-8"))
    ]
    assert not remote, "\n".join(remote)


def test_a_strict_build_fails_on_a_page_missing_from_the_nav_or_a_broken_link(
    tmp_path: Path,
) -> None:
    """The config's checks check something: a copy of docs/ with an extra page and a link to a
    missing heading does not build."""
    _require_mkdocs()
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "index.md").write_text("# Home\n\n[gone](other.md#no-such-heading)\n")
    (docs / "other.md").write_text("# Other\n")
    (docs / "orphan.md").write_text("# Not in the nav\n")
    config = _config()
    config["docs_dir"] = str(docs)
    config["nav"] = [{"Home": "index.md"}, {"Other": "other.md"}]
    (tmp_path / "mkdocs.yml").write_text(yaml.safe_dump(config))
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "s")],
        cwd=tmp_path,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode != 0
    assert "orphan.md" in result.stderr
    assert "no-such-heading" in result.stderr
