"""attnlab.plots: each figure kind rendered on small hand-made data, checked for what a reader needs (what it shows,
axis labels with units, bands explained, ours and the paper's on one axis, integer step ticks)."""

from __future__ import annotations

from pathlib import Path

import matplotlib
import pandas as pd
import pytest
from matplotlib.figure import Figure

from attnlab import plots

matplotlib.use("Agg")


def texts(fig: Figure) -> str:
    """Every title, label and legend text of a figure, one string."""
    found = [fig.get_suptitle()]
    for ax in fig.axes:
        found += [ax.get_title(), ax.get_xlabel(), ax.get_ylabel()]
    for legend in fig.legends:
        found += [t.get_text() for t in legend.get_texts()]
    return "\n".join(found)


def rendered(fig: Figure, path: Path) -> Figure:
    plots.save(fig, path)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    return fig


def curves(seeds: int) -> pd.DataFrame:
    rows = []
    for series in ("vanilla", "ssa"):
        for seed in range(1, seeds + 1):
            for step in (10, 20, 30):
                value = 6.0 - step / 20 + 0.1 * seed + (0.3 if series == "ssa" else 0.0)
                rows.append({"panel": "val/loss", "series": series, "seed": seed, "step": step, "value": value})
    return pd.DataFrame(rows)


def test_parameters_and_row_labels_name_our_real_size() -> None:
    assert plots.row_label("OPT-125m", "tiny", 953_856) == "OPT-125m row: our tiny, 0.95M params"
    assert plots.parameters_label(124_439_808) == "124M params" and plots.parameters_label(1234) == "1,234 params"
    assert plots.parameters_label(None) == "size unknown"


@pytest.mark.parametrize(("seeds", "band"), [(3, "min-max"), (2, "std"), (1, "std")])
def test_curves_explain_their_band_and_tick_at_the_logged_steps(tmp_path: Path, seeds: int, band: str) -> None:
    panel = plots.Panel("val/loss", "validation", "loss (nats per token)", thresholds=((5.0, "threshold (5)"),))
    fig = rendered(plots.curves_figure(curves(seeds), [panel], "sweep over attention"), tmp_path / "c.png")
    if band == "std":
        fig = plots.curves_figure(curves(seeds), [panel], "sweep over attention", band="std")
    shown = texts(fig)
    ax = fig.axes[0]
    assert "sweep over attention" in shown and ax.get_xlabel() == "optimizer steps done"
    assert "nats per token" in ax.get_ylabel() and "threshold (5)" in shown
    assert [t.get_text() for t in ax.get_xticklabels()] == ["10", "20", "30"]
    assert f"vanilla ({seeds} seed{'s' if seeds > 1 else ''})" in shown
    if seeds == 1:
        assert "band" not in shown and "std" not in shown and not ax.collections  # one run: no band, none named
    else:
        stat = "min-max" if band == "min-max" else "± 1 std"
        assert f"band: {stat} over {seeds} seeds" in shown and ax.collections


def test_many_steps_get_integer_ticks() -> None:
    frame = pd.DataFrame(
        {"panel": "p", "series": "a", "seed": 1, "step": range(50, 650, 50), "value": [float(i) for i in range(12)]}
    )
    fig = plots.curves_figure(frame, [plots.Panel("p", "p", "value (units)")], "t")
    ticks = fig.axes[0].get_xticks()
    assert len(ticks) > 2 and all(float(t).is_integer() for t in ticks)


def pruning_rows(seeds: int, perplexity: float) -> pd.DataFrame:
    rows = []
    for seed in range(1, seeds + 1):
        for order, repeats in (("importance", 1), ("random", 5)):
            for repeat in range(repeats):
                for heads in (0, 2, 3, 5, 8):
                    ppl = perplexity * (1 + heads / 16 * (0.5 if order == "importance" else 1.0)) + repeat + seed
                    rows.append({"order": order, "repeat": repeat, "seed": seed, "heads_pruned": heads})
                    rows[-1]["perplexity"] = ppl
    return pd.DataFrame(rows)


def test_pruning_panels_share_one_axis_count_heads_and_explain_both_bands(tmp_path: Path) -> None:
    panels = {
        "vanilla\nOPT-125m row: our tiny, 0.95M params": pruning_rows(3, 300.0),
        "gated\nOPT-125m row: our tiny, 0.95M params": pruning_rows(3, 240.0).assign(
            perplexity=lambda f: 240 + (f["perplexity"] - 240) / 100
        ),
    }
    fig = rendered(plots.pruning_figure(panels, 16, "table pruning, cpu scale"), tmp_path / "p.png")
    shown = texts(fig)
    top = [ax for ax in fig.axes if "row: our tiny, 0.95M params" in ax.get_title()]
    assert len(top) == 2 and top[0].get_ylim() == top[1].get_ylim()  # the same y range: panels compare
    assert "zoom" in shown  # the flattened panel gets its own range, said as such
    assert all(ax.get_xlabel() == "heads masked (of 16)" for ax in fig.axes[-2:])
    assert [t.get_text() for t in fig.axes[-1].get_xticklabels()] == ["0", "2", "3", "5", "8"]  # actual heads
    assert "band min-max over 3 seeds" in shown and "band min-max over 3 seeds x 5 random orders" in shown
    single = plots.pruning_figure({"": pruning_rows(1, 300.0)}, 16, "one model")
    assert "min-max over 5 random orders" in texts(single) and len(single.axes) == 1


