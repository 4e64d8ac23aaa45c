"""report.html opened in a real headless browser (Debian's chromium): it renders, its tables and images are there.

Skipped only when chromium is missing outside CI; under CI a missing browser fails the test set-up.
"""

from __future__ import annotations

import base64
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from conftest import starts
from test_aggregate import paper_rows, write_rollouts

from pipeline.metrics.run import open_run
from pipeline.metrics.settings import BootstrapSettings
from pipeline.report import build_report

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
# Runs after load: records each image's decoded size in the DOM, so --dump-dom shows what the browser rendered.
PROBE = """<script>
window.addEventListener("load", () => {
  const sizes = [...document.images].map(i => i.naturalWidth + "x" + i.naturalHeight).join(",");
  document.body.setAttribute("data-image-sizes", sizes);
});
</script>"""


@pytest.fixture(scope="module")
@starts("browser")
def chromium() -> str:
    if CHROMIUM is None:
        if os.environ.get("CI"):
            pytest.fail("chromium is not installed (CI is set): apt-get install -y chromium")
        pytest.skip("chromium not installed (apt-get install -y chromium); set CI=true to make this a failure")
    return CHROMIUM


def test_html_renders_in_chromium(chromium: str, tmp_path: Path) -> None:
    run = tmp_path / "run"
    write_rollouts(run, paper_rows())
    report = build_report(open_run(str(run)), tmp_path / "out", settings=BootstrapSettings(B=50))
    page = tmp_path / "probe.html"
    page.write_text((Path(report.out) / "report.html").read_text().replace("</body>", PROBE + "</body>"))
    cmd = [
        chromium, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync",
        f"--user-data-dir={tmp_path / 'profile'}", "--virtual-time-budget=5000", "--dump-dom", page.as_uri(),
    ]  # fmt: skip
    dom = subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=True).stdout
    assert dom.count("<table>") >= 3
    assert "93.2% (138/148)" in dom and "0.726 [" in dom and "0.050 [" in dom
    sizes = re.search(r'data-image-sizes="([^"]*)"', dom)
    assert sizes is not None, "the load handler did not run"
    widths = [int(s.split("x")[0]) for s in sizes.group(1).split(",")]
    assert len(widths) == 3 and all(w > 0 for w in widths)
    pngs = re.findall(r'src="data:image/png;base64,([^"]+)"', dom)
    svgs = re.findall(r'srcset="data:image/svg\+xml;base64,([^"]+)"', dom)
    assert len(pngs) == len(svgs) == 3
    assert all(base64.b64decode(p).startswith(b"\x89PNG") for p in pngs)
    assert all(b"<svg" in base64.b64decode(s) for s in svgs)
