"""Conditional head gate (Bondarenko et al. 2023, eq. 5-7): a head can switch itself off.

``o_h <- pi_h,t * o_h`` before ``W_o``, with ``pi_h,t = sigmoid(G_h(x_t,h-slice))`` computed from the h-th block
of d_h features of the layer input x (not of q/k/v). ``G_h`` is shared across positions, not across heads.

Init, ``gate_init``: ``every_gate`` (default, our rule) gives every gate type's last layer the bias logit(pi_init)
and, at fine-tuning, N(0, ``finetune_weight_std``) weights (std 0: the start is exactly the pretrained layer).
``reference`` is Qualcomm-AI-research/outlier-free-transformers@1e59744972da808a90d9996027bfc274689594b8
(``transformers_language/models/opt_attention.py``): only the per-head linear gate gets bias logit(pi_init), and
N(0, 1e-3) weights at fine-tuning; the mlp and all-features gates keep ``nn.Linear``'s default init (bias too).
Both scale the gate by 1 / pi_init when fine-tuning (the reference's ``gate_scaling_factor``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnlab.attention.base import AttentionContext, AttentionShape, AttentionVariant, VariantOptions, register
from attnlab.errors import require, require_choice

GATE_TYPES = ("linear", "mlp", "all_features")
GATE_INITS = ("every_gate", "reference")
REFERENCE_FINETUNE_STD = 1e-3  # the reference's fine-tuning std of the linear gate's weights (its OPT code)


@dataclass
class HeadGateOptions(VariantOptions):
    gate_type: str = "linear"  # linear: Linear(d_h, 1); mlp: Linear(d_h, d_h//4)-ReLU-Linear(., 1); all_features
    pi_init: float = 0.25  # gate value at init: bias = logit(pi_init) (their OPT runs; 0.5 gives bias 0)
    finetune_weight_std: float = 0.0  # std of the last layer's weights at fine-tuning init (every_gate's rule)
    gate_init: str = "every_gate"  # every_gate: bias logit(pi_init) for every gate type | reference: as Qualcomm's

    def __post_init__(self) -> None:
        require_choice(self.gate_type, GATE_TYPES, "attention.gate_type")
        require_choice(self.gate_init, GATE_INITS, "attention.gate_init")
        require(0 < self.pi_init < 1, "attention.pi_init", f"must be in (0, 1), got {self.pi_init}")
        require(self.finetune_weight_std >= 0, "attention.finetune_weight_std", "must be >= 0")


@register("gated")
class HeadGate(AttentionVariant):
    """o_h <- output_scale * sigmoid(G_h(x_h)) * o_h; output_scale is 1 when pretraining, 1 / pi_init when fine-tuning.

    Fine-tuning init: last-layer weights ~ N(0, finetune_weight_std), bias logit(pi_init), output_scale 1 / pi_init.
    With the default std 0 the gate is exactly ``sigmoid(logit(pi_init)) / pi_init`` (= 1 in fp32 for 0.25 and
    0.5), so the layer is the pretrained one; the zero weights still get gradient x * dL/dlogit.
    """

    Options = HeadGateOptions

    def __init__(self, shape: AttentionShape, options: HeadGateOptions) -> None:
        super().__init__(shape, options)
        h, dh = shape.n_head, shape.head_dim
        fan_in = {"linear": dh, "mlp": dh // 4, "all_features": shape.n_embd}[options.gate_type]
        if options.gate_type == "mlp":
            require(dh >= 4, "attention.gate_type", f"mlp needs head_dim >= 4, got {dh}; allowed: {GATE_TYPES}")
            self.hidden_weight = nn.Parameter(torch.empty(h, dh, dh // 4))
            self.hidden_bias = nn.Parameter(torch.empty(h, dh // 4))
        self.weight = nn.Parameter(torch.empty(h, fan_in))  # last layer of each G_h
        self.bias = nn.Parameter(torch.empty(h))
        self.register_buffer("output_scale", torch.ones(()))
        self.reset_parameters()

    @property
    def biased_to_pi_init(self) -> bool:
        """Whether the last layer's bias starts at logit(pi_init): every gate, or the linear one only (reference)."""
        return self.options.gate_init == "every_gate" or self.options.gate_type == "linear"

    def reset_parameters(self) -> None:
        """nn.Linear's default weights U(+-1/sqrt(fan_in)), bias = logit(pi_init) (else nn.Linear's), output_scale 1."""
        if self.options.gate_type == "mlp":
            bound = 1 / math.sqrt(self.shape.head_dim)
            nn.init.uniform_(self.hidden_weight, -bound, bound)
            nn.init.uniform_(self.hidden_bias, -bound, bound)
        bound = 1 / math.sqrt(self.weight.shape[1])
        nn.init.uniform_(self.weight, -bound, bound)
        if self.biased_to_pi_init:
            nn.init.constant_(self.bias, math.log(self.options.pi_init / (1 - self.options.pi_init)))
        else:
            nn.init.uniform_(self.bias, -bound, bound)
        self.output_scale.fill_(1.0)

    def init_for_finetuning(self) -> None:
        self.reset_parameters()
        if self.options.gate_init == "every_gate":
            nn.init.normal_(self.weight, 0.0, self.options.finetune_weight_std)
        elif self.options.gate_type == "linear":
            nn.init.normal_(self.weight, 0.0, REFERENCE_FINETUNE_STD)
        self.output_scale.fill_(1 / self.options.pi_init)

    def gate_logits(self, x: Tensor) -> Tensor:
        """G_h(x) for every head: (B, T, H)."""
        if self.options.gate_type == "all_features":
            return x @ self.weight.t() + self.bias
        xh = x.unflatten(-1, (self.shape.n_head, self.shape.head_dim))  # (B, T, H, d_h): head h's slice of x
        if self.options.gate_type == "mlp":
            xh = F.relu(torch.einsum("bthd,hdr->bthr", xh, self.hidden_weight) + self.hidden_bias)
        return torch.einsum("bthd,hd->bth", xh, self.weight) + self.bias

    def probes(self) -> list[str]:
        return ["gate"]

    def transform_heads(self, x: Tensor, o: Tensor, ctx: AttentionContext) -> Tensor:
        gate = torch.sigmoid(self.gate_logits(x))
        self.record("gate", gate)
        pi = gate * self.output_scale
        return o * pi.transpose(1, 2).unsqueeze(-1).to(o.dtype)
