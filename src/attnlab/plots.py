"""Every figure attnlab draws, in one style: one function per figure kind, each taking DataFrames or lists and the
labels a reader needs (table, scale, our model's real size, what a band is) and returning a matplotlib ``Figure``.

It imports nothing else from attnlab, so training, evaluation, tables, experiments and notebooks all call it without
import cycles; figures are built on ``matplotlib.figure.Figure`` (no pyplot state, no display needed).
"""

from __future__ import annotations

import io
import math
import textwrap
from collections.abc import Collection, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import matplotlib as mpl
import numpy as np
import pandas as pd
from cycler import cycler
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.colors import ListedColormap, Normalize
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch, Rectangle
from matplotlib.text import Annotation
from matplotlib.ticker import FixedLocator, FuncFormatter, LogFormatter, MaxNLocator
from matplotlib.transforms import Bbox

# Okabe & Ito's colour-blind-safe colours (yellow left out: too pale for lines on white), then three of Paul Tol's
# that stay apart from them; each series also gets its own marker, so even 10 lines read apart in grey print
PALETTE = (
    "#0072B2",
    "#D55E00",
    "#009E73",
    "#CC79A7",
    "#E69F00",
    "#56B4E9",
    "#000000",
    "#882255",
    "#999933",
    "#888888",
)
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "<", ">", "*")
PAPER_COLOUR = "#000000"
BASELINE_FREE_PALETTE = tuple(c for c in PALETTE if c != "#000000")  # black marks the baseline alone
DPI = 150
STYLE: dict[str, Any] = {
    "font.size": 9,
    "axes.titlesize": 10,
    "axes.labelsize": 9,
    "figure.titlesize": 11,
    "legend.fontsize": 8,
    "xtick.labelsize": 8,
    "ytick.labelsize": 8,
    "axes.grid": True,
    "grid.alpha": 0.3,
    "axes.prop_cycle": cycler(color=PALETTE),
    "axes.spines.top": False,
    "axes.spines.right": False,
    "legend.frameon": False,
    "savefig.dpi": DPI,
}
LOG_SPAN = 20.0  # a log axis once the values on it span this factor (said in the axis label)


@contextmanager
def style() -> Iterator[None]:
    """The one style: fonts, palette, grid and dpi, for every figure built inside it."""
    with mpl.rc_context(STYLE):
        yield


def save(fig: Figure, path: Path) -> Path:
    """Write ``fig`` as PNG at the style's dpi, trimmed to what it draws (legends outside the axes included)."""
    fig.savefig(path, dpi=DPI, bbox_inches="tight")
    return path


def png_bytes(fig: Figure) -> bytes:
    """``fig`` as PNG bytes, for a notebook to display without writing a file."""
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=DPI, bbox_inches="tight")
    return buffer.getvalue()


def series_style(index: int) -> dict[str, Any]:
    """Colour and marker of the ``index``-th series, the same in every panel of a figure."""
    return {"color": PALETTE[index % len(PALETTE)], "marker": MARKERS[index % len(MARKERS)]}


def wrap(text: str, width: int = 40) -> str:
    return "\n".join(textwrap.wrap(text, width)) or text


def parameters_label(parameters: float | None) -> str:
    """``0.93M params``: a model's real size as the figures print it beside the paper's row name."""
    if parameters is None or (isinstance(parameters, float) and math.isnan(parameters)):
        return "size unknown"
    if parameters < 1e5:
        return f"{int(parameters):,} params"
    if parameters >= 1e9:
        return f"{parameters / 1e9:.1f}B params"
    return f"{parameters / 1e6:.2g}M params" if parameters < 1e7 else f"{parameters / 1e6:.0f}M params"


def row_label(paper_row: str, model: str, parameters: float | None) -> str:
    """``OPT-125m row: our tiny, 0.93M params``: the paper's row name never stands alone for our model."""
    return f"{paper_row} row: our {model}, {parameters_label(parameters)}"


def wants_log(values: Sequence[float] | pd.Series) -> bool:
    """True when every value is positive and they span at least ``LOG_SPAN``."""
    found = [float(v) for v in values if v is not None and not math.isnan(float(v))]
    return bool(found) and min(found) > 0 and max(found) / min(found) >= LOG_SPAN


class PlainLogFormatter(LogFormatter):
    """``LogFormatter``'s choice of which ticks to label, each label a plain number (``0.6``, not ``6e-01``)."""

    def __call__(self, x: float, pos: int | None = None) -> str:
        return f"{x:g}" if super().__call__(x, pos) else ""


def plain_log_ticks(axis: Any, decades: float = 1) -> None:
    """Log-axis tick labels as plain numbers (``300``, ``0.6``, not ``3x10^2``, ``6e-01``), some minor ones labelled
    on ranges up to ``decades`` decades (all of them below half a decade)."""
    axis.set_major_formatter(PlainLogFormatter())
    axis.set_minor_formatter(PlainLogFormatter(labelOnlyBase=False, minor_thresholds=(decades, 0.5)))


