"""Attention sinks and gates (Qiu et al. 2025): does a layer dump attention on the first token, how large do its
activations get, and how sparse are its gate values? Beside our first-token shares, Gu et al.'s Sink^eps (ICLR 2025),
the share of heads whose mean attention on the first token of a short window exceeds eps."""

from __future__ import annotations

import logging
from typing import Any

import torch
from torch import Tensor, nn

from attnlab.eval.analysis.common import (
    AnalysisInputs,
    Tokens,
    as_batches,
    attention_maps,
    device_of,
    evaluating,
    per_layer_line,
    probed,
    register_metric,
    unwrap,
)
from attnlab.nn_utils import forward_hooks

log = logging.getLogger(__name__)
SINK_EPSILON, SINK_WINDOW, SINK_WINDOWS = 0.3, 64, 100  # Gu et al.'s eps, window length T and number of windows


@torch.no_grad()
def attention_sinks(model: nn.Module, tokens: Tokens, skip: int = 4, deep_skip: int = 16) -> dict[str, Any]:
    """Per layer: the mean probability that queries at 0-based positions >= ``skip`` put on key 0 (over heads,
    queries and sequences), and the max |x| of the block output (the residual stream) over all tokens.

    ``sink_share`` is the phenomenon check's number (the phenomena search): the same share for queries at positions >=
    ``deep_skip``, averaged over the layers after the first (the first layer rarely has a sink: Xiao et al. 2024,
    Gu et al. 2025), so early queries that can only see a few keys do not pass for a sink.

    ``attention_entropy``: the mean entropy (nats) of a query's attention over its keys, queries at positions >=
    ``skip``, over heads and layers; ``..._normalized`` divides each row's by log(keys it sees), so 1 is uniform.
    Rows that are not distributions (sigmoid and softpick rows need not sum to 1, differential ones can be negative)
    are taken as |weights| over their sum, and a row with no weight at all is left out."""
    model = unwrap(model)
    n_layer = len(model.blocks)
    share, rows = torch.zeros(n_layer, dtype=torch.float64), 0
    deep_share, deep_rows = torch.zeros(n_layer, dtype=torch.float64), 0
    max_activation = torch.zeros(n_layer, dtype=torch.float64)
    entropy = torch.zeros(3, dtype=torch.float64)  # nats, normalised, rows counted

    def track_max(i: int):
        def hook(_module: nn.Module, _args: tuple[Any, ...], output: Tensor) -> None:
            max_activation[i] = torch.maximum(max_activation[i], output.detach().abs().max().double().cpu())

        return hook

    def add_share(i: int, probabilities: Tensor) -> None:
        share[i] += probabilities[:, :, skip:, 0].double().sum().cpu()
        deep_share[i] += probabilities[:, :, deep_skip:, 0].double().sum().cpu()
        entropy.add_(row_entropy(probabilities[:, :, skip:], skip))

    tracked = forward_hooks((block, track_max(i)) for i, block in enumerate(model.blocks))
    with evaluating(model), attention_maps(model, add_share), tracked:
        for batch in as_batches(tokens, device_of(model)):
            if batch.shape[1] <= skip:
                continue
            model(batch)
            rows += batch.shape[0] * model.config.n_head * (batch.shape[1] - skip)
            deep_rows += batch.shape[0] * model.config.n_head * max(0, batch.shape[1] - deep_skip)
    if rows == 0:
        raise ValueError(f"no sequence is longer than skip={skip} tokens")
    share /= rows
    deep_share /= max(deep_rows, 1)
    deep_layers = deep_share[1:] if n_layer > 1 else deep_share
    return {
        "skip": skip,
        "first_token_share": share.tolist(),
        "first_token_share_mean": share.mean().item(),
        "deep_skip": deep_skip,
        "sink_share_per_layer": deep_share.tolist() if deep_rows else None,
        "sink_share": deep_layers.mean().item() if deep_rows else None,
        "max_activation": max_activation.tolist(),
        "max_activation_max": max_activation.max().item(),
        "attention_entropy": (entropy[0] / entropy[2]).item() if entropy[2] else None,
        "attention_entropy_normalized": (entropy[1] / entropy[2]).item() if entropy[2] else None,
    }


