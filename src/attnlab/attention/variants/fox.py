"""Forgetting attention (FoX, Lin et al. 2025): a learned per-head forget gate decays old keys.

``f_t = sigmoid(x_t w_h + b_h)`` per query head, ``c_t = sum_{u <= t} log f_u``, logits ``s_ij + c_i - c_j``
(zhixuan-lin/forgetting-transformer ``ops/forgetting_attention.py``: ``log_lambda = cumsum(log_fgate)``,
``decay_bias = log_lambda[..., -M:, None] - log_lambda[..., None, :]``, log f in fp32). The gate is the reference's
``fgate_type="full"``: one ``Linear(d, H)`` with bias; init N(0, 0.02) weights, zero bias (the model's init).
The decay replaces position encoding: rotary is refused, learned / sinusoidal / ALiBi / none are allowed.

The "Pro" block (``attention=fox_pro``; the paper's best configuration, the repository's
``configs/experiment/longcrawl64/forgetting_transformer/pro_*.yaml`` at 883f260c636e87971339749b0d8310004794a5cc,
2026-02-25: ``use_k_shift``, ``use_v_shift``, ``qk_norm``, ``use_output_gate``, ``use_output_norm``), each piece
an option as ``ForgettingAttentionLayer`` (``model/forgetting_transformer/modeling_forgetting_transformer.py``)
computes it:

- ``key_shift`` / ``value_shift`` (``ShiftLinear``): ``k_t <- a_t k_{t-1} + (1 - a_t) k_t`` with
  ``a_t = sigmoid(x_t w_h)`` per KV head (``Linear(d, heads)`` without bias, N(0, 0.02)), ``k_{-1} = 0``, in fp32;
- ``qk_norm`` (``GroupNorm(num_groups=H, is_rms_norm=True)``): RMSNorm of each head of q and of the shifted k, a
  weight per head and feature (init 1), eps 1e-5 (the reference constructs these norms without ``norm_eps``);
- ``output_norm`` and ``output_gate`` (``FusedGroupNormGated``, ``group_norm_gated_ref``): the attention output's
  per-head RMSNorm (weight per head and feature, eps ``norm_eps`` = 1e-6), times ``sigmoid(x W_g)``
  (``Linear(d, H d_h)`` without bias, N(0, 0.02)); either alone as the reference computes it alone.

The reference has no GQA ("GQA has not been tested"); here the shift gates and k's norm are per KV head.

Runs on ``F.scaled_dot_product_attention`` with the decay as an additive float mask (the memory-efficient kernel
takes it; flash does not): the mask costs O(T^2) memory per head. ``attention.backend=flex`` adds c_i - c_j in a
score_mod instead (c captured, O(T) memory, the gate's gradient through it).
KV cache: the reference's own cache keeps log f per key (``FgateDynamicCache``); here ``transform_qkv`` appends each
token's log f (fp32, one channel per query head of the group) to its key, so the cache keeps it, and ``attend``
recomputes c over every cached position. c_i - c_j does not depend on where the cumulative sum starts. With a shift,
the cache keeps the unshifted k (v) and the two shift weights as two more channels, and the attention shifts (and
normalises k) over every cached position: the reference keeps the last unshifted projection instead
(``key_shift_cache``). Under document masking a document's first token shifts in nothing from the one before.
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
    IntermediateHook,
    VariantOptions,
    causal_bias,
    compute_dtype,
    register,
    register_preset,
    unchanged,
)
from attnlab.attention.flex import FlexMask
from attnlab.errors import require

QK_NORM_EPS = 1e-5  # GroupNorm's default: the reference builds q_norm and k_norm without norm_eps


@dataclass
class ForgettingOptions(VariantOptions):
    """The Pro block's pieces (all false: the plain FoX layer; ``fox_pro``: all true, the reference's pro config)."""

    key_shift: bool = False  # k_t <- a_t k_{t-1} + (1 - a_t) k_t, a_t = sigmoid(x_t w) per KV head (use_k_shift)
    value_shift: bool = False  # the same on v (use_v_shift)
    qk_norm: bool = False  # per-head RMSNorm of q and (shifted) k, weight per head and feature, eps 1e-5
    output_norm: bool = False  # per-head RMSNorm of the attention output, weight per head and feature
    output_gate: bool = False  # output times sigmoid(x W_g), W_g (d, H d_h) without bias (ogate_act=sigmoid)
    norm_eps: float = 1e-6  # the output norm's eps (the reference's norm_eps)

    def __post_init__(self) -> None:
        require(self.norm_eps > 0, "attention.norm_eps", f"must be positive, got {self.norm_eps}")


def head_rms_norm(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    """x (B, heads, T, d_h) / rms over d_h times weight (heads, d_h), in fp32 (or wider) and cast back, as the
    reference's ``group_norm_ref`` with ``is_rms_norm=True``."""
    wide = x.to(compute_dtype(x))
    normed = wide * torch.rsqrt(wide.pow(2).mean(-1, keepdim=True) + eps)
    return (normed * weight.to(wide.dtype)[:, None, :]).to(x.dtype)


