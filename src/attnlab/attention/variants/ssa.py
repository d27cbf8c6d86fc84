"""Selective self-attention (Zhang et al. 2024) and the temperature baselines.

Each enabled component c in {q, k, v} is scaled per head and token by an inverse temperature before plain
SDPA, so the fused kernel stays. The scaling is applied to the raw projections, before RoPE: a scalar commutes
with the rotation, and the ``shared`` token function f(x) = w . GeLU(W_c x) must read W_c x itself (after RoPE
it would depend on the position on Pythia and Llama):

    c_h,t <- tau_c,h(x_t, n_t) * c_h,t,    tau = base + [tanh(f_c,h(x_t))] + [sigmoid(alpha_c,h) log n_t | 0.1 ln n_t]

``terms`` picks the pieces: ``token`` (tanh(f), f from ``parameterisation``), ``position`` (learned
sigmoid(alpha) log n), ``yarn`` (fixed 0.1 ln n: our reading of the paper's YaRN baseline, "0.1 ln s + 1"),
``constant`` (the base 1 becomes a learned per-head scalar, init 1); without ``constant`` the base is a fixed 1,
which for the token-only ablation is our choice (the paper is silent; it makes the layer start as vanilla).
``n_t`` = absolute position + 1, also for a window starting mid-sequence or a KV cache (the official code
indexes by query length and drops the term while decoding; we do not). With GQA, k/v temperatures are per KV head.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnlab.attention.base import (
    AttentionContext,
    AttentionShape,
    AttentionVariant,
    VariantOptions,
    compute_dtype,
    register,
    register_preset,
)
from attnlab.errors import require, require_choice

COMPONENTS = ("q", "k", "v")
TERMS = ("token", "position", "yarn", "constant")
PARAMETERISATIONS = ("base", "shared", "feature")
YARN_SLOPE = 0.1


@dataclass
class SelectiveTemperatureOptions(VariantOptions):
    components: list[str] = field(default_factory=lambda: ["q", "v"])  # which of q, k, v get a temperature
    terms: list[str] = field(default_factory=lambda: ["token", "position"])  # token, position, yarn, constant
    parameterisation: str = "base"  # token function f: base (MLP) | shared (reuse W_q/k/v) | feature (frequency)
    hidden_ratio: float = 0.4375  # base: d_hidden = hidden_ratio * d (q+v on GPT-2 124M: +5.1% parameters)
    share_across_heads: bool = False  # one token function f for every head of a component
    alpha_init: float = -4.47  # pretraining: sigmoid(alpha) = 0.0113 (official code)
    # fine-tuning: sigmoid(-7.4) = 6.11e-4. The official code's is exp(-exp(2)) = 6.18e-4 (1 + exp(-exp(beta)) log n at
    # beta = 2, umich-sota/selective_attention@4ea65202c4cc0d7e4d0f621d5f1722d3770cd275 lit_gpt/model_finetune_att.py),
    # alpha = -7.3884 here: 1.2% apart on a slope of 6e-4 (tau differs by < 1e-5 at n = 4096), so the default stays
    # the value every recorded fine-tuning cell ran with, and -7.3884 is the option for the official one
    alpha_init_finetune: float = -7.4

    def __post_init__(self) -> None:
        self.components, self.terms = list(self.components), list(self.terms)
        for key, values, allowed in (("components", self.components, COMPONENTS), ("terms", self.terms, TERMS)):
            require(
                len(values) > 0 and len(set(values)) == len(values),
                f"attention.{key}",
                f"must be a non-empty list without repeats, got {values}; allowed: {', '.join(allowed)}",
            )
            for value in values:
                require_choice(value, allowed, f"attention.{key}")
        require(
            not {"position", "yarn"} <= set(self.terms),
            "attention.terms",
            "position and yarn are two position rules: pick one",
        )
        require_choice(self.parameterisation, PARAMETERISATIONS, "attention.parameterisation")
        require(self.hidden_ratio > 0, "attention.hidden_ratio", f"must be positive, got {self.hidden_ratio}")


class Temperature(nn.Module):
    """tau_c,h(x_t, n_t) of one component c with ``heads`` heads, shape (B, heads, T, 1) (or broadcastable)."""

    def __init__(self, shape: AttentionShape, options: SelectiveTemperatureOptions, heads: int) -> None:
        super().__init__()
        self.options = options
        outputs = 1 if options.share_across_heads else heads
        if "token" in options.terms and options.parameterisation == "base":  # f = W GeLU(W' x)
            hidden = max(1, round(options.hidden_ratio * shape.n_embd))
            self.hidden = nn.Linear(shape.n_embd, hidden)
            self.out = nn.Linear(hidden, outputs)
        elif "token" in options.terms and options.parameterisation == "shared":  # f = w . GeLU(c_h) + b
            self.weight = nn.Parameter(torch.zeros(outputs, shape.head_dim))
            self.bias = nn.Parameter(torch.zeros(outputs))
        elif "token" in options.terms:  # feature: f = beta * phi(token)
            self.beta = nn.Parameter(torch.zeros(outputs))
        if "position" in options.terms:
            self.alpha = nn.Parameter(torch.zeros(heads))
        if "constant" in options.terms:
            self.constant = nn.Parameter(torch.ones(heads))

    def reset_parameters(self, alpha: float) -> None:
        """The token function's last layer at zero (tau_tok = 0), alpha as given, constant 1."""
        for name, p in self.named_parameters():
            if name == "hidden.weight":
                nn.init.normal_(p, 0.0, 0.02)
            else:
                nn.init.constant_(p, {"alpha": alpha, "constant": 1.0}.get(name, 0.0))

    def forward(self, x: Tensor, c: Tensor, log_n: Tensor, phi: Tensor | None) -> Tensor:
        terms = self.options.terms
        tau = self.constant.view(-1, 1, 1) if "constant" in terms else 1.0
        if "token" in terms:
            tau = tau + torch.tanh(self.token_function(x, c, phi))
        if "position" in terms:
            tau = tau + torch.sigmoid(self.alpha).view(-1, 1, 1) * log_n
        if "yarn" in terms:
            tau = tau + YARN_SLOPE * log_n
        return tau

    def token_function(self, x: Tensor, c: Tensor, phi: Tensor | None) -> Tensor:
        """f_c,h(x_t): (B, heads or 1, T, 1)."""
        if self.options.parameterisation == "base":
            return self.out(F.gelu(self.hidden(x))).transpose(1, 2).unsqueeze(-1)
        if self.options.parameterisation == "shared":
            return F.gelu(c) @ self.weight.unsqueeze(-1) + self.bias.view(-1, 1, 1)
        return phi[:, None, :, None] * self.beta.view(-1, 1, 1)