def step_ticks(ax: Any, steps: Sequence[int]) -> None:
    """Integer ticks: at each logged step when there are few, else integer-only automatic ones."""
    distinct = sorted({int(s) for s in steps})
    if 0 < len(distinct) <= 10:
        ax.xaxis.set_major_locator(FixedLocator(distinct))
    else:
        ax.xaxis.set_major_locator(MaxNLocator(integer=True, steps=[1, 2, 2.5, 5, 10]))


def band_label(stat: str, count: int, what: str) -> str:
    """``band: min-max over 3 seeds``: what a shaded band spans, for the legend."""
    return f"band: {stat} over {count} {what}"


# ------------------------------------------------------------------------------------------------ curves
@dataclass(frozen=True)
class Panel:
    """One panel of ``curves_figure``: the rows of ``curves`` whose ``panel`` column is ``key``; ``thresholds``
    (grey, dashed) and ``paper`` (black, dotted) are horizontal reference lines on the same axis, as ``(y, label)``."""

    key: str
    title: str
    ylabel: str
    log: bool = False
    thresholds: tuple[tuple[float, str], ...] = ()
    paper: tuple[tuple[float, str], ...] = ()


def curves_figure(
    curves: pd.DataFrame,
    panels: Sequence[Panel],
    title: str,
    *,
    xlabel: str = "optimizer steps done",
    band: str = "min-max",
    order: Sequence[str] | None = None,
    columns: int = 2,
) -> Figure:
    """Values against steps, one panel per ``Panel``: columns ``panel``, ``series``, ``seed``, ``step``, ``value``.
    Each series is its mean over seeds, with a band where it has more than one seed: ``band`` ``"min-max"`` or
    ``"std"`` (± 1 std). Integer step ticks; one legend beside the panels naming each series' seeds and the band."""
    if band not in ("min-max", "std"):
        raise ValueError(f"band: min-max or std (got {band})")
    series = list(order) if order is not None else sorted(curves["series"].unique())
    series += [s for s in sorted(curves["series"].unique()) if s not in series]
    columns = min(columns, len(panels))
    rows = math.ceil(len(panels) / columns)
    with style():
        fig = Figure(figsize=(5.2 * columns, 3.3 * rows + 1.0), layout="constrained")
        axes = fig.subplots(rows, columns, squeeze=False).flatten()
        handles: dict[str, Any] = {}
        seeds_per_series: dict[str, int] = {}
        for ax, panel in zip(axes, panels, strict=False):
            part = curves[curves["panel"] == panel.key]
            for index, name in enumerate(series):
                curve = part[part["series"] == name]
                if curve.empty:
                    continue
                stats = curve.groupby("step")["value"].agg(["mean", "std", "min", "max", "count"])
                steps = stats.index.to_numpy()
                look = series_style(index)
                (line,) = ax.plot(steps, stats["mean"], color=look["color"], marker=look["marker"], markersize=3)
                handles.setdefault(name, line)
                seeds = int(curve["seed"].nunique())
                seeds_per_series[name] = max(seeds, seeds_per_series.get(name, 0))
                if seeds > 1:
                    spread = stats["std"].fillna(0.0)
                    low, high = (
                        (stats["min"], stats["max"])
                        if band == "min-max"
                        else (stats["mean"] - spread, stats["mean"] + spread)
                    )
                    ax.fill_between(steps, low, high, color=look["color"], alpha=0.18, linewidth=0)
            for y, label in panel.thresholds:
                handles[label] = ax.axhline(y, color="#777777", linestyle="--", linewidth=1)
            for y, label in panel.paper:
                handles[label] = ax.axhline(y, color=PAPER_COLOUR, linestyle=":", linewidth=1.5)
            ax.set_title(panel.title)
            ax.set_xlabel(xlabel)
            ax.set_ylabel(panel.ylabel + (" (log scale)" if panel.log else ""))
            if panel.log:
                ax.set_yscale("log")
                plain_log_ticks(ax.yaxis)
            step_ticks(ax, part["step"])
        for ax in axes[len(panels) :]:
            ax.set_visible(False)
        labels = []
        for name in handles:
            seeds = seeds_per_series.get(name)
            labels.append(f"{name} ({seeds} seed{'s' if seeds != 1 else ''})" if seeds else name)
        entries = list(handles.values())
        most = max(seeds_per_series.values(), default=1)
        if most > 1:
            stat = "min-max" if band == "min-max" else "± 1 std"
            entries.append(Patch(color="#999999", alpha=0.35))
            labels.append(f"line: mean over seeds\n{band_label(stat, most, 'seeds')}")
        fig.legend(entries, labels, loc="outside lower center", ncols=min(3, len(entries)))
        fig.suptitle(title)
    return fig


# ------------------------------------------------------------------------------------------------ pruning
ZOOM = 0.25  # pruning_figure adds a zoomed row when some panel's own range is below this share of the shared one


