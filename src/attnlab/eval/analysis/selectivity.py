"""Selective attention analysis (Zhang et al. 2024, Figures 1-2): how spiky the attention rows are,
how large the query-key bilinear form is, and which tokens the learned temperature singles out."""

from __future__ import annotations

import html
from collections.abc import Sequence
from pathlib import Path
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
    first_tokens,
    per_layer_line,
    recording,
    register_metric,
    unwrap,
)


def spikiness(probabilities: Tensor) -> Tensor:
    """``||s||_1 / (||s||_2^2 L)`` of every causal row of (..., T, T) maps, L = t + 1 keys visible to query t.

    A uniform row gives 1, a one-hot row 1/L: smaller is spikier.
    """
    p = probabilities.double()
    visible = torch.arange(1, p.shape[-1] + 1, device=p.device, dtype=p.dtype)
    return p.abs().sum(-1) / (p.pow(2).sum(-1).clamp_min(1e-300) * visible)


@torch.no_grad()
def attention_spikiness(model: nn.Module, tokens: Tokens, max_tokens: int = 1000) -> dict[str, Any]:
    """Mean spikiness per layer (over rows and heads) on the first ``max_tokens`` tokens, and over layers."""
    model = unwrap(model)
    total, rows = torch.zeros(len(model.blocks), dtype=torch.float64), 0

    def add(i: int, probabilities: Tensor) -> None:
        total[i] += spikiness(probabilities).sum().cpu()

    with evaluating(model), attention_maps(model, add):
        for batch in first_tokens(as_batches(tokens, device_of(model)), max_tokens):
            model(batch)
            rows += batch.numel() * model.config.n_head
    per_layer = total / rows
    return {"layers": per_layer.tolist(), "mean": per_layer.mean().item(), "tokens": rows // model.config.n_head}


@torch.no_grad()
def qk_operator_norms(model: nn.Module) -> dict[str, Any]:
    """Largest singular value of the combined W_q^h W_k^h^T (d x d) of each head, from the fused qkv weights;
    with GQA query head h is paired with the KV head it reads (h // (H / KV)). Biases and RoPE are left out.

    With W_q^h^T = Q_q R_q and W_k^h^T = Q_k R_k (thin QR, d x d_h), the product is Q_q R_q R_k^T Q_k^T, whose
    singular values are those of the d_h x d_h matrix R_q R_k^T: no d x d SVD needed.
    """
    model = unwrap(model)
    heads = []
    for block in model.blocks:
        shape = block.attn.shape
        w_q, w_k, _ = block.attn.qkv.weight.detach().double().split(shape.qkv_sizes)
        w_q = w_q.unflatten(0, (shape.n_head, shape.head_dim))
        w_k = w_k.unflatten(0, (shape.n_kv_head, shape.head_dim)).repeat_interleave(shape.n_head // shape.n_kv_head, 0)
        r_q, r_k = torch.linalg.qr(w_q.mT).R, torch.linalg.qr(w_k.mT).R
        heads.append(torch.linalg.matrix_norm(r_q @ r_k.mT, ord=2).cpu())
    norms = torch.stack(heads)
    return {"heads": norms.tolist(), "layers": norms.mean(dim=1).tolist(), "mean": norms.mean().item()}


def has_temperature(model: nn.Module, component: str = "q") -> bool:
    return any(f"temperature_{component}" in block.attn.variant.probes() for block in unwrap(model).blocks)


@torch.no_grad()
def token_temperatures(model: nn.Module, tokens: Tensor, component: str = "q") -> Tensor:
    """(n_layer, B, T): the learned tau_c each token gets in each layer, averaged over heads (tau multiplies c,
    so a larger tau is a lower softmax temperature for q). Layers without a temperature on ``c`` give NaN.

    Read from the variant's ``temperature_<c>`` probe: tau (B, heads, T, 1) for every token.
    """
    model = unwrap(model)
    (batch,) = as_batches(tokens, device_of(model))
    taus = torch.full((len(model.blocks), *batch.shape), float("nan"))
    with evaluating(model), recording(model) as recorded:
        model(batch)
    for i, probes in enumerate(recorded):
        if f"temperature_{component}" in probes:
            taus[i] = probes[f"temperature_{component}"][0].mean(dim=1).squeeze(-1)
    return taus


def temperature_component(model: nn.Module) -> str | None:
    """The first of q, k, v that has a learned temperature, as the temperatures metric reads it."""
    return next((c for c in ("q", "k", "v") if has_temperature(model, c)), None)


def token_temperature_spread(model: nn.Module, batches: Sequence[Tensor]) -> float | None:
    """How far the learned temperature differs between tokens at the same position: per layer and position, the std
    over sequences of tau (mean over heads), averaged over positions, layers and batches. The base and the position
    term are the same for every sequence at one position, so only the token term counts: exactly 0 at
    initialisation (its last layer starts at zero), whatever the position slope. None without a temperature or
    without two sequences in a batch."""
    component = temperature_component(model)
    spreads = []
    for batch in batches:
        if component is None or batch.shape[0] < 2:
            continue
        taus = token_temperatures(model, batch, component)  # (layers, B, T); NaN for layers without one
        per_layer = taus.std(dim=1).mean(dim=-1)
        spreads.append(per_layer[~per_layer.isnan()].mean())
    return torch.stack(spreads).mean().item() if spreads else None


def temperature_html(pieces: Sequence[str], values: Sequence[float], title: str) -> str:
    """The text with each token on a background coloured by its value (darker = lower); hover shows the value."""
    from attnlab.plots import text_colour, value_colours

    colours, low, high = value_colours(values)
    spans = []
    for piece, value, rgba in zip(pieces, values, colours, strict=True):
        background = "#{:02x}{:02x}{:02x}".format(*(round(255 * c) for c in rgba[:3]))
        spans.append(
            f'<span title="{value:.4f}" style="background:{background};color:{text_colour(rgba)}">'
            f"{html.escape(piece)}</span>"
        )
    return (
        "<!DOCTYPE html>\n<html><head><meta charset='utf-8'>"
        f"<title>{html.escape(title)}</title></head>\n<body style='font-family:monospace'>\n"
        f"<h3>{html.escape(title)}</h3>\n<p>darker = lower value; range {low:.4f} .. {high:.4f}</p>\n"
        f"<div style='white-space:pre-wrap;line-height:1.6'>{''.join(spans)}</div>\n</body></html>\n"
    )


def temperature_png(
    pieces: Sequence[str], values: Sequence[float], path: Path, title: str, value_label: str = "tau", columns: int = 100
) -> None:
    """The same picture as a PNG (``attnlab.plots.text_heatmap_figure``), with a colour bar naming the value."""
    from attnlab.plots import save, text_heatmap_figure

    save(text_heatmap_figure(pieces, values, title, value_label, columns), path)


@register_metric(
    "spikiness",
    headline={"spikiness": "mean"},
    describe=lambda s: [per_layer_line("spikiness", s["layers"])],
)
def _spikiness(inputs: AnalysisInputs) -> dict[str, Any]:
    return attention_spikiness(inputs.model, inputs.map_batches, inputs.options["max_tokens"])


@register_metric(
    "operator_norm",
    headline={"qk_operator_norm": "mean"},
    describe=lambda s: [per_layer_line("||W_q W_k^T||_2", s["layers"])],
)
def _operator_norm(inputs: AnalysisInputs) -> dict[str, Any]:
    return qk_operator_norms(inputs.model)


@register_metric(
    "temperatures",
    options={"png_tokens": 400},  # tokens drawn in temperatures.png (the HTML shows all max_tokens)
    headline={"temperature_mean": "mean"},
    describe=lambda s: [per_layer_line("temperature", s["layers"])],
)
def _temperatures(inputs: AnalysisInputs) -> dict[str, Any] | None:
    """tau per token (mean over heads) per layer; the text coloured by its mean over layers (Figure 1)."""
    model, tokenizer = inputs.model, inputs.tokenizer
    component = temperature_component(model)
    if component is None:
        return None
    taus = torch.cat([token_temperatures(model, b, component).flatten(1) for b in inputs.map_batches], dim=1)
    ids = torch.cat([b.flatten() for b in inputs.map_batches]).tolist()
    pieces = [tokenizer.decode([i]) for i in ids]
    per_token = taus.nanmean(dim=0).tolist()
    title = f"tau_{component} per token, mean over heads and layers ({model.attention_config.get('name')})"
    (inputs.out / "temperatures.html").write_text(temperature_html(pieces, per_token, title), encoding="utf-8")
    n = inputs.options["png_tokens"]
    label = f"tau_{component} (larger = sharper softmax)"
    temperature_png(pieces[:n], per_token[:n], inputs.out / "temperatures.png", f"{title}, first {n} tokens", label)
    inputs.files += ["temperatures.html", "temperatures.png"]
    return {
        "component": component,
        "layers": taus.nanmean(dim=1).tolist(),
        "mean": taus.nanmean().item(),
        "min": min(per_token),
        "max": max(per_token),
        "tokens": len(ids),
    }
