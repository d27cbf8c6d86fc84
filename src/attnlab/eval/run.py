"""The evaluation job behind ``python evaluate.py``: load a checkpoint (or an HF model), run a task set, record it."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import lightning as L
from omegaconf import DictConfig, OmegaConf

from attnlab.configs import plain
from attnlab.errors import ConfigError
from attnlab.eval.harness import evaluate_suite
from attnlab.eval.lm import AttnlabLM
from attnlab.resolvers import run_id as current_run_id
from attnlab.run_directory import output_dir, remove_stub

log = logging.getLogger(__name__)


def wandb_settings(cfg: DictConfig) -> dict[str, Any] | None:
    """W&B project when ``logger=wandb`` (the training logger group); its Lightning-only fields are not resolved."""
    if OmegaConf.select(cfg, "logger.wandb", default=None) is None:
        return None
    return {"project": OmegaConf.select(cfg, "logger.wandb.project", default="attnlab"), "group": cfg.experiment_name}


def run(cfg: DictConfig) -> dict[str, Any]:
    """Evaluate ``ckpt_path`` or ``pretrained`` on ``cfg.eval``; returns what ``results.json`` holds."""
    if bool(cfg.get("ckpt_path")) == bool(cfg.get("pretrained")):
        raise ConfigError("ckpt_path", "pass one of ckpt_path=<run>/checkpoints/last.ckpt or pretrained=hf:<name>")
    L.seed_everything(cfg.seed, workers=True)
    log.info("Evaluating %s on eval=%s into %s", cfg.get("ckpt_path") or cfg.pretrained, cfg.eval.name, output_dir(cfg))
    lm = AttnlabLM(
        checkpoint=cfg.get("ckpt_path"),
        pretrained=cfg.get("pretrained"),
        attention=plain(cfg.attention),
        tokenizer=cfg.get("tokenizer"),
        batch_size=cfg.batch_size,
        device=cfg.device,
        max_length=cfg.get("max_length"),
        dtype=cfg.dtype,
    )
    return evaluate_suite(
        lm,
        plain(cfg.eval),
        output_dir(cfg),
        limit=cfg.get("limit"),
        seed=cfg.seed,
        cache_dir=cfg.paths.cache_dir,
        results_csv=Path(cfg.results_csv) if cfg.get("results_csv") else None,
        run_id=current_run_id(),
        wandb_cfg=wandb_settings(cfg),
    )


def main(cfg: DictConfig) -> dict[str, Any]:
    """The evaluation job: a bad config raises ``ConfigError`` leaving no run directory behind (the command line
    prints it as one line, ``attnlab.evaluate`` raises it)."""
    try:
        return run(cfg)
    except ConfigError:
        remove_stub(output_dir(cfg))
        raise
