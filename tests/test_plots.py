"""attnlab.plots: each figure kind rendered on small hand-made data, checked for what a reader needs (what it shows,
axis labels with units, bands explained, ours and the paper's on one axis, integer step ticks)."""

from __future__ import annotations

import itertools
import math
from pathlib import Path

import matplotlib
import pandas as pd
import pytest
import torch
from experiments import paper_numbers
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.text import Text
from matplotlib.transforms import Bbox
from omegaconf import open_dict

import attnlab.resolvers  # noqa: F401
from attnlab import plots

matplotlib.use("Agg")
CONF = Path(__file__).resolve().parents[1] / "experiments" / "conf"


def texts(fig: Figure) -> str:
    """Every title, label and legend text of a figure, one string."""
    found = [fig.get_suptitle()]
    for ax in fig.axes:
        found += [ax.get_title(), ax.get_xlabel(), ax.get_ylabel()]
    for legend in fig.legends:
        found += [t.get_text() for t in legend.get_texts()]
    return "\n".join(found)


def colliding_text(fig: Figure) -> list[tuple[str, str]]:
    """Pairs of (text, what it runs into) where a panel's title, axis label or tick label overlaps another panel's
    text or plotting area, or the figure's title, once drawn: empty for a figure that reads."""
    renderer = FigureCanvasAgg(fig).get_renderer()
    fig.draw(renderer)
    axes = [ax for ax in fig.axes if ax.get_visible()]

    def shown_ticks(ax: object) -> list[object]:
        """The tick labels drawn: those inside the view (matplotlib keeps labels for ticks beyond it)."""
        (x0, x1), (y0, y1) = sorted(ax.get_xlim()), sorted(ax.get_ylim())
        xs = [t for minor in (False, True) for t in ax.get_xticklabels(minor=minor) if x0 <= t.get_position()[0] <= x1]
        ys = [t for minor in (False, True) for t in ax.get_yticklabels(minor=minor) if y0 <= t.get_position()[1] <= y1]
        return xs + ys

    def text_boxes(ax: object) -> list[tuple[str, object]]:
        found = [ax.title, ax.xaxis.label, ax.yaxis.label, *shown_ticks(ax)]
        return [(t.get_text(), t.get_window_extent(renderer)) for t in found if t.get_visible() and t.get_text()]

    def overlap(a: object, b: object) -> bool:
        return min(a.x1, b.x1) - max(a.x0, b.x0) > 1 and min(a.y1, b.y1) - max(a.y0, b.y0) > 1

    suptitles = [fig._suptitle] + [sub._suptitle for sub in fig.subfigs]
    titles = [(t.get_text(), t.get_window_extent(renderer)) for t in suptitles if t is not None and t.get_text()]
    found = []
    for one, other in itertools.permutations(axes, 2):
        targets = [*text_boxes(other), ("plotting area", other.get_window_extent(renderer))]
        found += [(a, b) for a, box in text_boxes(one) for b, target in targets if overlap(box, target)]
    for ax in axes:
        found += [(a, t) for a, box in text_boxes(ax) for t, title in titles if overlap(box, title)]
    return found


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


def bar_widths(ax: object) -> list[float]:
    return [round(bar.get_width(), 6) for bar in ax.patches]


