"""Tokenizers: a byte-level BPE trained on the training split, and documents packed with the end-of-text token.
(A model's own tokenizer, from a file, the hub or a checkpoint: ``models.checkpoint.load_pretrained_tokenizer``.)"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

from attnlab.errors import ConfigError

EOS_CANDIDATES = ("<|endoftext|>", "</s>", "<|end_of_text|>", "<eos>")
BPE_EOS = "<|endoftext|>"


def train_bpe_tokenizer(texts: Iterable[str], vocab_size: int) -> Tokenizer:
    """Byte-level BPE (GPT-2 style) with ``<|endoftext|>`` as its only special token."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[BPE_EOS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(_batched(texts), trainer=trainer)
    return tokenizer


def eos_token_id(tokenizer: Tokenizer) -> int:
    """The end-of-document token that separates packed documents."""
    for token in EOS_CANDIDATES:
        token_id = tokenizer.token_to_id(token)
        if token_id is not None:
            return token_id
    raise ConfigError("model.tokenizer", f"tokenizer has none of the end-of-text tokens {EOS_CANDIDATES}")


def joined_ids(tokenizer: Tokenizer, texts: Iterable[str], limit: int | None = None) -> list[int]:
    """Token ids of ``texts`` joined by the end-of-text token, as documents are packed; with ``limit``, the first
    ``limit`` ids (the texts after them are not encoded)."""
    eos, ids = eos_token_id(tokenizer), []
    for index, text in enumerate(texts):
        ids += [*([eos] if index else []), *tokenizer.encode(text).ids]
        if limit is not None and len(ids) >= limit:
            break
    return ids[:limit]


def _batched(texts: Iterable[str], size: int = 1000) -> Iterator[list[str]]:
    batch: list[str] = []
    for text in texts:
        batch.append(text)
        if len(batch) == size:
            yield batch
            batch = []
    if batch:
        yield batch
