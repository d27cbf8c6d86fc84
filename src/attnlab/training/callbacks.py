"""Callback factories referenced from conf/callbacks."""

from __future__ import annotations

import sys
from typing import Any

import lightning as L
from lightning.pytorch.callbacks import ThroughputMonitor, TQDMProgressBar
from lightning.pytorch.callbacks.progress.tqdm_progress import Tqdm
from lightning.pytorch.trainer.states import RunningStage, TrainerFn
from lightning.pytorch.utilities import rank_zero_only


def _batch_size(batch: dict[str, Any]) -> int:
    return batch["input_ids"].shape[0]


def _tokens_in_batch(batch: dict[str, Any]) -> int:
    """Predicted tokens in the whole batch: ThroughputMonitor adds ``length_fn`` once per batch (not per sample)."""
    return batch["input_ids"][:, 1:].numel()


class TokenThroughput(ThroughputMonitor):
    """Lightning's ThroughputMonitor counting tokens, logging what a reader compares: ``train/tokens_per_sec`` (and
    ``train/flops_per_sec``, ``train/mfu`` where the device's peak is known; all processes together) on the logged
    steps, and ``validate/tokens_per_sec`` once per validation, at the training step it follows. Lightning's own
    logs every validation batch at the validation's batch count (W&B's points land at steps 1-4, behind the
    training's) and its per-device copies and running counters (``train/device/*``, ``train/time``, ...)."""

    SHOWN = ("items_per_sec", "flops_per_sec", "mfu")

    def __init__(self, window_size: int = 20) -> None:
        super().__init__(batch_size_fn=_batch_size, length_fn=_tokens_in_batch, window_size=window_size)

    def _compute(self, trainer: L.Trainer, iter_num: int | None = None) -> None:
        stage = trainer.state.stage
        if stage == RunningStage.VALIDATING or not trainer._logger_connector.should_update_logs:
            return  # a validation is logged once, when it ends
        computed = self._throughputs[stage].compute()
        metrics = {}
        for name in self.SHOWN:  # all processes' (logged past one process), else this one's
            value = computed.get(name, computed.get(f"device/{name}"))
            if value is not None:
                metrics[f"{stage.value}/{name.replace('items', 'tokens')}"] = value
        trainer._logger_connector.log_metrics(metrics)  # at the training step

    @rank_zero_only
    def on_validation_end(self, trainer: L.Trainer, *args: Any) -> None:
        if (
            not trainer.sanity_checking
            and trainer.state.fn == TrainerFn.FITTING
            and self.measured(RunningStage.VALIDATING)
        ):
            seconds = self._throughputs[RunningStage.VALIDATING].compute().get("time")
            if seconds:
                tokens = self._lengths[RunningStage.VALIDATING] * trainer.world_size
                trainer._logger_connector.log_metrics({"validate/tokens_per_sec": tokens / seconds})
        super().on_validation_end(trainer, *args)

    def measured(self, stage: RunningStage) -> bool:
        """Whether ``stage`` ran a batch: Lightning's ``Throughput.compute`` fails on none (a resumed run at its end)"""
        return bool(self._batches.get(stage))

    def training_tokens_per_second(self) -> float | None:
        """Tokens per second of the training steps alone (validation left out of the clock); None before any."""
        if not self.measured(RunningStage.TRAINING):
            return None
        computed = self._throughputs[RunningStage.TRAINING].compute()
        seconds = computed.get("time")
        return computed["lengths"] / seconds if seconds and computed.get("lengths") else None


class TokenProgressBar(TQDMProgressBar):
    """Lightning's bar counting tokens: its rate reads tokens/s, the unit the run's speed is quoted in (results.json,
    the summary line), not batches/s; and it names the training, not an epoch (a step-based run has one epoch, and a
    resumed one would read "Epoch 1")."""

    tokens_per_batch = 1  # set when training starts, from the data module (batch_size x block_size)

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        datamodule = trainer.datamodule
        if datamodule is not None:
            self.tokens_per_batch = datamodule.batch_size * datamodule.block_size
        super().on_train_start(trainer, pl_module)

    def init_train_tqdm(self) -> Tqdm:
        """Lightning's training bar (its documented hook), counting tokens and keeping its name."""
        return TrainingBar(
            desc=self.train_description,
            position=(2 * self.process_position),
            disable=self.is_disabled,
            leave=True,
            dynamic_ncols=True,
            file=sys.stdout,
            smoothing=0,
            bar_format=self.BAR_FORMAT,
            unit="tok",
            unit_scale=self.tokens_per_batch,
        )


class TrainingBar(Tqdm):
    """A bar that keeps its name: Lightning renames the training bar "Epoch <n>" (and draws it so) at each epoch start,
    which a log file keeps even where a terminal overwrites it at once."""

    def set_description(self, desc: str | None = None, refresh: bool = True) -> None:
        return None