def test_effects_bars_are_the_differences_with_their_whiskers_and_verdict_colours(tmp_path: Path) -> None:
    """A bar per variant on one row order across panels; whiskers only where the interval is finite; a variant a
    panel lacks says so instead of a bar at 0; a claimed effect takes its Holm verdict's colour; one bar that
    dwarfs most of 4+ bars puts the axis on a symmetric log scale, linear to the next decade, said in its label."""
    names = ["softpick", "stickbreaking (stick-breaking)", "sigmoid", "fox"]
    perplexity = pd.DataFrame(
        {"value": [-2.0, 1.5, 900.0, -1.0], "low": [-3.0, 0.5, 850.0, -2.0], "high": [-1.0, 2.5, 950.0, 0.0]},
        index=names,
    )
    entropy = pd.DataFrame(
        {"value": [-0.5, -0.25], "low": [-math.inf, -0.3], "high": [math.inf, -0.2]}, index=names[:2]
    )
    panels = [
        plots.EffectPanel("perplexity", "token perplexity, variant - vanilla (vanilla: 300)", perplexity, {}),
        plots.EffectPanel(
            "attention_entropy", "nats, variant - vanilla (vanilla: 2.8)", entropy, {names[0]: "reproduces"}
        ),
    ]
    fig = rendered(
        plots.effects_figure(panels, "table variants, cpu scale", "whiskers: 95% t-interval"), tmp_path / "e.png"
    )
    first, second = fig.axes[:2]
    assert [t.get_text() for t in first.get_yticklabels()] == names  # one row order, shared by every panel
    assert bar_widths(first) == [-2.0, 1.5, 900.0, -1.0] and bar_widths(second) == [-0.5, -0.25, 0.0, 0.0]
    assert first.get_xscale() == "symlog" and "symmetric log scale beyond ±10" in first.get_xlabel()
    assert second.get_xscale() == "linear" and second.get_xlabel().startswith("nats, variant - vanilla")
    (whiskers,) = [c for c in second.collections if c.get_segments()]
    assert len(whiskers.get_segments()) == 1  # softpick's interval is infinite (one seed): no whisker drawn
    assert [t.get_text() for t in second.texts] == ["no value"] * 2  # sigmoid and fox have no entropy here
    assert second.patches[0].get_facecolor()[:3] == matplotlib.colors.to_rgb(plots.VERDICT_COLOURS["reproduces"])
    assert second.patches[1].get_facecolor()[:3] == matplotlib.colors.to_rgb(plots.UNJUDGED_COLOUR)
    shown = texts(fig)
    assert "no paper direction to judge" in shown and "a paper's claim: unresolved (Holm)" in shown
    assert "whiskers: 95% t-interval" in fig.get_suptitle() and colliding_text(fig) == []
    # two bars are no "most bars": a 2,000x ratio stays on a linear axis (symlog ticks crowded around 0 here)
    two = plots.EffectPanel(
        "perplexity", "token perplexity", perplexity.iloc[:2].assign(value=[0.008, -15.7], low=None, high=None), {}
    )
    assert plots.effects_figure([two], "t").axes[0].get_xscale() == "linear"


def test_a_tables_effects_figure_reads_its_csvs_in_the_columns_units_beside_its_costs(tmp_path: Path) -> None:
    """attnlab.tables.figures: effects.csv's paired differences per column (in the column's unit, vanilla's mean in
    the label), then costs.csv's parameters added and step time (whiskers: quartiles), vanilla not a row."""
    from attnlab.tables.figures import TableResults

    place = {"stage": "pretrain", "row": "from scratch"}
    effects = [
        place
        | {"attention": a, "column": c, "metric": c, "seeds": n, "diff": d, "ci_low": d - 1, "ci_high": d + 1}
        | {"verdict": v, "verdict_holm": v}
        for a, c, d, v, n in (
            ("softpick", "perplexity", -4.0, "no paper value", 3),
            ("fox", "perplexity", 2.0, "opposite", 2),  # a seed short of softpick's
            ("softpick", "attention_entropy", -0.5, "no paper value", 3),
            ("fox", "attention_entropy", 0.1, "no paper value", 2),
        )
    ]
    pd.DataFrame(effects).to_csv(tmp_path / "effects.csv", index=False)
    means = [("vanilla", "perplexity", 300.0), ("vanilla", "attention_entropy", 2.8), ("fox", "perplexity", 302.0)]
    tidy_rows = [place | {"attention": a, "column": c, "mean": m} for a, c, m in means]
    pd.DataFrame(tidy_rows).to_csv(tmp_path / "variants.csv", index=False)
    costs = [
        place
        | {"attention": a, "parameters": n, "parameters_added_pct": pct, "rounds": 10}
        | {"step_ratio": r, "step_ratio_q1": r - 0.05, "step_ratio_q3": r + 0.1}
        for a, n, pct, r in (("vanilla", 1000, 0.0, 1.0), ("fox", 1010, 1.0, 1.5), ("softpick", 1000, 0.0, 1.25))
    ]
    pd.DataFrame(costs).to_csv(tmp_path / "costs.csv", index=False)
    table = {
        "name": "variants",
        "title": "Every variant",
        "baseline": "vanilla",
        "columns": [
            {"paper": "perplexity", "unit": "token perplexity"},
            {"paper": "attention_entropy", "unit": "nats"},
        ],
        "paper_variant_names": {"fox": "FoX"},
    }
    sizes = {("pretrain", "from scratch"): ("tiny", 953_856)}
    fig = rendered(TableResults(table, "cpu", tmp_path, sizes).effects_figure(), tmp_path / "effects.png")
    panels = [ax for ax in fig.axes if ax.get_visible()]
    assert [ax.get_title() for ax in panels] == ["perplexity", "attention_entropy", "parameters added", "step time"]
    # vanilla is no row; a variant on fewer seeds says so, on the same row in the cost panels
    assert [t.get_text() for t in panels[0].get_yticklabels()] == ["softpick", "fox (FoX) (2 seeds)"]
    assert bar_widths(panels[0]) == [-4.0, 2.0] and bar_widths(panels[1]) == [-0.5, 0.1]
    labels = [ax.get_xlabel().replace("\n", " ") for ax in panels]  # wrapped to the panel's width
    assert labels[:2] == [
        "token perplexity, variant - vanilla (vanilla: 300)",
        "nats, variant - vanilla (vanilla: 2.8)",
    ]
    assert panels[0].patches[1].get_facecolor()[:3] == matplotlib.colors.to_rgb(plots.VERDICT_COLOURS["opposite"])
    assert bar_widths(panels[2]) == [0.0, 1.0] and labels[2] == "% of vanilla's 1,000 parameters"
    assert bar_widths(panels[3]) == [25.0, 50.0]  # % above vanilla's median step
    assert "quartiles over 10 rounds" in labels[3] and "vanilla's own: -5% to +10%" in labels[3]
    title = fig.get_suptitle()
    assert "table variants, cpu scale" in title and "from scratch row: our tiny, 0.95M params; 2-3 seed(s)" in title
    assert "whiskers: its 95% t-interval" in title and colliding_text(fig) == []


