"""``make report`` on crafted results (fast, no browser): everything that comes from a file is escaped in the pages
(a run name, a table's Markdown, a directory or config file name), and the report replaces only what it wrote."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from attnlab import report
from attnlab.files import STAGING
from tests.conftest import ROOT

INJECTED = '<img src=x onerror="document.body.dataset.pwned=1">'


def crafted_results(root: Path) -> Path:
    """A results directory whose names and Markdown carry HTML: a table page, and an "other results" directory
    named with a tag holding a CSV whose name closes an attribute."""
    results = root / "results"
    table = results / "crafted"
    table.mkdir(parents=True)
    (table / "crafted.md").write_text(
        f"# Crafted {INJECTED}\n\n<script>document.body.dataset.pwned=1</script>\n\n| run | verdict |\n|---|---|\n"
        f"| {INJECTED} | reproduces |\n\n[link](javascript:alert(1))\n"
    )
    other = results / "<img src=x onerror=alert(1)>"
    other.mkdir()
    (other / 'a" onmouseover="alert(1).csv').write_text("x\n1\n")
    return results


def test_every_text_from_a_file_is_escaped_in_the_pages(tmp_path: Path) -> None:
    results = crafted_results(tmp_path)
    (results / "crafted" / "README.md").write_text(
        f"<!-- reading: crafted -->\nOur reading <script>alert(1)</script> {INJECTED}\n<!-- /reading -->\n"
    )
    index = report.build(results, tmp_path / "site", ROOT)
    pages = [index, *sorted(index.parent.glob("*.html"))]
    for page in pages:
        html = page.read_text()
        assert "<script>document" not in html and "<script>alert" not in html, page.name
        assert "<img src=x" not in html and 'onmouseover="alert' not in html, page.name
        assert 'href="javascript:' not in html, page.name
    crafted = (tmp_path / "site" / "crafted-default.html").read_text()
    assert "&lt;script&gt;document.body.dataset.pwned=1&lt;/script&gt;" in crafted  # shown as text
    assert "&lt;img src=x onerror=" in crafted and 'class="verdict reproduces"' in crafted


def test_a_run_name_and_its_config_name_are_escaped_in_the_cells_table() -> None:
    """The cells table of an engine table (its runs come from runs.csv, a file in a shared directory)."""
    page = report.Page("table3", "smoke", Path("table3/smoke"), title=f"Table {INJECTED}")
    config = report.Link("config", f"configs/table3-smoke/{INJECTED}.yaml", f"note {INJECTED}")
    page.runs = [report.RunRow(INJECTED, INJECTED, INJECTED, 0, INJECTED, config)]
    html = report.templates().get_template("page.html.j2").render(page=page, pages=[page], made="now", results="r")
    assert "<img src=x" not in html and "&lt;img src=x onerror=&#34;document" in html


def test_a_users_file_in_the_report_directory_survives_the_next_report(tmp_path: Path) -> None:
    results, out = crafted_results(tmp_path), tmp_path / "site"
    report.build(results, out, ROOT)
    (out / "my-notes.txt").write_text("mine")
    (out / "data" / "mine").mkdir()
    (out / "data" / "mine" / "plot.png").write_bytes(b"mine")
    (results / "crafted" / "crafted.md").write_text("# Crafted again\n")
    report.build(results, out, ROOT)
    assert (out / "my-notes.txt").read_text() == "mine" and (out / "data" / "mine" / "plot.png").read_bytes() == b"mine"
    assert "Crafted again" in (out / "crafted-default.html").read_text()
    (results / "crafted" / "crafted.md").unlink()
    (results / "crafted" / "gone.md").write_text("# gone\n")  # a page the earlier report wrote is no longer made
    report.build(results, out, ROOT)
    assert not (out / "data" / "crafted" / "default" / "crafted.md").exists()
    assert (out / "data" / "crafted" / "crafted" / "gone.md").is_file() and (out / "my-notes.txt").is_file()


def test_a_users_file_where_the_report_writes_is_refused_in_one_line(tmp_path: Path) -> None:
    results, out = crafted_results(tmp_path), tmp_path / "site"
    report.build(results, out, ROOT)
    (results / "crafted" / "extra.csv").write_text("x\n1\n")
    (out / "data" / "crafted" / "default" / "extra.csv").write_text("my own extra.csv")
    refused = run_report("--results", str(results), "--out", str(out))
    assert refused.returncode == 1 and "Traceback" not in refused.stderr
    assert refused.stderr.strip().splitlines() == [
        f"error: --out: {out}/data/crafted/default/extra.csv is not the report's (an earlier report did not write it) "
        "and the report would replace it; move it, or choose another --out"
    ]
    assert (out / "data" / "crafted" / "default" / "extra.csv").read_text() == "my own extra.csv"
    assert not list(tmp_path.glob(f".site{STAGING}*"))


def test_out_naming_an_existing_file_is_one_line(tmp_path: Path) -> None:
    mine = tmp_path / "README.md"
    mine.write_text("mine")
    refused = run_report("--results", str(crafted_results(tmp_path)), "--out", str(mine))
    assert refused.returncode == 1 and refused.stderr.strip().splitlines() == [
        f"error: --out: a directory for the site ({mine} is a file)"
    ]
    assert mine.read_text() == "mine"


def test_a_killed_reports_staging_directory_is_removed_by_the_next(tmp_path: Path) -> None:
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    abandoned = tmp_path / f".site{STAGING}{dead.stdout.strip()}-abc123"
    abandoned.mkdir()
    (abandoned / "index.html").write_text("half written")
    alive = tmp_path / f".site{STAGING}{os.getppid()}-def456"  # a live process's: left alone
    alive.mkdir()
    report.build(crafted_results(tmp_path), tmp_path / "site", ROOT)
    assert not abandoned.exists() and alive.is_dir()


def run_report(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "experiments/report.py", *args], cwd=ROOT, capture_output=True, text=True, timeout=120
    )


@pytest.fixture(autouse=True)
def _offline(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
