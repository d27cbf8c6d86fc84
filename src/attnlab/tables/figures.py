"""A reproduced table's figures (``notebooks/tables.ipynb``, ``notebooks/training_curves.ipynb``): its committed
CSVs, the table config's names for its rows and variants, and our models' real sizes, handed to ``attnlab.plots``."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
from matplotlib.figure import Figure

from attnlab.plots import (
    EffectPanel,
    Panel,
    TradeoffPanel,
    curves_figure,
    effects_figure,
    row_label,
    save,
    table_figure,
    tradeoff_figure,
)
from attnlab.tables.collect import NO_PAPER_VALUE, variant_label
from attnlab.tables.reports import COSTS_CSV
from attnlab.tables.stats import IDENTICAL

# what each logged metric measures, with its unit (a metric not named here is labelled by its name)
METRIC_LABELS = {
    "outliers/max_inf_norm": "max |activation| over modules",
    "outliers/kurtosis_mean": "mean kurtosis over modules (Gaussian: 3)",
    "outliers/kurtosis_max": "max kurtosis over modules (Gaussian: 3)",
    "val/loss": "validation loss (nats per token)",
}
EFFECTS_FIGURE = "effects.png"  # a table with ``effects_figure: true`` commits it beside its Markdown
TRADEOFF_FIGURE = "tradeoff.png"  # a table with ``tradeoff_figure: {x, y}`` commits it beside its Markdown
STANDIN_NOTE = "our columns are stand-ins on another dataset and model size: compare the pattern across variants"


def seeds_named(seeds: pd.Series, name: Callable[[str], str]) -> dict[str, str]:
    """Each variant's label (``name``), with its seed count beside it where it has fewer seeds than the most any
    variant has (``seeds``: per variant, the baseline left out): in a partial table, or one whose extra seeds went to
    some variants only, a bar or point on fewer seeds says so."""
    most = seeds.max()
    return {
        attention: name(attention) if n >= most else f"{name(attention)} ({int(n)} seed{'s' if n > 1 else ''})"
        for attention, n in seeds.items()
    }


@dataclass
class TableResults:
    """One reproduced table at one scale: its config, its results directory and our model per paper row."""

    table: dict[str, Any]
    scale: str
    results: Path
    sizes: dict[tuple[str, str], tuple[str, int]]

    @classmethod
    def load(cls, results: Path, root: Path, scale: str | None = None) -> TableResults:
        """``results``: ``experiments/results/<table>/<scale>/`` (``scale``: its directory's name unless given)."""
        from attnlab.tables.definitions import load_table
        from attnlab.tables.engine import Engine

        (markdown,) = results.glob("*.md")  # <table>.md; its tidy CSV has the same name
        table = load_table(markdown.stem, root)
        scale = scale or results.name
        return cls(
            table, scale, results, Engine(table, scale, root=root, runs_dir=root / "outputs" / "runs").row_sizes()
        )

    def row(self, stage: str, row: str) -> str:
        model, parameters = self.sizes.get((stage, row), ("?", None))
        return row_label(row, model, parameters)

    def rows_caption(self, stage: str, rows: list[str]) -> str:
        return "; ".join(self.row(stage, row) for row in rows)

    def heading(self, what: str) -> str:
        return f"{self.table['title']}\ntable {self.table['name']}, {self.scale} scale: {what}"

    def stage_figures(self) -> dict[str, Figure]:
        """Per stage: each column that ran, ours beside the paper's on one axis (``plots.table_figure``)."""
        tidy = pd.read_csv(self.results / f"{self.table['name']}.csv")
        figures = {}
        for stage, block in tidy.dropna(subset=["mean"]).groupby("stage", sort=False):
            rows = list(dict.fromkeys(block["row"]))
            labels = {a: variant_label(self.table, a) for a in block["attention"].unique()}
            caption = self.rows_caption(str(stage), rows)
            if self.scale != "paper":
                caption += f"\n{self.scale} scale: {STANDIN_NOTE}"
            everything = tidy[(tidy["stage"] == stage) & tidy["column"].isin(block["column"])]
            title = self.heading(f"{stage}, ours vs the paper's")
            unverified = self.table.get("paper_unverified") or []
            figures[str(stage)] = table_figure(everything, title, labels, caption=caption, unverified_rows=unverified)
        return figures

    def effects_figure(self) -> Figure | None:
        """Every variant against the baseline in one figure: per column that ran (and per stage and row, when the
        table has several), the paired difference in the column's ``unit`` with its 95% interval (``effects.csv``);
        and the ``costs`` report's parameters added and step time when the table has it (``costs.csv``). None while
        no variant has a cell paired with the baseline's (a partial table of the baseline alone)."""
        effects = pd.read_csv(self.results / "effects.csv").dropna(subset=["seeds"])
        if effects.empty:
            return None
        tidy = pd.read_csv(self.results / f"{self.table['name']}.csv")
        baseline = self.table["baseline"]
        means = tidy[tidy["attention"] == baseline].set_index(["stage", "row", "column"])["mean"]
        units = {column["paper"]: column.get("unit", column["paper"]) for column in self.table["columns"]}
        places = list(dict.fromkeys(zip(effects["stage"], effects["row"], strict=True)))
        # one label per variant for the whole figure: the variants table, which draws it, has one stage and row
        names = seeds_named(effects.groupby("attention")["seeds"].min(), lambda a: variant_label(self.table, a))
        panels = []
        for (stage, row, column), part in effects.groupby(["stage", "row", "column"], sort=False):
            labelled = part.assign(label=[names[a] for a in part["attention"]]).set_index("label")
            bars = labelled[["diff", "ci_low", "ci_high"]].set_axis(["value", "low", "high"], axis=1)
            judged = labelled[~labelled["verdict"].isin([NO_PAPER_VALUE, IDENTICAL])]["verdict_holm"].to_dict()
            base = means.get((stage, row, column))
            xlabel = f"{units[column]}, variant - {baseline} ({baseline}: {base:.4g})"
            title = column if len(places) == 1 else f"{column}\n{stage}, {row}"
            panels.append(EffectPanel(title, xlabel, bars, judged))
        costs = self.results / COSTS_CSV
        if costs.is_file():
            panels += self.cost_panels(pd.read_csv(costs), names)
        fewest, seeds = int(effects["seeds"].min()), int(effects["seeds"].max())
        whiskers = "its 95% t-interval" if seeds > 1 else "none (1 seed: no interval)"
        if fewest < seeds:  # some variants have fewer seeds (a partial table, or extra seeds for some variants)
            seeds = f"{fewest}-{seeds}"
        caption = (
            f"{'; '.join(self.row(str(s), str(r)) for s, r in places)}; {seeds} seed(s)\n"
            f"bars: mean difference with {baseline}, paired by seed; whiskers: {whiskers}"
        )
        if self.scale != "paper":
            caption += f"\n{self.scale} scale: {STANDIN_NOTE}"
        return effects_figure(panels, self.heading(f"each variant against {baseline}"), caption)

    def tradeoff_figure(self) -> Figure | None:
        """The table's ``tradeoff_figure`` (``x``: one column, ``y``: columns): per variant, each y column's mean
        over seeds against x's, with their stds, one panel per y column that ran; None when none did. A variant
        sits at the baseline's mean plus its mean difference paired by seed, which is its own mean once it has
        every seed the baseline has, and in a partial table keeps the distance to the baseline a paired one."""
        spec = self.table["tradeoff_figure"]
        tidy = pd.read_csv(self.results / f"{self.table['name']}.csv").dropna(subset=["mean"])
        effects = pd.read_csv(self.results / "effects.csv")
        units = {column["paper"]: column.get("unit", column["paper"]) for column in self.table["columns"]}
        place = tidy[["stage", "row"]].drop_duplicates().iloc[0]  # one stage and row: the variants table's
        here = tidy[(tidy["stage"] == place["stage"]) & (tidy["row"] == place["row"])]
        paired = effects[(effects["stage"] == place["stage"]) & (effects["row"] == place["row"])]
        baseline = self.table["baseline"]

        def located(column: str, axis: str) -> pd.DataFrame:
            """``axis`` and ``axis``_std per variant: the baseline's mean plus the paired difference, the own std."""
            mine = here[here["column"] == column].set_index("attention")
            if baseline not in mine.index:  # the column did not run: no panel
                return pd.DataFrame(columns=[axis, f"{axis}_std"])
            diff = paired[paired["column"] == column].set_index("attention")["diff"]
            where = (mine.loc[baseline, "mean"] + diff).reindex(mine.index)
            where[baseline] = mine.loc[baseline, "mean"]
            return pd.DataFrame({axis: where, f"{axis}_std": mine["std"]}).dropna(subset=[axis])

        fewest, most = int(here["seeds"].min()), int(here["seeds"].max())
        seeds_of = here.groupby("attention")["seeds"].min()
        short = seeds_named(seeds_of.drop(baseline, errors="ignore"), str)  # the points carry the short names
        x = located(spec["x"], "x")
        panels = []
        for column in spec["y"]:
            points = x.join(located(column, "y"), how="inner").rename(index=short)
            if points.empty:
                continue
            panels.append(TradeoffPanel(f"{column} ({units[column]})", points))
        if not panels:
            return None
        seeds = str(most) if fewest == most else f"{fewest}-{most}"  # a partial table, or extra seeds for some
        caption = f"{self.row(str(place['stage']), str(place['row']))}; mean over {seeds} seed(s) per point"
        if fewest < most:
            caption += f" ({baseline}'s mean plus the difference paired by seed)"
        if self.scale != "paper":
            caption += f"\n{self.scale} scale: {STANDIN_NOTE}"
        xlabel = f"{spec['x']} ({units[spec['x']]}), lower is better"
        # points carry the short names (the baseline's too): 16 labels with the papers' crowd a panel
        return tradeoff_figure(panels, xlabel, baseline, self.heading("what each variant buys and costs"), caption)

    def cost_panels(self, costs: pd.DataFrame, names: dict[str, str]) -> list[EffectPanel]:
        """Parameters added (% of the baseline's) and the training step's time against the baseline's (whiskers:
        the variant's quartiles over the timed rounds), from the ``costs`` report's record; ``names``: each
        variant's row label in the effect panels, so a variant reads across all of them."""
        baseline = self.table["baseline"]
        mine = costs[costs["attention"] == baseline].iloc[0]
        costs = costs[costs["attention"] != baseline]
        labels = [names.get(a) or variant_label(self.table, a) for a in costs["attention"]]
        added = pd.DataFrame({"value": costs["parameters_added_pct"].to_numpy()}, index=labels).reindex(
            columns=["value", "low", "high"]
        )
        slower = 100 * (costs[["step_ratio", "step_ratio_q1", "step_ratio_q3"]].set_axis(labels) - 1)
        base_spread = (
            f"{round(100 * (mine['step_ratio_q1'] - 1)):+d}% to {round(100 * (mine['step_ratio_q3'] - 1)):+d}%"
        )
        return [
            EffectPanel("parameters added", f"% of {baseline}'s {int(mine['parameters']):,} parameters", added, {}),
            EffectPanel(
                "step time",
                f"training step time, % above {baseline}'s median (whiskers: the variant's quartiles over "
                f"{int(mine['rounds'])} rounds in one process; {baseline}'s own: {base_spread})",
                slower.set_axis(["value", "low", "high"], axis=1),
                {},
            ),
        ]

    def training_figure(self) -> Figure | None:
        """The metrics the table logged while training (``curves.csv``), against the optimizer steps done."""
        path = self.results / "curves.csv"
        if not path.is_file():
            return None
        curves = pd.read_csv(path)
        return self._curves(curves, "metrics on held-out text while training")

    def validation_figure(self, runs_root: Path) -> tuple[Figure | None, pd.DataFrame, list[str]]:
        """Validation loss against steps per paper row, from each cell's ``csv/metrics.csv`` (``runs.csv``'s paths,
        relative to ``runs_root``); returns the figure, the curves and the runs whose metrics are not here."""
        runs = pd.read_csv(self.results / "runs.csv")
        frames, missing = [], []
        for run in runs.itertuples():
            metrics_file = runs_root / run.run / "csv" / "metrics.csv"
            if not metrics_file.is_file():
                missing.append(str(run.run))
                continue
            metrics = pd.read_csv(metrics_file).dropna(subset=["val/loss"])
            curve = metrics.groupby("step")["val/loss"].last()
            frames.append(
                pd.DataFrame({"step": curve.index, "value": curve.to_numpy()}).assign(
                    stage=run.stage, row=run.row, attention=run.attention, seed=run.seed, metric="val/loss"
                )
            )
        if not frames:
            return None, pd.DataFrame(), missing
        curves = pd.concat(frames, ignore_index=True)
        return self._curves(curves, "validation loss while training"), curves.assign(step=curves["step"] + 1), missing

    def _curves(self, curves: pd.DataFrame, what: str) -> Figure:
        """Long curves (``stage``, ``row``, ``attention``, ``seed``, 0-based ``step``, ``metric``, ``value``): one
        panel per metric, stage and row; steps shown as optimizer steps done."""
        frame = curves.assign(
            step=curves["step"] + 1,
            series=curves["attention"].map(lambda a: variant_label(self.table, a)),
            panel=curves["metric"] + " | " + curves["stage"] + " | " + curves["row"],
        )
        panels = []
        for key, part in frame.groupby("panel", sort=False):
            metric, stage, row = str(key).split(" | ")
            ylabel = METRIC_LABELS.get(metric, metric)
            log = part["value"].min() > 0 and part["value"].max() / part["value"].min() >= 20
            panels.append(Panel(str(key), f"{metric}, {stage}\n{self.row(stage, row)}", ylabel, log=log))
        order = [variant_label(self.table, a) for a in dict.fromkeys(curves["attention"])]
        return curves_figure(frame, panels, self.heading(what), order=order)


def save_effects_figure(
    table: dict[str, Any], scale: str, results: Path, sizes: Callable[[], dict[tuple[str, str], tuple[str, int]]]
) -> None:
    """A table with ``effects_figure: true`` draws ``effects.png``, one with ``tradeoff_figure`` ``tradeoff.png``,
    beside its Markdown whenever it is written; ``sizes`` (our model per paper row) is called only then, and once: it
    composes a config per row."""
    if not (table.get("effects_figure") or table.get("tradeoff_figure")):
        return
    drawn = TableResults(table, scale, results, sizes())
    if table.get("effects_figure") and (effects := drawn.effects_figure()) is not None:
        save(effects, results / EFFECTS_FIGURE)
    if table.get("tradeoff_figure") and (tradeoff := drawn.tradeoff_figure()) is not None:
        save(tradeoff, results / TRADEOFF_FIGURE)
