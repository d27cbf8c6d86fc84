"""One causal self-attention layer for every model family; a variant changes it through a few hooks.

The layer projects q/k/v, applies rotary positions, then calls the variant's hooks in order:
``transform_qkv`` (temperatures, gates on q/k/v; before the rotary embedding where the variant asks) ->
``attend`` (SDPA by default) -> ``transform_heads`` (gates on the per-head output) -> head mask -> output
projection -> ``transform_output`` (gate after W_o).
A variant overrides only the hooks its math needs, so its equations fit on one screen.
Analysis can run a layer through the variant's plain-math ``reference_attention`` instead of ``attend``
(``record_probabilities`` keeps the map; ``intermediate_hook`` sees or replaces QK^T, the probabilities and P@V).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnlab.attention.flex import FlexMask, causal_block_mask, document_block_mask
from attnlab.errors import ConfigError, require, require_choice

# sdpa: the variant's own path (the fused SDPA kernel, or its exact chunked math where SDPA cannot run it);
# flex: FlexAttention (compiled on a GPU), for variants whose change is a score modification or mask;
# reference: the plain-math (T x T) path analysis uses, for checks
BACKENDS = ("sdpa", "flex", "reference")


@dataclass(frozen=True)
class AttentionShape:
    """Sizes a variant is built for; ``block_size`` is the training context (clipped softmax's T_ctx)."""

    n_embd: int
    n_head: int
    n_kv_head: int
    head_dim: int
    block_size: int
    pos_encoding: str = "learned"  # model.pos_encoding: variants that need a particular one refuse the others
    layer: int = 0  # 0-based index of the block (diff's lambda_init depends on it)

    @property
    def qkv_sizes(self) -> list[int]:
        """Widths of q, k and v in the fused qkv projection's output (its weight's rows), in that order."""
        return [self.n_head * self.head_dim] + [self.n_kv_head * self.head_dim] * 2


@dataclass
class AttentionContext:
    """Per-forward inputs shared by all layers: absolute positions, position biases, token ids, document ids."""

    positions: Tensor  # (T,) absolute 0-based positions of the queries; n_t = positions + 1
    rope: tuple[Tensor, Tensor] | None = None  # cos, sin for the query positions, (T, rotary_dim)
    alibi_slopes: Tensor | None = None  # (H,) ALiBi slopes; adds -slope * distance to the scores
    token_features: Tensor | None = None  # (B, T) per-token features (standardised log frequency)
    token_ids: Tensor | None = None  # (B, T) token ids, for variants keyed by token (temp_lookup)
    # (B, T) the document each token belongs to in a packed block (document masking): a query attends only to the
    # keys of its own document; None: to the whole block
    documents: Tensor | None = None
    flex_masks: dict[int, FlexMask] = field(default_factory=dict)  # built once per forward, shared by the layers
    # SDPA's masks, built once per forward too: every layer then holds the same tensor for its backward
    sdpa_masks: dict[tuple[int, int, torch.dtype], tuple[Tensor | None, bool]] = field(default_factory=dict)

    def flex_mask(self, length: int) -> FlexMask:
        """The causal (or document-causal) block mask and position bias of ``attention.backend=flex``."""
        if length not in self.flex_masks:
            if self.documents is None:
                block_mask = causal_block_mask(length, self.positions.device)
            else:
                block_mask = document_block_mask(self.documents)
            self.flex_masks[length] = FlexMask(block_mask, self.alibi_slopes)
        return self.flex_masks[length]

    def mask(self, t_q: int, t_k: int, dtype: torch.dtype) -> tuple[Tensor | None, bool]:
        """SDPA's ``(attn_mask, is_causal)``: the fused causal flag where it is exact, else an explicit additive mask,
        (t_q, t_k), (H, t_q, t_k) with ALiBi, and with a leading batch dimension under document masking."""
        if (t_q, t_k, dtype) not in self.sdpa_masks:
            self.sdpa_masks[t_q, t_k, dtype] = self._build_mask(t_q, t_k, dtype)
        return self.sdpa_masks[t_q, t_k, dtype]

    def _build_mask(self, t_q: int, t_k: int, dtype: torch.dtype) -> tuple[Tensor | None, bool]:
        if self.documents is None and self.alibi_slopes is None and (t_q == t_k or t_q == 1):
            return None, t_q == t_k  # the fused causal flag, or one query that sees every key
        device = self.positions.device
        mask = causal_bias(t_q, t_k, device, dtype)
        if self.alibi_slopes is not None:
            query = torch.arange(t_q, device=device)[:, None] + (t_k - t_q)
            distance = (query - torch.arange(t_k, device=device)[None, :]).clamp(min=0).to(dtype)
            mask = mask - self.alibi_slopes.to(dtype)[:, None, None] * distance
        if self.documents is not None:  # full sequences only (GPT.features refuses a KV cache with documents)
            other = self.documents[:, :, None] != self.documents[:, None, :]  # (B, T, T)
            mask = torch.where(other[:, None], float("-inf"), mask if mask.ndim == 3 else mask[None])
        return mask, False


def causal_bias(t_q: int, t_k: int, device: torch.device, dtype: torch.dtype = torch.float32) -> Tensor:
    """(t_q, t_k) additive mask, -inf where a key comes after its query; the queries are the last t_q of the t_k
    positions (new tokens after a KV cache, or one chunk of queries over the keys up to its last one)."""
    future = torch.ones(t_q, t_k, dtype=torch.bool, device=device).triu(1 + t_k - t_q)
    return torch.zeros(t_q, t_k, device=device, dtype=dtype).masked_fill(future, float("-inf"))


def compute_dtype(x: Tensor) -> torch.dtype:
    """The dtype of an explicit path's math: fp32 for half inputs (and fp32), the input's own when it is wider
    (float64), so a float64 layer is not silently computed to fp32 precision."""
    return torch.promote_types(x.dtype, torch.float32)


IntermediateHook = Callable[[str, Tensor], Tensor]  # (name, tensor) -> the tensor to use instead


def unchanged(_name: str, x: Tensor) -> Tensor:
    """The identity ``IntermediateHook``: a reference path run without one."""
    return x


def masked(scores: Tensor, mask: Tensor | None, is_causal: bool) -> Tensor:
    """Scores plus the additive ``mask``, or the causal bias when there is none and the attention is causal."""
    if mask is not None:
        return scores + mask.to(scores.dtype)
    if is_causal:
        return scores + causal_bias(scores.shape[-2], scores.shape[-1], scores.device, scores.dtype)
    return scores


RENAMED_OPTIONS = {"temperature_lr": "variant_lr"}  # old name -> new name (it always set the gates' lr too)


@dataclass
class VariantOptions:
    """Options every variant has. Subclasses add theirs and validate in ``__post_init__``."""

    name: str = "vanilla"
    variant_lr: float | None = None  # lr of the variant's own parameters (temperatures, gates); None: the model's
    backend: str = "sdpa"  # sdpa | flex | reference: where the attention runs (see BACKENDS; flex trains on a GPU)

    # Options whose Hydra default is another config key (resolved when composing); Python callers get the field's.
    config_interpolations: ClassVar[dict[str, str]] = {}


class AttentionVariant(nn.Module):
    """Identity hooks = vanilla attention through ``F.scaled_dot_product_attention``."""

    Options: ClassVar[type[VariantOptions]] = VariantOptions
    needs_token_features: ClassVar[bool] = False
    # Whether ``transform_qkv`` sees q/k before the rotary embedding (the raw projections) instead of after it.
    transforms_before_rope: ClassVar[bool] = False

    def __init__(self, shape: AttentionShape, options: VariantOptions) -> None:
        super().__init__()
        require_choice(options.backend, BACKENDS, "attention.backend")
        require(
            options.backend in self.backends(),
            "attention.backend",
            f"attention={options.name} has no {options.backend} path; allowed: {', '.join(self.backends())}",
        )
        self.shape = shape
        self.options = options
        self.scale = 1.0 / math.sqrt(shape.head_dim)
        self.recorded: dict[str, list[Tensor]] | None = None  # analysis sets {} to collect what ``record`` gets

    @classmethod
    def backends(cls) -> tuple[str, ...]:
        """The backends this variant runs on: flex where its ``attend`` is the base one (its change lives in the other
        hooks) or where it says how in ``flex_attend``."""
        flex = cls.attend is AttentionVariant.attend or cls.flex_attend is not AttentionVariant.flex_attend
        return BACKENDS if flex else tuple(b for b in BACKENDS if b != "flex")

    def probes(self) -> list[str]:
        """Names of the values this variant ``record``s for analysis ("gate", "temperature_q", ...)."""
        return []

    def record(self, name: str, value: Tensor) -> None:
        """Keep ``value`` (fp32, on the CPU) while analysis collects (``recorded`` is a dict); a no-op otherwise."""
        if self.recorded is not None:
            self.recorded.setdefault(name, []).append(value.detach().float().cpu())

    def reset_parameters(self) -> None:
        """Pretraining init of the variant's own parameters (called after the model's global init)."""

    def init_for_finetuning(self) -> None:
        """Re-initialise so that the layer computes exactly what the pretrained layer did."""
        self.reset_parameters()

    def transform_qkv(self, x: Tensor, q: Tensor, k: Tensor, v: Tensor, ctx: AttentionContext):
        """Rescale or gate q (B,H,T,dh), k and v (B,KV,T,dh) computed from the layer input x (B,T,d)."""
        return q, k, v

    def probabilities(self, scores: Tensor) -> Tensor:
        """Row-wise attention probabilities from masked scores in ``compute_dtype`` (reference path)."""
        return torch.softmax(scores, dim=-1)

    def attend(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, is_causal: bool, dropout: float) -> Tensor:
        """The attention itself; the default is the fused kernel."""
        return F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, is_causal=is_causal, dropout_p=dropout, enable_gqa=q.shape[1] != k.shape[1]
        )

    def flex_attend(self, q: Tensor, k: Tensor, v: Tensor, flex: FlexMask) -> Tensor:
        """The attention on FlexAttention (``attention.backend=flex``), causal over one full sequence."""
        return flex.attend(q, k, v, self.scale)

    def transform_heads(self, x: Tensor, o: Tensor, ctx: AttentionContext) -> Tensor:
        """Gate the per-head outputs o (B,H,T,dh) before the output projection."""
        return o

    def transform_output(self, x: Tensor, y: Tensor, ctx: AttentionContext) -> Tensor:
        """Gate the layer output y (B,T,d) after the output projection."""
        return y

    def reference_attention(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        mask: Tensor | None,
        is_causal: bool,
        hook: IntermediateHook | None = None,
    ) -> tuple[Tensor, Tensor]:
        """Plain-math attention returning (output, probabilities): the oracle for tests and analysis.

        ``hook(name, tensor)``, when given, replaces each intermediate as it is computed: ``"scores"`` (scaled QK^T,
        before the mask), ``"probabilities"`` (the variant's own, e.g. clipped) and ``"context"`` (P@V), all in
        ``compute_dtype`` (fp32, or float64 for a float64 layer).
        """
        hook = hook or unchanged
        scores = masked(self.scaled_scores(q, k, hook), mask, is_causal)
        probs = hook("probabilities", self.probabilities(scores))
        values = v.repeat_interleave(q.shape[1] // v.shape[1], dim=1).to(probs.dtype)
        return hook("context", probs @ values).to(q.dtype), probs

    def scaled_scores(self, q: Tensor, k: Tensor, hook: IntermediateHook) -> Tensor:
        """``q k^T / sqrt(d_h)`` (B, H, t_q, t_k) in ``compute_dtype``, each query head against its KV group's keys,
        through ``hook("scores")``: the first step of every plain-math reference path. (Under autocast the product
        itself runs in the autocast dtype; what follows it stays in ``compute_dtype``.)"""
        dtype = compute_dtype(q)
        keys = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)
        return hook("scores", (q.to(dtype) @ keys.to(dtype).transpose(-2, -1)).to(dtype) * self.scale)


