"""Fallbacks several modules use when a config or a checkpoint does not say: written once, so they agree."""

import os
from pathlib import Path

DATA_SEED = 1337  # the held-out split and the tokenizer (conf: data.seed): runs with different seeds share them
EVAL_SEED = 1234  # evaluation's sampling (conf/eval: seed): passkey prompts, stand-in task order, lm-eval
CACHE_SETTING = "ATTNLAB_CACHE"  # the environment variable that moves the cache (conf: paths.cache_dir wins)


def cache_dir(project: str | Path | None = None) -> str:
    """Where the corpus, tokenizers and packed blocks are cached (conf: ``paths.cache_dir``): ``$ATTNLAB_CACHE``;
    else in a clone its own ``<project>/.cache/attnlab`` (``project``: the checkout unless given); else, installed,
    one per user, ``$XDG_CACHE_HOME/attnlab`` (``~/.cache/attnlab``, as Hugging Face's ``~/.cache/huggingface``), so
    a new working directory does not prepare the corpus and train the tokenizer again."""
    if os.environ.get(CACHE_SETTING):
        return os.environ[CACHE_SETTING]
    from attnlab.configs import checkout

    root = checkout()
    if root is not None:
        return str(Path(project or root) / ".cache" / "attnlab")
    return str(Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "attnlab")
