"""The report's index tells the truth at a glance, on the committed results: a verdict count is coloured
only when it is not 0, a table that judged nothing shows "-", a partial table says how many cells it holds, a table
whose every number is 0 is a pipeline check, and no title is a path. Its figures: an axis of values that cannot be
negative stops at 0, and paper numbers not verified against the paper's text are drawn apart."""

from __future__ import annotations

import pytest

from attnlab import report
from tests.conftest import ROOT

RESULTS = ROOT / "experiments" / "results"


def pages() -> dict[str, report.Page]:
    found = {}
    for page in report.discover(RESULTS):
        report.summarise(page)
        found[f"{page.name}-{page.variant}"] = page
    return found


def test_the_index_colours_only_counts_above_zero_and_shows_dashes_where_nothing_was_judged() -> None:
    found = pages()
    judged = found["table3-cpu"]
    counts = judged.verdict_counts
    assert [verdict for verdict, _, _ in counts] == list(report.JUDGED)
    assert all(coloured == (shown != "0") for _, shown, coloured in counts) and any(s == "0" for _, s, _ in counts)
    partial = found["pruning-cpu_long"]  # vanilla's cells alone: nothing judged yet
    held = report.PARTIAL.search((RESULTS / "pruning" / "cpu_long" / "pruning.md").read_text())[1]  # "3 of 9 cells"
    assert partial.verdict_counts == [(verdict, "-", False) for verdict in report.JUDGED]
    assert partial.partial == held and partial.status == f"partial: {held}" and held.endswith(" of 9 cells")
    index = report.templates().get_template("index.html.j2").render(pages=list(found.values()), made="", results="")
    row = index.rsplit(f'href="{partial.filename}"', 1)[1].split("</tr>")[0]  # the table follows the nav
    dashes = row.count("<td>-</td>")  # the four verdicts, and the phenomenon: the pruning table checks none
    assert f"(partial: {held})" in row and dashes == 5 and "0 / 0" not in row
    assert '<td class="verdict reproduces">0</td>' not in index and '<td class="verdict unresolved">' in index


def test_a_table_whose_every_number_is_zero_is_a_pipeline_check() -> None:
    found = pages()
    assert found["table4-cpu"].pipeline_check and "pipeline check" in found["table4-cpu"].status
    assert not found["table3-cpu"].pipeline_check and found["table3-cpu"].status == ""


def test_results_without_a_table_are_titled_by_what_they_hold_not_their_path() -> None:
    others = [page for page in report.discover(RESULTS) if page.name in ("emergence", "bench")]
    assert others
    for page in others:
        markdowns = sorted(page.source.glob("*.md"))
        title = report.results_title(page, markdowns)
        assert "experiments/results" not in title and title.startswith(page.name)
    bench = next(page for page in others if page.name == "bench")
    assert report.results_title(bench, sorted(bench.source.glob("*.md"))).endswith("reports")


@pytest.mark.slow
def test_figures_keep_accuracy_at_or_above_zero_and_draw_unverified_paper_numbers_hollow() -> None:
    from attnlab.tables.figures import TableResults

    passkey = TableResults.load(RESULTS / "table4" / "cpu", ROOT).stage_figures()
    for figure in passkey.values():
        assert all(ax.get_xlim()[0] >= 0 for ax in figure.axes if ax.get_visible())
    outliers = TableResults.load(RESULTS / "outliers" / "cpu", ROOT).stage_figures()
    legend = [text.get_text() for figure in outliers.values() for text in figure.legends[0].get_texts()]
    assert any("not verified against its text (OPT-125m)" in text for text in legend)
    hollow = [
        line
        for figure in outliers.values()
        for ax in figure.axes
        for line in ax.get_lines()
        if line.get_marker() == "D" and line.get_markerfacecolor() == "none"
    ]
    assert hollow
    verified = TableResults.load(RESULTS / "table3" / "cpu", ROOT).stage_figures()
    legend = [text.get_text() for figure in verified.values() for text in figure.legends[0].get_texts()]
    assert not any("not verified" in text for text in legend)
