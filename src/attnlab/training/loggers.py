"""Logger factories referenced from conf/logger."""

from __future__ import annotations

import os
from pathlib import Path

from lightning.pytorch.loggers import WandbLogger


def wandb_mode() -> str:
    """``WANDB_MODE`` if set; online when an API key is available; offline otherwise."""
    if os.environ.get("WANDB_MODE"):
        return os.environ["WANDB_MODE"]
    return "online" if os.environ.get("WANDB_API_KEY") else "offline"


def wandb_logger(project: str, save_dir: str, group: str, tags: list[str], name: str) -> WandbLogger:
    """A W&B run grouped by experiment and tagged with attention/model/data, one per Hydra job."""
    Path(save_dir).mkdir(parents=True, exist_ok=True)
    return WandbLogger(
        project=project, save_dir=save_dir, group=group, tags=list(tags), name=name, mode=wandb_mode(), reinit=True
    )
