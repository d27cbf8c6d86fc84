"""``eval=passkey`` without explicit lengths follows the model's window (explicit ones that do not fit stay errors),
in our harness and in lm-eval's own task loading (``attnlab-lm-eval``); lm-eval finds the model by entry point."""

from importlib.metadata import entry_points
from pathlib import Path

import pytest

from attnlab.errors import ConfigError
from attnlab.eval.lm import AttnlabLM
from attnlab.eval.passkey import MAX_NEW_TOKENS, default_lengths, passkey_dataset, template_tokenizer


def test_default_passkey_lengths_fit_the_window() -> None:
    assert default_lengths(2048) == [256, 512, 1024]  # the paper's lengths that leave room for the answer
    assert default_lengths(256) == [123, 246]  # the default tiny model: half its window and all of it
    assert all(n + MAX_NEW_TOKENS <= 256 for n in default_lengths(256))


def test_lm_eval_task_data_follows_the_models_window(tmp_path: Path) -> None:
    """lm-eval passes the model args (here ``max_length``) to the task: defaults fit, explicit misfits are errors."""
    tokenizer = tmp_path / "tokenizer.json"
    template_tokenizer(512, seed=0).save(str(tokenizer))
    docs = passkey_dataset(tokenizer=str(tokenizer), max_length="256", samples_per_length=1)
    assert sorted(docs["test"]["length"]) == [123, 246]
    with pytest.raises(ConfigError, match=r"context_lengths: \[512\] leave no room .* 256-token window"):
        passkey_dataset(tokenizer=str(tokenizer), max_length="256", context_lengths=[200, 512])


def test_model_is_declared_under_lm_evals_entry_point_group() -> None:
    (entry,) = [e for e in entry_points(group="lm_eval.models") if e.name == "attnlab"]
    assert entry.load() is AttnlabLM
