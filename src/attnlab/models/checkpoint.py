"""What a run's checkpoint carries and how it is read back: the record, its weights and the model's tokenizer.

Training stores a record inside every Lightning checkpoint (``checkpoint[RECORD_KEY]``): the run spec (model,
attention, optimiser and schedule horizon as plain dicts), the tokenizer (its JSON) and the data identity (what
rebuilds the held-out split). ``load_checkpoint`` reads it back with one ``torch.load(weights_only=True)`` and no
Lightning, so a checkpoint copied alone anywhere evaluates, fine-tunes or resumes, and no code inside it runs.
It sits in ``models`` below ``builder`` (fine-tuning starts from one of our checkpoints) and below ``data`` (a
model's tokenizer may be the one inside a checkpoint), so it imports neither.
"""

from __future__ import annotations

import pickle
import zipfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from attnlab.digest import start_identity
from attnlab.errors import ConfigError, require
from attnlab.hub import hf_tokenizer_path
from attnlab.models.config import ModelConfig
from attnlab.models.gpt import GPT
from attnlab.models.sizes import check_against_weights

if TYPE_CHECKING:  # (tokenizers and omegaconf on first use: the GPU bench builds models with torch alone)
    from tokenizers import Tokenizer

RECORD_KEY = "attnlab"
RECORD_FORMAT = 1
MODEL_PREFIX = "model."  # the LightningModule holds the GPT as ``self.model``
# Data settings that do not change which documents are held out or how they are tokenized.
DATA_RUNTIME_KEYS = ("_target_", "batch_size", "num_workers", "cache_dir", "shuffle_seed", "shuffle_buffer")


def load_pretrained_tokenizer(name_or_path: str) -> Tokenizer:
    """A ``tokenizer.json`` file, a directory holding one, a ``hf:`` checkpoint, a hub repo id, or one of our
    ``.ckpt`` files (the tokenizer travels inside it).

    Directories and hub repos go through the checkpoint loader's lookup, which fails fast without network.
    """
    from tokenizers import Tokenizer

    name_or_path = name_or_path.removeprefix("hf:")
    if name_or_path.endswith(".ckpt"):
        return load_checkpoint(name_or_path).tokenizer
    if Path(name_or_path).is_file():
        return Tokenizer.from_file(name_or_path)
    return Tokenizer.from_file(hf_tokenizer_path(name_or_path))


def data_identity(data: dict[str, Any]) -> dict[str, Any]:
    """What decides the documents and their split: a data config without its batch and cache settings."""
    return {key: value for key, value in data.items() if key not in DATA_RUNTIME_KEYS}


def record(spec: dict[str, Any], tokenizer: Tokenizer, data: dict[str, Any]) -> dict[str, Any]:
    """The entry training adds to each checkpoint (plain types only, so ``weights_only`` loading reads it)."""
    return {"format": RECORD_FORMAT, "spec": spec, "tokenizer": tokenizer.to_str(), "data": data_identity(data)}


@dataclass(frozen=True)
class RunCheckpoint:
    """One of our checkpoints, read without Lightning: enough to rebuild, evaluate, fine-tune from or resume it."""

    path: Path
    spec: dict[str, Any]  # model (the built architecture), model_request, attention, optim, schedule_steps
    tokenizer_json: str | None
    data: dict[str, Any]
    state_dict: dict[str, Tensor] = field(repr=False)  # the GPT's own parameter names
    global_step: int = 0
    legacy: bool = False  # written before checkpoints carried their record

    @property
    def tokenizer(self) -> Tokenizer:
        if self.tokenizer_json is None:
            raise ConfigError(
                "tokenizer",
                f"{self.path} predates checkpoints that carry their tokenizer and no tokenizer.json is in its run "
                "directory; pass tokenizer=<path to tokenizer.json>",
            )
        from tokenizers import Tokenizer

        try:
            return Tokenizer.from_str(self.tokenizer_json)
        except Exception as exc:  # tokenizers raises its own (Rust) error types for JSON that is not a tokenizer
            raise ConfigError("tokenizer", f"{self.path}: its tokenizer does not load ({exc})") from None

    def build_model(self) -> GPT:
        """The exact model the run trained: its architecture, attention variant and weights."""
        return restore_gpt(self.spec["model"], self.spec["attention"], self.state_dict)


def restore_gpt(model: Mapping[str, Any], attention: Mapping[str, Any], weights: Mapping[str, Tensor]) -> GPT:
    """A run's model exactly as it trained (``build_gpt``'s ``weights=``): its architecture, variant and weights."""
    gpt = GPT(ModelConfig.from_dict(dict(model)), dict(attention))
    gpt.load_state_dict(weights)
    return gpt


def read_checkpoint_file(path: Path, key: str = "ckpt_path") -> dict[str, Any]:
    """One ``torch.load`` with ``weights_only=True``: tensors and plain data only, never code from the file.
    ``key``: the config key that named the file, for the error line."""
    require(path.is_file(), key, f"no checkpoint file at {path}")
    try:
        return torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except pickle.UnpicklingError:
        raise ConfigError(key, f"{path} holds objects other than tensors and plain data; refusing to load it") from None
    except (RuntimeError, EOFError, OSError, ValueError, zipfile.BadZipFile):
        raise ConfigError(key, f"{path} is not a readable checkpoint (truncated or corrupt)") from None


