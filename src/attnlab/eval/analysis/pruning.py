"""Head pruning curves (Michel et al. 2019): how much of the model's quality survives removing heads
in order of importance, against removing them at random; and which layers keep their heads."""

from __future__ import annotations

import csv
import logging
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from attnlab.attention.head_importance import head_importance, prune_heads_by_importance
from attnlab.eval.analysis.common import (
    AnalysisInputs,
    Tokens,
    as_batches,
    device_of,
    mean_loss,
    register_metric,
    unwrap,
)

log = logging.getLogger(__name__)
DEFAULT_FRACTIONS = tuple(i / 10 for i in range(10))  # 0, 10, ..., 90 % of the heads removed
ORDERS = ("importance", "random")


def pruning_curves(
    model: nn.Module,
    tokens: Tokens,
    fractions: Sequence[float] = DEFAULT_FRACTIONS,
    seed: int = 0,
    recompute_importance: bool = False,
    importance_tokens: Tokens | None = None,
    random_orders: int = 5,
) -> dict[str, Any]:
    """Loss and perplexity on ``tokens`` with a fraction of all heads masked, starting from every head on.

    Heads are removed globally, least important first (importance from ``head_importance`` on
    ``importance_tokens``, default ``tokens``; with ``recompute_importance`` recomputed under the current mask
    after each step), or in ``random_orders`` seeded random orders (``repeat`` 0, 1, ...: the band the importance
    order is judged against). Each step keeps the heads the previous one removed. The model's own head mask is
    restored afterwards.
    """
    model = unwrap(model)
    device = device_of(model)
    batches = as_batches(tokens, device)
    scoring = batches if importance_tokens is None else as_batches(importance_tokens, device)
    original = model.head_mask().clone()
    model.set_head_mask(torch.ones_like(original))
    importance = head_importance(model, scoring)
    generator = torch.Generator().manual_seed(seed)
    orders = [("importance", 0, importance)] + [
        ("random", repeat, torch.rand(original.shape, generator=generator).to(device))
        for repeat in range(random_orders)
    ]
    rows = []
    try:
        for number, (order, repeat, score) in enumerate(orders, start=1):
            log.info(
                "pruning: %s order %d (%d of %d orders, %d steps each)",
                order,
                repeat,
                number,
                len(orders),
                len(fractions),
            )
            mask = torch.ones_like(original)
            for fraction in fractions:
                mask = prune_heads_by_importance(score, round(fraction * mask.numel()), mask)
                model.set_head_mask(mask)
                loss = mean_loss(model, batches)
                rows.append(
                    {
                        "order": order,
                        "repeat": repeat,
                        "fraction": fraction,
                        "heads_pruned": int((mask == 0).sum()),
                        "loss": loss,
                        "perplexity": math.exp(loss),
                        "heads_kept_per_layer": mask.sum(dim=1).int().tolist(),
                    }
                )
                if recompute_importance and order == "importance":
                    score = head_importance(model, scoring)
    finally:
        model.set_head_mask(original)
    return {
        "importance": importance.tolist(),
        "recompute_importance": recompute_importance,
        "seed": seed,
        "random_orders": random_orders,
        "rows": rows,
        **curve_headline(rows),
    }


HEADLINE_FRACTION = 0.5  # the summary's pruned perplexities: with this fraction of the heads removed


def curve_headline(rows: list[dict[str, Any]]) -> dict[str, float]:
    """Perplexity with half the heads removed, importance order and the mean over random orders (the summary)."""
    at = [r for r in rows if abs(r["fraction"] - HEADLINE_FRACTION) < 1e-9]
    if not at:
        return {}
    random = [r["perplexity"] for r in at if r["order"] == "random"]
    importance = next(r["perplexity"] for r in at if r["order"] == "importance")
    return {"pruned50_importance_ppl": importance, "pruned50_random_ppl": sum(random) / len(random) if random else None}


def write_pruning_csv(curves: dict[str, Any], path: Path) -> None:
    """One row per (order, fraction); heads kept per layer as a space-separated list."""
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        columns = ["order", "repeat", "fraction", "heads_pruned", "loss", "perplexity"]
        writer.writerow([*columns, "heads_kept_per_layer"])
        for row in curves["rows"]:
            writer.writerow([row[c] for c in columns] + [" ".join(map(str, row["heads_kept_per_layer"]))])


def plot_pruning(curves: dict[str, Any], path: Path, title: str = "") -> None:
    """One model's curves (``pruning_curves``): the importance order against the random orders' mean and min-max
    band, against the number of heads actually masked."""
    import pandas as pd

    from attnlab.plots import pruning_figure, save

    rows = pd.DataFrame(curves["rows"])
    heads = len(curves["importance"]) * len(curves["importance"][0])
    figure_title = f"Head pruning (Michel et al.): {title}" if title else "Head pruning (Michel et al.)"
    save(pruning_figure({"": rows}, heads, figure_title), path)


def _describe(section: dict[str, Any]) -> list[str]:
    """The plot's statistics: the importance order, and the mean over the random orders, per number of heads."""
    rows = section["rows"]
    orders = len({r.get("repeat", 0) for r in rows if r["order"] == "random"})
    total = sum(rows[0]["heads_kept_per_layer"]) + rows[0]["heads_pruned"]
    lines = []
    for order in ORDERS:
        by_heads: dict[int, list[float]] = {}
        for r in (r for r in rows if r["order"] == order):
            by_heads.setdefault(r["heads_pruned"], []).append(r["perplexity"])
        points = ", ".join(f"{masked} -> {sum(v) / len(v):.4g}" for masked, v in by_heads.items())
        name = f"random, mean of {orders}" if order == "random" and orders > 1 else order
        lines.append(f"  pruned ({name}) ppl by heads masked of {total}: {points}")
    kept = [r for r in rows if r["order"] == "importance" and r["fraction"] <= 0.5 + 1e-9][-1]
    lines.append(f"  heads kept per layer with {kept['heads_pruned']} masked: {kept['heads_kept_per_layer']}")
    return lines


@register_metric(
    "pruning",
    options={
        "prune_step": 0.1,  # pruning curve: fractions 0, step, ..., prune_max of all heads
        "prune_max": 0.9,
        "recompute_importance": False,
        "seed": 0,  # the random pruning orders
        "random_orders": 5,  # how many random orders (the band the importance order is judged against)
    },
    headline={"pruned50_importance_ppl": "pruned50_importance_ppl", "pruned50_random_ppl": "pruned50_random_ppl"},
    describe=_describe,
)
def _pruning(inputs: AnalysisInputs) -> dict[str, Any]:
    options = inputs.options
    steps = math.floor(options["prune_max"] / options["prune_step"] + 1e-9)
    fractions = [round(i * options["prune_step"], 6) for i in range(steps + 1)]
    model = inputs.model
    curves = pruning_curves(
        model,
        inputs.batches,
        fractions,
        options["seed"],
        options["recompute_importance"],
        random_orders=options["random_orders"],
    )
    write_pruning_csv(curves, inputs.out / "pruning.csv")
    gpt = unwrap(model)
    title = (
        f"attention={gpt.attention_config.get('name')}, {gpt.config.n_layer} layers x {gpt.config.n_head} heads, "
        f"{gpt.num_parameters() / 1e6:.2g}M params"
    )
    plot_pruning(curves, inputs.out / "pruning.png", title=title)
    inputs.files += ["pruning.csv", "pruning.png"]
    return curves