def _pruning_orders(ax: Any, frame: pd.DataFrame, legend: dict[str, tuple[Any, ...]]) -> None:
    """Per order, the mean over its rows (seeds, random orders) at each number of heads masked, with their min-max
    band; the legend says what each band spans."""
    for index, order in enumerate(("importance", "random")):
        rows = frame[frame["order"] == order]
        if rows.empty:
            continue
        by_step = rows.groupby("heads_pruned")["perplexity"]
        x = by_step.mean().index.to_numpy()
        look = series_style(index)
        (line,) = ax.plot(x, by_step.mean(), color=look["color"], marker=look["marker"], markersize=4)
        seeds = int(rows["seed"].nunique()) if "seed" in rows else 1
        orders = int(rows["repeat"].nunique()) if order == "random" and "repeat" in rows else 1
        parts = (f"{seeds} seeds" if seeds > 1 else "", f"{orders} random orders" if orders > 1 else "")
        over = " x ".join(part for part in parts if part)
        name = "importance order (least important first)" if order == "importance" else "random order"
        if over:
            ax.fill_between(x, by_step.min(), by_step.max(), color=look["color"], alpha=0.18, linewidth=0)
            legend.setdefault(f"{name}: mean, band min-max over {over}", (line, Patch(color=look["color"], alpha=0.3)))
        else:
            legend.setdefault(name, (line,))
    ax.xaxis.set_major_locator(FixedLocator(sorted(frame["heads_pruned"].unique())))


def pruning_figure(panels: Mapping[str, pd.DataFrame], heads: int, title: str) -> Figure:
    """Perplexity against the number of heads actually masked, one panel per model (``title -> rows`` with
    ``order``, ``heads_pruned``, ``perplexity`` and optionally ``seed`` and ``repeat``), all on one y axis so the
    models compare; where that flattens a model's curves, a second row zooms into each panel's own range (said in
    its label)."""
    values = pd.concat([frame["perplexity"] for frame in panels.values()])
    log = values.max() >= LOG_SPAN / 4 * values.min() > 0
    spans = [frame["perplexity"].max() - frame["perplexity"].min() for frame in panels.values()]
    zoom = len(panels) > 1 and min(spans) < ZOOM * (values.max() - values.min())
    with style():
        fig = Figure(figsize=(4.2 * len(panels) + 0.4, 3.3 * (1 + zoom) + 0.6), layout="constrained")
        grid = fig.subplots(1 + zoom, len(panels), squeeze=False, sharex="col")
        legend: dict[str, tuple[Any, ...]] = {}
        for column, (panel_title, frame) in enumerate(panels.items()):
            top = grid[0][column]
            _pruning_orders(top, frame, legend)
            top.set_title(panel_title)
            if column:
                top.sharey(grid[0][0])
                top.tick_params(labelleft=False)
            if zoom:
                _pruning_orders(grid[1][column], frame, legend)
                grid[1][column].set_title("zoom: this panel's own y range", fontsize=8)
            grid[-1][column].set_xlabel(f"heads masked (of {heads})")
        shared = "\nsame axis for every panel" if zoom else ""
        grid[0][0].set_ylabel("perplexity, held-out text" + (" (log scale)" if log else "") + shared)
        if log:
            grid[0][0].set_yscale("log")
            plain_log_ticks(grid[0][0].yaxis)
        if zoom:
            grid[1][0].set_ylabel("perplexity (zoomed)")
        fig.legend([tuple(h) for h in legend.values()], list(legend), loc="outside lower center", ncols=2)
        fig.suptitle(title)
    return fig


