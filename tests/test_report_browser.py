"""``make report`` on the committed results, opened in headless Chromium (slow): every page renders, every figure
loads, every table is on the index; screenshots are kept in ``outputs/test-artifacts/report/``."""

from __future__ import annotations

import html
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from attnlab import report
from tests.conftest import ROOT
from tests.test_report_safety import crafted_results

BROWSER = next(
    (shutil.which(name) for name in ("chromium", "chromium-browser", "google-chrome") if shutil.which(name)), None
)
SCREENSHOTS = ROOT / "outputs" / "test-artifacts" / "report"


def browse(*args: str) -> str:
    command = [BROWSER, "--headless", "--no-sandbox", "--disable-gpu", "--virtual-time-budget=5000", *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=120, check=True).stdout


@pytest.mark.slow
@pytest.mark.long
@pytest.mark.timeout(1800)
@pytest.mark.skipif(BROWSER is None, reason="no Chromium: `apt-get install chromium` (Debian's package) to run it")
def test_the_report_renders_in_a_browser_with_every_table_and_figure(tmp_path: Path) -> None:
    """The committed results and a crafted one (HTML in its name and Markdown, which must not run)."""
    results = tmp_path / "results"
    shutil.copytree(ROOT / "experiments" / "results", results)
    crafted_results(tmp_path / "crafted")
    shutil.copytree(tmp_path / "crafted" / "results", results, dirs_exist_ok=True)
    index = report.build(results, tmp_path / "site")
    pages = report.discover(results)
    dom = browse("--dump-dom", index.as_uri())
    links = {html.unescape(href) for href in re.findall(r'href="([^"]*)"', dom)}  # a crafted name arrives escaped
    assert {page.filename for page in pages} <= links
    text = re.sub(r"<[^>]+>", " ", dom)
    assert "experiments/results/" not in " ".join(re.findall(r"<td>([^<]*)</td>", dom))  # no path as a title
    held = report.PARTIAL.search((results / "outliers" / "cpu_long" / "outliers.md").read_text())[1]  # "5 of 15 cells"
    assert f"(partial: {held})" in text and "pipeline check: every number of ours is 0" in text
    assert not re.search(r'class="verdict [^"]*">0<', dom)  # a count is coloured only when it is not 0
    assert {"table3", "table4", "outliers", "gating", "pruning"} <= {page.name for page in pages}
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    for page in pages:
        path = tmp_path / "site" / page.filename
        dom = browse("--dump-dom", path.as_uri())
        assert "data-pwned" not in dom, f"{page.filename}: HTML from a results file ran"
        if page.name.startswith("<img") or page.name == "crafted":
            continue  # a crafted page: its escaped <img> is text, and it has no figures
        assert 'data-broken-images="0"' in dom, f"{page.filename}: a figure did not load"
        if page.filename == "table4-cpu.html":
            assert "A pipeline check: every number of ours in this table is 0" in dom
        assert "<h1>" in dom and ("<table" in dom or page.name in ("emergence", "bench"))
        assert len(re.findall(r"<img ", dom)) >= len(page.figures)
        if page.name in ("table3", "outliers") or page.filename == pages[0].filename:
            browse(
                f"--screenshot={SCREENSHOTS / page.filename.replace('.html', '.png')}",
                "--window-size=1400,2000",
                path.as_uri(),
            )
    browse(f"--screenshot={SCREENSHOTS / 'index.png'}", "--window-size=1400,1000", index.as_uri())
    assert (SCREENSHOTS / "index.png").stat().st_size > 10_000
