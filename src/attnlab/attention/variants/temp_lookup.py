"""Per-token-group query temperature: the SSA paper's Table 1 model (seed 004, section 4.1 and appendix A).

"We assign a scaling parameter to each group of nodes that share the same number of neighbors": a learned
temperature T_g,h per group g and head h, looked up by token id, divides the query, q_t <- q_t / T_g(t),h.
We learn the temperature itself (init 1), not its inverse: the paper reports temperatures (0.002 ... 0.751,
lower = sparser map), which Adam at lr 1e-4 reaches from 1 in about 1e4 steps only in this parameterisation.
``min_temperature`` keeps the divisor positive. Token ids come from ``AttentionContext.token_ids``; ids past
``token_groups`` belong to group 0, so the default (one group, empty map) is a learned per-head constant.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor, nn

from attnlab.attention.base import AttentionContext, AttentionShape, AttentionVariant, VariantOptions, register
from attnlab.errors import require


@dataclass
class TemperatureLookupOptions(VariantOptions):
    num_groups: int = 1  # learned temperatures per head
    token_groups: list[int] = field(default_factory=list)  # group of token id i; ids past the list: group 0
    min_temperature: float = 1.0e-3  # floor on T, so q / T never flips sign

    def __post_init__(self) -> None:
        self.token_groups = list(self.token_groups)
        require(self.num_groups >= 1, "attention.num_groups", f"must be >= 1, got {self.num_groups}")
        require(
            all(0 <= g < self.num_groups for g in self.token_groups),
            "attention.token_groups",
            f"groups must lie in [0, num_groups={self.num_groups}), got {self.token_groups}",
        )
        require(self.min_temperature > 0, "attention.min_temperature", f"must be > 0, got {self.min_temperature}")


@register("temp_lookup")
class TemperatureLookup(AttentionVariant):
    """q_t <- q_t / max(T[h, group(token_t)], min_temperature); k, v unchanged."""

    Options = TemperatureLookupOptions

    def __init__(self, shape: AttentionShape, options: TemperatureLookupOptions) -> None:
        super().__init__(shape, options)
        self.temperature = nn.Parameter(torch.ones(shape.n_head, options.num_groups))
        self.register_buffer("groups", torch.tensor(options.token_groups, dtype=torch.long), persistent=False)

    def reset_parameters(self) -> None:
        """T = 1: the layer starts as vanilla attention."""
        nn.init.ones_(self.temperature)

    def group_of(self, token_ids: Tensor) -> Tensor:
        if self.groups.numel() == 0:
            return torch.zeros_like(token_ids)
        known = token_ids < self.groups.numel()
        return torch.where(known, self.groups[token_ids.clamp(max=self.groups.numel() - 1)], 0)

    def transform_qkv(self, x: Tensor, q: Tensor, k: Tensor, v: Tensor, ctx: AttentionContext):
        if ctx.token_ids is None:
            raise ValueError("attention=temp_lookup needs AttentionContext.token_ids (the token id of each position)")
        temperature = self.temperature[:, self.group_of(ctx.token_ids)]  # (H, B, T)
        temperature = temperature.clamp_min(self.options.min_temperature).permute(1, 0, 2).unsqueeze(-1)
        return q / temperature.to(q.dtype), k, v
