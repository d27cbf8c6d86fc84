"""Logger factories referenced from conf/logger."""

from __future__ import annotations

from pathlib import Path

from lightning.pytorch.loggers import WandbLogger

from attnlab.hub import wandb_mode


def wandb_logger(project: str, save_dir: str, group: str, tags: list[str], name: str) -> WandbLogger:
    """A W&B run grouped by experiment and tagged with attention/model/data, one per Hydra job."""
    Path(save_dir).mkdir(parents=True, exist_ok=True)
    return WandbLogger(
        project=project, save_dir=save_dir, group=group, tags=list(tags), name=name, mode=wandb_mode(), reinit=True
    )
