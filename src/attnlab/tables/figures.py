"""A reproduced table's figures (``notebooks/tables.ipynb``, ``notebooks/training_curves.ipynb``): its committed
CSVs, the table config's names for its rows and variants, and our models' real sizes, handed to ``attnlab.plots``."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
from matplotlib.figure import Figure

from attnlab.plots import Panel, curves_figure, row_label, table_figure
from attnlab.tables.collect import variant_label

# what each logged metric measures, with its unit (a metric not named here is labelled by its name)
METRIC_LABELS = {
    "outliers/max_inf_norm": "max |activation| over modules",
    "outliers/kurtosis_mean": "mean kurtosis over modules (Gaussian: 3)",
    "outliers/kurtosis_max": "max kurtosis over modules (Gaussian: 3)",
    "val/loss": "validation loss (nats per token)",
}
STANDIN_NOTE = "our columns are stand-ins on another dataset and model size: compare the pattern across variants"


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
        from attnlab.tables import load_table
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
            figures[str(stage)] = table_figure(everything, title, labels, caption=caption)
        return figures

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
