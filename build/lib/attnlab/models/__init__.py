"""Models: the config dataclass and the GPT built from it."""

from attnlab.models.builder import build_gpt
from attnlab.models.config import ModelConfig
from attnlab.models.gpt import GPT

__all__ = ["GPT", "ModelConfig", "build_gpt"]
