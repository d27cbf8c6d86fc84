"""A training run's held-out documents as an lm-eval dataset, so CPU-scale runs get a perplexity without the hub."""

from __future__ import annotations

import inspect
from typing import Any

from datasets import DatasetDict

from attnlab.data.backcopy import SOURCE
from attnlab.defaults import DATA_SEED
from attnlab.defaults import cache_dir as default_cache_dir

LOCAL_SOURCES = ("wiki_sample", "registry", "files")  # data.source values whose documents are on this machine


def heldout_dataset(**metadata: Any) -> DatasetDict:
    """lm-eval ``custom_dataset``: the validation documents of the run's own corpus as its test split (its train
    split: the training documents, W8A8's calibration text).

    ``data``: the run's data config (attnlab's harness reads it from the checkpoint's record), split as training
    split it, when its documents are local (``LOCAL_SOURCES``: the embedded corpus, ``registry_text``, the user's
    text files) or generated from settings it records (Bigram-Backcopy sequences, ``attnlab.data.backcopy``).
    Otherwise (a hub dataset, generated passkey prompts, a legacy record without ``source``, none) the
    embedded corpus's split, with the run's ``seed`` and ``val_fraction`` where it has them."""
    from attnlab.data import TextDataModule

    data = dict(metadata.get("data") or {})
    cache_dir = str(metadata.get("cache_dir") or default_cache_dir())
    if data.get("source") == SOURCE:  # generated sequences: the same ones again, from the same settings
        from attnlab.data.backcopy import bigram_backcopy_datamodule

        accepted = inspect.signature(bigram_backcopy_datamodule).parameters
        settings = {key: value for key, value in data.items() if key in accepted and key != "tokenizer"}
        datamodule = bigram_backcopy_datamodule(**{**settings, "cache_dir": cache_dir})
    elif data.get("source") in LOCAL_SOURCES:
        accepted = inspect.signature(TextDataModule).parameters
        settings = {key: value for key, value in data.items() if key in accepted and key != "packed_dir"}
        datamodule = TextDataModule(**{**settings, "cache_dir": cache_dir})
    else:
        datamodule = TextDataModule(
            name="wiki_sample",
            source="wiki_sample",
            val_fraction=float(data.get("val_fraction") or 0.1),
            seed=int(data.get("seed") or DATA_SEED),
            cache_dir=cache_dir,
        )
    return DatasetDict(
        train=datamodule.training_documents().select_columns(["text"]),  # W8A8 calibration text
        test=datamodule.validation_documents().select_columns(["text"]),
    )


def scores_own_corpus(data: dict[str, Any]) -> bool:
    """Whether ``heldout_dataset`` scores a run trained on ``data`` on its own held-out documents."""
    return data.get("source") in (*LOCAL_SOURCES, SOURCE) or data.get("name") in (None, "wiki_sample")
