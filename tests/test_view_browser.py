"""`pexec view` (the real command, in a subprocess) driven in headless Chromium through cohort -> rollouts ->
step, and the report's and viewer's tables checked to fit at 1000 and 1400 px.

Playwright drives Debian's /usr/bin/chromium (no downloaded browser). Skipped only when chromium is missing
outside CI; under CI a missing browser fails the test set-up.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from conftest import ROOT, _answers, free_port, starts, wait_for
from test_aggregate import paper_rows, write_rollouts
from test_report_browser import chromium  # noqa: F401  (skipped without chromium, failed under CI)
from test_view import make_run

from pipeline.metrics.run import open_run
from pipeline.metrics.settings import BootstrapSettings
from pipeline.report import build_report

FLAGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
    "--disable-sync", "--no-first-run",
]  # fmt: skip
# The page fits its viewport; every scroll container reaches its last column, whose left edge stays behind
# the pinned first column's right edge only while scrolled to the start.
FIT = """() => {
  const doc = document.documentElement;
  const boxes = [...document.querySelectorAll('.scroll')].map(box => {
    box.scrollLeft = box.scrollWidth;
    const b = box.getBoundingClientRect();
    const cells = box.querySelectorAll('thead tr > *');
    const first = cells[0].getBoundingClientRect(), last = cells[cells.length - 1].getBoundingClientRect();
    return {scrolls: box.scrollWidth > box.clientWidth, lastRight: last.right, boxRight: b.right,
            firstLeft: first.left, boxLeft: b.left};
  });
  return {pageOverflow: doc.scrollWidth - window.innerWidth, boxes};
}"""


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> str:
    return make_run(tmp_path_factory.mktemp("viewb"))


@pytest.fixture(scope="module")
@starts("server")
def viewer(run: str) -> Iterator[str]:
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, "-m", "pipeline.apps.cli", "view", run, "--port", str(port), "--bootstrap", "20"]
    cmd += ["--inputs", run.removesuffix("/run") + "/store"]  # the rollout pages show the logged trajectory
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        wait_for(lambda: _answers(port) or proc.poll() is not None, 60, "pexec view")
        assert proc.poll() is None, proc.stderr.read().decode()
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(timeout=30)


@pytest.fixture(scope="module")
def browser(chromium: str) -> Iterator[object]:  # noqa: F811
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=chromium, args=FLAGS)
        yield b
        b.close()


def test_drill_from_a_cause_count_to_the_failing_step(browser, viewer: str, run: str, tmp_path: Path) -> None:
    table = pq.read_table(f"{run}/rollouts")
    page = browser.new_page(viewport={"width": 1400, "height": 900})
    page.goto(viewer + "/")
    first_row = page.locator("#cohorts tbody tr", has=page.locator("a.cause", has_text="dependency")).first
    key = first_row.locator("td.key").all_inner_texts()
    link = first_row.locator("a.cause", has_text="dependency")
    link.click()
    page.wait_for_url("**/rollouts?**")
    mask = pc.equal(table["first_cause"], "dependency")
    for col, value in zip(["benchmark", "method", "model"], key, strict=True):
        mask = pc.and_(mask, pc.equal(table[col], value))
    expected = pc.sum(mask.cast("int64")).as_py()
    assert page.inner_text("#count strong") == str(expected) and expected > 0
    assert "cause = dependency" in page.inner_text("#filters")
    rollout_id = page.locator("a.rollout").first.inner_text()
    page.locator("a.rollout").first.click()
    page.wait_for_url("**/rollout?**")
    assert page.inner_text("#rollout-id") == rollout_id
    failing = page.locator("#steps tr.first-error")
    assert failing.count() == 1 and "dependency" in failing.inner_text()
    fed = int(failing.locator("td").first.inner_text())
    assert page.inner_text("#fed") == str(fed)
    assert page.locator("#timeline li.call").nth(fed - 1).get_attribute("class") == "call bad"
    assert page.locator("#timeline li.msg").count() >= 1
    page.screenshot(path=str(tmp_path / "rollout.png"), full_page=True)
    # The URL is the whole state: a fresh page opened on it shows the same rollout.
    other = browser.new_page()
    other.goto(page.url)
    assert other.inner_text("#rollout-id") == rollout_id
    other.locator("#back").click()
    assert other.inner_text("#count strong") == str(expected)


@pytest.mark.parametrize("width", [1000, 1400])
def test_tables_fit_the_page(browser, viewer: str, tmp_path: Path, width: int) -> None:
    report_run = tmp_path / "run"
    write_rollouts(report_run, paper_rows())
    report = build_report(open_run(str(report_run)), tmp_path / "out", settings=BootstrapSettings(B=20))
    page = browser.new_page(viewport={"width": width, "height": 900})
    page.goto(viewer + "/rollouts?fed=1")
    one_rollout = viewer + page.locator("a.rollout").first.get_attribute("href")
    pages = [Path(report.out, "report.html").as_uri(), viewer + "/", viewer + "/rollouts", one_rollout]
    for url in pages:
        page.goto(url)
        page.screenshot(path=str(tmp_path / f"page-{width}.png"), full_page=True)
        fit = page.evaluate(FIT)
        text = page.inner_text("body")
        for dump in ("Run(", "Snapshot(", "object at 0x", "frozenset"):  # a header once showed the handle's repr
            assert dump not in text, f"{url} shows a Python object dump ({dump})"
        assert fit["pageOverflow"] <= 0, f"{url} overflows the page by {fit['pageOverflow']}px at {width}px"
        assert fit["boxes"], url
        for box in fit["boxes"]:
            assert box["lastRight"] <= box["boxRight"] + 1, f"{url}: the last column is out of reach"
            assert abs(box["firstLeft"] - box["boxLeft"]) <= 2, f"{url}: the first column does not stay"
    if width == 1000:
        assert any(b["scrolls"] for b in fit["boxes"]), "at 1000px the rollouts table should scroll in its box"
