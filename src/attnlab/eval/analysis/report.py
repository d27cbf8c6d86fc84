"""``run_analysis``: every registered metric that applies to one model, written to a folder; ``format_summary``
prints it. A metric is a ``register_metric`` function in its own module (outliers, sinks, selectivity, pruning)."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf
from tokenizers import Tokenizer
from torch import Tensor, nn

# The metric modules register their metrics on import, in this order (the order they run and print in).
import attnlab.eval.analysis.outliers  # isort: skip
import attnlab.eval.analysis.sinks  # isort: skip
import attnlab.eval.analysis.selectivity  # isort: skip
import attnlab.eval.analysis.pruning  # noqa: F401  isort: skip
from attnlab.data.tokenizer import joined_ids
from attnlab.errors import ConfigError, require
from attnlab.eval.analysis.common import METRICS, AnalysisInputs, perplexity, unwrap
from attnlab.files import write_atomic

log = logging.getLogger(__name__)

SHARED_OPTIONS: dict[str, Any] = {
    "texts": None,  # str or list of str, tokenized and joined with the end-of-text token
    "eval_tokens": None,  # or token ids: a 1-D stream or (N, T) rows (takes precedence over texts)
    "max_tokens": 1000,  # attention-map metrics (sinks, spikiness, temperatures) use the first this many tokens
    "eval_max_tokens": None,  # perplexity-type metrics use at most this many tokens; None: all
    "batch_size": 8,
    "seq_len": None,  # rows of this many tokens; None: the model's block_size
    "metrics": None,  # which registered metrics to run; None: all of them
}


def defaults() -> dict[str, Any]:
    """Every option ``run_analysis`` accepts with its default: the shared ones, then each metric's own."""
    options = dict(SHARED_OPTIONS, metrics=list(METRICS))
    for metric in METRICS.values():
        options.update(metric.options)
    return options


def _options(cfg: Mapping[str, Any]) -> dict[str, Any]:
    allowed = defaults()
    unknown = sorted(set(cfg) - set(allowed))
    if unknown:
        raise ConfigError(f"analysis.{unknown[0]}", f"unknown option; allowed: {', '.join(allowed)}")
    options = {**allowed, **{k: v for k, v in cfg.items() if not (k == "metrics" and v is None)}}
    for metric in options["metrics"]:
        require(metric in METRICS, "analysis.metrics", f"got {metric!r}; allowed: {', '.join(METRICS)}")
    return options


def _token_stream(tokenizer: Tokenizer, options: dict[str, Any]) -> Tensor:
    if options["eval_tokens"] is not None:
        return torch.as_tensor(options["eval_tokens"]).long()
    texts = options["texts"]
    require(texts is not None, "analysis.eval_tokens", "give eval_tokens (token ids) or texts (strings)")
    texts = [texts] if isinstance(texts, str) else list(texts)
    return torch.tensor(joined_ids(tokenizer, texts), dtype=torch.long)


def run_analysis(model_or_module: nn.Module, tokenizer: Tokenizer, out_dir: Path, cfg: Mapping[str, Any]) -> dict:
    """Every metric asked for that applies to the model (gates only for gated variants, temperatures only for
    temperature variants); writes analysis.json and the metrics' figures and CSVs to ``out_dir`` and returns what
    analysis.json holds: ``summary`` (headline numbers) plus one section per metric."""
    model = unwrap(model_or_module)
    options = _options(OmegaConf.to_container(cfg, resolve=True) if isinstance(cfg, DictConfig) else dict(cfg))
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    inputs = AnalysisInputs(model, tokenizer, [], [], options, out, options["seq_len"] or model.config.block_size)
    tokens = _token_stream(tokenizer, options)
    inputs.batches = inputs.rows(tokens, options["eval_max_tokens"])
    inputs.map_batches = inputs.rows(tokens, options["max_tokens"])
    sections: dict[str, Any] = {}
    chosen = [name for name in METRICS if name in options["metrics"]]
    for number, name in enumerate(chosen, start=1):  # minutes in all on a CPU: a line per metric says where it is
        log.info("analysis: %s (%d of %d) on %d sequences", name, number, len(chosen), len(inputs.batches))
        started = time.perf_counter()
        if (section := METRICS[name].compute(inputs)) is not None:
            sections[name] = section
        log.info(
            "analysis: %s %s in %.0f s",
            name,
            "done" if section is not None else "skipped",
            time.perf_counter() - started,
        )
    fp = sections["w8a8"]["fp_perplexity"] if "w8a8" in sections else perplexity(model, inputs.batches)
    summary: dict[str, Any] = {
        "attention": model.attention_config.get("name", "vanilla"),
        "eval_tokens": sum(b.numel() for b in inputs.batches),
        "map_tokens": sum(b.numel() for b in inputs.map_batches),
        "perplexity": fp,
    }
    for name, section in sections.items():
        summary.update({key: section[field] for key, field in METRICS[name].headline.items()})
    recorded = {k: v for k, v in options.items() if k not in ("texts", "eval_tokens", "calibration_tokens")}
    result = {"summary": summary, "options": recorded, **sections, "files": ["analysis.json", *inputs.files]}
    write_atomic(out / "analysis.json", json.dumps(result, indent=2))
    return result


def format_summary(result: Mapping[str, Any]) -> str:
    """A few readable lines from ``run_analysis``'s result: headline numbers, per-layer values, pruning curve."""
    head = result["summary"]
    lines = [
        f"analysis of attention={head['attention']} ({head['eval_tokens']} eval tokens, {head['map_tokens']} "
        f"for attention maps)",
        f"  perplexity              {head['perplexity']:.4g}",
    ]
    for name, metric in METRICS.items():
        if name in result:
            lines += metric.describe(result[name])
    return "\n".join(lines)
