"""Run a synthetic table from its Hydra config and write it beside the paper's numbers (Markdown, CSV, PNG)."""

from __future__ import annotations

import itertools
import statistics
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pandas as pd
import torch
from matplotlib.figure import Figure
from omegaconf import DictConfig, OmegaConf

import attnlab.plots as plots
from attnlab.digest import digest
from attnlab.errors import require, require_choice
from attnlab.synthetic.data import entropy, option_counts, transition_matrix
from attnlab.synthetic.model import SyntheticAttentionModel
from attnlab.synthetic.runs import (
    Convergence,
    DenoisingTask,
    GraphRun,
    Training,
    baseline_mse,
    sigma_for_bayes,
    small_noise_ratio,
    train_denoising,
    train_graph,
)
from attnlab.tables.stats import IDENTICAL, decide, paired_test, step_down

COLUMNS = ["quantity", "model", "ours_mean", "ours_std", "paper", "ours_minus_paper"]
SCALING = {  # temp_lookup's scaling, in the tables' headers
    "multiply": "q * tau (Definition 1's inverse temperature), reported as T = 1/tau",
    "divide": "q / T (the temperature learned directly), reported as T",
}


def row(quantity: str, model: str, values: list[float], paper: float | None) -> dict[str, Any]:
    mean = statistics.fmean(values)
    return {
        "quantity": quantity,
        "model": model,
        "ours_mean": mean,
        "ours_std": statistics.stdev(values) if len(values) > 1 else 0.0,
        "paper": paper,
        "ours_minus_paper": None if paper is None else mean - paper,
    }


def markdown(frame: pd.DataFrame) -> str:
    """A GitHub table; floats to 4 significant digits, mean and std joined as ``mean ± std``."""
    frame = frame.copy()
    if "ours_mean" in frame:
        frame.insert(
            frame.columns.get_loc("ours_mean"),
            "ours (mean ± std)",
            [f"{m:.4g} ± {s:.2g}" for m, s in zip(frame.pop("ours_mean"), frame.pop("ours_std"), strict=True)],
        )
    shown = frame.map(lambda v: "" if pd.isna(v) else f"{v:.4g}" if isinstance(v, float) else str(v))
    return shown.to_markdown(index=False, disable_numparse=True)


def stopping(optim: DictConfig) -> int | Convergence:
    """``optim.until``: ``steps`` trains exactly ``optim.steps``; ``converged`` follows ``optim.convergence``."""
    require_choice(optim.until, ("steps", "converged"), "optim.until")
    return optim.steps if optim.until == "steps" else Convergence(**optim.convergence)


@dataclass(frozen=True)
class Ordering:
    """The paper's pattern in Table 1: temperature increasing with the number of options, and near zero for one
    option. T is only defined up to the scale of W_q (q / T is what matters), so "near zero" is read relative to
    the most-options group: T(1 option) / T(4 options), 0.0027 in the paper."""

    options: list[int]  # numbers of options, increasing
    means: list[float]  # mean temperature over seeds, per number of options
    monotone_seeds: int  # seeds whose own temperatures strictly increase with the number of options
    monotone_seeds_past_fewest: int  # the same, leaving out the fewest-options group (is it alone out of order?)
    seeds: int
    threshold: float  # T(fewest) / T(most options) counts as near zero at or below this

    @property
    def monotone(self) -> bool:
        """The seed means strictly increase with the number of options."""
        return all(a < b for a, b in itertools.pairwise(self.means))

    @property
    def ratio(self) -> float:
        return self.means[0] / self.means[-1]

    @property
    def near_zero(self) -> bool:
        return self.ratio <= self.threshold

    @property
    def appears(self) -> bool:
        return self.monotone and self.near_zero

    def describe(self) -> str:
        """One Markdown line: the verdict and the numbers behind it."""
        chain = (" < " if self.monotone else ", ").join(f"{m:.3g}" for m in self.means)
        few, most = self.options[0], self.options[-1]
        return (
            f"Paper's ordering (T increasing with the number of options, T({few} option) near zero): "
            f"**{'appears' if self.appears else 'does not appear'}**. Monotone in the seed means: "
            f"{'yes' if self.monotone else 'no'} ({chain} for {', '.join(map(str, self.options))} options; "
            f"{self.monotone_seeds} of {self.seeds} seeds monotone, {self.monotone_seeds_past_fewest} of {self.seeds} "
            f"without the {few}-option group); T({few}) / T({most}) = {self.ratio:.3g}, "
            f"{'<= ' if self.near_zero else '> '}{self.threshold:g}: {'' if self.near_zero else 'not '}near zero."
        )


