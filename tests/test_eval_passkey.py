"""Passkey retrieval: the exact template, lengths in tokens, the needle kept whole, scoring and seeding."""

from __future__ import annotations

import random
import re
from pathlib import Path

import pytest
from tokenizers import Tokenizer

from attnlab.errors import ConfigError
from attnlab.eval.passkey import (
    INTRO,
    NEEDLE,
    QUESTION,
    first_integer,
    is_correct,
    make_prompt,
    passkey_dataset,
    passkey_prompts,
    passkey_training_texts,
    process_results,
    template_tokenizer,
)


@pytest.fixture(scope="module")
def tokenizer() -> Tokenizer:
    return template_tokenizer(1024, seed=0)


EXPECTED_SEED_7_90_TOKENS = (
    "There is an important info hidden inside a lot of irrelevant text. Find it and memorize them. "
    "I will quiz you about the important information there.\n"
    "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again.\n"
    "The pass key is 52445. Remember it. 52445 is the pass key.\n"
    "The g\n"
    "What is the pass key? The pass key is"
)


def test_prompt_follows_the_template_exactly(tokenizer: Tokenizer) -> None:
    prompt = make_prompt(tokenizer, 90, random.Random(7))
    assert prompt.prompt == EXPECTED_SEED_7_90_TOKENS
    assert prompt.key == 52445 and prompt.tokens == len(tokenizer.encode(prompt.prompt).ids) <= 90


def test_prompt_lengths_hit_the_target_in_tokens_and_keep_the_needle_whole(tokenizer: Tokenizer) -> None:
    prompts = passkey_prompts(tokenizer, [100, 200, 400], per_length=4, seed=1)
    assert [p.target_tokens for p in prompts] == [100] * 4 + [200] * 4 + [400] * 4
    for p in prompts:
        assert p.target_tokens - 3 <= len(tokenizer.encode(p.prompt).ids) <= p.target_tokens
        lines = p.prompt.split("\n")
        assert len(lines) == 5 and lines[0] == INTRO and lines[4] == QUESTION
        assert lines[2] == NEEDLE.format(key=p.key) and 10000 <= p.key <= 99999
        prefix, suffix = len(lines[1]), len(lines[3])
        assert prefix / (prefix + suffix) == pytest.approx(p.depth, abs=0.02)  # depth over the filler
    depths = [p.depth for p in prompts]
    assert min(depths) < 0.3 and max(depths) > 0.7


def test_a_length_too_short_for_the_template_is_an_error(tokenizer: Tokenizer) -> None:
    with pytest.raises(ConfigError, match="cannot hold the template"):
        make_prompt(tokenizer, 20, random.Random(0))


def test_seeds_reproduce_and_differ(tokenizer: Tokenizer) -> None:
    first = passkey_prompts(tokenizer, [120], 3, seed=5)
    assert first == passkey_prompts(tokenizer, [120], 3, seed=5)
    assert [p.key for p in first] != [p.key for p in passkey_prompts(tokenizer, [120], 3, seed=6)]


@pytest.mark.parametrize(
    ("output", "correct"),
    [
        (" 52445.", True),
        ("52445 is the pass key", True),
        (" 5244", False),
        (" 12 and 52445", False),
        (" the key", False),
        ("", False),
        (" 524451", False),
    ],
)
def test_correct_when_the_first_integer_is_the_key(output: str, correct: bool) -> None:
    assert is_correct(output, 52445) is correct


def test_process_results_reports_overall_and_per_length() -> None:
    assert process_results({"key": "52445", "length": 128}, [" 52445."]) == {"acc": 1.0, "acc_128": 1.0}
    assert process_results({"key": "52445", "length": 64}, [" 1"]) == {"acc": 0.0, "acc_64": 0.0}


def test_dataset_interleaves_lengths_so_limit_covers_all(tokenizer: Tokenizer, tmp_path: Path) -> None:
    file = tmp_path / "tokenizer.json"
    tokenizer.save(str(file))
    docs = passkey_dataset(tokenizer=str(file), context_lengths=[100, 150], samples_per_length=3, passkey_seed=1)
    assert docs["test"]["length"] == [100, 150] * 3
    assert all(str(first_integer(d["prompt"].split("\n")[2])) == d["key"] for d in docs["test"])


def test_training_texts_end_with_their_own_key(tokenizer: Tokenizer) -> None:
    texts = list(passkey_training_texts(tokenizer, 6, [80, 120], seed=3))
    assert len(texts) == 6 and texts == list(passkey_training_texts(tokenizer, 6, [80, 120], seed=3))
    for text in texts:
        key = re.search(r"The pass key is (\d{5})\.", text).group(1)
        assert text.endswith(f"{QUESTION} {key}.")


def test_train_py_data_passkey_trains_on_generated_prompts(make_config, tmp_path: Path, data_cache: Path) -> None:
    from attnlab.training.run import run
    from tests.conftest import MICRO_MODEL

    overrides = [
        "debug=fdr",
        "logger=csv",
        "trainer=cpu",
        "callbacks.progress_bar.refresh_rate=0",
        *MICRO_MODEL,
        "model.block_size=128",
        "data=passkey",
        "data.train_texts=40",
        "data.val_texts=4",
        "data.lengths=[80,100]",
        "data.block_size=64",
        "data.batch_size=4",
    ]
    results = run(make_config(overrides, tmp_path / "run"))
    assert results["steps"] == 1 and results["val_loss"] is not None
    assert 40 in [len(f.read_text().splitlines()) for f in data_cache.glob("passkey/*/train.jsonl")]
