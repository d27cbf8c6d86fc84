"""A run's layout, in one place: what a checkpoint carries, how it is read back, and the typed run spec.

Training stores a record inside every Lightning checkpoint (``checkpoint[RECORD_KEY]``): the run spec (model,
attention, optimiser and schedule horizon as plain dicts), the tokenizer (its JSON) and the data identity (what
rebuilds the held-out split). ``load_checkpoint`` reads it back with one ``torch.load(weights_only=True)`` and no
Lightning, so a checkpoint copied alone anywhere evaluates, fine-tunes or resumes, and no code inside it runs.
"""

from __future__ import annotations

import json
import logging
import math
import os
import pickle
import re
import shutil
import tempfile
import zipfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, ClassVar

from hydra.core.hydra_config import HydraConfig
from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf, open_dict, read_write

from attnlab.config_checks import check_evaluate_config, check_run_config, check_seed, positive_int, typed
from attnlab.digest import start_identity
from attnlab.errors import ConfigError, require, require_choice
from attnlab.files import write_atomic

if TYPE_CHECKING:
    from tokenizers import Tokenizer
    from torch import Tensor

    from attnlab.models import GPT

log = logging.getLogger(__name__)

RECORD_KEY = "attnlab"
RECORD_FORMAT = 1
MODEL_PREFIX = "model."  # the LightningModule holds the GPT as ``self.model``
# Data settings that do not change which documents are held out or how they are tokenized.
DATA_RUNTIME_KEYS = ("_target_", "batch_size", "num_workers", "cache_dir", "shuffle_seed", "shuffle_buffer")
SCHEDULES = ("cosine", "constant")
# Variants made for the SSA paper's synthetic tables (`make reproduce-table1/2`), not for
# language data: a temperature looked up per graph node, and an oracle that reads one-hot signal tokens.
SYNTHETIC_ONLY_ATTENTION = ("temp_lookup", "value_select")
SAFE_NAME = re.compile(r"[^\W_][\w.=,+-]*")  # letters (any script), digits, then also . _ = , + -
NAME_BYTES = 200  # a directory name is at most 255 bytes; a sweep's job directories add to it
# Inside a run directory: the latest state (always written) and the final metrics (written once, when fit ends).
LAST_CHECKPOINT = Path("checkpoints") / "last.ckpt"
RESULTS_FILE = "results.json"
RESUME_LAST = "last"  # ckpt_path=last: the newest last.ckpt among the experiment's runs (resolve_last_checkpoint)


# ------------------------------------------------------------------------------------------------ directories


def plain(node: Any) -> Any:
    """A resolved config node as plain Python (dicts and lists), what specs and checkpoints hold."""
    return OmegaConf.to_container(node, resolve=True) if isinstance(node, DictConfig) else node


def output_dir(cfg: DictConfig) -> Path:
    """The run's own directory: Hydra's when running under it, else ``paths.output_dir``."""
    if HydraConfig.initialized():
        return Path(HydraConfig.get().runtime.output_dir)
    return Path(cfg.paths.output_dir)


@contextmanager
def locked(path: Path, mode: str = "a+") -> Iterator[IO[str]]:
    """``path`` opened in ``mode`` (created if missing) under an exclusive ``flock`` until it is closed, so writers
    that share a file (sweep jobs, evaluations) take turns on the file itself and no ``.lock`` file is left beside
    it. A writer that replaces the file (``write_atomic``) does so while holding the lock; one that was waiting then
    finds its lock on the old file and opens the new one, so no row goes to a file that is no longer there."""
    import fcntl

    path.parent.mkdir(parents=True, exist_ok=True)
    while True:
        fh = path.open(mode, newline="")
        fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
        try:
            current = path.stat().st_ino == os.fstat(fh.fileno()).st_ino
        except FileNotFoundError:
            current = False
        if current:
            break
        fh.close()
    with fh:  # closing the file releases the lock
        yield fh


# run directory -> the names it held before Hydra wrote into it (recorded by ValidateBeforeWriting); a directory
# that is not here did not exist before this run
EXISTING_BEFORE: dict[str, set[str]] = {}
# run directory -> its nearest ancestor that existed before this run (the parents made for it are removed with it)
EXISTING_ANCESTOR: dict[str, Path] = {}


def record_existing(directory: Path) -> None:
    """What was there before Hydra makes ``directory`` (its entries, the ancestor it will be made under), so that a
    refused run removes what it made and nothing else."""
    resolved = directory.resolve()
    if directory.is_dir():
        EXISTING_BEFORE[str(resolved)] = {entry.name for entry in directory.iterdir()}
    EXISTING_ANCESTOR[str(resolved)] = next(parent for parent in (resolved, *resolved.parents) if parent.exists())


def remove_stub(directory: Path) -> None:
    """Remove what Hydra wrote before the task failed (``.hydra/``, the job's log), and the directory itself only
    if this run created it: a directory that was there before (a user's own, passed as ``hydra.run.dir``) keeps
    everything it held."""
    if not directory.is_dir():
        return
    before = EXISTING_BEFORE.get(str(directory.resolve()))
    created = [entry for entry in directory.iterdir() if before is None or entry.name not in before]
    if not all(entry.name == ".hydra" or (entry.is_file() and entry.suffix == ".log") for entry in created):
        return
    if before is None:
        shutil.rmtree(directory)
        remove_empty_parents(directory)
        return
    for entry in created:
        shutil.rmtree(entry) if entry.is_dir() else entry.unlink()


