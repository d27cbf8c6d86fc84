"""Outlier statistics while a model trains: Bondarenko et al.'s point is that outliers grow with training, so a
table that compares them needs the trajectory, not only the end. ``callbacks.outlier_monitor`` (on by default)
logs ``outliers/max_inf_norm``, ``outliers/kurtosis_mean`` and ``outliers/kurtosis_max`` at every validation, on
its first ``batches`` validation batches (the same text each time), with ``activation_outliers``'s module set.
With ``sinks: true`` it also logs ``sinks/sink_share``, ``sinks/first_token_share`` and
``sinks/attention_entropy_normalized`` (``attention_sinks``; 1 is uniform attention, near 0 every query reads one
key, the first or another) on the same batches, and Gu et al.'s ``sinks/sink_epsilon`` (``sink_epsilon``: the
share of heads whose mean attention on the first token of a 64-token window exceeds 0.3; ``sinks/sink_epsilon_layer<i>``
per layer), so the attention sink's emergence is a curve too: one more forward per monitored batch (two with
Sink^eps), through the plain-math path that exposes the maps, after the validation step (the validation
loss is untouched). A model with a learned temperature (SSA and its ablations) also logs
``temperatures/token_spread`` (``token_temperature_spread``: 0 at initialisation), so whether the temperatures have
learned anything is a curve as well (``temperatures: false`` turns it off)."""

from __future__ import annotations

from contextlib import ExitStack
from typing import Any

import lightning as L
import torch

from attnlab.eval.analysis.outliers import OutlierStatistics
from attnlab.eval.analysis.selectivity import token_temperature_spread
from attnlab.eval.analysis.sinks import SINK_WINDOW, attention_sinks, sink_epsilon
from attnlab.nn_utils import forward_hooks


class OutlierMonitor(L.Callback):
    """Hooks the validation loop's own forwards of its first ``batches`` batches: no extra forward, and under any
    strategy (FSDP's sharded wrappers, DDP) and precision the statistics are those of the model as validated."""

    LOGGED = ("max_inf_norm", "kurtosis_mean", "kurtosis_max")

    def __init__(self, batches: int = 2, sinks: bool = False, temperatures: bool = True) -> None:
        if batches < 1:
            raise ValueError(f"callbacks.outlier_monitor.batches must be >= 1, got {batches}")
        self.batches = batches
        self.sinks = sinks
        self.temperatures = temperatures
        self.statistics: OutlierStatistics | None = None
        self.hooked: ExitStack | None = None
        self.monitored_inputs: list[torch.Tensor] = []

    def on_validation_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.statistics = None if trainer.sanity_checking else OutlierStatistics(pl_module.model)
        self.monitored_inputs = []

    def on_validation_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int, dataloader_idx: int = 0
    ) -> None:
        self._unhook()
        if self.statistics is not None and batch_idx < self.batches:
            self.hooked = ExitStack()
            # compile=true: a graph compiled without hooks would be reused with them (dynamo skips hook guards)
            self.hooked.enter_context(torch.compiler.set_stance("force_eager"))
            self.hooked.enter_context(forward_hooks(self.statistics.hooks()))

    def on_validation_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int, *args: Any
    ) -> None:
        self._unhook()
        if (self.sinks or self.temperatures) and self.statistics is not None and batch_idx < self.batches:
            self.monitored_inputs.append(batch["input_ids"][:, :-1].long())  # the model reads all but the last token

    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException) -> None:
        self._unhook()

    def _unhook(self) -> None:
        if self.hooked is not None:
            self.hooked.close()
            self.hooked = None

    def on_validation_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._unhook()
        if self.statistics is None or self.statistics.sequences == 0:
            return
        stats = self.statistics.summary()
        pl_module.log_dict({f"outliers/{key}": float(stats[key]) for key in self.LOGGED}, sync_dist=True)
        self.statistics = None
        logged = {}
        with torch.compiler.set_stance("force_eager"):
            if self.sinks and self.monitored_inputs:
                sinks = attention_sinks(pl_module.model, self.monitored_inputs)
                logged["sinks/first_token_share"] = sinks["first_token_share_mean"]
                if sinks["sink_share"] is not None:
                    logged["sinks/sink_share"] = sinks["sink_share"]
                if sinks["attention_entropy_normalized"] is not None:
                    logged["sinks/attention_entropy_normalized"] = sinks["attention_entropy_normalized"]
                if self.monitored_inputs[0].shape[1] >= SINK_WINDOW:  # rows too short for Gu et al.'s window: none
                    gu = sink_epsilon(pl_module.model, self.monitored_inputs)
                    logged["sinks/sink_epsilon"] = gu["sink_epsilon"]
                    for layer, value in enumerate(gu["sink_epsilon_per_layer"]):
                        logged[f"sinks/sink_epsilon_layer{layer}"] = value
            if self.temperatures and self.monitored_inputs:
                spread = token_temperature_spread(pl_module.model, self.monitored_inputs)
                if spread is not None:  # only models with a learned temperature
                    logged["temperatures/token_spread"] = spread
        if logged:
            pl_module.log_dict(logged, sync_dist=True)
        self.monitored_inputs = []
