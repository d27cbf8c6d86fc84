"""Table sections beyond ours-beside-the-paper's, named in a table config's ``reports``: each reads what its cells'
evaluations wrote and returns Markdown (and may write CSVs and figures beside the table); ``RENDERS`` writes a
report again from the CSV it committed, without its cells (``make reproduce-<table> RENDER=1``)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd

from attnlab.tables.collect import paired_interval, variant_label, verdict

if TYPE_CHECKING:
    from attnlab.tables.engine import Cell, Engine

Report = Callable[["Engine", "list[Cell]", Path], str]
Render = Callable[[dict[str, Any], str, Path, Path], str]
PRUNING_CSV = "pruning_curves.csv"


def pruning_curves(engine: Engine, cells: list[Cell], out_dir: Path) -> str:
    """Michel et al.'s pruning curves per variant, from each cell's ``analysis/pruning.csv``: written as
    ``pruning_curves.csv``, then drawn and judged by ``pruning_section``."""
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
    curves.to_csv(out_dir / PRUNING_CSV, index=False)
    return pruning_section(curves, engine.table, engine.scale, engine.row_sizes(), out_dir)


def render_pruning(table: dict[str, Any], scale: str, root: Path, out_dir: Path) -> str:
    """The pruning section and figure again from the committed ``pruning_curves.csv``."""
    from attnlab.tables.engine import Engine

    sizes = Engine(table, scale, root=root, runs_dir=root / "outputs" / "runs").row_sizes()
    return pruning_section(pd.read_csv(out_dir / PRUNING_CSV), table, scale, sizes, out_dir)


def pruning_section(
    curves: pd.DataFrame,
    table: dict[str, Any],
    scale: str,
    sizes: dict[tuple[str, str], tuple[str, int]],
    out_dir: Path,
) -> str:
    """Perplexity against the number of heads masked, importance order (mean over seeds) against the random orders
    (mean over seeds and orders), drawn as ``pruning_curves.png``; per step, importance minus random paired by seed
    with its interval and a verdict against the paper's claim (importance order degrades less); and which layers
    keep their heads."""
    first = curves.iloc[0]
    heads = int(first["heads_pruned"]) + sum(int(v) for v in str(first["heads_kept_per_layer"]).split())
    plot_pruning_curves(curves, table, scale, sizes, heads, out_dir)
    keys = ["stage", "row", "attention"]
    rows, kept = [], []
    for key, group in curves.groupby(keys, sort=False):
        per_seed = group.groupby(["seed", "heads_pruned", "order"])["perplexity"].mean().unstack("order")
        for masked, at in per_seed.groupby(level="heads_pruned"):
            if masked == 0:
                continue
            diffs = (at["importance"] - at["random"]).tolist()
            mean, low, high = paired_interval(diffs)
            rows.append(
                dict(zip(keys, key, strict=True))
                | {"heads masked": f"{masked} of {heads}", "importance": at["importance"].mean()}
                | {"random": at["random"].mean(), "diff": mean, "interval": f"[{low:+.4g}, {high:+.4g}]"}
                | {"verdict": verdict(low, high, paper_diff=-1.0)}
            )
        half = group[(group["order"] == "importance") & (group["heads_pruned"] == heads // 2)]
        per_layer = half["heads_kept_per_layer"].map(lambda s: [int(v) for v in str(s).split()])
        column = f"heads kept per layer, {heads // 2} masked (per seed)"
        kept.append(dict(zip(keys, key, strict=True)) | {column: list(per_layer)})
    effect = pd.DataFrame(rows)
    effect["attention"] = effect["attention"].map(lambda a: variant_label(table, a))
    lines = [
        "## Head pruning (Michel et al.): importance order vs random orders",
        "",
        f"Perplexity with some of the {heads} heads masked (the configured fractions, rounded to whole heads); "
        "importance: least important first (mean over seeds); random: mean over seeds and random orders. diff = "
        "importance - random, paired by seed (95% t-interval); the paper's claim is that the importance order "
        "degrades less (diff < 0). Curves: pruning_curves.csv, pruning_curves.png.",
        "",
        effect.to_markdown(index=False, floatfmt=".4g"),
        "",
        pd.DataFrame(kept).to_markdown(index=False),
        "",
    ]
    return "\n".join(lines)


def plot_pruning_curves(
    curves: pd.DataFrame,
    table: dict[str, Any],
    scale: str,
    sizes: dict[tuple[str, str], tuple[str, int]],
    heads: int,
    out_dir: Path,
) -> None:
    """One panel per variant on one y axis, titled with the paper's row and our model's real size."""
    from attnlab.plots import pruning_figure, row_label, save

    panels = {}
    for (stage, row, attention), group in curves.groupby(["stage", "row", "attention"], sort=False):
        model, parameters = sizes.get((stage, row), ("?", None))
        panels[f"{variant_label(table, attention)}\n{row_label(row, model, parameters)}"] = group
    title = f"{table['title']}\ntable {table['name']}, {scale} scale: perplexity on held-out text as heads are masked"
    save(pruning_figure(panels, heads, title), out_dir / "pruning_curves.png")


REPORTS: dict[str, Report] = {"pruning": pruning_curves}
RENDERS: dict[str, tuple[str, Render]] = {"pruning": (PRUNING_CSV, render_pruning)}
