"""What ``train.py`` and ``evaluate.py`` check before they write anything: the config (``config_checks``), the
run directory (``run_directory``), and the Hydra callback that runs both before Hydra makes the directory; also the
typed optimiser spec a run trains with.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, ClassVar

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf, open_dict, read_write

from attnlab.config_checks import check_evaluate_config, check_run_config, check_seed, positive_int, typed
from attnlab.configs import plain
from attnlab.errors import ConfigError, require, require_choice
from attnlab.run_directory import (
    LAST_CHECKPOINT,
    check_run_directory,
    check_writable,
    claim_run_directory,
    in_multirun,
    record_existing,
)

SCHEDULES = ("cosine", "constant")
# Variants made for the SSA paper's synthetic tables (`make reproduce-table1/2`), not for
# language data: a temperature looked up per graph node, and an oracle that reads one-hot signal tokens.
SYNTHETIC_ONLY_ATTENTION = ("temp_lookup", "value_select")
SAFE_NAME = re.compile(r"[^\W_][\w.=,+-]*")  # letters (any script), digits, then also . _ = , + -
NAME_BYTES = 200  # a directory name is at most 255 bytes; a sweep's job directories add to it
RESUME_LAST = "last"  # ckpt_path=last: the newest last.ckpt among the experiment's runs (resolve_last_checkpoint)


@dataclass(frozen=True)
class OptimSpec:
    """AdamW and its warmup + cosine schedule; ``__post_init__`` checks every range with the key's name."""

    lr: float = 2e-3
    beta1: float = 0.9
    beta2: float = 0.95
    eps: float = 1e-8
    weight_decay: float = 0.1
    warmup_steps: int = 30
    min_lr_ratio: float = 0.1
    schedule: str = "cosine"

    def __post_init__(self) -> None:
        require(self.lr > 0, "optim.lr", f"must be a positive number, got {self.lr}")
        for key in ("beta1", "beta2"):
            value = getattr(self, key)
            require(0 <= value < 1, f"optim.{key}", f"must be in [0, 1), got {value}")
        require(self.eps > 0, "optim.eps", f"must be a positive number, got {self.eps}")
        require(self.weight_decay >= 0, "optim.weight_decay", f"must be >= 0, got {self.weight_decay}")
        require(self.warmup_steps >= 0, "optim.warmup_steps", f"must be an integer >= 0, got {self.warmup_steps}")
        require(0 <= self.min_lr_ratio <= 1, "optim.min_lr_ratio", f"must be in [0, 1], got {self.min_lr_ratio}")
        require_choice(self.schedule, SCHEDULES, "optim.schedule")


def optim_spec(values: dict[str, Any]) -> OptimSpec:
    """The optimiser section, typed: unknown keys and values of the wrong type are errors naming the key."""
    known = {f.name: f for f in fields(OptimSpec)}
    unknown = sorted(set(values) - set(known))
    require(not unknown, f"optim.{unknown[0] if unknown else ''}", f"unknown key; allowed: {', '.join(known)}")
    kinds = {"float": float, "int": int, "str": str}
    checked = {
        key: typed(value, kinds[known[key].type], f"optim.{key}", f"must be a {known[key].type}")
        for key, value in values.items()
    }
    return OptimSpec(**checked)


def check_common(cfg: DictConfig) -> None:
    """What both entry points check: a run directory that stays under outputs/, the checkpoint."""
    name = str(cfg.get("experiment_name"))
    require(
        SAFE_NAME.fullmatch(name) is not None and ".." not in name,
        "experiment_name",
        f"a plain directory name (letters, digits, . _ = , + -; no '/' or '..'), got {name!r}",
    )
    size = len(name.encode())
    require(size <= NAME_BYTES, "experiment_name", f"at most {NAME_BYTES} bytes (a directory name), got {size}")
    ckpt_path = cfg.get("ckpt_path")
    if ckpt_path:
        require(Path(ckpt_path).is_file(), "ckpt_path", f"no checkpoint file at {ckpt_path}")


