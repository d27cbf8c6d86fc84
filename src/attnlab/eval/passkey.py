"""Passkey retrieval (SSA Table 4), the landmark-attention / YaRN template, sized in the model's own tokens.

The prompt is the intro line, a filler prefix, the needle, a filler suffix and the question, joined with newlines.
The filler is the fixed five-sentence text repeated and cut (in characters) to length; the needle's depth is uniform
over the filler; the total filler is the longest whose prompt fits the target length in tokens, so nothing is ever
cut out of the needle. The model answers greedily (up to 10 tokens); it is right when the first integer it writes
is the key.
"""

from __future__ import annotations

import hashlib
import json
import random
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from datasets import Dataset, DatasetDict
from tokenizers import Tokenizer

from attnlab.defaults import DATA_SEED, EVAL_SEED
from attnlab.errors import ConfigError
from attnlab.files import write_atomic

INTRO = (
    "There is an important info hidden inside a lot of irrelevant text. Find it and memorize them. "
    "I will quiz you about the important information there."
)
FILLER = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."
NEEDLE = "The pass key is {key}. Remember it. {key} is the pass key."
QUESTION = "What is the pass key? The pass key is"
MAX_NEW_TOKENS = 10
TASK = "attnlab_passkey"  # our lm-eval task (lm-eval's own `passkey` is another task)
DEFAULT_LENGTHS = (256, 512, 1024, 2048)


