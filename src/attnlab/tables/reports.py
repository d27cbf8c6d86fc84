"""Table sections beyond ours-beside-the-paper's, named in a table config's ``reports``: each reads what its cells'
evaluations wrote and returns Markdown (and may write CSVs and figures beside the table); ``RENDERS`` writes a
report again from the CSV it committed, without its cells (``make reproduce-<table> RENDER=1``)."""

from __future__ import annotations

import datetime
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

import pandas as pd

from attnlab.errors import ConfigError
from attnlab.tables.collect import variant_label, verdict_counts
from attnlab.tables.stats import decide, paired_test, step_down


class Cell(Protocol):
    """A cell as its reports read it (``tables.engine.Cell``)."""

    stage: str
    row: str
    attention: str
    seed: int
    overrides: tuple[str, ...]


class Engine(Protocol):
    """The engine as the reports it runs read it (``tables.engine.Engine``, which imports them: not the reverse)."""

    table: dict[str, Any]
    scale: str
    settings: dict[str, Any]

    def eval_dir(self, cell: Any) -> Path: ...

    def row_sizes(self) -> dict[tuple[str, str], tuple[str, int]]: ...

    def compose(self, overrides: list[str]) -> Any: ...


RowSizes = Callable[[], dict[tuple[str, str], tuple[str, int]]]  # ``Engine.row_sizes``: our model per paper row
Report = Callable[[Engine, list[Cell], Path], str]
Render = Callable[[dict[str, Any], str, RowSizes, Path], str]
PRUNING_CSV = "pruning_curves.csv"
PRUNING_HEADING = "## Head pruning (Michel et al.): importance order vs random orders"
COSTS_CSV = "costs.csv"  # the ``costs`` report's record: parameters and step time against the baseline


def pruning_curves(engine: Engine, cells: list[Cell], out_dir: Path) -> str:
    """Michel et al.'s pruning curves per variant, from each cell's ``analysis/pruning.csv``: written as
    ``pruning_curves.csv``, then drawn and judged by ``pruning_section``."""
    frames = []
    for cell in cells:
        path = engine.eval_dir(cell) / "analysis" / "pruning.csv"
        if path.is_file():
            frame = pd.read_csv(path)
            frames.append(frame.assign(stage=cell.stage, row=cell.row, attention=cell.attention, seed=cell.seed))
    expected = [(cell.attention, cell.seed) for cell in cells]
    if not frames:
        return "\n".join([PRUNING_HEADING, "", curves_missing(expected, have=set())])
    curves = pd.concat(frames, ignore_index=True)
    out_dir.mkdir(parents=True, exist_ok=True)
    curves.to_csv(out_dir / PRUNING_CSV, index=False)
    return pruning_section(curves, engine.table, engine.scale, engine.row_sizes(), out_dir, expected)


def render_pruning(table: dict[str, Any], scale: str, row_sizes: RowSizes, out_dir: Path) -> str:
    """The pruning section and figure again from the committed ``pruning_curves.csv`` (and ``runs.csv``: which cells
    it should hold); without that CSV, the line naming the cells whose curves are not here, as ``pruning_curves``
    writes it."""
    runs = pd.read_csv(out_dir / "runs.csv")
    expected = list(zip(runs["attention"], runs["seed"], strict=True))
    if not (out_dir / PRUNING_CSV).is_file():  # its cells' curves never came back (the reproduced table says so too)
        return "\n".join([PRUNING_HEADING, "", curves_missing(expected, have=set())])
    return pruning_section(pd.read_csv(out_dir / PRUNING_CSV), table, scale, row_sizes(), out_dir, expected)


def curves_missing(expected: list[tuple[str, int]], have: set[tuple[str, int]]) -> str:
    """A line naming the cells (attention, seed) of ``expected`` whose pruning curves are not among ``have`` (evaluated
    on another machine whose archive did not bring back ``analysis/pruning.csv``), or "" when every cell has them."""
    missing = [f"{attention} seed {seed}" for attention, seed in expected if (attention, seed) not in have]
    if not missing:
        return ""
    left = "no curves" if not have else "the curves below leave them out"
    return f"No pruning curves for {', '.join(missing)} (their `analysis/pruning.csv` is not here): {left}.\n"