def paper_ordering(temperatures: dict[int, list[float]], threshold: float) -> Ordering:
    """``temperatures``: number of options -> the learned temperature of each seed."""
    options = sorted(temperatures)
    by_options = torch.tensor([temperatures[count] for count in options], dtype=torch.float64)  # (groups, seeds)
    return Ordering(
        options=options,
        means=by_options.mean(dim=1).tolist(),
        monotone_seeds=int(by_options.diff(dim=0).gt(0).all(dim=0).sum()),
        monotone_seeds_past_fewest=int(by_options[1:].diff(dim=0).gt(0).all(dim=0).sum()),
        seeds=by_options.shape[1],
        threshold=threshold,
    )


# Bump when the training code changes what a configuration trains to, so old checkpoints stop matching.
CHECKPOINT_VERSION = 2  # 2: temp_lookup's scaling, the embedding and the readout became options


def checkpoint_path(cfg: DictConfig, label: str) -> Path:
    """Where one model's training until convergence checkpoints, named after what decides its trajectory and the
    stopping rule, but not the cap: raising ``max_steps`` continues a capped run instead of starting over."""
    rule = {key: value for key, value in cfg.optim.convergence.items() if key != "max_steps"}
    identity = {
        "version": CHECKPOINT_VERSION,
        "attention": OmegaConf.to_container(cfg.models[label], resolve=True),
        "graph": OmegaConf.to_container(cfg.graph, resolve=True),
        "model": OmegaConf.to_container(cfg.model, resolve=True),
        "seeds": list(cfg.seeds),
        "threads": cfg.threads,  # CPU reductions may depend on it; resuming is exact only with the same count
        "optim": {"lr": cfg.optim.lr, "batch_size": cfg.optim.batch_size, "convergence": rule},
    }
    return Path(cfg.checkpoint_dir) / f"{cfg.table}-{label}-{digest(identity)}.pt"


def stopped(label: str, training: Training) -> str:
    """Where one model's joint training stopped, saying so plainly when the cap stopped it."""
    seeds = f"{sum(training.settled)} of {len(training.settled)} seeds converged"
    if training.converged:
        return f"{label} converged at step {training.steps} ({seeds})"
    return f"{label} **stopped by the cap at step {training.steps}, not converged** ({seeds})"


def p_label(p: float | None) -> str:
    return "-" if p is None else f"{p:.3g}"


def paired_effects(runs: dict[str, list[GraphRun]], paper: dict[str, Any]) -> str:
    """SSA against vanilla seed by seed (a seed fixes the sampled walks for both), judged as the table engine judges
    an effect (``attnlab.tables.stats``): the mean paired difference, its 95% t-interval, the tests against no effect
    and against the paper's difference (the same units here: the task is the paper's), the raw verdict and the one
    after Holm over this table's two comparisons."""
    if not {"vanilla", "ssa"} <= runs.keys():
        return ""
    found = []
    for quantity, field, paper_key in (
        ("CE - H(P*)", "kl", "cross_entropy"),
        ("sum |G - P*|", "err_transition", "err_map"),
    ):
        ssa, vanilla = ([getattr(r, field) for r in runs[label]] for label in ("ssa", "vanilla"))
        paper_diff = paper[paper_key]["ssa"] - paper[paper_key]["vanilla"]
        lower = sum(map(float.__lt__, ssa, vanilla))
        found.append((quantity, paired_test(ssa, vanilla, paper_diff), paper_diff, lower))
    tested_ones = [entry for entry in found if not entry[1].identical]  # all-zero differences: nothing to test
    hypotheses = [(quantity, None, tested.p) for quantity, tested, *_ in tested_ones]
    hypotheses += [
        (quantity, paper_diff, tested.p_paper)
        for quantity, tested, paper_diff, _ in tested_ones
        if tested.p_paper is not None
    ]
    adjusted = step_down(hypotheses)
    no_effect, paper_side = iter(adjusted[: len(tested_ones)]), iter(adjusted[len(tested_ones) :])
    lines = []
    for quantity, tested, paper_diff, lower in found:
        head = (
            f"- {quantity}: {tested.mean:+.3g}, 95% interval [{tested.low:+.3g}, {tested.high:+.3g}], lower in {lower} "
            f"of {tested.seeds} seeds; paper {paper_diff:+.3g}"
        )
        if tested.identical:
            lines.append(f"{head}: **{IDENTICAL}** (every seed's difference is 0: nothing to test)")
            continue
        p_holm = next(no_effect)
        p_paper_holm = next(paper_side) if tested.p_paper is not None else None
        lines.append(
            f"{head}; p {tested.p:.3g}, p paper {p_label(tested.p_paper)}: "
            f"**{decide(tested.mean, tested.p, tested.p_paper, paper_diff)}**; after Holm over the table's "
            f"{len(tested_ones)} tested comparison(s) (p {p_holm:.3g}, p paper {p_label(p_paper_holm)}): "
            f"**{decide(tested.mean, p_holm, p_paper_holm, paper_diff)}**"
        )
    return "SSA minus vanilla, paired by seed:\n\n" + "\n".join(lines) + "\n\n"