def load_checkpoint(path: str | Path, key: str = "ckpt_path") -> RunCheckpoint:
    """Our checkpoint at ``path``; one written before the record existed is read from its run directory. ``key``:
    the config key that named it (``ckpt_path``, ``model.init_from``), for error lines."""
    path = Path(path)
    raw = read_checkpoint_file(path, key)
    require("state_dict" in raw, key, f"{path} is not an attnlab training checkpoint (no state_dict)")
    weights = {
        name.removeprefix(MODEL_PREFIX): value
        for name, value in raw["state_dict"].items()
        if name.startswith(MODEL_PREFIX)
    }
    step = raw.get("global_step", 0)
    require(isinstance(step, int) and step >= 0, key, f"{path}: its global_step {step!r} is not a step count")
    if RECORD_KEY in raw:
        saved = raw[RECORD_KEY]
        require(
            isinstance(saved, dict) and isinstance(saved.get("spec"), dict) and isinstance(saved.get("tokenizer"), str),
            key,
            f"{path}: its attnlab record is malformed (no spec or tokenizer); it was not written by this train.py",
        )
        check_record_against_weights(path, saved["spec"], weights, key)
        return RunCheckpoint(path, saved["spec"], saved["tokenizer"], saved.get("data") or {}, weights, step)
    return legacy_checkpoint(path, raw, weights, step)


def check_record_against_weights(path: Path, spec: dict[str, Any], weights: dict[str, Tensor], key: str) -> None:
    """The model a checkpoint's record describes must be the one its weights are: a record is data from a file, so
    its sizes are checked against the tensors (``check_against_weights``) before anything is built."""
    model, attention = spec.get("model"), spec.get("attention")
    require(
        isinstance(model, dict) and isinstance(attention, dict),
        key,
        f"{path}: its record has no model or attention section; it was not written by this train.py",
    )
    try:
        config = ModelConfig.from_dict(model)
    except ConfigError as exc:
        raise ConfigError(key, f"{path}: its record's {exc}") from None
    check_against_weights(config, weights, str(path), key, "record")


def legacy_checkpoint(path: Path, raw: dict[str, Any], weights: dict[str, Tensor], step: int) -> RunCheckpoint:
    """Before the record: hyperparameters in the checkpoint, tokenizer and data config in the run directory."""
    hparams = raw.get("hyper_parameters")
    require(
        isinstance(hparams, dict) and {"model", "attention"} <= set(hparams),
        "ckpt_path",
        f"{path} carries neither attnlab's record nor its hyperparameters; it was not written by train.py",
    )
    run_dir = path.resolve().parent.parent
    tokenizer_file = run_dir / "tokenizer.json"
    tokenizer_json = tokenizer_file.read_text() if tokenizer_file.is_file() else None
    if tokenizer_json is None and hparams["model"].get("tokenizer"):
        tokenizer_json = load_pretrained_tokenizer(hparams["model"]["tokenizer"]).to_str()
    from omegaconf import OmegaConf

    config_file = run_dir / ".hydra" / "config.yaml"
    data = OmegaConf.load(config_file).get("data") if config_file.is_file() else None
    data = data_identity(OmegaConf.to_container(data)) if data is not None else {}
    spec = {
        "model": dict(hparams["model"]),
        "model_request": None,
        "attention": dict(hparams["attention"]),
        "optim": dict(hparams.get("optim") or {}),
        "schedule_steps": None,
    }
    return RunCheckpoint(path, spec, tokenizer_json, data, weights, step, legacy=True)


def same_setting(key: str, ours: Any, theirs: Any) -> bool:
    """Equal, or (``init_from``) the same start run seen from a moved checkout."""
    if key == "init_from" and isinstance(ours, str) and isinstance(theirs, str):
        return start_identity(ours) == start_identity(theirs)
    return ours == theirs


def check_resume(saved: RunCheckpoint, model: dict[str, Any], attention: dict[str, Any], optim: dict[str, Any]) -> None:
    """Resuming continues the same run: a different model, attention or optimiser is an error naming the key."""
    sections = [("attention", attention, saved.spec["attention"]), ("optim", optim, saved.spec["optim"])]
    if saved.spec.get("model_request") is not None:  # legacy checkpoints kept only the built model
        sections.insert(0, ("model", model, saved.spec["model_request"]))
    for section, ours, theirs in sections:
        for key in sorted(set(ours) | set(theirs), key=lambda k: (k != "name", k)):  # a new variant: name first
            if not same_setting(key, ours.get(key), theirs.get(key)):
                raise ConfigError(
                    f"{section}.{key}",
                    f"{ours.get(key)!r} differs from the resumed checkpoint's {theirs.get(key)!r}; resuming "
                    f"(ckpt_path=) continues the same run. To fine-tune from it instead, pass "
                    f"model.init_from={saved.path}",
                )
