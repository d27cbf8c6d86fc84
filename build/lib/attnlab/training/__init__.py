"""Training: the LightningModule and the Hydra-driven run."""

from attnlab.training.module import LanguageModel

__all__ = ["LanguageModel"]