def sparser_with_lower_temperature(runs: list[GraphRun], token_groups: list[int], groups: list[int]) -> str:
    """Whether the paper's reading "lower temperature = sparser map" holds in the trained model: per seed, the
    Spearman correlation over the groups between the reported T and the mean entropy of the group's attention rows
    (+1: the lower a group's T, the sparser its map)."""
    correlations = []
    for run in runs:
        entropies = torch.tensor([run.attention_entropy[[t for t, g in enumerate(token_groups) if g == group]].mean()
                                  for group in groups])  # fmt: skip
        temperatures = torch.tensor([run.temperatures[group] for group in groups])
        ranks = [values.argsort().argsort().double() for values in (temperatures, entropies)]
        correlations.append(torch.corrcoef(torch.stack(ranks))[0, 1].item())
    return (
        f"Lower T = sparser map? Spearman correlation over the {len(groups)} groups between T and the mean entropy of "
        f"the group's attention rows, per seed: {', '.join(f'{c:+.2f}' for c in correlations)} (mean "
        f"{statistics.fmean(correlations):+.2f}; +1 in {sum(c > 0.999 for c in correlations)} of {len(runs)} seeds)."
    )


def kl_ratio(trajectory: pd.DataFrame) -> pd.DataFrame:
    """SSA / vanilla of the seed-mean excess loss CE - H(P*) at every recorded step (the paper: 0.009 / 0.0126 =
    0.71), with both means."""
    means = trajectory.groupby(["model", "step"]).kl.mean().unstack("model")
    frame = pd.DataFrame({"step": means.index, "kl_vanilla": means.vanilla.values, "kl_ssa": means.ssa.values})
    return frame.assign(ratio=frame.kl_ssa / frame.kl_vanilla)