@register("ssa")
class SelectiveTemperature(AttentionVariant):
    """c <- tau_c(x, n) * c for c in components; SDPA (with its 1/sqrt(d_h)) unchanged."""

    Options = SelectiveTemperatureOptions
    transforms_before_rope = True

    def __init__(self, shape: AttentionShape, options: SelectiveTemperatureOptions) -> None:
        super().__init__(shape, options)
        heads = {"q": shape.n_head, "k": shape.n_kv_head, "v": shape.n_kv_head}
        self.temperatures = nn.ModuleDict({c: Temperature(shape, options, heads[c]) for c in options.components})
        self.reset_parameters()

    @property
    def needs_token_features(self) -> bool:
        return "token" in self.options.terms and self.options.parameterisation == "feature"

    def reset_parameters(self) -> None:
        for temperature in self.temperatures.values():
            temperature.reset_parameters(self.options.alpha_init)

    def init_for_finetuning(self) -> None:
        """Token term zero, alpha at alpha_init_finetune: tau = 1 + 6.11e-4 log n, close to (not) vanilla."""
        for temperature in self.temperatures.values():
            temperature.reset_parameters(self.options.alpha_init_finetune)

    def probes(self) -> list[str]:
        return [f"temperature_{c}" for c in self.temperatures]

    def transform_qkv(self, x: Tensor, q: Tensor, k: Tensor, v: Tensor, ctx: AttentionContext):
        log_n = torch.log(ctx.positions.to(compute_dtype(q)) + 1).unsqueeze(-1)  # (T, 1), absolute positions
        qkv = {"q": q, "k": k, "v": v}
        for c, temperature in self.temperatures.items():
            tau = temperature(x, qkv[c], log_n, ctx.token_features)
            self.record(f"temperature_{c}", tau.expand(*qkv[c].shape[:-1], 1))
            qkv[c] = qkv[c] * tau.to(qkv[c].dtype)
        return qkv["q"], qkv["k"], qkv["v"]


register_preset("ssa_shared", SelectiveTemperature, parameterisation="shared")
register_preset("ssa_feature", SelectiveTemperature, parameterisation="feature")
register_preset("temp_q", SelectiveTemperature, components=["q"])  # Table 5: token + position on these
register_preset("temp_k", SelectiveTemperature, components=["k"])
register_preset("temp_v", SelectiveTemperature, components=["v"])
register_preset("temp_qv", SelectiveTemperature, components=["q", "v"])
register_preset("temp_kqv", SelectiveTemperature, components=["q", "k", "v"])
register_preset("ssa_tok_only", SelectiveTemperature, terms=["token"])  # Table 6, per component by override
register_preset("ssa_pos_only", SelectiveTemperature, terms=["position"])
register_preset("temp_q_tok", SelectiveTemperature, components=["q"], terms=["token"])  # Table 6's rows
register_preset("temp_q_pos", SelectiveTemperature, components=["q"], terms=["position"])
register_preset("temp_v_tok", SelectiveTemperature, components=["v"], terms=["token"])
register_preset("temp_v_pos", SelectiveTemperature, components=["v"], terms=["position"])
# Table 8's rows, as the paper's text around it describes them (appendix B.3): SSA on q and v with one of its two
# terms replaced. "Instead of employing our Position-aware Temperature Scaling function, we use a constant
# parameter" and "the temperature scaling method proposed by [YaRN]" keep the token term (rows "Token Yarn",
# "Constant"); "in place of our Token-aware Temperature Scaling, we adopt [...] token frequency and training only a
# scale parameter" keeps the position term (row "Position Frequency").
register_preset("temp_tok_yarn", SelectiveTemperature, terms=["token", "yarn"])
register_preset("temp_tok_constant", SelectiveTemperature, terms=["token", "constant"])
register_preset("temp_pos_frequency", SelectiveTemperature, terms=["token", "position"], parameterisation="feature")
# the same baselines alone on q, with no SSA term beside them: our first reading of Table 8 (table8_single_term)
register_preset("temp_constant", SelectiveTemperature, components=["q"], terms=["constant"])
register_preset("temp_yarn", SelectiveTemperature, components=["q"], terms=["yarn"])
register_preset("temp_frequency", SelectiveTemperature, components=["q"], terms=["token"], parameterisation="feature")
