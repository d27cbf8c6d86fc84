"""Fail fast without network: hub calls otherwise hang for tens of seconds before erroring; W&B goes offline."""

from __future__ import annotations

import os
import socket
from functools import cache
from pathlib import Path

from attnlab.errors import ConfigError

HUB_HOST = "huggingface.co"
TOKENIZER_PATTERNS = ["tokenizer*", "special_tokens_map.json"]


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


def snapshot(repo_id: str, patterns: list[str], key: str = "model.init_from") -> Path:
    """The local snapshot of a hub repo: the cache when offline (failing fast if absent), else a download."""
    from huggingface_hub import constants, snapshot_download
    from huggingface_hub.errors import GatedRepoError, LocalEntryNotFoundError, RepositoryNotFoundError

    offline = not hub_reachable()
    try:
        return Path(snapshot_download(repo_id, allow_patterns=patterns, local_files_only=offline))
    except LocalEntryNotFoundError as error:
        raise ConfigError(
            key,
            f"Hugging Face repo {repo_id!r} is not in the local cache ({constants.HF_HUB_CACHE}) and the hub "
            "cannot be reached (HF_HUB_OFFLINE=1, or no connection to huggingface.co:443). Run once with internet "
            f"access (e.g. `hf download {repo_id}`) to cache it, or pass a local directory with config.json and "
            "model.safetensors.",
        ) from error
    except GatedRepoError as error:
        raise ConfigError(
            key,
            f"{repo_id!r} is gated: accept its licence on huggingface.co and log in (`hf auth login` or HF_TOKEN)",
        ) from error
    except RepositoryNotFoundError as error:
        raise ConfigError(key, f"no Hugging Face repo {repo_id!r} (or it is private)") from error


def local_dir(path_or_name: str) -> Path | None:
    """The directory if ``path_or_name`` names one, None if it is a hub repo id."""
    path = Path(path_or_name).expanduser()
    if path.is_dir():
        return path
    if path.exists() or path_or_name.startswith(("/", "./", "../", "~")):
        raise ConfigError("model.init_from", f"{path_or_name!r} is not a directory with an HF checkpoint")
    return None


def hf_tokenizer_path(path_or_name: str) -> str:
    """Path of the checkpoint's ``tokenizer.json`` (for ``tokenizers.Tokenizer.from_file``), fetching only it."""
    directory = local_dir(path_or_name) or snapshot(path_or_name, TOKENIZER_PATTERNS, "model.tokenizer")
    path = directory / "tokenizer.json"
    if not path.is_file():
        raise ConfigError("model.tokenizer", f"no tokenizer.json in {directory} ({path_or_name!r})")
    return str(path)


def wandb_mode() -> str:
    """``WANDB_MODE`` if set; online when an API key is available; offline otherwise."""
    if os.environ.get("WANDB_MODE"):
        return os.environ["WANDB_MODE"]
    return "online" if os.environ.get("WANDB_API_KEY") else "offline"
