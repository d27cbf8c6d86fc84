"""Callback factories referenced from conf/callbacks."""

from __future__ import annotations

from typing import Any

from lightning.pytorch.callbacks import ThroughputMonitor


def _batch_size(batch: dict[str, Any]) -> int:
    return batch["input_ids"].shape[0]


def _tokens_per_sequence(batch: dict[str, Any]) -> int:
    return batch["input_ids"].shape[1] - 1


def token_throughput(window_size: int = 20) -> ThroughputMonitor:
    """Lightning's ThroughputMonitor counting tokens: logs items (= tokens) per second, FLOP/s and MFU on GPUs."""
    return ThroughputMonitor(batch_size_fn=_batch_size, length_fn=_tokens_per_sequence, window_size=window_size)