@torch.no_grad()
def sink_epsilon(
    model: nn.Module,
    tokens: Tokens,
    epsilon: float = SINK_EPSILON,
    window: int = SINK_WINDOW,
    max_windows: int = SINK_WINDOWS,
) -> dict[str, Any]:
    """Gu et al.'s Sink^eps (ICLR 2025, "When Attention Sink Emerges in Language Models"; sail-sg/Attention-Sink
    ``eval_sink_open_source.py`` ``compute_attention_sink``, commit af49727): the attention a head puts on key 0 of
    a window, averaged over all ``window`` queries (query 0 included, as their ``ratios`` divide key 0's column by
    T), compared with ``epsilon`` per window, layer and head; Sink^eps is the share of (window, layer, head) above it.

    Windows are the first ``window`` tokens of each row (at most ``max_windows`` rows; shorter rows are skipped): on
    packed text a row starts anywhere in a document, so there is no BOS, as in their pipeline. Per layer and head:
    ``sink_epsilon_per_head`` (share of windows above eps) and ``first_token_share_per_head`` (the mean itself)."""
    model = unwrap(model)
    n_layer, n_head = len(model.blocks), model.config.n_head
    above = torch.zeros(n_layer, n_head, dtype=torch.float64)
    share = torch.zeros(n_layer, n_head, dtype=torch.float64)

    def add(i: int, probabilities: Tensor) -> None:
        first = probabilities[..., 0].double().mean(dim=-1)  # (B, H): mean over the window's queries
        above[i] += (first > epsilon).sum(dim=0).cpu()
        share[i] += first.sum(dim=0).cpu()

    batches = [batch[:, :window] for batch in as_batches(tokens, device_of(model)) if batch.shape[1] >= window]
    counted = 0
    with evaluating(model), attention_maps(model, add):
        for batch in batches:
            batch = batch[: max_windows - counted]
            if batch.numel() == 0:
                break
            model(batch)
            counted += batch.shape[0]
    if counted == 0:
        raise ValueError(f"no row has the {window} tokens of a Sink^eps window")
    above /= counted
    share /= counted
    return {
        "epsilon": epsilon,
        "window": window,
        "windows": counted,
        "sink_epsilon": above.mean().item(),
        "sink_epsilon_per_layer": above.mean(dim=1).tolist(),
        "sink_epsilon_per_head": above.tolist(),
        "first_token_share_per_head": share.tolist(),
    }


def sink_heads_figure(section: dict[str, Any], title: str):
    """The per-head first-token share (layers x heads) of ``sink_epsilon`` as a heat map."""
    from attnlab.plots import heads_figure

    caption = (
        f"mean attention on the first token of {section['windows']} windows of {section['window']} tokens; "
        f"Sink^eps (eps = {section['epsilon']:g}) = {section['sink_epsilon']:.3f}"
    )
    return heads_figure(section["first_token_share_per_head"], title, caption, "first-token share")


def row_entropy(weights: Tensor, first_query: int) -> Tensor:
    """Sums over the rows of ``weights`` (B, H, t_q, t_k; queries at 0-based positions ``first_query`` ...) of each
    row's entropy, of that divided by log(keys the query sees), and the number of rows with any weight."""
    magnitude = weights.double().abs()
    total = magnitude.sum(dim=-1, keepdim=True)
    kept = total.squeeze(-1) > 0
    share = magnitude / total.clamp_min(torch.finfo(torch.float64).tiny)
    nats = -torch.special.xlogy(share, share).sum(dim=-1)
    seen = torch.arange(first_query + 1, first_query + 1 + weights.shape[-2], dtype=torch.float64)
    uniform = seen.log().clamp_min(torch.finfo(torch.float64).tiny).to(nats.device)  # the first query sees 1 key
    normalised = torch.where(seen.to(nats.device) > 1, nats / uniform, torch.zeros_like(nats))
    return torch.stack([nats[kept].sum(), normalised[kept].sum(), kept.sum().double()]).cpu()


@torch.no_grad()
def gate_statistics(model: nn.Module, tokens: Tokens, bins: int = 20) -> dict[str, Any] | None:
    """Per layer: mean gate value and a histogram (on [0, 1] for sigmoid-type gates, the data range for SiLU);
    the seed reports means around 0.1-0.25 (sparse) for its SDPA gate. None for models without gates.

    The gate is what the variant records as its "gate" probe, before any fine-tuning rescale."""

    def describe(variant: nn.Module, gates: list[Tensor]) -> dict[str, Any]:
        flat = torch.cat([gate.flatten() for gate in gates])
        bounded = getattr(variant.options, "activation", "sigmoid") != "silu"
        low, high = (0.0, 1.0) if bounded else (flat.min().item(), flat.max().item())
        return {
            "mean": flat.mean().item(),
            "fraction_below_0.1": (flat < 0.1).double().mean().item(),
            "histogram": torch.histc(flat, bins=bins, min=low, max=high).long().tolist(),
            "histogram_range": [low, high],
        }

    layers = probed(model, tokens, "gate", describe)
    if layers is None:
        return None
    means = [layer["mean"] for layer in layers if layer is not None]
    return {"layers": layers, "mean": sum(means) / len(means)}


