"""Attention variants: one module each, registered by name when this package is imported."""
