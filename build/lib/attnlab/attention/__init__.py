"""Attention: the shared layer, the variant registry, and every registered variant."""

import importlib
import pkgutil

from attnlab.attention import variants
from attnlab.attention.base import (
    AttentionContext,
    AttentionShape,
    AttentionVariant,
    CausalSelfAttention,
    KVCache,
    VariantOptions,
    available_attention,
    build_variant,
    register,
    register_preset,
    resolve_options,
    store_presets,
)

for _module in pkgutil.iter_modules(variants.__path__):
    importlib.import_module(f"{variants.__name__}.{_module.name}")

__all__ = [
    "AttentionContext",
    "AttentionShape",
    "AttentionVariant",
    "CausalSelfAttention",
    "KVCache",
    "VariantOptions",
    "available_attention",
    "build_variant",
    "register",
    "register_preset",
    "resolve_options",
    "store_presets",
]