@dataclass(frozen=True)
class _Preset:
    variant: type[AttentionVariant]
    defaults: dict[str, Any]


_PRESETS: dict[str, _Preset] = {}


def register(name: str, **defaults: Any):
    """Class decorator: make ``attention.name=<name>`` build this variant with these option defaults."""

    def decorate(cls: type[AttentionVariant]) -> type[AttentionVariant]:
        register_preset(name, cls, **defaults)
        return cls

    return decorate


def register_preset(name: str, variant: type[AttentionVariant], **defaults: Any) -> None:
    """Register a named configuration of an existing variant (e.g. ``temp_q`` = SSA on q only)."""
    if name in _PRESETS:
        raise ValueError(f"attention {name!r} registered twice")
    _PRESETS[name] = _Preset(variant, defaults)


def available_attention() -> list[str]:
    return sorted(_PRESETS)


def resolve_options(attention: dict[str, Any]) -> tuple[type[AttentionVariant], VariantOptions]:
    """Validate an ``attention`` config mapping into the variant class and its options."""
    values = dict(attention)
    for old, new in RENAMED_OPTIONS.items():  # checkpoints written before the rename
        if old in values:
            values.setdefault(new, values.pop(old))
    name = values.get("name", "vanilla")
    if name not in _PRESETS:
        raise ConfigError("attention.name", f"unknown attention {name!r}; allowed: {', '.join(available_attention())}")
    preset = _PRESETS[name]
    allowed = {f.name for f in fields(preset.variant.Options)}
    unknown = sorted(set(values) - allowed)
    if unknown:
        raise ConfigError(
            f"attention.{unknown[0]}", f"not an option of attention={name}; allowed: {', '.join(sorted(allowed))}"
        )
    return preset.variant, preset.variant.Options(**{**preset.defaults, **values, "name": name})


