"""Table sections beyond ours-beside-the-paper's, named in a table config's ``reports``: each reads what its cells'
evaluations wrote and returns Markdown (and may write CSVs and figures beside the table)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import pandas as pd

from attnlab.tables.collect import paired_interval, variant_label, verdict

if TYPE_CHECKING:
    from attnlab.tables.engine import Cell, Engine

Report = Callable[["Engine", "list[Cell]", Path], str]


def pruning_curves(engine: Engine, cells: list[Cell], out_dir: Path) -> str:
    """Michel et al.'s pruning curves per variant: perplexity against the fraction of heads removed, importance order
    (mean, min-max band over seeds) against the random orders (mean, min-max band over seeds and orders), written as
    ``pruning_curves.csv`` and ``pruning_curves.png``; per fraction, importance minus random paired by seed with its
    interval and a verdict against the paper's claim (importance order degrades less); and which layers keep their
    heads."""
    frames = []
    for cell in cells:
        path = engine.eval_dir(cell) / "analysis" / "pruning.csv"
        if path.is_file():
            frame = pd.read_csv(path)
            frames.append(frame.assign(stage=cell.stage, row=cell.row, attention=cell.attention, seed=cell.seed))
    if not frames:
        return ""
    curves = pd.concat(frames, ignore_index=True)
    out_dir.mkdir(parents=True, exist_ok=True)
    curves.to_csv(out_dir / "pruning_curves.csv", index=False)
    plot_pruning_curves(curves, engine.table, out_dir / "pruning_curves.png")
    keys = ["stage", "row", "attention"]
    rows, kept = [], []
    for key, group in curves.groupby(keys, sort=False):
        per_seed = group.groupby(["seed", "fraction", "order"])["perplexity"].mean().unstack("order")
        for fraction, at in per_seed.groupby(level="fraction"):
            if fraction == 0:
                continue
            diffs = (at["importance"] - at["random"]).tolist()
            mean, low, high = paired_interval(diffs)
            rows.append(
                dict(zip(keys, key, strict=True))
                | {"removed": f"{100 * fraction:.0f}%", "importance": at["importance"].mean()}
                | {"random": at["random"].mean(), "diff": mean, "interval": f"[{low:+.4g}, {high:+.4g}]"}
                | {"verdict": verdict(low, high, paper_diff=-1.0)}
            )
        half = group[(group["order"] == "importance") & ((group["fraction"] - 0.5).abs() < 1e-9)]
        per_layer = half["heads_kept_per_layer"].map(lambda s: [int(v) for v in str(s).split()])
        kept.append(dict(zip(keys, key, strict=True)) | {"heads kept per layer at 50% (per seed)": list(per_layer)})
    effect = pd.DataFrame(rows)
    effect["attention"] = effect["attention"].map(lambda a: variant_label(engine.table, a))
    lines = [
        "## Head pruning (Michel et al.): importance order vs random orders",
        "",
        "Perplexity with a fraction of all heads masked; importance: least important first (mean over seeds); random: "
        "mean over seeds and random orders. diff = importance - random, paired by seed (95% t-interval); the paper's "
        "claim is that the importance order degrades less (diff < 0). Curves: pruning_curves.csv, pruning_curves.png.",
        "",
        effect.to_markdown(index=False, floatfmt=".4g"),
        "",
        pd.DataFrame(kept).to_markdown(index=False),
        "",
    ]
    return "\n".join(lines)


def plot_pruning_curves(curves: pd.DataFrame, table: dict, path: Path) -> None:
    """One panel per variant: mean over seeds (and random orders) with the min-max band over them."""
    from matplotlib.figure import Figure

    from attnlab.eval.analysis.pruning import draw_pruning_orders

    panels = list(curves.groupby(["stage", "row", "attention"], sort=False))
    fig = Figure(figsize=(4.5 * len(panels), 3.5), layout="constrained")
    for ax, ((_, row, attention), group) in zip(fig.subplots(1, len(panels), squeeze=False)[0], panels, strict=True):
        draw_pruning_orders(ax, group, title=f"{row} {variant_label(table, attention)}")
    fig.savefig(path, dpi=120)


REPORTS: dict[str, Report] = {"pruning": pruning_curves}
