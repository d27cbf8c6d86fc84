"""Models: the config dataclass and the GPT built from it."""

from attnlab.models.config import ModelConfig
from attnlab.models.gpt import GPT

__all__ = ["GPT", "ModelConfig"]
