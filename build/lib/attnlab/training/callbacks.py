"""Callback factories referenced from conf/callbacks."""

from __future__ import annotations

from typing import Any

from lightning.pytorch.callbacks import ThroughputMonitor


def _batch_size(batch: dict[str, Any]) -> int:
    return batch["input_ids"].shape[0]


def _tokens_in_batch(batch: dict[str, Any]) -> int:
    """Predicted tokens in the whole batch: ThroughputMonitor adds ``length_fn`` once per batch (not per sample)."""
    return batch["input_ids"][:, 1:].numel()


def token_throughput(window_size: int = 20) -> ThroughputMonitor:
    """Lightning's ThroughputMonitor counting tokens: logs items (= tokens) per second, FLOP/s and MFU on GPUs."""
    return ThroughputMonitor(batch_size_fn=_batch_size, length_fn=_tokens_in_batch, window_size=window_size)