def default_lengths(max_length: int) -> list[int]:
    """The paper's lengths that leave room for the answer in the model's window; else half the window and all of it."""
    window = max_length - MAX_NEW_TOKENS
    return [n for n in DEFAULT_LENGTHS if n <= window] or [window // 2, window]


def fitting_lengths(requested: Sequence[int] | None, max_length: int, key: str) -> list[int]:
    """``requested`` (else the defaults for the window), each leaving room for the answer in the model's window:
    a prompt is never cut to fit, so a length that does not fit is an error (``key`` names the setting)."""
    lengths = list(requested or default_lengths(max_length))
    too_long = [n for n in lengths if n > max_length - MAX_NEW_TOKENS]
    if too_long:
        raise ConfigError(
            key,
            f"{too_long} leave no room for the {MAX_NEW_TOKENS}-token answer in the model's {max_length}-token "
            "window (prompts are never truncated)",
        )
    return lengths


def model_window(metadata: dict[str, Any]) -> int | None:
    """The window of the model lm-eval scores (its model args arrive as task metadata): ``max_length``, else the
    checkpoint's or the pretrained model's block size; None when the model is not named (a bare dataset)."""
    if metadata.get("max_length"):
        return int(metadata["max_length"])
    if metadata.get("checkpoint"):
        from attnlab.models.checkpoint import load_checkpoint

        return int(load_checkpoint(metadata["checkpoint"]).spec["model"]["block_size"])
    if metadata.get("pretrained"):
        from attnlab.models.hf import INIT_FROM_PREFIX, config_from_hf, resolve_checkpoint

        directory = resolve_checkpoint(str(metadata["pretrained"]).removeprefix(INIT_FROM_PREFIX))
        return config_from_hf(json.loads((directory / "config.json").read_text())).block_size
    return None


@dataclass(frozen=True)
class PasskeyPrompt:
    prompt: str
    key: int
    target_tokens: int
    tokens: int
    depth: float  # where the needle sits: fraction of the filler before it


def filler(n_chars: int) -> str:
    """The filler sentences repeated (space-separated, as in the reference code) and cut to ``n_chars``."""
    repeats = n_chars // (len(FILLER) + 1) + 1
    return " ".join([FILLER] * repeats)[:n_chars]


def build_prompt(key: int, prefix_chars: int, suffix_chars: int) -> str:
    return "\n".join([INTRO, filler(prefix_chars), NEEDLE.format(key=key), filler(suffix_chars), QUESTION])


def make_prompt(tokenizer: Tokenizer, target_tokens: int, rng: random.Random) -> PasskeyPrompt:
    """The longest prompt (in ``tokenizer``'s tokens) of at most ``target_tokens``, with a random key and depth."""
    key = rng.randint(10000, 99999)
    depth = rng.random()

    def render(total_chars: int) -> tuple[str, int]:
        prefix = round(depth * total_chars)
        text = build_prompt(key, prefix, total_chars - prefix)
        return text, len(tokenizer.encode(text).ids)

    text, count = render(0)
    if count > target_tokens:
        raise ConfigError(
            "passkey.context_lengths", f"{target_tokens} tokens cannot hold the template itself ({count} tokens)"
        )
    low, high = 0, 8 * target_tokens  # no tokenizer packs more than 8 characters of this filler into a token
    while low < high:  # largest filler length whose prompt still fits
        middle = (low + high + 1) // 2
        if render(middle)[1] <= target_tokens:
            low = middle
        else:
            high = middle - 1
    text, count = render(low)
    return PasskeyPrompt(text, key, target_tokens, count, depth)


def passkey_prompts(tokenizer: Tokenizer, lengths: Sequence[int], per_length: int, seed: int) -> list[PasskeyPrompt]:
    """``per_length`` prompts at each target length; the same seed gives the same prompts."""
    rng = random.Random(seed)
    return [make_prompt(tokenizer, int(length), rng) for length in lengths for _ in range(per_length)]


def first_integer(text: str) -> int | None:
    match = re.search(r"\d+", text)
    return int(match.group()) if match else None


def is_correct(output: str, key: int) -> bool:
    return first_integer(output) == key


# ---------------------------------------------------------------------------- the lm-eval task's hooks
def passkey_dataset(**metadata: Any) -> DatasetDict:
    """lm-eval ``custom_dataset``: metadata carries the model args (the tokenizer, the window the lengths must fit)
    and the task settings (``attnlab-lm-eval --metadata '{"context_lengths": [...]}'``)."""
    from attnlab.eval.lm import load_tokenizer

    tokenizer = load_tokenizer(metadata.get("checkpoint"), metadata.get("pretrained"), metadata.get("tokenizer"))
    window = model_window(metadata)
    lengths = metadata.get("context_lengths") or DEFAULT_LENGTHS
    if window is not None:
        lengths = fitting_lengths(metadata.get("context_lengths"), window, "context_lengths")
    per_length = int(metadata.get("samples_per_length", 10))
    prompts = passkey_prompts(tokenizer, lengths, per_length, int(metadata.get("passkey_seed", EVAL_SEED)))
    # interleave the lengths, so that lm-eval's `limit` (the first N documents) still covers every length
    order = sorted(range(len(prompts)), key=lambda i: (i % per_length, i // per_length))
    rows = [
        {"prompt": p.prompt, "key": str(p.key), "length": p.target_tokens, "tokens": p.tokens, "depth": p.depth}
        for p in (prompts[i] for i in order)
    ]
    return DatasetDict(test=Dataset.from_list(rows))


def process_results(doc: dict[str, Any], results: list[str]) -> dict[str, float]:
    """Overall accuracy, and accuracy at this prompt's length (``acc_<length>``, averaged over its prompts)."""
    correct = float(is_correct(results[0], int(doc["key"])))
    return {"acc": correct, f"acc_{doc['length']}": correct}


def per_length_accuracy(task_results: dict[str, Any]) -> dict[int, float]:
    """``{length: accuracy}`` from an lm-eval results entry of the passkey task."""
    found = (re.fullmatch(r"acc_(\d+),none", key) for key in task_results)
    return {int(m.group(1)): float(task_results[m.group()]) for m in found if m}


# ---------------------------------------------------------------------------- training data
def passkey_training_texts(tokenizer: Tokenizer, n: int, lengths: Sequence[int], seed: int) -> Iterator[str]:
    """``n`` prompts followed by their answer (`` <key>.``), at lengths drawn from ``lengths``: a task to learn."""
    rng = random.Random(seed)
    for _ in range(n):
        prompt = make_prompt(tokenizer, int(rng.choice(list(lengths))), rng)
        yield f"{prompt.prompt} {prompt.key}."


def template_tokenizer(vocab_size: int, seed: int) -> Tokenizer:
    """A byte-level BPE learned from the template itself, for models trained only on passkey data."""
    from attnlab.data.tokenizer import train_bpe_tokenizer

    rng = random.Random(seed)
    texts = [build_prompt(rng.randint(10000, 99999), rng.randint(0, 400), rng.randint(0, 400)) for _ in range(100)]
    return train_bpe_tokenizer(texts, vocab_size)


def passkey_datamodule(
    train_texts: int,
    val_texts: int,
    lengths: Sequence[int],
    cache_dir: str,
    name: str = "passkey",
    seed: int = DATA_SEED,
    tokenizer: str | None = None,
    tokenizer_vocab_size: int = 1024,
    **datamodule_kwargs: Any,
) -> Any:
    """A ``TextDataModule`` over generated passkey texts, written once as local train/validation JSON files.

    Lengths are measured in the tokenizer the model will use: ``tokenizer`` (e.g. a pretraining run's
    ``tokenizer.json``) or, by default, a small BPE learned from the template and saved next to the texts.
    """
    from attnlab.data import TextDataModule

    identity = json.dumps([train_texts, val_texts, list(lengths), seed, tokenizer, tokenizer_vocab_size])
    key = hashlib.sha256(identity.encode()).hexdigest()[:16]
    directory = Path(cache_dir) / "passkey" / key
    if tokenizer:
        from attnlab.models.checkpoint import load_pretrained_tokenizer

        tok, tokenizer_file = load_pretrained_tokenizer(tokenizer), tokenizer
    else:
        tokenizer_file = str(directory / "tokenizer.json")
        tok = Tokenizer.from_file(tokenizer_file) if Path(tokenizer_file).is_file() else None
    if not (directory / "validation.jsonl").is_file():
        if tok is None:
            tok = template_tokenizer(tokenizer_vocab_size, seed)
            write_atomic(Path(tokenizer_file), tok.to_str(pretty=True))  # as Tokenizer.save writes it
        for split, count, split_seed in (("train", train_texts, seed), ("validation", val_texts, seed + 1)):
            # each writer its own temporary file: two jobs sharing the cache write the same texts side by side
            texts = passkey_training_texts(tok, count, lengths, split_seed)
            write_atomic(directory / f"{split}.jsonl", "".join(json.dumps({"text": text}) + "\n" for text in texts))
    return TextDataModule(
        name=name,
        source="hub",  # a local directory of split files goes through the same `load_dataset` path
        path=str(directory),
        train_split="train",
        val_split="validation",
        tokenizer=tokenizer_file,
        cache_dir=cache_dir,
        seed=seed,
        **datamodule_kwargs,
    )
