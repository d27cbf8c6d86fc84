"""Head pruning curves (Michel et al. 2019, seed 001): how much of the model's quality survives removing heads
in order of importance, against removing them at random; and which layers keep their heads."""

from __future__ import annotations

import csv
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

DEFAULT_FRACTIONS = tuple(i / 10 for i in range(10))  # 0, 10, ..., 90 % of the heads removed
ORDERS = ("importance", "random")


def pruning_curves(
    model: nn.Module,
    tokens: Tokens,
    fractions: Sequence[float] = DEFAULT_FRACTIONS,
    seed: int = 0,
    recompute_importance: bool = False,
    importance_tokens: Tokens | None = None,
) -> dict[str, Any]:
    """Loss and perplexity on ``tokens`` with a fraction of all heads masked, starting from every head on.

    Heads are removed globally, least important first (importance from ``head_importance`` on
    ``importance_tokens``, default ``tokens``; with ``recompute_importance`` recomputed under the current mask
    after each step), or in one seeded random order. Each step keeps the heads the previous one removed.
    The model's own head mask is restored afterwards.
    """
    model = unwrap(model)
    device = device_of(model)
    batches = as_batches(tokens, device)
    scoring = batches if importance_tokens is None else as_batches(importance_tokens, device)
    original = model.head_mask().clone()
    model.set_head_mask(torch.ones_like(original))
    importance = head_importance(model, scoring)
    generator = torch.Generator().manual_seed(seed)
    scores = {"importance": importance, "random": torch.rand(original.shape, generator=generator).to(device)}
    rows = []
    try:
        for order in ORDERS:
            mask, score = torch.ones_like(original), scores[order]
            for fraction in fractions:
                mask = prune_heads_by_importance(score, round(fraction * mask.numel()), mask)
                model.set_head_mask(mask)
                loss = mean_loss(model, batches)
                rows.append(
                    {
                        "order": order,
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
    return {"importance": importance.tolist(), "recompute_importance": recompute_importance, "seed": seed, "rows": rows}


def write_pruning_csv(curves: dict[str, Any], path: Path) -> None:
    """One row per (order, fraction); heads kept per layer as a space-separated list."""
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["order", "fraction", "heads_pruned", "loss", "perplexity", "heads_kept_per_layer"])
        for row in curves["rows"]:
            kept = " ".join(map(str, row["heads_kept_per_layer"]))
            writer.writerow([row["order"], row["fraction"], row["heads_pruned"], row["loss"], row["perplexity"], kept])


def plot_pruning(curves: dict[str, Any], path: Path, title: str = "") -> None:
    """Perplexity against the fraction of heads removed, one line per order; log scale once it spans 10x."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(5, 3.5), layout="constrained")
    ax = fig.add_subplot()
    for order in ORDERS:
        rows = [r for r in curves["rows"] if r["order"] == order]
        ax.plot([100 * r["fraction"] for r in rows], [r["perplexity"] for r in rows], marker="o", label=order)
    values = [r["perplexity"] for r in curves["rows"]]
    ax.set(xlabel="heads removed (%)", ylabel="perplexity", title=title)
    if max(values) > 10 * min(values):
        ax.set_yscale("log")
    ax.legend()
    fig.savefig(path, dpi=120)


def _describe(section: dict[str, Any]) -> list[str]:
    lines = []
    for order in ORDERS:
        curve = [r for r in section["rows"] if r["order"] == order]
        points = ", ".join(f"{100 * r['fraction']:.0f}%: {r['perplexity']:.4g}" for r in curve)
        lines.append(f"  pruned ({order:<10}) ppl {points}")
    kept = [r for r in section["rows"] if r["order"] == "importance" and r["fraction"] <= 0.5 + 1e-9][-1]
    lines.append(f"  heads kept per layer at {100 * kept['fraction']:.0f}% pruned: {kept['heads_kept_per_layer']}")
    return lines


@register_metric(
    "pruning",
    options={
        "prune_step": 0.1,  # pruning curve: fractions 0, step, ..., prune_max of all heads
        "prune_max": 0.9,
        "recompute_importance": False,
        "seed": 0,  # random pruning order
    },
    describe=_describe,
)
def _pruning(inputs: AnalysisInputs) -> dict[str, Any]:
    options = inputs.options
    steps = math.floor(options["prune_max"] / options["prune_step"] + 1e-9)
    fractions = [round(i * options["prune_step"], 6) for i in range(steps + 1)]
    model = inputs.model
    curves = pruning_curves(model, inputs.batches, fractions, options["seed"], options["recompute_importance"])
    write_pruning_csv(curves, inputs.out / "pruning.csv")
    plot_pruning(curves, inputs.out / "pruning.png", title=str(model.attention_config.get("name")))
    inputs.files += ["pruning.csv", "pruning.png"]
    return curves