def run_table1(cfg: DictConfig, paper: dict[str, Any]) -> pd.DataFrame:
    """Train every model of ``cfg.models`` on the graph task; CE, KL, err_map and the learned temperatures."""
    transition = transition_matrix(cfg.graph.nodes, cfg.graph.edges)
    steps = stopping(cfg.optim)
    record_every = cfg.optim.record_every if isinstance(steps, int) else None
    runs: dict[str, list[GraphRun]] = {}
    trainings: dict[str, Training] = {}
    for label, attention in cfg.models.items():
        runs[label], trainings[label] = train_graph(
            cfg.graph.nodes,
            OmegaConf.to_container(cfg.graph.edges),
            OmegaConf.to_container(attention),
            cfg.model.dim,
            steps,
            cfg.optim.batch_size,
            cfg.optim.lr,
            list(cfg.seeds),
            cfg.model.bias,
            checkpoint=None if isinstance(steps, int) else checkpoint_path(cfg, label),
            embedding=cfg.model.embedding,
            readout=cfg.model.readout,
            record_every=record_every,
        )
    rows = []
    quantities = [  # (row label, RunResult field, paper column it compares with)
        ("cross-entropy (raw, nats)", "cross_entropy", "cross_entropy"),
        ("cross-entropy - H(P*) = KL(P* || g)", "kl", "cross_entropy"),
        ("err_map = sum |P^ - P*|, P^ = attention map", "err_map", "err_map"),
        ("sum |G - P*|, G = predicted transition g(X)", "err_transition", "err_map"),
    ]
    options = option_counts(transition).tolist()
    for label, model_runs in runs.items():
        for quantity, field, paper_key in quantities:
            values = [getattr(r, field) for r in model_runs]
            rows.append(row(quantity, label, values, paper[paper_key].get(label)))
        for count in sorted(set(options)):
            queries = [t for t, c in enumerate(options) if c == count]
            values = [r.attention_entropy[queries].mean().item() for r in model_runs]
            rows.append(row(f"attention entropy (nats), {count} option(s)", label, values, None))
    group_options = {g: options[t] for t, g in enumerate(cfg.models.ssa.token_groups)} if "ssa" in runs else {}
    largest = max(group_options.values(), default=0)
    temperatures = {}
    for group, count in sorted(group_options.items(), key=lambda item: item[1]):
        nodes = ",".join(str(t) for t, g in enumerate(cfg.models.ssa.token_groups) if g == group)
        temperatures[count] = [r.temperatures[group] for r in runs["ssa"]]
        reference = [r.temperatures[g] for r in runs["ssa"] for g, c in group_options.items() if c == largest]
        rows.append(
            row(
                f"temperature T, {count} option(s) (nodes {nodes})",
                "ssa",
                temperatures[count],
                paper["temperature"].get(count),
            )
        )
        rows.append(
            row(
                f"T / T({largest} options), {count} option(s)",
                "ssa",
                [t / r for t, r in zip(temperatures[count], reference, strict=True)],
                paper["temperature"][count] / paper["temperature"][largest],
            )
        )
    frame = pd.DataFrame(rows, columns=COLUMNS)
    results = Path(cfg.results_dir)
    results.mkdir(parents=True, exist_ok=True)
    frame.to_csv(results / "table1.csv", index=False)
    maps_frame(runs, list(cfg.seeds)).to_csv(results / "maps.csv", index=False)
    notes = ""
    check_every = record_every if isinstance(steps, int) else steps.check_every
    if check_every is not None:
        trajectory = trajectories(trainings, check_every, entropy(transition).item(), group_options)
        trajectory.to_csv(results / "trajectory.csv", index=False)
        if {"vanilla", "ssa"} <= runs.keys():
            ratio = kl_ratio(trajectory)
            ratio.to_csv(results / "ratio.csv", index=False)
            shown = ratio.iloc[:: max(1, len(ratio) // 10)]
            notes += (
                "SSA / vanilla of the seed-mean CE - H(P*) along the training (paper: 0.009 / 0.0126 = 0.71; the "
                "paper gives no step count, so no step of this trajectory is the paper's), every check in "
                f"`ratio.csv`:\n\n{markdown(shown)}\n\n"
            )
    if isinstance(steps, int):
        trained = f"{steps} Adam steps (lr {cfg.optim.lr}, batch {cfg.optim.batch_size})"
    else:
        trained = f"Adam (lr {cfg.optim.lr}, batch {cfg.optim.batch_size}) until converged"
        notes = (
            f"Convergence (L: the exact cross-entropy over the {cfg.graph.nodes} queries, not the batch loss): "
            f"{steps.describe()}.\n\nStopped: "
            + "; ".join(stopped(label, t) for label, t in trainings.items())
            + ". The checks' values are in `trajectory.csv` (plotted in `trajectory.png`).\n\n"
        ) + notes
    notes += paired_effects(runs, paper)
    if temperatures:
        notes += paper_ordering(temperatures, cfg.ordering.near_zero).describe() + "\n\n"
        groups = sorted(group_options, key=group_options.get)
        notes += sparser_with_lower_temperature(runs["ssa"], list(cfg.models.ssa.token_groups), groups) + "\n\n"
    header = (
        f"# SSA Table 1 / Figure 3 (ours vs paper)\n\n{len(cfg.seeds)} seeds, {trained}, d = {cfg.model.dim}, "
        f"embedding {cfg.model.embedding}, readout {cfg.model.readout}"
        + (f", SSA's scalar: {SCALING[cfg.models.ssa.get('scaling', 'multiply')]}" if "ssa" in cfg.models else "")
        + f". Evaluated exactly over the {cfg.graph.nodes} queries. Figure: `figure3.png` (P^ as attention map and "
        "as predicted transition g(X), averaged over seeds).\n\n"
    )
    (results / "table1.md").write_text(header + notes + markdown(frame) + "\n")
    draw_table1(cfg, paper)
    return frame


def trajectories(
    trainings: dict[str, Training], check_every: int, floor: float, group_options: dict[int, int]
) -> pd.DataFrame:
    """One row per model, seed and check: the values the convergence rule watched, and the excess loss CE - H(P*)
    (``floor``) that shows how far the loss still is from its minimum."""
    names = {g: f"T_{count}_option{'s' if count > 1 else ''}" for g, count in group_options.items()}
    rows = []
    for label, training in trainings.items():
        for check, values in enumerate(training.history.tolist()):
            for seed, (loss, *temperatures) in enumerate(values):
                head = {"model": label, "seed": seed, "step": check * check_every, "cross_entropy": loss}
                rows.append(head | {"kl": loss - floor} | {names[g]: t for g, t in enumerate(temperatures)})
    by_options = [names[g] for g in sorted(names, key=group_options.get)]
    return pd.DataFrame(rows, columns=["model", "seed", "step", "cross_entropy", "kl", *by_options])


def lr_text(lr: float) -> str:
    """``1e-4``, ``2.5e-3``: a learning rate as the figures print it."""
    mantissa, exponent = f"{lr:.3e}".split("e")
    return f"{mantissa.rstrip('0').rstrip('.')}e{int(exponent)}"


def seeds_text(seeds: list[int]) -> str:
    """``5 seeds (0-4)``, ``2 seeds (3, 7)``."""
    consecutive = len(seeds) > 2 and seeds == list(range(seeds[0], seeds[-1] + 1))
    listed = f"{seeds[0]}-{seeds[-1]}" if consecutive else ", ".join(map(str, seeds))
    return f"{len(seeds)} seed{'s' if len(seeds) != 1 else ''} ({listed})"


def parameter_counts(cfg: DictConfig) -> dict[str, int]:
    """Trainable parameters of each model of ``cfg.models`` as built for Table 1 (the same for every seed)."""
    counts = {}
    for label, attention in cfg.models.items():
        with torch.random.fork_rng():  # building initialises weights: leave the global generator as it was
            model = SyntheticAttentionModel(
                cfg.model.dim, OmegaConf.to_container(attention), cfg.graph.nodes, cfg.graph.nodes, cfg.graph.nodes,
                bias=cfg.model.bias, embedding=cfg.model.embedding, readout=cfg.model.readout,
            )  # fmt: skip
        counts[label] = sum(p.numel() for p in model.parameters() if p.requires_grad)
    return counts


def figure_caption(cfg: DictConfig, last_step: int) -> str:
    """What every Table 1 figure says it shows: the protocol, the training, the seeds and our model's real size."""
    protocol = f"embedding {cfg.model.embedding}, readout {cfg.model.readout}"
    if "ssa" in cfg.models:
        protocol += ", SSA " + ("q * tau" if cfg.models.ssa.get("scaling", "multiply") == "multiply" else "q / T")
    optim = cfg.optim
    if optim.until == "steps":
        trained = f"{optim.steps:,} Adam steps at lr {lr_text(optim.lr)}, batch {optim.batch_size}"
    else:
        trained = (
            f"Adam at lr {lr_text(optim.lr)}, batch {optim.batch_size}, until converged or the cap of "
            f"{optim.convergence.max_steps:,} steps (last check: step {last_step:,})"
        )
    sizes = ", ".join(f"{label} {count:,} params" for label, count in parameter_counts(cfg).items())
    return (
        f"protocol: {protocol}; {trained}; {seeds_text(list(cfg.seeds))}\n"
        f"our model: 1 attention layer, 1 head, d = {cfg.model.dim}, {cfg.graph.nodes}-node graph ({sizes})"
    )


def maps_frame(runs: dict[str, list[GraphRun]], seeds: list[int]) -> pd.DataFrame:
    """Every seed's P^ (``attention``) and G (``transition``) per model, one row per entry: Figure 3's data, so the
    figure can be redrawn without training (``render=true``)."""
    rows = []
    for label, model_runs in runs.items():
        for kind, attribute in (("attention", "attention_map"), ("transition", "transition")):
            for seed, run in zip(seeds, model_runs, strict=True):
                matrix = getattr(run, attribute)
                for query, key in itertools.product(range(matrix.shape[0]), range(matrix.shape[1])):
                    rows.append([label, kind, seed, query, key, matrix[query, key].item()])
    return pd.DataFrame(rows, columns=["model", "kind", "seed", "query", "key", "value"])


def figure3(cfg: DictConfig, transition: torch.Tensor, maps: pd.DataFrame, last_step: int) -> Figure:
    """P* beside each model's seed-mean P^ (top row: the attention map; bottom row: the predicted transition G, left
    out when the map is the readout and G = P^), each panel titled with its sum |. - P*| as mean ± std over seeds."""
    nodes = transition.shape[0]
    seeds = sorted(maps["seed"].unique())
    truth = ("P* (ground truth)", transition.numpy())
    kinds = {"attention": ("attention map P^", "P^", "key token attended to (node id)")}
    if cfg.model.readout == "head":
        kinds["transition"] = ("predicted transition G = g(X)", "G", "next token (node id)")
    else:  # the map is the prediction: one row
        kinds = {"attention": ("attention map P^ = prediction G", "P^", "key token attended to = next token (node id)")}
    grid, xlabels = [], []
    for kind, (name, symbol, xlabel) in kinds.items():
        row: list[tuple[str, Any] | None] = [truth]
        for label in dict.fromkeys(maps["model"]):
            part = maps[(maps["model"] == label) & (maps["kind"] == kind)]
            per_seed = torch.tensor(
                [part[part["seed"] == seed].sort_values(["query", "key"])["value"].tolist() for seed in seeds]
            ).reshape(len(seeds), nodes, nodes)
            errors = (per_seed - transition).abs().sum(dim=(1, 2))
            spread = f" ± {errors.std().item():.2g}" if len(seeds) > 1 else ""
            row.append((f"{label}: {name}\nsum |{symbol} - P*| = {errors.mean().item():.3g}{spread}", per_seed.mean(0)))
        grid.append(row)
        xlabels.append(xlabel)
    title = (
        f"SSA Table 1 / Figure 3, ours: P* beside each model's maps, each the mean over the seeds (sum |. - P*|: mean "
        f"± std over the seeds)\n{figure_caption(cfg, last_step)}"
    )
    return plots.matrices_figure(
        grid,
        title,
        xlabels=xlabels,
        ylabel="query: last token (node id)",
        value_label="probability (each row sums to 1)",
        ticks=[str(t) for t in range(nodes)],
    )


def trajectory_figure(cfg: DictConfig, trajectory: pd.DataFrame, paper: dict[str, Any]) -> Figure:
    """CE - H(P*) per model against steps (mean and min-max over seeds), SSA / vanilla of the seed means beside
    the paper's ratio, and SSA's learned temperature per group, one panel per seed."""
    losses = trajectory.rename(columns={"model": "series", "kl": "value"})[["series", "seed", "step", "value"]]
    ratio = None
    if {"vanilla", "ssa"} <= set(trajectory["model"]):
        ratio = kl_ratio(trajectory).rename(columns={"ratio": "value"})
    ssa, vanilla = paper["cross_entropy"]["ssa"], paper["cross_entropy"]["vanilla"]
    columns = [c for c in trajectory.columns if c.startswith("T_")]
    temperatures = None
    if columns and "ssa" in set(trajectory["model"]):
        learned = trajectory[trajectory["model"] == "ssa"].melt(["seed", "step"], columns, "series", "value")
        options = option_counts(transition_matrix(cfg.graph.nodes, cfg.graph.edges)).tolist()
        names = {}
        for count in sorted(set(options)):
            plural, members = "s" if count > 1 else "", [str(t) for t, c in enumerate(options) if c == count]
            nodes = f"node{'s' if len(members) > 1 else ''} {','.join(members)}"
            names[f"T_{count}_option{plural}"] = f"T, {count} option{plural} ({nodes})"
        temperatures = learned.assign(series=learned["series"].map(names)).dropna(subset=["value"])
    last_step = int(trajectory["step"].max())
    interval = int(pd.Series(sorted(trajectory["step"].unique())).diff().min())
    return plots.trajectory_figure(
        losses,
        f"SSA Table 1, ours: each model evaluated exactly over the {cfg.graph.nodes} queries every {interval:,} steps "
        f"of training\n{figure_caption(cfg, last_step)}",
        loss_label="CE - H(P*) = KL(P* || g), nats",
        ratio=ratio,
        ratio_label="SSA / vanilla of the seed-mean CE - H(P*) (ratio.csv)",
        paper_ratio=(ssa / vanilla, f"paper: {ssa} / {vanilla} = {ssa / vanilla:.2f} (at no stated step)"),
        temperatures=temperatures,
        temperature_label="learned temperature T = 1/tau",
        temperature_title="SSA only (vanilla has no temperature): each group's learned T, one panel per seed",
    )


def draw_table1(cfg: DictConfig, paper: dict[str, Any]) -> list[Path]:
    """Draw ``figure3.png`` from ``maps.csv`` and ``trajectory.png`` from ``trajectory.csv`` in ``cfg.results_dir``,
    each where its CSV is there; the PNGs written."""
    results = Path(cfg.results_dir)
    transition = transition_matrix(cfg.graph.nodes, cfg.graph.edges)
    drawn = []
    trajectory = pd.read_csv(results / "trajectory.csv") if (results / "trajectory.csv").exists() else None
    last_step = cfg.optim.steps if trajectory is None else int(trajectory["step"].max())
    if (results / "maps.csv").exists():
        figure = figure3(cfg, transition, pd.read_csv(results / "maps.csv"), last_step)
        drawn.append(plots.save(figure, results / "figure3.png"))
    if trajectory is not None:
        drawn.append(plots.save(trajectory_figure(cfg, trajectory, paper), results / "trajectory.png"))
    return drawn


def table2_point(cfg: DictConfig, task: DenoisingTask, seeds: list[int]) -> dict[str, list[float]]:
    """Test MSE of every model (per seed) and of the two baselines at one (L, sigma)."""
    values = {key: [value] for key, value in baseline_mse(task, cfg.eval.samples, cfg.eval.seed).items()}
    for label, attention in cfg.models.items():
        values[label] = train_denoising(
            task,
            OmegaConf.to_container(attention),
            cfg.optim.steps,
            cfg.optim.batch_size,
            cfg.optim.lr,
            seeds,
            cfg.eval.samples,
            cfg.eval.seed,
            cfg.model.bias,
        )
    return values


def run_table2(cfg: DictConfig, paper: dict[str, float]) -> pd.DataFrame:
    """Table 2 at (cfg.task.length, cfg.task.sigma), then the sweep over L and sigma."""
    require(cfg.optim.until == "steps", "optim.until", "Table 2 trains a fixed number of steps: until=steps")
    task = DenoisingTask(cfg.task.length, cfg.task.sigma, cfg.task.alpha, cfg.task.dim, cfg.task.positions)
    values = table2_point(cfg, task, list(cfg.seeds))
    frame = pd.DataFrame(
        [row("normalised MSE", label, v, paper.get(label)) for label, v in values.items()], columns=COLUMNS
    )
    sweep = []
    grid = cfg.sweep.baselines
    for length, sigma in itertools.product(grid.length, grid.sigma):
        point = replace(task, length=length, sigma=sigma)
        sweep.append({"length": length, "sigma": sigma, **baseline_mse(point, cfg.eval.samples, cfg.eval.seed)})
    trained = cfg.sweep.trained
    for length, sigma in itertools.product(trained.length, trained.sigma):
        point = replace(task, length=length, sigma=sigma)
        means = {k: statistics.fmean(v) for k, v in table2_point(cfg, point, list(trained.seeds)).items()}
        sweep.append({"length": length, "sigma": sigma, **means})
    sweep_frame = pd.DataFrame(sweep).groupby(["length", "sigma"], as_index=False).last()
    sweep_frame = sweep_frame.reindex(columns=["length", "sigma", *paper])
    consistency = bayes_matched(cfg, task, paper["bayes_optimal"])
    results = Path(cfg.results_dir)
    results.mkdir(parents=True, exist_ok=True)
    frame.to_csv(results / "table2.csv", index=False)
    sweep_frame.to_csv(results / "sweep.csv", index=False)
    consistency.to_csv(results / "consistency.csv", index=False)
    scored = "the last position L" if task.positions == "last" else "every position, averaged (causal prefixes)"
    header = (
        f"# SSA Table 2 (ours vs paper)\n\nL = {task.length}, sigma = {task.sigma}, K = d = {task.dim}, "
        f"alpha = {task.alpha}; risk scored at {scored}; {len(cfg.seeds)} seeds, {cfg.optim.steps} Adam steps "
        f"(lr {cfg.optim.lr}, batch {cfg.optim.batch_size}); test set of {cfg.eval.samples}. Baselines are "
        "deterministic (std 0).\n\n"
    )
    sweep_text = (
        f"\n\n## Sweep over L and sigma (mean test MSE; trained models at {len(trained.seeds)} seeds, "
        f"blank where not trained)\n\nPaper: " + ", ".join(f"{k} {v}" for k, v in paper.items()) + "\n\n"
    )
    consistency_text = (
        f"\n\n## Where Bayes-optimal is the paper's {paper['bayes_optimal']} (risk at the last position)\n\n"
        "Per L, the sigma at which the Bayes-optimal risk equals the paper's, naive averaging there, and their "
        "ratio; `small_noise_ratio` is its exact sigma -> 0 limit L E[S^-2] / E[S^-1] (S = number of signal tokens). "
        f"Paper: naive averaging {paper['naive_average']}, i.e. {paper['naive_average'] / paper['bayes_optimal']:.0f}x "
        "Bayes-optimal; and naive averaging's risk is below 2 at every (L, sigma), since its output always has a "
        "positive component along y = e_q.\n\n"
    )
    (results / "table2.md").write_text(
        header + markdown(frame) + sweep_text + markdown(sweep_frame) + consistency_text + markdown(consistency) + "\n"
    )
    return frame


def bayes_matched(cfg: DictConfig, task: DenoisingTask, bayes: float) -> pd.DataFrame:
    """Whether the paper's four numbers fit its data model: per L of ``cfg.consistency.lengths``, the sigma where the
    Bayes-optimal risk at the last position is ``bayes``, and naive averaging's risk there."""
    rows = []
    for length in cfg.consistency.lengths:
        point = replace(task, length=length, positions="last")
        sigma = sigma_for_bayes(point, bayes, cfg.eval.samples, cfg.eval.seed)
        risks = baseline_mse(replace(point, sigma=sigma), cfg.eval.samples, cfg.eval.seed)
        rows.append(
            {"length": length, "sigma": sigma, **risks, "ratio": risks["naive_average"] / risks["bayes_optimal"]}
            | {"small_noise_ratio": small_noise_ratio(length, task.alpha)}
        )
    return pd.DataFrame(rows)


def run(cfg: DictConfig, paper: dict[str, Any]) -> pd.DataFrame:
    """Dispatch on ``cfg.table``; ``paper`` holds the paper's numbers of that table."""
    torch.set_num_threads(cfg.threads)
    if cfg.get("render"):
        require(cfg.table == "table1", "render", f"only Table 1 has figures to redraw, not {cfg.table}")
        drawn = draw_table1(cfg, paper)
        require(bool(drawn), "render", f"no maps.csv or trajectory.csv in {cfg.results_dir} to draw from")
        return pd.read_csv(Path(cfg.results_dir) / "table1.csv")
    if cfg.table == "table1":
        return run_table1(cfg, paper)
    if cfg.table == "table2":
        return run_table2(cfg, paper)
    raise ValueError(f"table: got {cfg.table!r}; allowed: table1, table2")
