"""Vanilla causal attention: the base hooks unchanged, through the fused SDPA kernel."""

from attnlab.attention.base import AttentionVariant, register


@register("vanilla")
class Vanilla(AttentionVariant):
    """softmax(q k^T / sqrt(d_h)) v."""