# ------------------------------------------------------------------------------------------------ tables
def table_figure(
    block: pd.DataFrame,
    title: str,
    variant_labels: Mapping[str, str] | None = None,
    caption: str = "",
    columns: int = 3,
    unverified_rows: Collection[str] = (),
) -> Figure:
    """Ours beside the paper's, one panel per table column that ran, on one axis: our mean as a dot with ± 1 std
    over seeds, the paper's value (or its stated range) as a black diamond just below it. A log axis, said in its
    label, once ours and the paper's span ``LOG_SPAN``. ``block``: rows of a tidy table CSV (``row``, ``attention``,
    ``column``, ``metric``, ``standin``, ``seeds``, ``mean``, ``std``, ``paper``, ``paper_low``, ``paper_high``).
    ``unverified_rows``: paper rows whose numbers were not checked against the paper's text, drawn hollow. An axis
    whose every value is at least 0 (an accuracy, a perplexity) does not reach below 0."""
    variant_labels = variant_labels or {}
    ran = block.dropna(subset=["mean"])
    names = list(dict.fromkeys(ran["column"]))
    several_rows = ran["row"].nunique() > 1
    categories = list(dict.fromkeys(zip(ran["row"], ran["attention"], strict=True)))
    columns = min(columns, len(names))
    rows = math.ceil(len(names) / columns)
    height = 0.32 * len(categories) + 1.6
    with style():
        fig = Figure(figsize=(4.0 * columns + 1.6, height * rows + 1.0), layout="constrained")
        axes = fig.subplots(rows, columns, squeeze=False, sharey=True).flatten()
        seeds = int(ran["seeds"].max())
        for ax, name in zip(axes, names, strict=False):
            part = ran[ran["column"] == name].set_index(["row", "attention"])
            paper = block[block["column"] == name].set_index(["row", "attention"])
            shown: list[float] = []
            for y, key in enumerate(categories):
                if key in part.index:
                    ours = part.loc[key]
                    std = 0.0 if pd.isna(ours["std"]) else float(ours["std"])
                    ax.errorbar(ours["mean"], y + 0.15, xerr=std, fmt="o", color=PALETTE[0], capsize=3, markersize=5)
                    shown += [float(ours["mean"]) - std, float(ours["mean"]) + std, float(ours["mean"])]
                if key not in paper.index:
                    continue
                found = paper.loc[key]
                face = "none" if key[0] in unverified_rows else PAPER_COLOUR
                if not pd.isna(found["paper"]):
                    ax.plot(found["paper"], y - 0.15, "D", color=PAPER_COLOUR, markerfacecolor=face, markersize=5)
                    shown.append(float(found["paper"]))
                elif not pd.isna(found["paper_low"]):
                    low, high = float(found["paper_low"]), float(found["paper_high"])
                    ax.plot(
                        [low, high],
                        [y - 0.15] * 2,
                        color=PAPER_COLOUR,
                        linewidth=2,
                        marker="D",
                        markerfacecolor=face,
                        markersize=4,
                    )
                    shown += [low, high]
            first = part.iloc[0]
            ax.set_title(f"{name} (ours: {first['metric']})")
            ax.set_xlabel(wrap(str(first["standin"] if isinstance(first["standin"], str) else first["metric"]), 45))
            if wants_log([v for v in shown if v > 0]) and min(shown) > 0:
                ax.set_xscale("log")
                ax.set_xlabel(ax.get_xlabel() + "\n(log scale: ours and the paper's differ by orders)")
            elif shown and min(shown) >= 0:
                ax.set_xlim(left=max(ax.get_xlim()[0], 0))
        for ax in axes[len(names) :]:
            ax.set_visible(False)
        labels = [
            variant_labels.get(attention, attention) + (f"\n({row} row)" if several_rows else "")
            for row, attention in categories
        ]
        axes[0].set_yticks(range(len(categories)), labels)
        axes[0].set_ylim(len(categories) - 0.5, -0.5)
        for ax in axes[::columns]:
            ax.set_ylabel("variant")
        ours_label = f"ours: mean, ± 1 std over {seeds} seeds" if seeds > 1 else "ours (1 seed)"
        entries = [
            Line2D([], [], color=PALETTE[0], marker="o", linestyle="none"),
            Line2D([], [], color=PAPER_COLOUR, marker="D", linestyle="none"),
        ]
        names = [ours_label, "paper (a line: the range it states)"]
        if set(unverified_rows) & {row for row, _ in categories}:
            entries.append(Line2D([], [], color=PAPER_COLOUR, marker="D", markerfacecolor="none", linestyle="none"))
            names.append(f"paper, quoted secondhand and not verified against its text ({', '.join(unverified_rows)})")
        fig.legend(entries, names, loc="outside lower center", ncols=2)
        fig.suptitle(title + (f"\n{caption}" if caption else ""))
    return fig


# ------------------------------------------------------------------------------------------------ effects
VERDICT_COLOURS = {
    "reproduces": PALETTE[2],
    "opposite": PALETTE[1],
    "smaller than the paper's": PALETTE[4],
    "unresolved": "#BBBBBB",
}
UNJUDGED_COLOUR = PALETTE[0]  # a difference no paper gives a direction for
SYMLOG_SPAN = 30.0  # a symmetric log axis once a bar or whisker passes this many times most bars (3 in 4 of 4+)


@dataclass
class EffectPanel:
    """One metric's bars: per variant label, ``value`` and its whiskers ``low``-``high`` (NaN or infinite: none)
    in the unit ``xlabel`` names; ``verdicts``: the Holm verdict of the variants a paper gives a direction for."""

    title: str
    xlabel: str
    bars: pd.DataFrame  # index: variant label; columns: value, low, high
    verdicts: Mapping[str, str]


def effect_bars(ax: Any, panel: EffectPanel, order: Sequence[str]) -> None:
    """``panel``'s bars on ``order``'s rows; a variant it lacks reads "no value" instead of a bar at 0. A
    symmetric log axis (said in the label) when one bar or whisker dwarfs the panel's typical bar."""
    bars = panel.bars.reindex(order)[["value", "low", "high"]].astype(float)
    colours = [VERDICT_COLOURS.get(panel.verdicts.get(label, ""), UNJUDGED_COLOUR) for label in order]
    ax.barh(range(len(order)), bars["value"].fillna(0), color=colours, height=0.6)
    whiskered = bars[np.isfinite(bars.to_numpy()).all(axis=1)]
    ax.errorbar(
        whiskered["value"],
        [order.index(label) for label in whiskered.index],
        xerr=[whiskered["value"] - whiskered["low"], whiskered["high"] - whiskered["value"]],
        fmt="none",
        color="#000000",
        capsize=2,
        linewidth=1,
    )
    for y in np.flatnonzero(bars["value"].isna().to_numpy()):  # at the panel's left edge, inside it
        ax.text(0.01, y, "no value", va="center", fontsize=7, color="#777777", transform=ax.get_yaxis_transform())
    ax.axvline(0, color="#000000", linewidth=0.8)
    shown = np.abs(bars.to_numpy())
    reach = shown[np.isfinite(shown)].max(initial=0.0)
    sizes = shown[:, 0][np.isfinite(shown[:, 0])]
    typical = float(np.quantile(sizes, 0.75, method="lower")) if len(sizes) >= 4 else 0.0  # most bars, not outliers
    xlabel = panel.xlabel
    if typical and reach > SYMLOG_SPAN * typical:
        linear = 10.0 ** math.ceil(math.log10(typical))  # a decade: the ticks stay a decade apart around 0
        ax.set_xscale("symlog", linthresh=linear)
        xlabel += f" (symmetric log scale beyond ±{linear:g})"
    else:  # few short labels: 4-digit decimals side by side overlap
        ax.xaxis.set_major_locator(MaxNLocator(nbins=4))
        ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _pos: f"{x:.3g}"))
    ax.set_title(panel.title)
    ax.set_xlabel(wrap(xlabel, 48))