def shift_weights(x: Tensor, projection: nn.Linear, ctx: AttentionContext, dtype: torch.dtype) -> Tensor:
    """(B, KV, T, 2): the weights of x_{t-1} and of x_t, ``a_t`` and ``1 - a_t`` with ``a_t = sigmoid(x_t w)``, the
    first zero where t starts a document of a packed block (it has no previous token, as the reference's padding)."""
    shift = torch.sigmoid(projection(x).to(dtype)).transpose(1, 2).unsqueeze(-1)
    previous = shift
    if ctx.documents is not None:
        same = F.pad(ctx.documents[:, 1:] == ctx.documents[:, :-1], (1, 0), value=False)  # (B, T)
        previous = shift * same[:, None, :, None].to(dtype)
    return torch.cat([previous, 1 - shift], dim=-1)


def token_shift(x: Tensor, weights: Tensor) -> Tensor:
    """prev_t x_{t-1} + curr_t x_t over the T axis of x (B, heads, T, d_h), weights (B, heads, T, 2) from
    ``shift_weights``, x_{-1} = 0, in the weights' dtype (fp32 or wider) and cast back: the reference's
    ``token_shift(x, prev_weight, curr_weight)`` (its ``test_op`` reference)."""
    previous = F.pad(x[..., :-1, :], (0, 0, 1, 0)).to(weights.dtype)
    return (weights[..., :1] * previous + weights[..., 1:] * x.to(weights.dtype)).to(x.dtype)


