"""Strategy factories referenced from conf/trainer (Hydra cannot spell a set of module classes)."""

from __future__ import annotations

from lightning.pytorch.strategies import FSDPStrategy

from attnlab.models.gpt import Block


def fsdp(sharding_strategy: str = "FULL_SHARD", activation_checkpointing: bool = True) -> FSDPStrategy:
    """FSDP sharding each transformer block as one unit (and recomputing its activations), for 7B-8B models."""
    return FSDPStrategy(
        auto_wrap_policy={Block},
        activation_checkpointing_policy={Block} if activation_checkpointing else None,
        sharding_strategy=sharding_strategy,
        state_dict_type="full",
    )