def effects_figure(panels: Sequence[EffectPanel], title: str, caption: str = "", columns: int = 3) -> Figure:
    """Small multiples, one panel per metric, every variant a horizontal bar (with whiskers) on one row order, so a
    variant reads across the panels; bars of claimed effects take their Holm verdict's colour (the legend)."""
    order = list(dict.fromkeys(label for panel in panels for label in panel.bars.index))
    columns = min(columns, len(panels))
    rows = math.ceil(len(panels) / columns)
    with style():
        fig = Figure(figsize=(4.2 * columns + 1.8, (0.3 * len(order) + 1.6) * rows + 1.4), layout="constrained")
        axes = fig.subplots(rows, columns, squeeze=False, sharey=True).flatten()
        for ax, panel in zip(axes, panels, strict=False):
            effect_bars(ax, panel, order)
        for ax in axes[len(panels) :]:
            ax.set_visible(False)
        axes[0].set_yticks(range(len(order)), order)
        axes[0].set_ylim(len(order) - 0.5, -0.5)
        entries = [Patch(color=UNJUDGED_COLOUR)] + [Patch(color=c) for c in VERDICT_COLOURS.values()]
        names = ["no paper direction to judge"] + [f"a paper's claim: {v} (Holm)" for v in VERDICT_COLOURS]
        fig.legend(entries, names, loc="outside lower center", ncols=len(entries))
        fig.suptitle(title + (f"\n{caption}" if caption else ""))
    return fig


# where a point's name may go, in points from the point: above right first, then the other sides, then farther out
LABEL_OFFSETS = tuple((dx, dy) for dy in (4, -11, 14, -21, 24, -31) for dx in (4, -4))
LEADER_BEYOND_PT = 11  # a name moved farther than this from its point gets a thin line to it
MARKER_CLEARANCE_PX = 4.0  # half the side of the box a name keeps off another point's marker
LABEL_PADDING_PX = 2.0  # two names side by side would read as one


def first_clear_place(name: Annotation, renderer: Any, taken: Sequence[Bbox], within: Bbox | None) -> Bbox | None:
    """Moves ``name`` through ``LABEL_OFFSETS`` and stops at the first where its (padded) box overlaps none of
    ``taken`` and lies inside ``within`` (if given): that box, or None with the name at the last offset."""
    for dx, dy in LABEL_OFFSETS:
        name.set_position((dx, dy))
        name.set_horizontalalignment("left" if dx > 0 else "right")
        box = name.get_window_extent(renderer).padded(LABEL_PADDING_PX)
        inside = within is None or (
            within.x0 <= box.x0 and box.x1 <= within.x1 and within.y0 <= box.y0 <= box.y1 <= within.y1
        )
        if inside and not any(box.overlaps(other) for other in taken):
            return box
    return None


def spread_labels(fig: Figure, names: Sequence[Annotation]) -> None:
    """Moves each point's name (in order) to the first of ``LABEL_OFFSETS`` where it covers no name placed before it
    and no other point's marker, inside its panel if it can, or leaves it at the last one tried, with a leader line
    when it ends up far from its point: variants with close means would otherwise print their names over each other.
    Measured on the figure as laid out, so it runs after every other artist is drawn."""
    renderer = FigureCanvasAgg(fig).get_renderer()
    fig.draw_without_rendering()
    anchors = [name.axes.transData.transform(name.xy) for name in names]
    side = 2 * MARKER_CLEARANCE_PX
    placed: list[Bbox] = []
    for index, name in enumerate(names):
        taken = placed + [
            Bbox.from_bounds(x - MARKER_CLEARANCE_PX, y - MARKER_CLEARANCE_PX, side, side)
            for other, (x, y) in enumerate(anchors)
            if other != index and names[other].axes is name.axes
        ]
        panel = name.axes.get_window_extent(renderer)
        box = first_clear_place(name, renderer, taken, panel) or first_clear_place(name, renderer, taken, None)
        placed.append(box or name.get_window_extent(renderer).padded(LABEL_PADDING_PX))
        dx, dy = name.xyann
        if abs(dy) > LEADER_BEYOND_PT:
            leader = {"arrowstyle": "-", "color": "#888888", "linewidth": 0.5, "shrinkA": 1, "shrinkB": 3}
            name.axes.annotate(
                name.get_text(),
                name.xy,
                xytext=(dx, dy),
                textcoords="offset points",
                fontsize=name.get_fontsize(),
                horizontalalignment=name.get_horizontalalignment(),
                arrowprops=leader,
            )
            name.remove()


@dataclass
class TradeoffPanel:
    """One y metric against the shared x metric: per variant label, ``x``/``y`` means and their ``x_std``/``y_std``
    over seeds (NaN: one seed, no bar)."""

    ylabel: str
    points: pd.DataFrame  # index: variant label; columns: x, x_std, y, y_std


