"""Fallbacks several modules use when a config or a checkpoint does not say: written once, so they agree."""

DATA_SEED = 1337  # the held-out split and the tokenizer (conf: data.seed): runs with different seeds share them
EVAL_SEED = 1234  # evaluation's sampling (conf/eval: seed): passkey prompts, stand-in task order, lm-eval
CACHE_DIR = ".cache/attnlab"  # corpus, tokenizers and packed blocks (conf: paths.cache_dir)