def test_matrices_share_one_labelled_colour_scale_and_no_text_collides(tmp_path: Path) -> None:
    truth = torch.tensor([[0.5, 0.5, 0.0], [0.0, 0.5, 0.5], [0.0, 0.0, 1.0]])
    grid = [
        [("P* (ground truth)", truth), ("vanilla: attention map P^\nsum |P^ - P*| = 1.2 ± 0.1", truth.roll(1, 1))],
        [("P* (ground truth)", truth), ("vanilla: predicted transition G\nsum |G - P*| = 0.5 ± 0.1", truth * 0.9)],
    ]
    fig = plots.matrices_figure(
        grid, "maps, lr 1e-4", xlabels=["key token (node id)", "next token (node id)"],
        ylabel="query: last token (node id)", value_label="probability (each row sums to 1)", ticks=["0", "1", "2"],
    )  # fmt: skip
    rendered(fig, tmp_path / "m.png")
    bar = fig.axes[-1]
    assert bar.get_ylabel() == "probability (each row sums to 1)"  # the one colour bar names its value
    panels = fig.axes[:-1]
    assert [ax.get_ylabel() for ax in panels] == ["query: last token (node id)", "", "query: last token (node id)", ""]
    assert [ax.get_xlabel() for ax in panels[2:]] == ["next token (node id)"] * 2
    assert {ax.images[0].get_clim() for ax in panels} == {(0.0, 1.0)}  # one colour scale for every panel
    assert ".50" in [t.get_text() for t in panels[0].texts] and "0" not in [t.get_text() for t in panels[0].texts]
    assert colliding_text(fig) == []


def test_the_collision_check_catches_labels_running_into_the_next_panel() -> None:
    """The old Figure 3's fault: long titles and y labels on panels packed side by side."""
    fig = Figure(figsize=(6, 2.5))
    for ax in fig.subplots(1, 3):
        ax.set(title="vanilla: predicted transition g(X)", ylabel="query token", xlabel="key / next token")
    assert colliding_text(fig)


def trajectory_rows(seeds: int, steps: tuple[int, ...]) -> tuple[pd.DataFrame, pd.DataFrame]:
    losses, temperatures = [], []
    for series, seed, step in itertools.product(("vanilla", "ssa"), range(seeds), steps):
        losses.append({"series": series, "seed": seed, "step": step, "value": 1.0 / (1 + step / 1000) + 0.01 * seed})
    for group, seed, step in itertools.product(range(1, 5), range(seeds), steps):
        temperatures.append({"series": f"T, {group} options", "seed": seed, "step": step, "value": group / (1 + seed)})
    return pd.DataFrame(losses), pd.DataFrame(temperatures)


