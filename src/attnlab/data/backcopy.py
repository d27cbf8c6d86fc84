"""The Bigram-Backcopy task (Guo et al. 2024, "Active-Dormant Attention Heads: Mechanistically Demystifying
Extreme-Token Phenomena in LLMs", arXiv 2410.13835, Section 2): a setting small enough for a CPU in which a one- to
three-layer transformer grows an attention sink on the BOS token within a few thousand steps.

Each sequence starts with ``<s>``; its first token is drawn from the unigram marginal with the trigger tokens left
out; after that, a token that is not a trigger is followed by a draw from the bigram transition P(. | x_n), and a
trigger x_n is followed by a copy of the token before it (x_{n+1} = x_{n-1}). The triggers are the ``triggers`` most
frequent tokens. The authors' code (GuoTianYu2000/Active-Dormant-Attention, ``BBM/data.py`` class ``bbm``
``gen_seq``, commit 16b3593) estimates the marginal and the bigram from Tiny Shakespeare's characters; offline, the
characters of the embedded Wikipedia sample stand in (its ``vocabulary`` most frequent characters; transitions
between them only). A head that only needs the previous token after a trigger has nothing to do elsewhere, and the
paper's point is that it then parks its attention on ``<s>`` (the "dormant" phase): the sink.

Sequences are written once as blank-line separated paragraphs of token names under ``<cache_dir>/bigram_backcopy/``
with a word-level tokenizer, and read back through ``TextDataModule`` (``source=files``, no separator): each sequence
is ``block_size + 1`` tokens, so each packed block is exactly one sequence, ``<s>`` first.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
from tokenizers import Tokenizer, models, pre_tokenizers

from attnlab.data.datamodule import TextDataModule
from attnlab.data.tokenizer import BPE_EOS
from attnlab.defaults import DATA_SEED
from attnlab.defaults import cache_dir as default_cache_dir
from attnlab.digest import digest
from attnlab.errors import require
from attnlab.files import write_atomic

SOURCE = "bigram_backcopy"  # data.source of this option: the held-out analysis rebuilds it from the run's record
BOS = "<s>"
GENERATOR_VERSION = 1  # bump when the sequences change, so cached copies are rebuilt


def token_name(character: str) -> str:
    """A whitespace-free name for a character, one word of the word-level tokenizer."""
    return character if character.isprintable() and not character.isspace() else f"U+{ord(character):04X}"


def character_bigrams(texts: list[str], vocabulary: int) -> tuple[list[str], np.ndarray, np.ndarray]:
    """The ``vocabulary`` most frequent characters of ``texts`` (most frequent first), their unigram marginal and
    their bigram transition matrix (rows: the current character), counted within each text."""
    counts = Counter(ch for text in texts for ch in text)
    kept = [ch for ch, _ in counts.most_common(vocabulary)]
    index = {ch: i for i, ch in enumerate(kept)}
    marginal = np.array([counts[ch] for ch in kept], dtype=np.float64)
    pairs = np.zeros((len(kept), len(kept)), dtype=np.float64)
    for text in texts:
        ids = np.array([index.get(ch, -1) for ch in text])
        both = (ids[:-1] >= 0) & (ids[1:] >= 0)
        np.add.at(pairs, (ids[:-1][both], ids[1:][both]), 1)
    require(bool((pairs.sum(axis=1) > 0).all()), "data.vocabulary", "a kept character is never followed by another")
    return kept, marginal / marginal.sum(), pairs / pairs.sum(axis=1, keepdims=True)


def backcopy_sequences(
    marginal: np.ndarray, transition: np.ndarray, triggers: int, count: int, length: int, seed: int
) -> np.ndarray:
    """``count`` sequences of ``length`` token ids (0 .. V-1, no ``<s>``) drawn as the module docstring says, all at
    once per position; the triggers are ids 0 .. ``triggers`` - 1 (``character_bigrams`` sorts by frequency)."""
    rng = np.random.default_rng(seed)
    first = marginal.copy()
    first[:triggers] = 0
    cumulative = np.cumsum(transition, axis=1)
    sequences = np.empty((count, length), dtype=np.int64)
    sequences[:, 0] = rng.choice(len(marginal), size=count, p=first / first.sum())
    for n in range(1, length):
        current = sequences[:, n - 1]
        drawn = (cumulative[current] < rng.random((count, 1))).sum(axis=1).clip(max=len(marginal) - 1)
        previous = sequences[:, n - 2] if n >= 2 else drawn
        sequences[:, n] = np.where(current < triggers, previous, drawn)
    return sequences


SPECIAL_TOKENS = (BOS, BPE_EOS)  # before the characters in the word-level vocabulary


def tokenizer_vocab_size(vocabulary: int) -> int:
    """The word-level tokenizer's size for ``data.vocabulary`` characters: what a model trained on the task embeds
    (the tables' model sizes read it, since ``data.tokenizer_vocab_size`` is the BPE's and unused here)."""
    return vocabulary + len(SPECIAL_TOKENS)


def word_level_tokenizer(names: list[str]) -> Tokenizer:
    """``<s>``, the end-of-text token (the analysis joins documents with it) and one word per character."""
    vocab = {name: i for i, name in enumerate([*SPECIAL_TOKENS, *names])}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token=BPE_EOS))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return tokenizer


def bigram_backcopy_datamodule(
    block_size: int,
    train_sequences: int,
    val_sequences: int,
    triggers: int = 3,
    vocabulary: int = 64,
    name: str = SOURCE,
    source: str = SOURCE,
    seed: int = DATA_SEED,
    cache_dir: str | None = None,
    tokenizer: str | None = None,
    **datamodule_kwargs: Any,
) -> TextDataModule:
    """A ``TextDataModule`` over generated Bigram-Backcopy sequences of ``block_size + 1`` tokens (``<s>`` first),
    ``train_sequences`` to train on and ``val_sequences`` held out, written once per setting."""
    require(source == SOURCE, "data.source", f"the Bigram-Backcopy option's source is {SOURCE!r}, got {source!r}")
    require(tokenizer is None, "data.tokenizer", "the Bigram-Backcopy task brings its own word-level tokenizer")
    require(train_sequences > 0 and val_sequences > 0, "data.train_sequences", "both counts must be positive")
    require(0 < triggers < vocabulary, "data.triggers", f"must be in (0, vocabulary={vocabulary}), got {triggers}")
    identity = [GENERATOR_VERSION, block_size, train_sequences, val_sequences, triggers, vocabulary, seed]
    cache_dir = cache_dir or default_cache_dir()
    directory = Path(cache_dir) / SOURCE / digest(identity)
    text_file, tokenizer_file = directory / "sequences.txt", directory / "tokenizer.json"
    if not text_file.is_file():
        corpus = TextDataModule(name="wiki_sample", source="wiki_sample", seed=seed, cache_dir=cache_dir)
        characters, marginal, transition = character_bigrams(list(corpus.training_documents()["text"]), vocabulary)
        names = [token_name(ch) for ch in characters]
        total = train_sequences + val_sequences
        sequences = backcopy_sequences(marginal, transition, triggers, total, block_size, seed)
        write_atomic(tokenizer_file, word_level_tokenizer(names).to_str(pretty=True))  # as Tokenizer.save writes it
        meta = {"characters": characters, "triggers": characters[:triggers], "identity": identity}
        write_atomic(directory / "task.json", json.dumps(meta, indent=1))
        lines = (" ".join([BOS, *(names[i] for i in row)]) for row in sequences)
        write_atomic(text_file, "\n\n".join(lines) + "\n")
    return TextDataModule(
        name=name,
        source="files",
        files=[str(text_file)],
        document_separator="none",
        tokenizer=str(tokenizer_file),
        val_fraction=val_sequences / (train_sequences + val_sequences),
        block_size=block_size,
        seed=seed,
        cache_dir=cache_dir,
        **datamodule_kwargs,
    )