def tradeoff_figure(
    panels: Sequence[TradeoffPanel], xlabel: str, baseline: str, title: str, caption: str = ""
) -> Figure:
    """What a variant buys and what it costs, at a glance: each panel one y metric (W8A8 gap, max kurtosis) against
    the same x (FP perplexity), a point per variant with its name and ±1 std bars over seeds on both axes; the
    baseline drawn apart (black square, dashed lines through it), so "below and left of the lines" reads "fewer
    outliers and no worse perplexity". A log y axis (said in the label) where the values span ``LOG_SPAN``."""
    with style():
        fig = Figure(figsize=(5.2 * len(panels) + 0.6, 5.0), layout="constrained")
        axes = fig.subplots(1, len(panels), squeeze=False, sharex=True)[0]
        names: list[Annotation] = []
        for ax, panel in zip(axes, panels, strict=True):
            points = panel.points.astype(float)
            for index, (label, point) in enumerate(points.iterrows()):
                mine = label == baseline
                colour = BASELINE_FREE_PALETTE[index % len(BASELINE_FREE_PALETTE)]
                look = (
                    {"color": "#000000", "marker": "s"}
                    if mine
                    else {"color": colour, "marker": MARKERS[index % len(MARKERS)]}
                )
                ax.errorbar(
                    point["x"],
                    point["y"],
                    xerr=point["x_std"],
                    yerr=point["y_std"],
                    fmt=look["marker"],
                    color=look["color"],
                    markersize=7 if mine else 5,
                    capsize=2,
                    linewidth=1,
                )
                names.append(
                    ax.annotate(
                        str(label), (point["x"], point["y"]), xytext=(4, 4), textcoords="offset points", fontsize=7
                    )
                )
            if baseline in points.index:
                ax.axvline(points.loc[baseline, "x"], color="#000000", linestyle="--", linewidth=0.8)
                ax.axhline(points.loc[baseline, "y"], color="#000000", linestyle="--", linewidth=0.8)
            ylabel = panel.ylabel
            positive = points["y"][points["y"] > 0]
            if len(positive) == len(points) and wants_log(positive):
                ax.set_yscale("log")
                ylabel += " (log scale)"
            ax.set_ylabel(wrap(ylabel, 48))
            ax.set_xlabel(wrap(xlabel, 48))
        entries = [
            Line2D([], [], color="#000000", marker="s", linestyle="--", label=f"{baseline} (dashed: its values)"),
            Line2D(
                [], [], color="#555555", marker="|", linestyle="none", markersize=10, label="bars: ±1 std over seeds"
            ),
        ]
        fig.legend(handles=entries, loc="outside lower center", ncols=2)
        fig.suptitle(title + (f"\n{caption}" if caption else ""))
        spread_labels(fig, names)
    return fig


# ------------------------------------------------------------------------------------------------ text heatmap
# magma without its black and white ends, so text on every cell stays readable
HEAT = ListedColormap(mpl.colormaps["magma"]([0.05 + 0.9 * i / 255 for i in range(256)]), name="magma_mid")


def value_colours(values: Sequence[float]) -> tuple[list[tuple[float, ...]], float, float]:
    """A colour per value (dark for the lowest), and the value range the colour bar spans."""
    low, high = min(values), max(values)
    return [HEAT((v - low) / max(high - low, 1e-12)) for v in values], low, high


def text_colour(rgba: Sequence[float]) -> str:
    """Black on light cells, white on dark ones."""
    return "black" if 0.299 * rgba[0] + 0.587 * rgba[1] + 0.114 * rgba[2] > 0.5 else "white"


def text_heatmap_figure(
    pieces: Sequence[str], values: Sequence[float], title: str, value_label: str, columns: int = 100
) -> Figure:
    """Text on a monospace character grid, each token's run of cells coloured by its value, with a colour bar that
    names the value and its range."""
    colours, low, high = value_colours(values)
    cells = []  # (column, row, text, colour) per run of a token's characters on one line
    col = row = 0
    for piece, rgba in zip(pieces, colours, strict=True):
        for k, line in enumerate(piece.replace("\t", " ").split("\n")):
            if k:
                col, row = 0, row + 1
            if col + len(line) > columns and col:
                col, row = 0, row + 1
            if line:
                cells.append((col, row, line, rgba))
                col += len(line)
    rows = row + 1
    fontsize = 10.0
    char_in, line_in = 0.6 * fontsize / 72, 1.5 * fontsize / 72  # DejaVu Sans Mono advance ~0.6 em
    width, height = columns * char_in + 0.4, rows * line_in + 1.4  # with room for the title and the colour bar
    with style():
        fig = Figure(figsize=(width, height))
        ax = fig.add_axes((0.2 / width, 0.8 / height, 1 - 0.4 / width, 1 - 1.4 / height))
        ax.set_xlim(0, columns)
        ax.set_ylim(rows, 0)
        ax.axis("off")
        for col, row, line, rgba in cells:
            ax.add_patch(Rectangle((col, row), len(line), 1, facecolor=rgba, edgecolor="none"))
            ax.text(col, row + 0.5, line, family="monospace", fontsize=fontsize, va="center", color=text_colour(rgba))
        bar_axes = fig.add_axes((0.25, 0.3 / height, 0.5, 0.12 / height))
        scale = mpl.cm.ScalarMappable(Normalize(low, high), HEAT)
        bar = fig.colorbar(scale, cax=bar_axes, orientation="horizontal")
        bar.set_label(f"{value_label}; darker = lower", fontsize=fontsize)
        fig.suptitle(title, fontsize=fontsize + 1, y=1 - 0.1 / height, va="top")
    return fig