@register("fox")
class ForgettingAttention(AttentionVariant):
    """softmax(q k^T / sqrt(d_h) + c_i - c_j) v with c the cumulative log forget gate of each head."""

    Options = ForgettingOptions

    def __init__(self, shape: AttentionShape, options: ForgettingOptions) -> None:
        super().__init__(shape, options)
        require(
            shape.pos_encoding != "rotary",
            "model.pos_encoding",
            "attention=fox replaces rotary positions with its forget gate (Lin et al.); "
            "use learned, sinusoidal, alibi or none",
        )
        h, kv, dh = shape.n_head, shape.n_kv_head, shape.head_dim
        self.gate = nn.Linear(shape.n_embd, h)
        self.key_shift = nn.Linear(shape.n_embd, kv, bias=False) if options.key_shift else None
        self.value_shift = nn.Linear(shape.n_embd, kv, bias=False) if options.value_shift else None
        self.q_norm = nn.Parameter(torch.empty(h, dh)) if options.qk_norm else None
        self.k_norm = nn.Parameter(torch.empty(kv, dh)) if options.qk_norm else None
        self.output_norm = nn.Parameter(torch.empty(h, dh)) if options.output_norm else None
        self.output_gate = nn.Linear(shape.n_embd, h * dh, bias=False) if options.output_gate else None
        self.reset_parameters()

    def probes(self) -> list[str]:
        return ["forget_gate"]

    def reset_parameters(self) -> None:
        """Linear weights N(0, 0.02) and biases 0 (the reference's ``_initialize_weights``), norm weights 1."""
        for linear in (self.gate, self.key_shift, self.value_shift, self.output_gate):
            if linear is not None:
                nn.init.normal_(linear.weight, 0.0, 0.02)
        nn.init.zeros_(self.gate.bias)
        for weight in (self.q_norm, self.k_norm, self.output_norm):
            if weight is not None:
                nn.init.ones_(weight)

    @property
    def groups(self) -> int:
        return self.shape.n_head // self.shape.n_kv_head

    def transform_qkv(self, x: Tensor, q: Tensor, k: Tensor, v: Tensor, ctx: AttentionContext):
        log_f = F.logsigmoid(self.gate(x).to(compute_dtype(k)))  # (B, T, H), fp32 (or wider) as the reference requires
        self.record("forget_gate", log_f.exp())
        batch, t, _ = log_f.shape
        per_kv_head = log_f.view(batch, t, k.shape[1], -1).transpose(1, 2)  # (B, KV, T, H / KV)
        keys = [k.to(log_f.dtype)]
        if self.key_shift is not None:  # the weights, kept with the unshifted key: the cache then shifts across calls
            keys.append(shift_weights(x, self.key_shift, ctx, log_f.dtype))
        if self.value_shift is not None:
            v = torch.cat([v.to(log_f.dtype), shift_weights(x, self.value_shift, ctx, log_f.dtype)], dim=-1)
        if self.q_norm is not None:
            q = head_rms_norm(q, self.q_norm, QK_NORM_EPS)
        return q, torch.cat([*keys, per_kv_head], dim=-1), v

    def keys_values(self, k: Tensor, v: Tensor, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
        """The attention's keys and values (B, KV, t_k, d_h) in ``dtype`` from what the cache holds: shifted over
        every cached position and k normalised where the options say so."""
        dh = self.shape.head_dim
        keys, values = k[..., :dh], v[..., :dh]
        if self.key_shift is not None:
            keys = token_shift(keys, k[..., dh : dh + 2])
        if self.k_norm is not None:
            keys = head_rms_norm(keys, self.k_norm, QK_NORM_EPS)
        if self.value_shift is not None:
            values = token_shift(values, v[..., dh:])
        return keys.to(dtype), values.to(dtype)

    def cumulative_gate(self, k: Tensor) -> Tensor:
        """c (B, H, t_k), the cumulative log forget gate over the keys, from the log f stored with them."""
        return torch.cumsum(k[..., -self.groups :].transpose(-2, -1).flatten(1, 2), dim=-1)

    def decay(self, k: Tensor, t_q: int) -> Tensor:
        """c_i - c_j (B, H, t_q, t_k) for the last t_q of the t_k keys."""
        c = self.cumulative_gate(k)
        return c[..., -t_q:, None] - c[..., None, :]

    def bias(self, q: Tensor, k: Tensor, mask: Tensor | None, is_causal: bool) -> Tensor:
        """The additive bias in k's dtype (fp32 or wider): decay plus the causal (or ALiBi) mask."""
        t_q, t_k = q.shape[2], k.shape[2]
        bias = self.decay(k, t_q)
        if mask is not None:
            return bias + mask.to(bias.dtype)
        return bias + causal_bias(t_q, t_k, q.device, bias.dtype) if is_causal else bias

    def attend(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, is_causal: bool, dropout: float) -> Tensor:
        keys, values = self.keys_values(k, v, q.dtype)
        return F.scaled_dot_product_attention(
            q,
            keys,
            values,
            attn_mask=self.bias(q, k, mask, is_causal).to(q.dtype),
            dropout_p=dropout,
            enable_gqa=q.shape[1] != k.shape[1],
        )

    def flex_attend(self, q: Tensor, k: Tensor, v: Tensor, flex: FlexMask) -> Tensor:
        c = self.cumulative_gate(k)

        def decayed(score: Tensor, batch: Tensor, head: Tensor, query: Tensor, key: Tensor) -> Tensor:
            return score + (c[batch, head, query] - c[batch, head, key]).to(score.dtype)

        return flex.attend(q, *self.keys_values(k, v, q.dtype), self.scale, decayed)

    def reference_attention(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        mask: Tensor | None,
        is_causal: bool,
        hook: IntermediateHook | None = None,
    ) -> tuple[Tensor, Tensor]:
        hook = hook or unchanged
        keys, values = self.keys_values(k, v, q.dtype)
        scores = self.scaled_scores(q, keys, hook)
        probs = hook("probabilities", torch.softmax(scores + self.bias(q, k, mask, is_causal), dim=-1))
        values = values.repeat_interleave(q.shape[1] // v.shape[1], dim=1).to(probs.dtype)
        return hook("context", probs @ values).to(q.dtype), probs

    def transform_heads(self, x: Tensor, o: Tensor, ctx: AttentionContext) -> Tensor:
        if self.output_norm is not None:
            o = head_rms_norm(o, self.output_norm, self.options.norm_eps)
        if self.output_gate is not None:
            gate = torch.sigmoid(self.output_gate(x)).unflatten(-1, (self.shape.n_head, -1)).transpose(1, 2)
            o = o * gate.to(o.dtype)
        return o


register_preset(
    "fox_pro", ForgettingAttention, key_shift=True, value_shift=True, qk_norm=True, output_norm=True, output_gate=True
)
