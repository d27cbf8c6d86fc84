"""The embedded corpus's held-out split as an lm-eval dataset, so CPU-scale runs get a perplexity without the hub."""

from __future__ import annotations

from typing import Any

from datasets import DatasetDict

from attnlab.defaults import CACHE_DIR, DATA_SEED


def heldout_dataset(**metadata: Any) -> DatasetDict:
    """lm-eval ``custom_dataset``: the validation documents of ``TextDataModule(source="wiki_sample")`` as its test
    split (its train split: the training documents).

    ``data_seed`` and ``val_fraction`` must match the training run's data config for the split to be held out;
    attnlab's harness reads them from the checkpoint's run directory.
    """
    from attnlab.data import TextDataModule

    datamodule = TextDataModule(
        name="wiki_sample",
        source="wiki_sample",
        val_fraction=float(metadata.get("val_fraction", 0.1)),
        seed=int(metadata.get("data_seed", DATA_SEED)),
        cache_dir=str(metadata.get("cache_dir", CACHE_DIR)),
    )
    return DatasetDict(
        train=datamodule.training_documents().select_columns(["text"]),  # W8A8 calibration text
        test=datamodule.validation_documents().select_columns(["text"]),
    )
