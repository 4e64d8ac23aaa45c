"""The documentation site as the README says to read it, in a headless browser (Debian's chromium through
Playwright): opened from disk (`out/site/index.html`) every navigation link reaches its page, not a directory
listing; served as `make docs-serve` serves it (Python's http.server on 127.0.0.1), search finds pages. Nothing is
fetched from the network either way."""

from __future__ import annotations

import os
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import free_port, starts, wait_for
from test_report_browser import chromium  # noqa: F401  (skipped without chromium, failed under CI)
from test_view_browser import FLAGS

pytestmark = [pytest.mark.docs, pytest.mark.browser]
ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("site") / "site"
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)], cwd=ROOT, env=env,
                   check=True, capture_output=True, timeout=300)  # fmt: skip
    return out


@pytest.fixture(scope="module")
def browser(chromium: str) -> Iterator[Any]:  # noqa: F811
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=chromium, args=FLAGS)
        yield b
        b.close()


def _page(browser: Any) -> tuple[Any, list[str]]:
    page = browser.new_page(viewport={"width": 1400, "height": 900})
    remote: list[str] = []
    page.on("request", lambda r: remote.append(r.url) if r.url.startswith(("http:", "https:")) else None)
    return page, remote


def test_from_disk_every_nav_link_reaches_its_page(browser: Any, site: Path) -> None:
    page, remote = _page(browser)
    page.goto((site / "index.html").as_uri())
    hrefs = page.eval_on_selector_all("nav.md-nav--primary a.md-nav__link[href]", "links => links.map(a => a.href)")
    pages = sorted({h.split("#")[0] for h in hrefs if h.startswith("file:")})
    assert len(pages) >= 30, pages  # every page of the nav
    for url in pages:
        assert url.endswith(".html"), url  # a directory URL opens a listing from disk
        page.goto(url)
        assert page.locator("article h1").count() == 1, url
        assert not page.title().startswith("Index of"), url
    assert remote == []


@pytest.fixture(scope="module")
@starts("server")
def served(site: Path) -> Iterator[str]:
    """The site as `make docs-serve` serves it."""
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "http.server", "--bind", "127.0.0.1", "--directory", str(site),
                             str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    url = f"http://127.0.0.1:{port}"

    def up() -> bool:
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                return response.status == 200
        except OSError:
            return False

    try:
        wait_for(up, 30, url)
        yield url
    finally:
        proc.terminate()
        proc.wait(10)


def test_served_search_finds_pages(browser: Any, served: str) -> None:
    page, remote = _page(browser)
    page.goto(f"{served}/index.html")
    page.keyboard.press("/")
    page.keyboard.type("bootstrap")
    results = page.locator(".md-search-result__item")
    results.first.wait_for(timeout=30_000)
    assert results.count() >= 3
    assert [u for u in remote if not u.startswith(served)] == []
