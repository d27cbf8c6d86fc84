"""``run_analysis``: every metric that applies to one model, written to a folder; ``format_summary`` prints it."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf
from tokenizers import Tokenizer
from torch import Tensor, nn

from attnlab.data.tokenizer import eos_token_id
from attnlab.errors import ConfigError, require
from attnlab.eval.analysis.common import first_tokens, perplexity, unwrap, windows
from attnlab.eval.analysis.outliers import activation_outliers, w8a8_perplexity
from attnlab.eval.analysis.pruning import plot_pruning, pruning_curves, write_pruning_csv
from attnlab.eval.analysis.selectivity import (
    attention_spikiness,
    has_temperature,
    qk_operator_norms,
    temperature_html,
    temperature_png,
    token_temperatures,
)
from attnlab.eval.analysis.sinks import attention_sinks, gate_statistics

METRICS = ("outliers", "w8a8", "sinks", "gates", "spikiness", "operator_norm", "temperatures", "pruning")
DEFAULTS: dict[str, Any] = {
    "texts": None,  # str or list of str, tokenized and joined with the end-of-text token
    "eval_tokens": None,  # or token ids: a 1-D stream or (N, T) rows (takes precedence over texts)
    "max_tokens": 1000,  # attention-map metrics (sinks, spikiness, temperatures) use the first this many tokens
    "eval_max_tokens": None,  # perplexity-type metrics use at most this many tokens; None: all
    "batch_size": 8,
    "seq_len": None,  # rows of this many tokens; None: the model's block_size
    "calibration_tokens": None,  # W8A8 calibration ids (training text, as the seed); None: first eval batches
    "calibration_batches": 4,
    "bits": 8,
    "quant_momentum": 0.9,  # EMA of the activation min/max while calibrating
    "sink_skip": 4,  # queries at 0-based positions < sink_skip are left out of the first-token share
    "gate_bins": 20,
    "prune_step": 0.1,  # pruning curve: fractions 0, step, ..., prune_max of all heads
    "prune_max": 0.9,
    "recompute_importance": False,
    "seed": 0,  # random pruning order
    "png_tokens": 400,  # tokens drawn in temperatures.png (the HTML shows all max_tokens)
    "metrics": list(METRICS),
}


def _options(cfg: Mapping[str, Any]) -> dict[str, Any]:
    unknown = sorted(set(cfg) - set(DEFAULTS))
    if unknown:
        raise ConfigError(f"analysis.{unknown[0]}", f"unknown option; allowed: {', '.join(DEFAULTS)}")
    options = {**DEFAULTS, **cfg}
    for metric in options["metrics"]:
        require(metric in METRICS, "analysis.metrics", f"got {metric!r}; allowed: {', '.join(METRICS)}")
    return options


def _token_stream(tokenizer: Tokenizer, options: dict[str, Any]) -> Tensor:
    if options["eval_tokens"] is not None:
        return torch.as_tensor(options["eval_tokens"]).long()
    texts = options["texts"]
    require(texts is not None, "analysis.eval_tokens", "give eval_tokens (token ids) or texts (strings)")
    texts = [texts] if isinstance(texts, str) else list(texts)
    eos = eos_token_id(tokenizer)
    ids = [i for text in texts for i in [*tokenizer.encode(text).ids, eos]][:-1]
    return torch.tensor(ids, dtype=torch.long)


def _rows(tokens: Tensor, seq_len: int, batch_size: int, max_tokens: int | None, device: torch.device) -> list[Tensor]:
    batches = windows(tokens, seq_len, batch_size) if tokens.dim() == 1 else list(tokens.split(batch_size))
    if max_tokens is not None:
        batches = first_tokens(batches, max_tokens)
    return [b.to(device) for b in batches]


def _temperatures(model: nn.Module, tokenizer: Tokenizer, batches: list[Tensor], options: dict[str, Any], out: Path):
    """tau per token (mean over heads) per layer; the text coloured by its mean over layers (Figure 1)."""
    component = next(c for c in ("q", "k", "v") if has_temperature(model, c))
    taus = torch.cat([token_temperatures(model, b, component).flatten(1) for b in batches], dim=1)
    ids = torch.cat([b.flatten() for b in batches]).tolist()
    pieces = [tokenizer.decode([i]) for i in ids]
    per_token = taus.nanmean(dim=0).tolist()
    title = f"tau_{component} per token, mean over heads and layers ({model.attention_config.get('name')})"
    (out / "temperatures.html").write_text(temperature_html(pieces, per_token, title), encoding="utf-8")
    n = options["png_tokens"]
    temperature_png(pieces[:n], per_token[:n], out / "temperatures.png", title)
    return {
        "component": component,
        "layers": taus.nanmean(dim=1).tolist(),
        "mean": taus.nanmean().item(),
        "min": min(per_token),
        "max": max(per_token),
        "tokens": len(ids),
    }


def run_analysis(model_or_module: nn.Module, tokenizer: Tokenizer, out_dir: Path, cfg: Mapping[str, Any]) -> dict:
    """Every metric that applies to the model (gates only for gated variants, temperatures only for
    temperature variants); writes analysis.json, pruning.csv/.png and temperatures.html/.png to ``out_dir`` and
    returns what analysis.json holds: ``summary`` (headline numbers) plus one section per metric."""
    model = unwrap(model_or_module)
    options = _options(OmegaConf.to_container(cfg, resolve=True) if isinstance(cfg, DictConfig) else dict(cfg))
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    device = next(model.parameters()).device
    tokens = _token_stream(tokenizer, options)
    seq_len = options["seq_len"] or model.config.block_size
    batches = _rows(tokens, seq_len, options["batch_size"], options["eval_max_tokens"], device)
    map_batches = _rows(tokens, seq_len, options["batch_size"], options["max_tokens"], device)
    metrics = set(options["metrics"])
    result: dict[str, Any] = {
        "options": {k: v for k, v in options.items() if k not in ("texts", "eval_tokens", "calibration_tokens")}
    }
    if "outliers" in metrics:
        result["outliers"] = activation_outliers(model, batches)
    if "w8a8" in metrics:
        calibration = batches[: options["calibration_batches"]]
        if options["calibration_tokens"] is not None:
            ids = torch.as_tensor(options["calibration_tokens"]).long()
            calibration = _rows(ids, seq_len, options["batch_size"], None, device)
        result["w8a8"] = w8a8_perplexity(model, calibration, batches, options["bits"], options["quant_momentum"])
    if "sinks" in metrics:
        result["sinks"] = attention_sinks(model, map_batches, options["sink_skip"])
    if "gates" in metrics and (gates := gate_statistics(model, batches, options["gate_bins"])) is not None:
        result["gates"] = gates
    if "spikiness" in metrics:
        result["spikiness"] = attention_spikiness(model, map_batches, options["max_tokens"])
    if "operator_norm" in metrics:
        result["operator_norm"] = qk_operator_norms(model)
    files = ["analysis.json"]
    if "temperatures" in metrics and any(has_temperature(model, c) for c in ("q", "k", "v")):
        result["temperatures"] = _temperatures(model, tokenizer, map_batches, options, out)
        files += ["temperatures.html", "temperatures.png"]
    if "pruning" in metrics:
        steps = math.floor(options["prune_max"] / options["prune_step"] + 1e-9)
        fractions = [round(i * options["prune_step"], 6) for i in range(steps + 1)]
        result["pruning"] = pruning_curves(model, batches, fractions, options["seed"], options["recompute_importance"])
        write_pruning_csv(result["pruning"], out / "pruning.csv")
        plot_pruning(result["pruning"], out / "pruning.png", title=str(model.attention_config.get("name")))
        files += ["pruning.csv", "pruning.png"]
    fp = result["w8a8"]["fp_perplexity"] if "w8a8" in result else perplexity(model, batches)
    result = {"summary": _summary(model, fp, result, batches, map_batches), **result, "files": files}
    (out / "analysis.json").write_text(json.dumps(result, indent=2))
    return result


def _summary(model: nn.Module, fp: float, result: dict[str, Any], batches: list[Tensor], maps: list[Tensor]) -> dict:
    """The headline numbers of each section, flat (for loggers and tables)."""
    picks = {
        "w8a8_perplexity": ("w8a8", "quantized_perplexity"),
        "kurtosis_max": ("outliers", "kurtosis_max"),
        "kurtosis_mean": ("outliers", "kurtosis_mean"),
        "max_inf_norm": ("outliers", "max_inf_norm"),
        "first_token_share": ("sinks", "first_token_share_mean"),
        "max_activation": ("sinks", "max_activation_max"),
        "gate_mean": ("gates", "mean"),
        "spikiness": ("spikiness", "mean"),
        "qk_operator_norm": ("operator_norm", "mean"),
        "temperature_mean": ("temperatures", "mean"),
    }
    summary: dict[str, Any] = {
        "attention": model.attention_config.get("name", "vanilla"),
        "eval_tokens": sum(b.numel() for b in batches),
        "map_tokens": sum(b.numel() for b in maps),
        "perplexity": fp,
    }
    summary.update({key: result[section][field] for key, (section, field) in picks.items() if section in result})
    return summary


def _numbers(values: list[float]) -> str:
    return " ".join(f"{v:.3g}" for v in values)


def format_summary(summary: Mapping[str, Any]) -> str:
    """A few readable lines from ``run_analysis``'s result: headline numbers, per-layer values, pruning curve."""
    head = summary["summary"]
    lines = [
        f"analysis of attention={head['attention']} ({head['eval_tokens']} eval tokens, {head['map_tokens']} "
        f"for attention maps)"
    ]
    lines.append(f"  perplexity              {head['perplexity']:.4g}")
    if "w8a8" in summary:
        lines.append(
            f"  W{summary['w8a8']['bits']}A{summary['w8a8']['bits']} perplexity{'':<9}{head['w8a8_perplexity']:.4g}"
        )
    if "outliers" in summary:
        lines.append(f"  kurtosis max / mean     {head['kurtosis_max']:.4g} / {head['kurtosis_mean']:.4g}")
        lines.append(f"  max inf norm            {head['max_inf_norm']:.4g}")
    per_layer = {
        "first-token share": ("sinks", "first_token_share"),
        "max |block output|": ("sinks", "max_activation"),
        "spikiness": ("spikiness", "layers"),
        "||W_q W_k^T||_2": ("operator_norm", "layers"),
        "temperature": ("temperatures", "layers"),
    }
    for label, (section, field) in per_layer.items():
        if section in summary:
            values = summary[section][field]
            lines.append(f"  {label:<23} mean {sum(values) / len(values):.4g}; per layer {_numbers(values)}")
    if "gates" in summary:
        means = [layer["mean"] for layer in summary["gates"]["layers"] if layer is not None]
        lines.append(f"  gate value              mean {head['gate_mean']:.4g}; per layer {_numbers(means)}")
    if "pruning" in summary:
        rows = summary["pruning"]["rows"]
        for order in ("importance", "random"):
            curve = [r for r in rows if r["order"] == order]
            points = ", ".join(f"{100 * r['fraction']:.0f}%: {r['perplexity']:.4g}" for r in curve)
            lines.append(f"  pruned ({order:<10}) ppl {points}")
        kept = [r for r in rows if r["order"] == "importance" and r["fraction"] <= 0.5 + 1e-9][-1]
        lines.append(f"  heads kept per layer at {100 * kept['fraction']:.0f}% pruned: {kept['heads_kept_per_layer']}")
    return "\n".join(lines)