def pruning_section(
    curves: pd.DataFrame,
    table: dict[str, Any],
    scale: str,
    sizes: dict[tuple[str, str], tuple[str, int]],
    out_dir: Path,
    expected: list[tuple[str, int]],
) -> str:
    """Perplexity against the number of heads masked, importance order (mean over seeds) against the random orders
    (mean over seeds and orders), drawn as ``pruning_curves.png``; per step, importance minus random paired by seed
    with its interval and a verdict against the paper's claim (importance order degrades less); and which layers
    keep their heads. ``expected``: the table's (attention, seed) cells, so those without curves are named."""
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
            tested = paired_test(at["importance"].tolist(), at["random"].tolist())
            rows.append(
                dict(zip(keys, key, strict=True))
                | {"heads masked": f"{masked} of {heads}", "importance": at["importance"].mean()}
                | {"random": at["random"].mean(), "diff": tested.mean}
                | {"interval": f"[{tested.low:+.4g}, {tested.high:+.4g}]", "p": tested.p}
                | {"verdict": decide(tested.mean, tested.p, None, direction=-1.0)}
            )
        half = group[(group["order"] == "importance") & (group["heads_pruned"] == heads // 2)]
        per_layer = half["heads_kept_per_layer"].map(lambda s: [int(v) for v in str(s).split()])
        column = f"heads kept per layer, {heads // 2} masked (per seed)"
        kept.append(dict(zip(keys, key, strict=True)) | {column: list(per_layer)})
    effect = pd.DataFrame(rows)
    effect["Holm p"] = step_down([(i, None, p) for i, p in enumerate(effect["p"])])  # one per masked count: Holm
    effect["verdict (Holm)"] = [
        decide(mean, p, None, direction=-1.0) for mean, p in zip(effect["diff"], effect["Holm p"], strict=True)
    ]
    effect["attention"] = effect["attention"].map(lambda a: variant_label(table, a))
    missing = curves_missing(expected, have=set(zip(curves["attention"], curves["seed"], strict=True)))
    lines = [
        PRUNING_HEADING,
        "",
        *([missing] if missing else []),
        f"Perplexity with some of the {heads} heads masked (the configured fractions, rounded to whole heads); "
        "importance: least important first (mean over seeds); random: mean over seeds and random orders. diff = "
        "importance - random, paired by seed (95% t-interval); the paper's claim is that the importance order "
        "degrades less (diff < 0); p: the paired t-test; Holm p: over this section's comparisons (every variant and "
        "masked count), the paper giving a direction but no size, so a verdict is reproduces, opposite or unresolved. "
        "Curves: pruning_curves.csv, pruning_curves.png.",
        "",
        effect.to_markdown(index=False, floatfmt=".4g"),
        "",
        f"Raw verdicts: {verdict_counts(effect['verdict'])}. After Holm over {len(effect)}: "
        f"{verdict_counts(effect['verdict (Holm)'])}.",
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


def variant_costs(engine: Engine, cells: list[Cell], out_dir: Path) -> str:
    """What each variant costs beside the baseline at each row's cell shape: parameters added (counted from the cell's
    composed config) and the training step's time as a ratio to the baseline's, timed in this one process round
    robin (``attnlab.bench.timing``: ratios, not absolute times, carry over between machines). Written as
    ``costs.csv``; ``table.scales.<scale>.costs.rounds`` sets the timed rounds."""
    import torch

    from attnlab.bench.peers import training_step
    from attnlab.bench.timing import Contender, Progress, time_round_robin
    from attnlab.tables.sizes import config_model, model_parts

    rounds = cost_rounds(engine)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    baseline = engine.table["baseline"]
    firsts: dict[tuple[str, str, str], Cell] = {}  # each variant's cell of the first seed, in the table's order
    for cell in cells:
        firsts.setdefault((cell.stage, cell.row, cell.attention), cell)
    rows = []
    for stage, row in dict.fromkeys((stage, row) for stage, row, _ in firsts):
        chosen = [cell for (s, r, _), cell in firsts.items() if (s, r) == (stage, row)]
        contenders, parameters = [], {}
        for cell in sorted(chosen, key=lambda c: c.attention != baseline):
            cfg = engine.compose(list(cell.overrides))
            torch.manual_seed(0)
            model = config_model(*model_parts(cfg)).to(device)
            parameters[cell.attention] = model.num_parameters()
            data = cfg.data
            generator = torch.Generator().manual_seed(0)
            shape = (data.batch_size, data.block_size + 1)
            tokens = torch.randint(0, model.config.vocab_size, shape, generator=generator).to(device)
            step = training_step(model, tokens, bf16=device.type == "cuda", fused_adamw=False)
            contenders.append(Contender(cell.attention, step))
        timings = time_round_robin(contenders, rounds, warmup=1, progress=Progress())
        base = timings[baseline]
        for contender in contenders:
            timing, added = timings[contender.name], parameters[contender.name] - parameters[baseline]
            rows.append(
                {"stage": stage, "row": row, "attention": contender.name, "parameters": parameters[contender.name]}
                | {"parameters_added": added, "parameters_added_pct": 100 * added / parameters[baseline]}
                | {"step_ms": 1000 * timing.median_s, "step_ratio": timing.median_s / base.median_s}
                | {"step_ratio_q1": timing.q1_s / base.median_s, "step_ratio_q3": timing.q3_s / base.median_s}
                | {"rounds": rounds, "device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu"}
                | {"threads": torch.get_num_threads(), "measured": datetime.date.today().isoformat()}
            )
    costs = pd.DataFrame(rows)
    out_dir.mkdir(parents=True, exist_ok=True)
    costs.to_csv(out_dir / COSTS_CSV, index=False)
    return costs_section(costs, engine.table)


def cost_rounds(engine: Engine) -> int:
    """``table.scales.<scale>.costs.rounds`` (default 10), checked when the engine starts, not hours later."""
    rounds = (engine.settings.get("costs") or {}).get("rounds", 10)
    if not isinstance(rounds, int) or rounds < 1:
        raise ConfigError(f"table.scales.{engine.scale}.costs.rounds", f"a whole number >= 1 (got {rounds})")
    return rounds


def render_costs(table: dict[str, Any], scale: str, row_sizes: RowSizes, out_dir: Path) -> str:
    """The cost section again from the committed ``costs.csv`` (timing again would measure another machine)."""
    return costs_section(pd.read_csv(out_dir / COSTS_CSV), table)


def costs_section(costs: pd.DataFrame, table: dict[str, Any]) -> str:
    """The cost table: parameters added and step time against the baseline, with how and where it was timed."""
    first = costs.iloc[0]
    shown = costs.assign(attention=[variant_label(table, a) for a in costs["attention"]])
    shown = shown.assign(
        added=[
            f"{n:+,} ({p:+.2f}%)" for n, p in zip(shown["parameters_added"], shown["parameters_added_pct"], strict=True)
        ],
        step=[
            f"{r:.2f} [{lo:.2f}, {hi:.2f}]"
            for r, lo, hi in zip(shown["step_ratio"], shown["step_ratio_q1"], shown["step_ratio_q3"], strict=True)
        ],
    )[["stage", "row", "attention", "parameters", "added", "step_ms", "step"]]
    shown.columns = [
        "stage",
        "row",
        "attention",
        "parameters",
        f"added to {table['baseline']}",
        "ms/step",
        f"step time x {table['baseline']} [quartiles]",
    ]
    return "\n".join(
        [
            f"## What each variant costs beside {table['baseline']}",
            "",
            "Parameters counted from each cell's config; a training step (forward, loss, backward, AdamW) on the "
            f"cells' batch shape, timed in one process, round robin in shuffled order over {first['rounds']} rounds "
            "(median; quartiles: the variant's times over the baseline's median) on "
            f"{first['device']} with {first['threads']} threads, {first['measured']}. Ratios carry over between "
            "machines; milliseconds do not. Record: costs.csv.",
            "",
            shown.to_markdown(index=False, floatfmt=",.1f"),
            "",
        ]
    )


REPORTS: dict[str, Report] = {"pruning": pruning_curves, "costs": variant_costs}
CHECKS: dict[str, Callable[[Engine], object]] = {"costs": cost_rounds}  # a report's settings, read at the start
RENDERS: dict[str, tuple[str, Render]] = {  # report -> the CSV it is rendered from, and how
    "pruning": (PRUNING_CSV, render_pruning),
    "costs": (COSTS_CSV, render_costs),
}
READS_CELL_FILES = {"pruning"}  # reports that read the cells' run directories (costs composes their configs only)
SAYS_WHAT_IS_MISSING = {"pruning"}  # reports whose render names the cells its CSV lacks, so the CSV may be absent