@pytest.mark.slow
def test_trajectory_shows_the_seed_spread_a_panel_per_seed_and_says_what_the_band_spans(tmp_path: Path) -> None:
    steps = tuple(range(0, 400_001, 20_000))
    losses, temperatures = trajectory_rows(3, steps)
    ratio = pd.DataFrame({"step": steps, "value": [1.0 - step / 1e6 for step in steps]})
    fig = plots.trajectory_figure(
        losses, "checks, lr 1e-4, 3 seeds", loss_label="CE - H(P*), nats", ratio=ratio, ratio_label="SSA / vanilla",
        paper_ratio=(0.71, "paper: 0.71"), temperatures=temperatures, temperature_label="learned T",
        temperature_title="SSA only",
    )  # fmt: skip
    rendered(fig, tmp_path / "t.png")
    loss, ratio_axis, *seed_axes = fig.axes
    legend = [t.get_text() for t in loss.get_legend().get_texts()]
    assert "vanilla (3 seeds)" in legend and "line: mean over seeds\nband: min-max over 3 seeds" in legend
    assert loss.collections and loss.get_yscale() == "log" and "log scale" in loss.get_ylabel()
    assert "paper: 0.71" in [t.get_text() for t in ratio_axis.get_legend().get_texts()]
    assert [ax.get_title() for ax in seed_axes] == ["seed 0", "seed 1", "seed 2"]
    assert len({ax.get_ylim() for ax in seed_axes}) == 1  # one y axis: the seeds compare
    assert fig.subfigs[1].get_suptitle() == "SSA only" and "log scale" in seed_axes[0].get_ylabel()
    ticks = [t.get_text() for t in loss.get_xticklabels() if t.get_text()]
    assert "400k" in ticks and all(t == "0" or t.endswith("k") for t in ticks)  # no six-digit labels
    assert colliding_text(fig) == []
    one = plots.trajectory_figure(trajectory_rows(1, (0, 10, 20))[0], "one seed", loss_label="loss")
    assert len(one.axes) == 1 and not one.axes[0].collections  # one seed: no band, and none named
    assert "band" not in "".join(t.get_text() for t in one.axes[0].get_legend().get_texts())


def synthetic_config(tmp_path: Path, experiment: str):
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose(config_name="synthetic", overrides=[f"synthetic_table={experiment}"])
    GlobalHydra.instance().clear()
    with open_dict(cfg):
        cfg.results_dir = str(tmp_path)
    return cfg