def resolve_last_checkpoint(cfg: DictConfig) -> None:
    """``ckpt_path=last`` -> the newest (last written) ``checkpoints/last.ckpt`` among the single runs of this
    experiment, ``<paths.log_dir>/<experiment_name>/<run>/``, written back into ``cfg`` (the run's saved config names
    the file it resumed). A sweep's jobs are other cells: each resumes its own with ``ckpt_path=${resume_ckpt:}``."""
    if cfg.get("ckpt_path") != RESUME_LAST:
        return
    require(
        not in_multirun(),
        "ckpt_path",
        "last picks one run's checkpoint for every job of a -m sweep; use ckpt_path=${resume_ckpt:} (each job its own)",
    )
    experiment = Path(cfg.paths.log_dir) / str(cfg.experiment_name)
    found = sorted(experiment.glob(f"*/{LAST_CHECKPOINT}"), key=lambda path: (path.stat().st_mtime, str(path)))
    require(
        bool(found),
        "ckpt_path",
        f"last: no run of experiment_name={cfg.experiment_name} has saved a {LAST_CHECKPOINT} under {experiment}",
    )
    with read_write(cfg), open_dict(cfg):
        cfg.ckpt_path = str(found[-1])


def validate_train_config(cfg: DictConfig, check_machine: bool = True) -> OptimSpec:
    """Everything ``train.py`` can check before it writes anything; returns the typed optimiser spec.
    ``check_machine=False``: not whether the devices and files the config names are on this machine now."""
    resolve_last_checkpoint(cfg)
    check_seed(cfg)
    check_common(cfg)
    positive_int(cfg.data.get("batch_size"), "data.batch_size")
    for flag in ("compile", "fused_loss"):
        value = cfg.get(flag, False)
        require(isinstance(value, bool), flag, f"must be true or false, got {value!r}")
    name = OmegaConf.select(cfg, "attention.name")
    if name in SYNTHETIC_ONLY_ATTENTION:
        from attnlab.attention import available_attention

        allowed = [n for n in available_attention() if n not in SYNTHETIC_ONLY_ATTENTION]
        raise ConfigError(
            "attention",
            f"{name} is made for the synthetic tables (make reproduce-table1, reproduce-table2), not for language "
            f"data; allowed here: {', '.join(allowed)}",
        )
    spec = optim_spec(plain(cfg.optim))  # before the run config's checks, whose data and callback targets import
    check_run_config(cfg, machine=check_machine)  # Lightning (seconds): a bad value above is refused at once
    return spec


class ValidateBeforeWriting(Callback):
    """Hydra callback: check a single run's config before Hydra creates its directory, so a bad value writes
    nothing. (A sweep's jobs are checked by the task, which then removes the stub Hydra made.)"""

    CHECKS: ClassVar[dict[str, Callable[[DictConfig], Any]]] = {
        "train": validate_train_config,
        "evaluate": lambda cfg: (check_common(cfg), check_evaluate_config(cfg)),
    }

    def __init__(self, entry: str) -> None:
        require_choice(entry, tuple(self.CHECKS), "hydra.callbacks.validate.entry")
        self.entry = entry

    def check(self, config: DictConfig) -> None:
        """Raise ``ConfigError`` for a bad value or run directory (what ``attnlab.train`` / ``evaluate`` raise)."""
        directory = Path(OmegaConf.select(config, "hydra.run.dir"))
        record_existing(directory)
        primary = config.hydra.output_subdir is not None  # not a DDP rank > 0 in rank 0's directory
        if self.entry == "train":
            resolve_last_checkpoint(config)  # before the directory check: it may be the run's own last.ckpt
        if self.entry == "train" and primary:
            check_run_directory(directory, config.get("ckpt_path"))
        self.CHECKS[self.entry](config)
        if primary:  # before Hydra writes .hydra/ and the log into it
            check_writable(directory, "hydra.run.dir")
        if self.entry == "train" and primary:
            claim_run_directory(directory, "hydra.run.dir")

    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        """The command line's: one line and a non-zero exit, before Hydra writes anything."""
        try:
            self.check(config)
        except ConfigError as exc:
            raise SystemExit(f"error: {exc}") from None