# ------------------------------------------------------------------------------------------------ matrices
def heads_figure(values: Sequence[Sequence[float]], title: str, caption: str, value_label: str) -> Figure:
    """One value per layer (rows) and head (columns) on [0, 1], each printed on its cell (blank where it rounds to
    0), with a colour bar named ``value_label`` and the ``caption`` under the map."""
    matrix = np.asarray(values, dtype=float)
    layers, heads = matrix.shape
    with style():
        fig = Figure(figsize=(max(3.5, 0.45 * heads + 1.8), max(2.2, 0.4 * layers + 1.6)), layout="constrained")
        ax = fig.subplots()
        image = ax.imshow(matrix, vmin=0.0, vmax=1.0, cmap=HEAT, aspect="auto")
        for (i, j), value in np.ndenumerate(matrix):
            if round(value, 2):
                ax.text(j, i, f"{value:.2f}".removeprefix("0"), ha="center", va="center", fontsize=6,
                        color=text_colour(HEAT(min(max(value, 0.0), 1.0))))  # fmt: skip
        ax.set_xticks(range(heads), [str(h) for h in range(heads)])
        ax.set_yticks(range(layers), [str(layer) for layer in range(layers)])
        ax.set_xlabel(f"head\n{wrap(caption, 70)}")
        ax.set_ylabel("layer")
        ax.grid(False)
        fig.colorbar(image, ax=ax, shrink=0.8).set_label(value_label)
        ax.set_title(title)
    return fig


def matrices_figure(
    grid: Sequence[Sequence[tuple[str, Any] | None]],
    title: str,
    *,
    xlabels: Sequence[str],
    ylabel: str,
    value_label: str,
    ticks: Sequence[str],
    limits: tuple[float, float] = (0.0, 1.0),
) -> Figure:
    """Square matrices as heat maps on one colour scale: ``grid`` rows of ``(panel title, matrix)`` (anything
    ``numpy.asarray`` reads; None leaves the cell empty), ``xlabels`` one per grid row (what its columns are), the
    ``ylabel`` on the first column only, each cell's value printed on it (blank where it rounds to 0), and one colour
    bar named ``value_label``."""
    rows, columns = len(grid), max(len(row) for row in grid)
    size = len(ticks)
    with style():
        fig = Figure(figsize=(2.9 * columns + 1.2, 3.7 * rows + 1.1), layout="constrained")
        axes = fig.subplots(rows, columns, squeeze=False)
        image = None
        for r, row in enumerate(grid):
            for c in range(columns):
                ax = axes[r][c]
                cell = row[c] if c < len(row) else None
                if cell is None:
                    ax.set_visible(False)
                    continue
                panel_title, matrix = cell
                values = np.asarray(matrix, dtype=float)
                image = ax.imshow(values, vmin=limits[0], vmax=limits[1], cmap=HEAT)
                for (i, j), value in np.ndenumerate(values):
                    if round(value, 2):
                        shade = text_colour(HEAT((value - limits[0]) / (limits[1] - limits[0])))
                        ax.text(j, i, f"{value:.2f}".removeprefix("0"), ha="center", va="center", fontsize=5.5,
                                color=shade)  # fmt: skip
                ax.set_title(panel_title, fontsize=8.5)
                ax.set_xticks(range(size), ticks)
                ax.set_yticks(range(size), ticks if c == 0 else [])
                ax.set_xlabel(xlabels[r], fontsize=8)
                if c == 0:
                    ax.set_ylabel(ylabel)
                ax.grid(False)
        if image is not None:
            bar = fig.colorbar(image, ax=axes.flatten().tolist(), shrink=0.7, pad=0.02)
            bar.set_label(value_label)
        fig.suptitle(title)
    return fig


# ------------------------------------------------------------------------------------------------ trajectories
def thousands_ticks(ax: Any, steps: Sequence[int]) -> None:
    """Step ticks: ``20k`` once the steps reach 10,000 (six-digit labels run into each other), else ``step_ticks``."""
    if max(steps, default=0) < 10_000:
        step_ticks(ax, steps)
        return
    ax.xaxis.set_major_locator(MaxNLocator(nbins=5, integer=True, steps=[1, 2, 2.5, 5, 10]))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda step, _: f"{step / 1000:g}k" if step else "0"))