def tidy() -> pd.DataFrame:
    rows = []
    for attention, kurtosis, paper in (("vanilla", 4.15, 1778.0), ("gated", 3.8, 18.9)):
        gated = attention == "gated"
        base = {"stage": "pretrain", "row": "OPT-125m", "model": "tiny", "attention": attention, "seeds": 3}
        rows.append(
            base
            | {"column": "kurtosis_mean", "metric": "kurtosis_mean", "standin": "mean kurtosis (Gaussian: 3)"}
            | {"mean": kurtosis, "std": 0.2, "paper": paper, "paper_low": paper, "paper_high": paper}
        )
        rows.append(
            base
            | {"column": "gate_mean", "metric": "gate_mean", "standin": "mean gate value"}
            | {"mean": 0.4 if gated else None, "std": 0.01, "paper": None}
            | {"paper_low": 0.11 if gated else None, "paper_high": 0.25 if gated else None}
        )
    return pd.DataFrame(rows)


def test_table_puts_ours_and_the_papers_on_one_axis(tmp_path: Path) -> None:
    title = "table outliers, cpu scale: pretrain"
    caption = plots.row_label("OPT-125m", "tiny", 953_856)
    fig = rendered(plots.table_figure(tidy(), title, {"gated": "gated (G1)"}, caption=caption), tmp_path / "t.png")
    shown = texts(fig)
    assert "cpu scale" in shown and "OPT-125m row: our tiny, 0.95M params" in shown
    assert "ours: mean, ± 1 std over 3 seeds" in shown and "paper" in shown
    visible = [ax for ax in fig.axes if ax.get_visible()]
    assert len(visible) == 2  # no twin axes: one axis per table column
    kurtosis, gate = visible
    assert kurtosis.get_xscale() == "log" and "log scale" in kurtosis.get_xlabel()  # 4.15 against 1,778
    assert gate.get_xscale() == "linear" and gate.get_xlabel() == "mean gate value"
    assert [t.get_text() for t in kurtosis.get_yticklabels()] == ["vanilla", "gated (G1)"]
    ours_x = [line.get_xdata()[0] for line in kurtosis.get_lines() if line.get_marker() == "D"]
    assert sorted(ours_x) == [18.9, 1778.0]  # the paper's values drawn on the same axis as ours


def test_text_heatmap_has_a_colour_bar_naming_the_value(tmp_path: Path) -> None:
    fig = plots.text_heatmap_figure(["low", " mid\n", "high"], [1.0, 2.0, 3.0], "tau per token", "tau_q")
    rendered(fig, tmp_path / "h.png")
    bar = next(ax for ax in fig.axes if "tau_q" in ax.get_xlabel())
    assert "darker = lower" in bar.get_xlabel() and fig.get_suptitle() == "tau per token"
    colours, low, high = plots.value_colours([1.0, 2.0, 3.0])
    assert (low, high) == (1.0, 3.0) and plots.text_colour(colours[0]) == "white"


def test_a_tables_figures_name_the_table_scale_and_our_model_per_row(tmp_path: Path) -> None:
    """attnlab.tables.figures: a results directory's tidy CSV and curves.csv, drawn with our model's size per row."""
    from attnlab.tables.figures import TableResults

    tidy().to_csv(tmp_path / "t.csv", index=False)
    logged = curves(3).rename(columns={"series": "attention", "panel": "metric"})
    logged = logged.assign(stage="pretrain", row="OPT-125m")
    logged.assign(step=logged["step"] - 1).to_csv(tmp_path / "curves.csv", index=False)
    table = {"name": "t", "title": "Quantizable Transformers", "paper_variant_names": {"gated": "Gated attention"}}
    results = TableResults(table, "cpu", tmp_path, {("pretrain", "OPT-125m"): ("tiny", 953_856)})
    (stage, figure), *_ = results.stage_figures().items()
    shown = texts(figure)
    assert stage == "pretrain" and "table t, cpu scale" in shown and "OPT-125m row: our tiny, 0.95M params" in shown
    assert "stand-ins" in shown
    assert [t.get_text() for t in figure.axes[0].get_yticklabels()] == ["vanilla", "gated (Gated attention)"]
    training = results.training_figure()
    assert training is not None and "OPT-125m row: our tiny, 0.95M params" in texts(training)
    assert [t.get_text() for t in training.axes[0].get_xticklabels()] == ["10", "20", "30"]  # steps done, not 0-based
