"""Logger factories referenced from conf/logger, and what a finished run adds to its W&B summary."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from lightning.pytorch.loggers import Logger, WandbLogger

from attnlab.hub import wandb_mode


def wandb_logger(
    project: str,
    save_dir: str,
    group: str,
    tags: list[str],
    name: str,
    job_type: str = "train",
    extra_tags: Sequence[str] = (),
) -> WandbLogger:
    """A W&B run grouped by experiment and tagged with attention/model/data/seed, one per Hydra job; the table
    engine sets the group (``table3-cpu``), the job type (its stage) and extra tags (table, scale)."""
    Path(save_dir).mkdir(parents=True, exist_ok=True)
    return WandbLogger(
        project=project,
        save_dir=save_dir,
        group=group,
        job_type=job_type,
        tags=[*tags, *extra_tags],
        name=name,
        mode=wandb_mode(),
        reinit=True,
    )


def numbers(results: dict[str, Any], prefix: str = "") -> dict[str, float]:
    """The numeric entries of a results dict, nested ones (``eval``) flattened as ``eval/<key>``."""
    flat: dict[str, float] = {}
    for key, value in results.items():
        if isinstance(value, dict):
            flat |= numbers(value, f"{prefix}{key}/")
        elif isinstance(value, int | float) and not isinstance(value, bool):
            flat[f"{prefix}{key}"] = value
    return flat


def log_results(loggers: Sequence[Logger], results: dict[str, Any]) -> None:
    """results.json's numbers (val ppl, unigram baseline, parameters, tokens/s, eval) in each W&B run's summary,
    so the dashboard compares runs on them side by side."""
    for logger in loggers:
        if isinstance(logger, WandbLogger):
            logger.experiment.summary.update(numbers(results))