@pytest.mark.parametrize("experiment", ["table1/default", "table1/options/readout_attention"])
@pytest.mark.slow
def test_table1_figures_name_the_protocol_lr_seeds_and_our_model(tmp_path: Path, experiment: str) -> None:
    """attnlab.synthetic.tables: Figure 3 and the trajectory drawn from hand-made maps.csv and trajectory.csv."""
    from attnlab.synthetic.data import transition_matrix
    from attnlab.synthetic.tables import draw_table1, figure3, trajectory_figure

    cfg = synthetic_config(tmp_path, experiment)
    truth = transition_matrix(8, [[0, 1], [0, 2], [0, 3], [1, 4], [2, 5], [3, 6]])
    maps = [
        {"model": model, "kind": kind, "seed": seed, "query": q, "key": k, "value": float(truth[q, k]) * 0.9 + 0.0125}
        for model, kind, seed, q, k in itertools.product(("vanilla", "ssa"), ("attention", "transition"), range(5),
                                                          range(8), range(8))
    ]  # fmt: skip
    trajectory = [
        {"model": model, "seed": seed, "step": step, "cross_entropy": 1.0, "kl": 1 / (1 + step / 1000 + seed)}
        | ({f"T_{n}_option{'s' if n > 1 else ''}": n / (1 + seed) for n in range(1, 5)} if model == "ssa" else {})
        for model, seed, step in itertools.product(("vanilla", "ssa"), range(5), range(0, 20_001, 2000))
    ]
    pd.DataFrame(maps).to_csv(tmp_path / "maps.csv", index=False)
    pd.DataFrame(trajectory).to_csv(tmp_path / "trajectory.csv", index=False)
    assert [p.name for p in draw_table1(cfg, paper_numbers.TABLE1)] == ["figure3.png", "trajectory.png"]
    one_row = experiment.endswith("readout_attention")
    for fig in (figure3(cfg, truth, pd.DataFrame(maps), 20_000), trajectory_figure(cfg, pd.DataFrame(trajectory),
                                                                                   paper_numbers.TABLE1)):  # fmt: skip
        title = fig.get_suptitle()
        assert "20,000 Adam steps at lr 1e-4, batch 128; 5 seeds (0-4)" in title
        assert f"readout {'attention' if one_row else 'head'}" in title and "SSA q * tau" in title
        assert "d = 8" in title and "vanilla 384 params" in title if not one_row else "params" in title
        assert colliding_text(fig) == []
    maps_figure = figure3(cfg, truth, pd.DataFrame(maps), 20_000)
    assert maps_figure.axes[-1].get_ylabel() == "probability (each row sums to 1)"
    panels = [ax for ax in maps_figure.axes[:-1] if ax.get_visible()]
    assert len(panels) == (3 if one_row else 6)
    assert "vanilla: attention map P^" in panels[1].get_title() and "sum |P^ - P*| = " in panels[1].get_title()
    if not one_row:
        assert "sum |G - P*|" in panels[4].get_title() and panels[4].get_xlabel() == "next token (node id)"
    steps = trajectory_figure(cfg, pd.DataFrame(trajectory), paper_numbers.TABLE1)
    assert "SSA only" in steps.subfigs[1].get_suptitle()
    assert steps.subfigs[1].legends[0].get_texts()[0].get_text() == "T, 1 option (node 7)"


def test_tradeoff_names_of_close_variants_do_not_print_over_each_other(tmp_path: Path) -> None:
    """Four variants within a marker of each other (as softpick and softmax1 in the cpu_long table): each name lands
    inside the panel where it covers no other name and no other point's marker, and still points at its own
    mean, with a line to it once it is farther than the first ring of places."""
    close = pd.DataFrame(
        {"x": [80.0, 80.3, 80.1, 80.2, 95.0], "x_std": 1.0, "y": [2.0, 2.02, 1.98, 2.01, 4.6], "y_std": 0.3},
        index=["softpick", "softmax1", "sink (1 seed)", "gated", "vanilla"],
    )
    fig = rendered(
        plots.tradeoff_figure([plots.TradeoffPanel("w8a8_gap_pct", close)], "perplexity", "vanilla", "close"),
        tmp_path / "close.png",
    )
    renderer = FigureCanvasAgg(fig).get_renderer()
    fig.draw(renderer)
    (ax,) = fig.axes
    boxes = {t.get_text(): Text.get_window_extent(t, renderer) for t in ax.texts}  # the name, not its leader
    assert len(boxes) == 5 and any(t.arrow_patch is not None for t in ax.texts)  # four close: one goes far
    panel = ax.get_window_extent(renderer)
    assert all(panel.x0 <= b.x0 and b.x1 <= panel.x1 and panel.y0 <= b.y0 and b.y1 <= panel.y1 for b in boxes.values())
    for (one, box), (other, target) in itertools.combinations(boxes.items(), 2):
        assert not box.overlaps(target), f"{one!r} prints over {other!r}"
    for name in close.index:
        text = next(t for t in ax.texts if t.get_text() == name)
        assert text.xy == pytest.approx((close.loc[name, "x"], close.loc[name, "y"]))
        x, y = ax.transData.transform(text.xy)
        for other in close.index.drop(name):
            ox, oy = ax.transData.transform((close.loc[other, "x"], close.loc[other, "y"]))
            marker = Bbox.from_bounds(ox - 3, oy - 3, 6, 6)
            assert not boxes[name].overlaps(marker), f"{name!r} covers {other!r}'s marker"
        assert boxes[name].x0 - 40 < x < boxes[name].x1 + 40 and boxes[name].y0 - 40 < y < boxes[name].y1 + 40
        assert (text.arrow_patch is not None) == (abs(text.xyann[1]) > plots.LEADER_BEYOND_PT)  # a far name: a line


