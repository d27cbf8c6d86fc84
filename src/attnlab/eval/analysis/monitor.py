"""Outlier statistics while a model trains: Bondarenko et al.'s point is that outliers grow with training, so a
table that compares them needs the trajectory, not only the end. ``callbacks.outlier_monitor`` (on by default)
logs ``outliers/max_inf_norm``, ``outliers/kurtosis_mean`` and ``outliers/kurtosis_max`` at every validation, on
its first ``batches`` validation batches (the same text each time), with ``activation_outliers``'s module set."""

from __future__ import annotations

from typing import Any

import lightning as L
import torch
from torch import Tensor

from attnlab.eval.analysis.outliers import activation_outliers

LOGGED = ("max_inf_norm", "kurtosis_mean", "kurtosis_max")


class OutlierMonitor(L.Callback):
    def __init__(self, batches: int = 2) -> None:
        if batches < 1:
            raise ValueError(f"callbacks.outlier_monitor.batches must be >= 1, got {batches}")
        self.batches = batches
        self.kept: list[Tensor] = []

    def on_validation_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.kept = []

    def on_validation_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int, *args: Any
    ) -> None:
        if len(self.kept) < self.batches:
            self.kept.append(batch["input_ids"][:, :-1].long())  # the inputs (the last token is only a target)

    def on_validation_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.sanity_checking or not self.kept:
            return
        with torch.no_grad():
            stats = activation_outliers(pl_module.model, self.kept)
        pl_module.log_dict({f"outliers/{key}": float(stats[key]) for key in LOGGED}, sync_dist=True)
        self.kept = []
