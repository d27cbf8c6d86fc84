"""The LightningModule: owns the loss, the optimiser groups, the schedule and what gets logged."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.pytorch.strategies import FSDPStrategy
from torch import Tensor
from torch.optim import Optimizer
from torchmetrics.aggregation import MeanMetric

from attnlab.errors import require
from attnlab.models import GPT, ModelConfig
from attnlab.models.checkpoint import MODEL_PREFIX, RECORD_KEY, check_record_against_weights, read_checkpoint_file
from attnlab.models.gpt import document_ids
from attnlab.nn_utils import fused_next_token_loss, next_token_loss
from attnlab.validation import OptimSpec


class LanguageModel(L.LightningModule):
    """Next-token prediction for a ``GPT`` built by ``attnlab.models.build_gpt``; every checkpoint it saves carries
    the run's record (spec, tokenizer, data identity), so ``attnlab.models.checkpoint`` reads it back without
    Lightning, and ``LanguageModel.load_from_checkpoint(path)`` rebuilds the module from it (``on_load_checkpoint``)."""

    def __init__(
        self,
        model: GPT | None = None,
        optim: OptimSpec | None = None,
        schedule_steps: int | None = None,
        run_record: dict[str, Any] | None = None,
        compile: bool = False,
        fused_loss: bool = False,
        document_separator: int | None = None,
    ) -> None:
        """``schedule_steps``: the schedule's horizon, fixed when the run starts (a resumed run keeps it).
        ``compile``: ``torch.compile`` the forward and the loss as one graph, once the strategy has placed the model.
        ``fused_loss``: the head and the cross-entropy without the full logits (``fused_next_token_loss``).
        ``document_separator``: the token that ends a document, for document masking (``data.document_mask``).
        With no ``model`` (what Lightning's ``load_from_checkpoint`` calls, having no hyperparameters to pass) the
        model, ``optim``, ``schedule_steps`` and ``run_record`` come from the checkpoint's record when it loads: the
        record already holds them all, so checkpoints need no second copy and those written before load too."""
        super().__init__()
        self.model = model
        self.compile_loss = compile
        self.eager_loss = fused_next_token_loss if fused_loss else next_token_loss
        self.next_token_loss = self.eager_loss
        self.optim = optim
        self.schedule_steps = schedule_steps
        self.run_record = run_record
        self.document_separator = document_separator
        self.val_loss = MeanMetric()

    @classmethod
    def load_from_checkpoint(cls, checkpoint_path: str | Path, *args: Any, **kwargs: Any) -> LanguageModel:
        """Lightning's, after the file is read as ``attnlab.models.checkpoint`` reads it (tensors and plain data
        only): a pickled payload, a truncated file or a record whose sizes its weights contradict is one
        ``ConfigError`` line naming the file, before Lightning builds anything."""
        if isinstance(checkpoint_path, str | Path):
            raw = read_checkpoint_file(Path(checkpoint_path), "checkpoint")
            saved = raw.get(RECORD_KEY)
            if isinstance(saved, dict) and isinstance(saved.get("spec"), dict):
                weights = {k.removeprefix(MODEL_PREFIX): v for k, v in (raw.get("state_dict") or {}).items()}
                check_record_against_weights(Path(checkpoint_path), saved["spec"], weights, "checkpoint")
        return super().load_from_checkpoint(checkpoint_path, *args, **kwargs)

    def configure_model(self) -> None:
        """The model stays uncompiled (parameter names, and so checkpoints, are its own); the compiled loss also
        fuses the cross-entropy with the logits (``make bench`` on an H100: 1.45x compiling the model alone)."""
        if self.compile_loss:
            torch.compiler.reset()  # an earlier run in this process (a -m sweep) must not fill dynamo's cache
            self.next_token_loss = torch.compile(self.eager_loss)

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        checkpoint[RECORD_KEY] = self.run_record

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """``load_from_checkpoint``: build the run's model from the record before Lightning loads the weights into it
        (a resumed fit built its module already: nothing to do)."""
        if self.model is not None:
            return
        saved = checkpoint.get(RECORD_KEY)
        require(
            isinstance(saved, dict) and isinstance(saved.get("spec"), dict),
            "checkpoint",
            "carries no attnlab record (written before checkpoints had one); read it with "
            "attnlab.models.checkpoint.load_checkpoint",
        )
        spec = saved["spec"]
        weights = {k.removeprefix(MODEL_PREFIX): v for k, v in checkpoint["state_dict"].items()}
        check_record_against_weights(Path("the file"), spec, weights, "checkpoint")
        self.model = GPT(ModelConfig.from_dict(spec["model"]), spec["attention"])
        self.optim = OptimSpec(**spec["optim"])
        self.schedule_steps = spec["schedule_steps"]
        self.document_separator = spec.get("document_separator")  # (absent from checkpoints written before it)
        self.run_record = saved

    def forward(self, idx: Tensor, start_pos: int = 0) -> Tensor:
        return self.model(idx, start_pos)

    def loss(self, batch: dict[str, Tensor]) -> Tensor:
        tokens = batch["input_ids"].long()
        separator = self.document_separator
        documents = None if separator is None else document_ids(tokens[:, :-1], separator)
        return self.next_token_loss(self.model, tokens, documents=documents)

    def training_step(self, batch: dict[str, Tensor], batch_idx: int) -> Tensor:
        loss = self.loss(batch)
        self.log("train/loss", loss, prog_bar=True, sync_dist=True)  # DDP: the mean over processes (the global batch)
        return loss

    def validation_step(self, batch: dict[str, Tensor], batch_idx: int) -> None:
        tokens = batch["input_ids"]
        self.val_loss.update(self.loss(batch), weight=tokens[:, 1:].numel())

    def on_validation_epoch_end(self) -> None:
        loss = self.val_loss.compute()  # under DDP already the mean over every process's blocks (synced here)
        self.val_loss.reset()
        # sync_dist averages values that are equal on every process; it only quiets Lightning's DDP warning
        self.log("val/loss", loss, prog_bar=True, sync_dist=True)
        self.log("val/ppl", torch.exp(loss), prog_bar=True, sync_dist=True)

    @property
    def flops_per_batch(self) -> float | None:
        """Read by Lightning's ThroughputMonitor to log achieved FLOP/s and MFU."""
        shape = getattr(self, "_batch_shape", None)
        if shape is None:
            return None
        batch, length = shape
        return self.model.flops_per_token(length) * batch * length

    def on_train_batch_start(self, batch: dict[str, Tensor], batch_idx: int) -> None:
        batch_size, width = batch["input_ids"].shape
        self._batch_shape = (batch_size, width - 1)

    def on_train_batch_end(self, outputs: Any, batch: dict[str, Tensor], batch_idx: int) -> None:
        """On a GPU: the most memory this process has held (weights, optimizer state, activations), in GiB."""
        if self.device.type == "cuda":
            self.log("train/device/peak_memory_gib", torch.cuda.max_memory_allocated(self.device) / 2**30)

    def configure_gradient_clipping(
        self, optimizer: Optimizer, gradient_clip_val: float | None = None, gradient_clip_algorithm: str | None = None
    ) -> None:
        """Under FSDP each process holds a shard of every gradient: the norm must be FSDP's own, over all shards
        (Lightning's generic clipping refuses it); clipping by value is per element and stays Lightning's."""
        by_norm = gradient_clip_algorithm in (None, "norm")
        if isinstance(self.trainer.strategy, FSDPStrategy) and gradient_clip_val and by_norm:
            self.trainer.model.clip_grad_norm_(gradient_clip_val)
        else:
            super().configure_gradient_clipping(optimizer, gradient_clip_val, gradient_clip_algorithm)

    def configure_optimizers(self) -> dict[str, Any]:
        """AdamW over three groups: decayed matrices; norms, biases and embeddings; the variant's own parameters."""
        cfg = self.optim
        variant = {name for name, _ in self.model.variant_parameters()}
        decay, no_decay, variant_params = [], [], []
        for name, param in self.model.named_parameters():
            if not param.requires_grad:
                continue
            if name in variant:
                variant_params.append(param)
            elif param.ndim >= 2 and not name.startswith(("wte.", "wpe.")):
                decay.append(param)
            else:
                no_decay.append(param)
        groups = [
            {"params": decay, "weight_decay": cfg.weight_decay, "name": "decay"},
            {"params": no_decay, "weight_decay": 0.0, "name": "no_decay"},
        ]
        if variant_params:
            variant_lr = self.model.attention_config.get("variant_lr") or cfg.lr
            groups.append({"params": variant_params, "weight_decay": 0.0, "lr": variant_lr, "name": "variant"})
        optimizer = torch.optim.AdamW(groups, lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), eps=cfg.eps)
        # The horizon comes from the run, never from trainer.estimated_stepping_batches: reading that reloads the
        # dataloader and drops a stateful loader's restored position (Lightning issue #20550).
        schedule = warmup_cosine(cfg.warmup_steps, self.schedule_steps, cfg.min_lr_ratio, cfg.schedule)
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, schedule)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}


def warmup_cosine(warmup_steps: int, total_steps: int, min_ratio: float, kind: str = "cosine"):
    """Linear warmup, then cosine decay to ``min_ratio`` of the peak and flat after ``total_steps`` (or constant,
    the fine-tuning setting). A factor of each group's own lr: torch's CosineAnnealingLR takes one absolute
    ``eta_min`` for all groups, which the variant group's separate lr would not follow."""
    # Not a library schedule: step by step, transformers' get_cosine_with_min_lr_schedule_with_warmup starts at lr 0
    # (a step behind) and rises again past the horizon; torch's SequentialLR also rises, and differs in the last bits.

    def factor(step: int) -> float:
        if step < warmup_steps:
            return (step + 1) / warmup_steps
        if kind == "constant":
            return 1.0
        progress = min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))
        return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress))

    return factor