def store_presets() -> None:
    """Offer every registered preset as ``attention=<name>``: Hydra's node is the Options dataclass's defaults,
    so a default is written once (in the dataclass, or in ``register``/``register_preset`` where a preset differs)."""
    from hydra.core.config_store import ConfigStore

    for name in available_attention():
        _, options = resolve_options({"name": name})
        ConfigStore.instance().store(
            group="attention", name=name, node={**asdict(options), **type(options).config_interpolations}
        )


def build_variant(attention: dict[str, Any], shape: AttentionShape) -> AttentionVariant:
    variant_class, options = resolve_options(attention)
    return variant_class(shape, options)


class KVCache:
    """Keys and values of one layer seen so far, for incremental decoding."""

    def __init__(self) -> None:
        self.k: Tensor | None = None
        self.v: Tensor | None = None

    @property
    def length(self) -> int:
        return 0 if self.k is None else self.k.shape[2]

    def update(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        self.k = k if self.k is None else torch.cat([self.k, k], dim=2)
        self.v = v if self.v is None else torch.cat([self.v, v], dim=2)
        return self.k, self.v


class CausalSelfAttention(nn.Module):
    """Multi-head (or grouped-query) causal self-attention whose math comes from ``self.variant``."""

    def __init__(self, shape: AttentionShape, attention: dict[str, Any], bias: bool, dropout: float) -> None:
        super().__init__()
        self.shape = shape
        h, kv, dh = shape.n_head, shape.n_kv_head, shape.head_dim
        self.qkv = nn.Linear(shape.n_embd, (h + 2 * kv) * dh, bias=bias)
        self.proj = nn.Linear(h * dh, shape.n_embd, bias=bias)
        self.dropout = dropout
        self.variant = build_variant(attention, shape)
        backend = self.variant.options.backend
        require(
            backend == "sdpa" or dropout == 0,
            "attention.backend",
            f"{backend} has no attention dropout (model.dropout={dropout}); use sdpa, or model.dropout=0",
        )
        # Michel et al.: xi_h multiplies head h's output; all ones is the unmasked model.
        self.register_buffer("head_mask", torch.ones(h))
        self.masks_heads = False  # whether any xi differs from 1: an all-ones mask is not multiplied in
        self.register_load_state_dict_post_hook(_head_mask_loaded)  # a module-level function: models pickle
        self.record_probabilities = False  # analysis only: use the reference path and keep the map
        self.probabilities: Tensor | None = None
        # analysis only (W8A8): when set, use the reference path and pass its intermediates through this hook
        self.intermediate_hook: IntermediateHook | None = None

    def head_mask_changed(self) -> None:
        """Call after writing ``head_mask`` (a state dict load does): decides whether forward multiplies it in."""
        self.masks_heads = bool((self.head_mask != 1).any())

    def forward(self, x: Tensor, ctx: AttentionContext, cache: KVCache | None = None) -> Tensor:
        batch, t, _ = x.shape
        h, kv, dh = self.shape.n_head, self.shape.n_kv_head, self.shape.head_dim
        q, k, v = self.qkv(x).split(self.shape.qkv_sizes, dim=-1)
        q = q.view(batch, t, h, dh).transpose(1, 2)
        k = k.view(batch, t, kv, dh).transpose(1, 2)
        v = v.view(batch, t, kv, dh).transpose(1, 2)
        if self.variant.transforms_before_rope:
            q, k, v = self.variant.transform_qkv(x, q, k, v, ctx)
        if ctx.rope is not None:
            q, k = apply_rotary(q, *ctx.rope), apply_rotary(k, *ctx.rope)
        if not self.variant.transforms_before_rope:
            q, k, v = self.variant.transform_qkv(x, q, k, v, ctx)
        if cache is not None:
            k, v = cache.update(k, v)
        backend = self.variant.options.backend
        if backend == "flex" and k.shape[2] == t and not self.record_probabilities and self.intermediate_hook is None:
            o = self.variant.flex_attend(q, k, v, ctx.flex_mask(t))  # (a decoding step: the variant's own path)
        else:
            mask, is_causal = ctx.mask(t, k.shape[2], q.dtype)
            if self.record_probabilities or self.intermediate_hook is not None or backend == "reference":
                o, probabilities = self.variant.reference_attention(q, k, v, mask, is_causal, self.intermediate_hook)
                if self.record_probabilities:
                    self.probabilities = probabilities
            else:
                o = self.variant.attend(q, k, v, mask, is_causal, self.dropout if self.training else 0.0)
        o = self.variant.transform_heads(x, o, ctx)
        if self.masks_heads or self.head_mask.requires_grad:  # (differentiating against xi needs it in the graph)
            o = o * self.head_mask.view(1, h, 1, 1).to(o.dtype)
        y = self.proj(o.transpose(1, 2).reshape(batch, t, h * dh))
        return self.variant.transform_output(x, y, ctx)


def _head_mask_loaded(module: CausalSelfAttention, incompatible_keys: Any) -> None:
    module.head_mask_changed()


def apply_rotary(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """GPT-NeoX/Llama rotary on the first ``cos.shape[-1]`` dims of each head (rotate-half convention)."""
    rotary_dim = cos.shape[-1]
    rot, rest = x[..., :rotary_dim], x[..., rotary_dim:]
    half = rotary_dim // 2
    rotated = torch.cat([-rot[..., half:], rot[..., :half]], dim=-1)
    rot = rot * cos.to(x.dtype) + rotated * sin.to(x.dtype)
    return torch.cat([rot, rest], dim=-1) if rest.shape[-1] else rot
