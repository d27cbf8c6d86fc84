"""Gated attention (Qiu et al. 2025): a sigmoid gate from x modulates one tensor.

``g = act(x W_g + b_g)`` from the same normalised x as q/k/v, at each token; ``y <- y * g`` (or ``y + g``) where
y is the SDPA output (G1, default), v (G2), k (G3), q (G4, after RoPE: the hook's order) or the output after
W_o (G5). Elementwise: one gate per feature of each head; headwise: one scalar per head. The seed's point:
a bounded, query-dependent gate adds non-linearity after the low-rank W_v W_o and sparsifies the output,
removing the attention sink (only at the SDPA output, not at v).

The reference (qiuzh20/gated_attention@df42212f08f0ab69d3b26956d61feff730dc3804 ``modeling_qwen3.py``) computes the
gate as extra output rows of ``q_proj``, so b_g exists only when the attention projections have a bias
(``qkv_bias``; Qwen3 has none). Ours always has one by default (``gate_bias=true``: a learned offset, which the
multiplicative SiLU gate's exact fine-tuning start needs); ``gate_bias=false`` is the reference's bias-free gate.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnlab.attention.base import (
    AttentionContext,
    AttentionShape,
    AttentionVariant,
    VariantOptions,
    register,
    register_preset,
)
from attnlab.errors import require, require_choice

POSITIONS = ("sdpa", "value", "key", "query", "dense")
GRANULARITIES = ("elementwise", "headwise")
ACTIVATIONS = {
    "sigmoid": torch.sigmoid,
    "silu": F.silu,
    "ns_sigmoid": lambda z: 0.5 + 0.5 * torch.sigmoid(z),  # non-sparse control: gate in (0.5, 1)
}
FORMS = ("multiplicative", "additive")


@dataclass
class GateOptions(VariantOptions):
    position: str = "sdpa"  # sdpa (G1) | value (G2) | key (G3) | query (G4) | dense (G5, after W_o)
    granularity: str = "elementwise"  # elementwise: W_g d -> heads*d_h; headwise: W_g d -> heads
    activation: str = "sigmoid"  # sigmoid | silu | ns_sigmoid (0.5 + 0.5 sigmoid)
    form: str = "multiplicative"  # multiplicative: y * g; additive: y + g
    share_across_heads: bool = False  # one W_g block reused by every head (the seed: loses the benefit)
    init_std: float = 0.02  # W_g ~ N(0, init_std), b_g = 0
    finetune_weight_std: float = 0.0  # W_g ~ N(0, this) at fine-tuning init; 0 makes the start exact
    gate_bias: bool = True  # b_g; false: none, as the reference on projections without bias (Qwen3)

    def __post_init__(self) -> None:
        require_choice(self.position, POSITIONS, "attention.position")
        require_choice(self.granularity, GRANULARITIES, "attention.granularity")
        require_choice(self.activation, tuple(ACTIVATIONS), "attention.activation")
        require_choice(self.form, FORMS, "attention.form")
        require(self.init_std >= 0, "attention.init_std", f"must be >= 0, got {self.init_std}")
        require(self.finetune_weight_std >= 0, "attention.finetune_weight_std", "must be >= 0")


@register("gated_sdpa")
class Gate(AttentionVariant):
    """y <- y * g / neutral (multiplicative) or y + g - neutral (additive), g = act(x W_g + b_g).

    ``neutral`` is a buffer: 1 (multiplicative) / 0 (additive) when pretraining. Fine-tuning init sets
    W_g ~ N(0, finetune_weight_std), b_g = b0 and neutral = act(b0) (b0 = 0, or 1 for a multiplicative SiLU
    since silu(0) = 0), so with the default std 0 the gate is exactly neutral: the layer is the pretrained one
    (the paper's "output scaled by 1 / 0.5" for a sigmoid).
    """

    Options = GateOptions

    def __init__(self, shape: AttentionShape, options: GateOptions) -> None:
        super().__init__(shape, options)
        heads = shape.n_kv_head if options.position in ("key", "value") else shape.n_head
        self.gates = 1 if options.share_across_heads else heads  # broadcast over heads when shared
        self.width = shape.head_dim if options.granularity == "elementwise" else 1
        self.multiplicative = options.form == "multiplicative"
        self.activation = ACTIVATIONS[options.activation]
        self.proj = nn.Linear(shape.n_embd, self.gates * self.width, bias=options.gate_bias)
        self.register_buffer("neutral", torch.tensor(1.0 if self.multiplicative else 0.0))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        nn.init.normal_(self.proj.weight, 0.0, self.options.init_std)
        if self.proj.bias is not None:
            nn.init.zeros_(self.proj.bias)
        self.neutral.fill_(1.0 if self.multiplicative else 0.0)

    def init_for_finetuning(self) -> None:
        b0 = 1.0 if self.multiplicative and self.options.activation == "silu" else 0.0
        require(
            self.proj.bias is not None or b0 == 0.0,
            "attention.gate_bias",
            "a multiplicative silu gate starts neutral only through its bias (silu(0) = 0); set true to fine-tune it",
        )
        nn.init.normal_(self.proj.weight, 0.0, self.options.finetune_weight_std)
        if self.proj.bias is not None:
            nn.init.constant_(self.proj.bias, b0)
        self.neutral.copy_(self.activation(torch.full_like(self.neutral, b0)))

    def modulate(self, x: Tensor, y: Tensor) -> Tensor:
        """Gate y (B, heads, T, d_h) with the gate computed from x (B, T, d)."""
        g = self.activation(self.proj(x))
        self.record("gate", g)
        g = g.unflatten(-1, (self.gates, self.width)).transpose(1, 2).to(y.dtype)
        return y * (g / self.neutral) if self.multiplicative else y + (g - self.neutral)

    def probes(self) -> list[str]:
        return ["gate"]

    def transform_qkv(self, x: Tensor, q: Tensor, k: Tensor, v: Tensor, ctx: AttentionContext):
        position = self.options.position
        if position == "query":
            q = self.modulate(x, q)
        elif position == "key":
            k = self.modulate(x, k)
        elif position == "value":
            v = self.modulate(x, v)
        return q, k, v

    def transform_heads(self, x: Tensor, o: Tensor, ctx: AttentionContext) -> Tensor:
        return self.modulate(x, o) if self.options.position == "sdpa" else o

    def transform_output(self, x: Tensor, y: Tensor, ctx: AttentionContext) -> Tensor:
        if self.options.position != "dense":
            return y
        heads = y.unflatten(-1, (self.shape.n_head, self.shape.head_dim)).transpose(1, 2)
        return self.modulate(x, heads).transpose(1, 2).flatten(-2)


register_preset("gated_sdpa_headwise", Gate, granularity="headwise")
register_preset("gated_value", Gate, position="value")  # the gating table's G2; G3-G5 and G1's ablations:
register_preset("gated_key", Gate, position="key")
register_preset("gated_query", Gate, position="query")
register_preset("gated_dense", Gate, position="dense")
register_preset("gated_sdpa_silu", Gate, activation="silu")
register_preset("gated_sdpa_ns_sigmoid", Gate, activation="ns_sigmoid")
register_preset("gated_sdpa_additive", Gate, form="additive")
register_preset("gated_sdpa_shared", Gate, share_across_heads=True)
