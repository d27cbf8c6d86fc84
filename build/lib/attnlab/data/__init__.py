"""Data: the embedded corpus, tokenizers, and the LightningDataModule."""

from attnlab.data.datamodule import TextDataModule

__all__ = ["TextDataModule"]
