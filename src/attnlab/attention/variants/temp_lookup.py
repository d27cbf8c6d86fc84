"""Per-token-group query temperature: the SSA paper's Table 1 model (section 4.1 and appendix A).

"We assign a scaling parameter to each group of nodes that share the same number of neighbors": one learned
scalar per group g and head h, looked up by token id, scales the query. ``scaling`` says how:

- ``multiply`` (default): q_t <- tau_g(t),h * q_t with tau the learned *inverse* temperature, as Definition 1
  writes it (``Q = tau_q(X) ⊙ X W_q``, "tau ... the inverse-temperature functions"); init 1, no floor and no sign
  constraint ("we don't restrict tau to be non-negative").
- ``divide``: q_t <- q_t / max(T_g(t),h, min_temperature), the temperature itself learned (init 1). It reaches the
  paper's reported values (0.002 ... 0.751) from 1 with Adam at lr 1e-4 in ~1e4 steps; ``min_temperature`` keeps
  the divisor positive.

Either way ``temperatures()`` reports T = 1 / (the factor on q), the paper's convention (lower T = larger q).
Token ids come from ``AttentionContext.token_ids``; ids past ``token_groups`` belong to group 0, so the default
(one group, empty map) is a learned per-head constant.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor, nn

from attnlab.attention.base import AttentionContext, AttentionShape, AttentionVariant, VariantOptions, register
from attnlab.errors import require, require_choice


@dataclass
class TemperatureLookupOptions(VariantOptions):
    num_groups: int = 1  # learned scalars per head
    token_groups: list[int] = field(default_factory=list)  # group of token id i; ids past the list: group 0
    scaling: str = "multiply"  # multiply: q * tau (Definition 1's inverse temperature) | divide: q / T
    min_temperature: float = 1.0e-3  # scaling=divide only: floor on T, so q / T never flips sign

    def __post_init__(self) -> None:
        self.token_groups = list(self.token_groups)
        require(self.num_groups >= 1, "attention.num_groups", f"must be >= 1, got {self.num_groups}")
        require(
            all(0 <= g < self.num_groups for g in self.token_groups),
            "attention.token_groups",
            f"groups must lie in [0, num_groups={self.num_groups}), got {self.token_groups}",
        )
        require_choice(self.scaling, ("multiply", "divide"), "attention.scaling")
        require(self.min_temperature > 0, "attention.min_temperature", f"must be > 0, got {self.min_temperature}")


@register("temp_lookup")
class TemperatureLookup(AttentionVariant):
    """q_t <- tau[h, group(token_t)] * q_t (``multiply``) or q_t / max(T[h, group], min_temperature) (``divide``);
    k, v unchanged."""

    Options = TemperatureLookupOptions

    def __init__(self, shape: AttentionShape, options: TemperatureLookupOptions) -> None:
        super().__init__(shape, options)
        # tau (multiply) or T (divide), per head and group
        self.temperature = nn.Parameter(torch.ones(shape.n_head, options.num_groups))
        self.register_buffer("groups", torch.tensor(options.token_groups, dtype=torch.long), persistent=False)

    def reset_parameters(self) -> None:
        """1: the layer starts as vanilla attention in both parameterisations."""
        nn.init.ones_(self.temperature)

    def factor(self) -> Tensor:
        """The factor each group's query is multiplied by, (H, groups)."""
        if self.options.scaling == "multiply":
            return self.temperature
        return 1.0 / self.temperature.clamp_min(self.options.min_temperature)

    def temperatures(self) -> Tensor:
        """T = 1 / factor per head and group, the paper's reporting convention, (H, groups)."""
        return 1.0 / self.factor()

    def group_of(self, token_ids: Tensor) -> Tensor:
        if self.groups.numel() == 0:
            return torch.zeros_like(token_ids)
        known = token_ids < self.groups.numel()
        return torch.where(known, self.groups[token_ids.clamp(max=self.groups.numel() - 1)], 0)

    def transform_qkv(self, x: Tensor, q: Tensor, k: Tensor, v: Tensor, ctx: AttentionContext):
        if ctx.token_ids is None:
            raise ValueError("attention=temp_lookup needs AttentionContext.token_ids (the token id of each position)")
        value = self.temperature[:, self.group_of(ctx.token_ids)].permute(1, 0, 2).unsqueeze(-1)  # (B, H, T, 1)
        if self.options.scaling == "multiply":
            return q * value.to(q.dtype), k, v
        return q / value.clamp_min(self.options.min_temperature).to(q.dtype), k, v