@torch.no_grad()
def sink_logits(model: nn.Module, tokens: Tokens) -> dict[str, Any] | None:
    """Per layer of a model with gpt-oss sink logits (``attention=sink``, ``softmax1``): the logits s_h per head and
    the mean share of each row's attention the sink takes, sigmoid(s_h - lse_i), over every query of ``tokens``.
    None for models without a sink: what a learned sink became, which the first-token shares cannot show.

    ``sink_logit_mean`` is the mean over layers and heads; ``sink_mass`` the mean over layers of that share."""

    def describe(variant: nn.Module, masses: list[Tensor]) -> dict[str, Any]:
        mass = torch.cat([m.double().transpose(0, 1).flatten(1) for m in masses], dim=1)  # (H, rows)
        logits = variant.sinks.double().tolist()
        return {"logits": logits, "mass_per_head": mass.mean(dim=1).tolist(), "mass": mass.mean().item()}

    layers = probed(model, tokens, "sink_mass", describe)
    if layers is None:
        return None
    present = [layer for layer in layers if layer is not None]
    logits = [logit for layer in present for logit in layer["logits"]]
    return {
        "layers": layers,
        "sink_logit_mean": sum(logits) / len(logits),
        "sink_logit_min": min(logits),
        "sink_logit_max": max(logits),
        "sink_mass": sum(layer["mass"] for layer in present) / len(present),
    }


def entropy_lines(section: dict[str, Any]) -> list[str]:
    """The printout's entropy line; none for a section recorded before it had the entropy (the README's samples)."""
    if "attention_entropy" not in section:
        return []
    nats, normalised = section["attention_entropy"], section["attention_entropy_normalized"]
    if nats is None:
        return ["  attention entropy       - (no row with any attention weight)"]
    return [f"  attention entropy       {nats:.4g} nats ({normalised:.3f} of uniform)"]


@register_metric(
    "sinks",
    # queries at 0-based positions < sink_skip are left out of the first-token share, < sink_deep_skip out of
    # sink_share (which also leaves out the first layer)
    options={"sink_skip": 4, "sink_deep_skip": 16},
    headline={
        "first_token_share": "first_token_share_mean",
        "sink_share": "sink_share",
        "max_activation": "max_activation_max",
        "attention_entropy": "attention_entropy",
        "attention_entropy_normalized": "attention_entropy_normalized",
    },
    describe=lambda s: [
        per_layer_line("first-token share", s["first_token_share"]),
        per_layer_line("max |block output|", s["max_activation"]),
        *entropy_lines(s),
    ],
)
def _sinks(inputs: AnalysisInputs) -> dict[str, Any]:
    options = inputs.options
    return attention_sinks(inputs.model, inputs.map_batches, options["sink_skip"], options["sink_deep_skip"])


@register_metric(
    "sink_epsilon",
    # Gu et al.'s eps, window length and number of windows; the windows are the first tokens of the held-out rows
    # the perplexity-type metrics read (at most eval_max_tokens), so they can be many more than max_tokens allows
    options={"sink_epsilon": SINK_EPSILON, "sink_window": SINK_WINDOW, "sink_windows": SINK_WINDOWS},
    headline={"sink_epsilon": "sink_epsilon"},
    describe=lambda s: [per_layer_line(f"Sink^eps ({s['epsilon']:g}, T={s['window']})", s["sink_epsilon_per_layer"])],
)
def _sink_epsilon(inputs: AnalysisInputs) -> dict[str, Any] | None:
    from attnlab.plots import save

    options = inputs.options
    if all(batch.shape[1] < options["sink_window"] for batch in inputs.batches):
        log.info("analysis: Sink^eps left out: no held-out row has its %d-token window", options["sink_window"])
        return None  # a shorter window is another metric (Sink^eps falls as T grows)
    section = sink_epsilon(
        inputs.model, inputs.batches, options["sink_epsilon"], options["sink_window"], options["sink_windows"]
    )
    gpt = unwrap(inputs.model)
    title = f"attention={gpt.attention_config.get('name', 'vanilla')}: first-token share per head"
    save(sink_heads_figure(section, title), inputs.out / "sink_heads.png")
    inputs.files.append("sink_heads.png")
    return section


@register_metric(
    "gates",
    options={"gate_bins": 20},
    headline={"gate_mean": "mean"},
    describe=lambda s: [per_layer_line("gate value", [layer["mean"] for layer in s["layers"] if layer is not None])],
)
def _gates(inputs: AnalysisInputs) -> dict[str, Any] | None:
    return gate_statistics(inputs.model, inputs.batches, inputs.options["gate_bins"])


@register_metric(
    "sink_logits",
    headline={
        "sink_logit_mean": "sink_logit_mean",
        "sink_logit_min": "sink_logit_min",
        "sink_logit_max": "sink_logit_max",
        "sink_mass": "sink_mass",
    },
    describe=lambda s: [
        per_layer_line("sink logit", [sum(la["logits"]) / len(la["logits"]) for la in s["layers"] if la is not None]),
        per_layer_line("attention to the sink", [layer["mass"] for layer in s["layers"] if layer is not None]),
    ],
)
def _sink_logits(inputs: AnalysisInputs) -> dict[str, Any] | None:
    return sink_logits(inputs.model, inputs.batches)