def test_a_tables_tradeoff_figure_puts_each_variant_at_its_means_with_the_baseline_marked(tmp_path: Path) -> None:
    """attnlab.tables.figures: per y column (W8A8 gap, max kurtosis), one point per variant at the baseline's mean
    plus its paired difference (its own mean when it has every seed; in a partial table the paired distance, not
    the one to another seed's baseline) with its std bars; the baseline a black square with dashed lines through
    it; a column that did not run is no panel; kurtosis spanning 20x goes on a log axis, said in its label."""
    from attnlab.tables.figures import TableResults

    place = {"stage": "pretrain", "row": "from scratch"}
    means = {  # mean, std, seeds, paired difference with vanilla
        "vanilla": {"perplexity": (300.0, 10.0, 3, None), "w8a8_gap_pct": (4.6, 1.0, 3, None)}
        | {"kurtosis_max": (486.0, 50.0, 3, None)},
        "gated": {"perplexity": (310.0, 5.0, 3, 10.0), "w8a8_gap_pct": (0.7, 0.2, 3, -3.9)}
        | {"kurtosis_max": (12.0, 3.0, 3, -474.0)},
        # one seed so far, paired with vanilla's seed 1 (ppl 293): 2 above it, though 5 below vanilla's mean
        "softpick": {"perplexity": (295.0, None, 1, 2.0), "w8a8_gap_pct": (2.0, None, 1, -2.5)}
        | {"kurtosis_max": (40.0, None, 1, -420.0)},
    }
    tidy = [
        place | {"attention": a, "column": c, "mean": m, "std": s, "seeds": n}
        for a, columns in means.items()
        for c, (m, s, n, _) in columns.items()
    ]
    tidy.append(place | {"attention": "vanilla", "column": "sink_epsilon", "mean": None, "std": None, "seeds": 0})
    pd.DataFrame(tidy).to_csv(tmp_path / "variants.csv", index=False)
    effects = [
        place | {"attention": a, "column": c, "diff": d}
        for a, columns in means.items()
        for c, (_, _, _, d) in columns.items()
        if d is not None
    ]
    pd.DataFrame(effects).to_csv(tmp_path / "effects.csv", index=False)
    table = {
        "name": "variants",
        "title": "Every variant",
        "baseline": "vanilla",
        "columns": [
            {"paper": "perplexity", "unit": "token perplexity"},
            {"paper": "w8a8_gap_pct", "unit": "percentage points"},
            {"paper": "kurtosis_max", "unit": "kurtosis"},
            {"paper": "sink_epsilon", "unit": "share of heads"},
        ],
        "paper_variant_names": {"gated": "Bondarenko gated"},
        "tradeoff_figure": {"x": "perplexity", "y": ["w8a8_gap_pct", "kurtosis_max", "sink_epsilon"]},
    }
    sizes = {("pretrain", "from scratch"): ("tiny", 4_300_000)}
    fig = rendered(TableResults(table, "cpu_long", tmp_path, sizes).tradeoff_figure(), tmp_path / "tradeoff.png")
    gap, kurtosis = fig.axes  # sink_epsilon has no mean: no panel
    assert gap.get_ylabel().startswith("w8a8_gap_pct (percentage points)") and gap.get_yscale() == "linear"
    assert kurtosis.get_yscale() == "log" and "(log scale)" in kurtosis.get_ylabel().replace("\n", " ")
    labels = {t.get_text(): t.xy for t in gap.texts}
    expected = {"vanilla": (300.0, 4.6), "gated": (310.0, 0.7), "softpick (1 seed)": (302.0, 2.1)}  # its seeds named
    assert labels.keys() == expected.keys()
    assert all(labels[name] == pytest.approx(xy) for name, xy in expected.items())
    dashed = [line for line in gap.get_lines() if line.get_linestyle() == "--"]
    assert sorted(tuple(line.get_xdata()) + tuple(line.get_ydata()) for line in dashed) == sorted(
        [(300.0, 300.0, 0, 1), (0, 1, 4.6, 4.6)]
    )
    shown = texts(fig)
    assert "bars: ±1 std over seeds" in shown and "4.3M" in fig.get_suptitle()
    assert "mean over 1-3 seed(s) per point (vanilla's mean plus the difference paired by seed)" in fig.get_suptitle()
    assert colliding_text(fig) == []