def every(steps: Sequence[int] | pd.Series) -> int:
    """``markevery`` for a curve: about 20 markers, enough to tell the series apart without hiding the line."""
    return max(1, len(steps) // 20)


def _mean_and_band(ax: Any, frame: pd.DataFrame, look: Mapping[str, Any]) -> tuple[Any, int]:
    """The mean over seeds of ``frame`` (``seed``, ``step``, ``value``) as a line, their min-max as a band."""
    stats = frame.groupby("step")["value"].agg(["mean", "min", "max"])
    steps = stats.index.to_numpy()
    (line,) = ax.plot(
        steps, stats["mean"], color=look["color"], marker=look["marker"], markersize=3, markevery=every(steps)
    )
    seeds = int(frame["seed"].nunique())
    if seeds > 1:
        ax.fill_between(steps, stats["min"], stats["max"], color=look["color"], alpha=0.18, linewidth=0)
    return line, seeds


def trajectory_figure(
    losses: pd.DataFrame,
    title: str,
    *,
    loss_label: str,
    ratio: pd.DataFrame | None = None,
    ratio_label: str = "",
    paper_ratio: tuple[float, str] | None = None,
    temperatures: pd.DataFrame | None = None,
    temperature_label: str = "",
    temperature_title: str = "",
    xlabel: str = "optimizer steps done",
) -> Figure:
    """A training run's checks. Top: ``losses`` (``series``, ``seed``, ``step``, ``value``) per series, the mean
    over seeds with a min-max band (log axis), and ``ratio`` (``step``, ``value``: one line, with the paper's value
    ``paper_ratio`` dotted). Bottom, if ``temperatures`` (``series``, ``seed``, ``step``, ``value``) is given: one
    panel per seed with every series of it, on one shared log axis, so each seed's ordering shows (a band would hide
    it). The legend names the seeds and what the band spans."""
    seeds = sorted(losses["seed"].unique())
    steps = losses["step"].unique().tolist()
    top = 1 + (ratio is not None)
    bottom = 0 if temperatures is None else len(temperatures["seed"].unique())
    width = max(10.5, 2.35 * bottom + 0.8)
    with style():
        fig = Figure(figsize=(width, 3.4 + (3.0 if bottom else 0.0) + 1.2), layout="constrained")
        upper, lower = fig.subfigures(2, 1, height_ratios=[3.4, 3.0]) if bottom else (fig, None)
        top_axes = upper.subplots(1, top, squeeze=False)[0]
        entries, labels = [], []
        for index, name in enumerate(dict.fromkeys(losses["series"])):
            line, count = _mean_and_band(top_axes[0], losses[losses["series"] == name], series_style(index))
            entries.append(line)
            labels.append(f"{name} ({count} seed{'s' if count != 1 else ''})")
        if len(seeds) > 1:
            entries.append(Patch(color="#999999", alpha=0.35))
            labels.append(f"line: mean over seeds\n{band_label('min-max', len(seeds), 'seeds')}")
        loss_axis = top_axes[0]
        loss_axis.set_yscale("log")
        plain_log_ticks(loss_axis.yaxis, decades=2)
        loss_axis.set(title=loss_label, xlabel=xlabel, ylabel=loss_label + " (log scale)")
        loss_axis.legend(entries, labels, loc="best", frameon=True, framealpha=0.9, edgecolor="none")
        thousands_ticks(loss_axis, steps)
        if ratio is not None:
            ratio_axis = top_axes[1]
            ratio_axis.plot(ratio["step"], ratio["value"], color=PALETTE[6], marker="o", markersize=3,
                            markevery=every(ratio["step"]), label="ratio of the seed means")  # fmt: skip
            if paper_ratio is not None:
                ratio_axis.axhline(paper_ratio[0], color=PAPER_COLOUR, linestyle=":", linewidth=1.5,
                                   label=paper_ratio[1])  # fmt: skip
            ratio_axis.axhline(1.0, color="#777777", linestyle="--", linewidth=1, label="1: no difference")
            ratio_axis.set(title=wrap(ratio_label, 60), xlabel=xlabel, ylabel="ratio (no unit)")
            low, high = ratio_axis.get_ylim()
            ratio_axis.set_ylim(low, high + 0.4 * (high - low))  # headroom: the legend sits above the curve
            ratio_axis.legend(loc="upper center", ncols=2)
            thousands_ticks(ratio_axis, steps)
        if temperatures is not None and lower is not None:
            panels = lower.subplots(1, bottom, squeeze=False, sharey=True)[0]
            groups = list(dict.fromkeys(temperatures["series"]))
            handles = []
            for ax, seed in zip(panels, sorted(temperatures["seed"].unique()), strict=True):
                part = temperatures[temperatures["seed"] == seed]
                for index, group in enumerate(groups):
                    curve = part[part["series"] == group].sort_values("step")
                    look = series_style(index + 2)  # the loss series keep colours 0 and 1
                    (line,) = ax.plot(curve["step"], curve["value"], color=look["color"], marker=look["marker"],
                                      markersize=3, markevery=every(curve["step"]), linewidth=1)  # fmt: skip
                    if len(handles) < len(groups):
                        handles.append(line)
                ax.set_yscale("log")
                ax.set(title=f"seed {seed}", xlabel=xlabel)
                thousands_ticks(ax, steps)
            panels[0].set_ylabel(temperature_label + " (log scale)")
            plain_log_ticks(panels[0].yaxis, decades=2)
            lower.legend(handles, groups, loc="outside lower center", ncols=len(groups))
            lower.suptitle(temperature_title, fontsize=10)
        fig.suptitle(title)
    return fig
