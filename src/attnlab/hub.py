"""Fail fast without network: hub calls otherwise hang for tens of seconds before erroring."""

from __future__ import annotations

import os
import socket
from functools import cache

HUB_HOST = "huggingface.co"


@cache
def hub_reachable(timeout: float = 3.0) -> bool:
    """Whether the Hugging Face hub answers a TCP connect; False when offline mode is already set."""
    if os.environ.get("HF_HUB_OFFLINE") == "1" or os.environ.get("HF_DATASETS_OFFLINE") == "1":
        return False
    try:
        with socket.create_connection((HUB_HOST, 443), timeout=timeout):
            return True
    except OSError:
        return False


def use_cache_only_if_offline() -> bool:
    """Switch the HF libraries to cache-only mode when the hub is unreachable; returns True if offline."""
    if hub_reachable():
        return False
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ["HF_DATASETS_OFFLINE"] = "1"
    try:  # huggingface_hub and datasets read these at import; refresh their module-level flags too
        import datasets.config
        import huggingface_hub.constants

        huggingface_hub.constants.HF_HUB_OFFLINE = True
        datasets.config.HF_HUB_OFFLINE = True
        datasets.config.HF_DATASETS_OFFLINE = True
    except (ImportError, AttributeError):
        pass
    return True