def remove_empty_parents(directory: Path) -> None:
    """The parents made for a removed run directory (``outputs/``, ``outputs/eval/``), while they are empty and below
    the nearest ancestor that existed before the run."""
    resolved = directory.resolve()
    existing = EXISTING_ANCESTOR.get(str(resolved))
    if existing is None:
        return
    for parent in resolved.parents:
        if parent == existing or not parent.is_relative_to(existing):
            return
        try:
            parent.rmdir()
        except OSError:  # not empty (another run's, a user's file) or gone: it stays
            return


def check_writable(directory: Path, key: str) -> None:
    """The run directory can be made and written (a read-only or full filesystem), found before Hydra writes its
    files there with a traceback: the directory is made, a page written, flushed and removed."""
    try:
        directory.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=directory) as probe:
            probe.write(b"\0" * 4096)
            probe.flush()
            os.fsync(probe.fileno())
    except OSError as exc:
        raise ConfigError(key, f"cannot write in {directory}: {exc.strerror or exc}") from None


# run directory -> an open descriptor holding its flock while this process trains in it
CLAIMED: dict[str, int] = {}


class RunDirectoryInUse(ConfigError):
    """Another process trains in the directory now: this process refuses it, and nothing there is its to remove
    (a sweep reports the job as held elsewhere, not as failed)."""


def claim_run_directory(directory: Path, key: str) -> None:
    """Hold an exclusive ``flock`` on the run directory while this process trains in it, so a second process (a
    second table sharing the cell, the same resume typed twice) is refused instead of writing into the same files.
    The kernel drops the lock when the process ends, however it ends; a claim this process holds is kept."""
    import fcntl

    resolved = str(directory.resolve())
    if resolved in CLAIMED:
        return
    directory.mkdir(parents=True, exist_ok=True)
    descriptor = os.open(directory, os.O_RDONLY)
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(descriptor)
        raise RunDirectoryInUse(
            key,
            f"{directory} is in use: another process is training in it now; wait for it to end (its last.ckpt resumes "
            "it), or choose another directory",
        ) from None
    except OSError as exc:  # a filesystem without flock on directories (some NFS mounts): train unclaimed, and say so
        os.close(descriptor)
        log.warning("%s cannot be claimed (%s): two processes could train in it at once", directory, exc.strerror)
        return
    CLAIMED[resolved] = descriptor


def release_run_directory(directory: Path) -> None:
    descriptor = CLAIMED.pop(str(directory.resolve()), None)
    if descriptor is not None:
        os.close(descriptor)


def run_directory_in_use(directory: Path) -> bool:
    """Whether another process holds the directory's claim now (this one's own claims do not count)."""
    import fcntl

    if not directory.is_dir() or str(directory.resolve()) in CLAIMED:
        return False
    descriptor = os.open(directory, os.O_RDONLY)
    try:
        fcntl.flock(descriptor, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    except OSError:  # no flock on this filesystem: no claim can be seen either
        return False
    finally:
        os.close(descriptor)  # closing drops the shared lock just taken
    return False


def check_run_directory(directory: Path, ckpt_path: str | None) -> None:
    """A new run never writes into another run's directory: one that finished (``results.json``) or holds a run's
    checkpoints is refused, unless this run resumes from that directory's own checkpoint."""
    finished, saved = (directory / RESULTS_FILE).is_file(), (directory / LAST_CHECKPOINT).is_file()
    if not (finished or saved):
        return
    resuming_here = bool(ckpt_path) and Path(ckpt_path).resolve().is_relative_to(directory.resolve())
    what = "a finished run (results.json)" if finished else "a run's checkpoints (checkpoints/last.ckpt)"
    require(
        resuming_here,
        "hydra.run.dir",
        f"{directory} holds {what}; a new run would overwrite it. Choose another directory, or continue that run "
        f"with ckpt_path={directory / LAST_CHECKPOINT}",
    )


# ------------------------------------------------------------------------------------------------ run spec


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
    from attnlab.training.sweeps import in_multirun  # (it imports this module)

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
    check_run_config(cfg, machine=check_machine)
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
    return optim_spec(plain(cfg.optim))


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


def write_results(path: Path, results: dict[str, Any]) -> None:
    """``results.json`` as strict JSON: a NaN or infinite number becomes null and is listed under ``non_finite``."""
    non_finite: list[str] = []

    def finite(value: Any, key: str) -> Any:
        if isinstance(value, dict):
            return {k: finite(v, f"{key}.{k}" if key else str(k)) for k, v in value.items()}
        if isinstance(value, list):
            return [finite(v, f"{key}[{i}]") for i, v in enumerate(value)]
        if isinstance(value, float) and not math.isfinite(value):
            non_finite.append(key)
            return None
        return value

    cleaned = finite(results, "")
    if non_finite:
        cleaned["non_finite"] = non_finite
    write_atomic(path, json.dumps(cleaned, indent=2, allow_nan=False, default=str))


# ------------------------------------------------------------------------------------------------ checkpoints


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
        from attnlab.models.builder import build_gpt

        return build_gpt(self.spec["model"], self.spec["attention"], weights=self.state_dict)


def read_checkpoint_file(path: Path, key: str = "ckpt_path") -> dict[str, Any]:
    """One ``torch.load`` with ``weights_only=True``: tensors and plain data only, never code from the file.
    ``key``: the config key that named the file, for the error line."""
    import torch  # (here: Hydra's plugin discovery imports this module for every command, ``--help`` included)

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
    from attnlab.models.config import ModelConfig
    from attnlab.models.sizes import check_against_weights

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
        from attnlab.data.tokenizer import load_pretrained_tokenizer

        tokenizer_json = load_pretrained_tokenizer(hparams["model"]["tokenizer"]).to_str()
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
