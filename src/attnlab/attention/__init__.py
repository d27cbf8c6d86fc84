"""Attention: the shared layer, the variant registry, and every registered variant: ours, then those of installed
packages that name a module in the ``attnlab.attention`` entry point group (importing it runs its ``@register``)."""

import importlib
import pkgutil
import warnings
from importlib.metadata import entry_points

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

PLUGIN_GROUP = "attnlab.attention"
for _entry in entry_points(group=PLUGIN_GROUP):
    try:
        _entry.load()
    except Exception as _error:  # one broken package must not take every other variant down with it
        _package = _entry.dist.name if _entry.dist else "?"
        warnings.warn(
            f"attnlab: the attention plugin {_entry.name} ({_entry.value}, package {_package}) did not load, so its "
            f"variants are not available: {type(_error).__name__}: {_error}",
            stacklevel=1,
        )

__all__ = [
    "PLUGIN_GROUP",
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
