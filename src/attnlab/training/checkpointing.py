"""Checkpoints you can trust: atomic writes in place, a periodic and final ``last.ckpt``, RNG state for exact resume.

Lightning's ``ModelCheckpoint`` decides when to save; these classes only close its gaps: the stock IO writes
through ``$TMPDIR`` and copies over the old file (a kill mid-copy leaves a truncated ``last.ckpt``), step and
time triggers are mutually exclusive, the end of fit is saved only if nothing was saved before, and the global
RNG states are not part of a checkpoint.
"""

from __future__ import annotations

import os
import random
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import lightning as L
import numpy as np
import torch
from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO
from lightning.fabric.utilities.types import _PATH
from lightning.pytorch.callbacks import Callback, ModelCheckpoint
from lightning.pytorch.trainer.states import TrainerFn
from lightning.pytorch.utilities.rank_zero import rank_zero_info, rank_zero_warn

from attnlab.errors import require
from attnlab.files import write_atomic

VALIDATION_PROGRESS = "epoch_loop.val_loop.batch_progress"  # the fit loop's validation batches in a checkpoint


class CheckpointWriteError(OSError):
    """A checkpoint could not be written; the destination holds the previous file (or none), never a partial one."""

    def __init__(self, path: _PATH, cause: OSError) -> None:
        super().__init__(cause.errno, f"could not write checkpoint {path}: {cause.strerror or cause}")
        self.path = str(path)


class NonFiniteError(RuntimeError):
    """The loss or a gradient was NaN/Inf at ``step``; no optimizer step was taken with it."""

    def __init__(self, step: int, what: str) -> None:
        super().__init__(f"non-finite {what} at step {step}")
        self.step = step


class AtomicCheckpointIO(TorchCheckpointIO):
    """``torch.save`` through ``write_atomic``: a temp file beside the target, fsync, ``os.replace``, fsync the
    directory, so a reader (or a kill at any instant) sees either the complete old checkpoint or the complete new one.
    """

    def save_checkpoint(self, checkpoint: dict[str, Any], path: _PATH, storage_options: Any | None = None) -> None:
        if storage_options is not None:
            raise TypeError(f"{type(self).__name__} does not take storage_options")
        target = Path(path)
        try:
            write_atomic(target, lambda fh: torch.save(checkpoint, fh))
        except (OSError, RuntimeError) as exc:
            # torch.save reports a failed write from its zip writer as a RuntimeError caused by the OSError
            cause = exc if isinstance(exc, OSError) else exc.__context__
            if not isinstance(cause, OSError):
                raise
            raise CheckpointWriteError(target, cause) from exc


class LastCheckpoint(ModelCheckpoint):
    """``last.ckpt`` = the latest state: every ``every_n_train_steps`` steps, every ``every_minutes`` minutes,
    at the end of fit and when fit is interrupted (SIGTERM, SIGINT, an exception) -- never on a non-finite stop.

    Independent of validation (no monitor); keep a monitored ``ModelCheckpoint`` beside it for the best model.
    """

    def __init__(self, dirpath: str, every_n_train_steps: int = 100, every_minutes: float | None = 30.0) -> None:
        require(
            isinstance(every_n_train_steps, int) and every_n_train_steps >= 1,
            "callbacks.last_checkpoint.every_n_train_steps",
            f"must be an integer >= 1 (a run that never saves loses everything), got {every_n_train_steps!r}",
        )
        require(
            every_minutes is None or every_minutes > 0,
            "callbacks.last_checkpoint.every_minutes",
            f"must be a positive number of minutes or null (steps only), got {every_minutes!r}",
        )
        super().__init__(
            dirpath=dirpath,
            monitor=None,
            save_top_k=0,
            save_last=True,
            every_n_train_steps=every_n_train_steps,
            enable_version_counter=False,
        )
        self.every_seconds = None if every_minutes is None else timedelta(minutes=every_minutes).total_seconds()
        self._last_save_time = time.monotonic()
        self._validation_cut = False  # a stop came inside a validation of fit: the save being made is its step's

    @property
    def state_key(self) -> str:
        return self._generate_state_key(role="last")  # the same state when the intervals change on resume

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        super().on_train_start(trainer, pl_module)
        self._last_save_time = time.monotonic()
        self._last_global_step_saved = trainer.global_step  # a resumed run's start is already on disk
        if trainer.is_global_zero and self.dirpath is not None:
            remove_partial_saves(Path(self.dirpath))

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, *args: Any, **kwargs: Any) -> None:
        super().on_train_batch_end(trainer, pl_module, *args, **kwargs)  # the every-N-steps trigger
        if self.every_seconds is not None:
            due = trainer.strategy.broadcast(time.monotonic() - self._last_save_time >= self.every_seconds)
            if due:
                self.save_last_now(trainer)

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.save_last_now(trainer)
        if trainer.is_global_zero:
            self.share_with_best(trainer)

    def share_with_best(self, trainer: L.Trainer) -> None:
        """A run whose last validation is its best ends with the best checkpoint and ``last.ckpt`` of the same step:
        the same weights and optimizer twice (64 MB each for model=tiny). The best's name then becomes a hard link to
        ``last.ckpt`` (one file, both names; the next save of either replaces its own name, never the other's file).
        Where links are not possible (another filesystem, object storage) both copies stay."""
        last = Path(self.last_model_path) if self.last_model_path else None
        if last is None or not last.is_file():
            return
        for callback in trainer.checkpoint_callbacks:
            same_step = callback._last_global_step_saved == trainer.global_step
            if callback is self or not same_step or not callback.best_k_models:
                continue
            saved_now = Path(max(callback.best_k_models, key=lambda path: Path(path).stat().st_mtime_ns))
            if saved_now == last or not saved_now.is_file() or saved_now.stat().st_ino == last.stat().st_ino:
                continue
            link = saved_now.with_name(f".{saved_now.name}.link.tmp")  # (remove_partial_saves' pattern)
            try:
                os.link(last, link)
                os.replace(link, saved_now)
            except OSError:
                link.unlink(missing_ok=True)

    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException) -> None:
        if isinstance(exception, NonFiniteError | CheckpointWriteError) or trainer.global_step == 0:
            return  # keep the last finite (and complete) checkpoint as it is
        self._validation_cut = trainer.state.fn == TrainerFn.FITTING and trainer.validating
        try:  # a step saved before its validation was cut is saved again: that save resumes past the validation
            self.save_last_now(trainer, even_if_saved=self._validation_cut)
        except Exception as failure:  # the run's own exception is what to report; a failed save must not replace it
            # (FSDP's optimizer state cannot be gathered after a crash inside its forward: H100, 2026-11-22)
            rank_zero_warn(
                f"Could not save step {trainer.global_step} after {type(exception).__name__}: "
                f"{type(failure).__name__}: {failure}; {describe_last_checkpoint(trainer)}"
            )
        finally:
            self._validation_cut = False

    def on_save_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict) -> None:
        if self._validation_cut:
            redo_cut_validation(checkpoint["loops"]["fit_loop"])

    def save_last_now(self, trainer: L.Trainer, even_if_saved: bool = False) -> None:
        """Save ``last.ckpt`` unless this step is already on disk (``even_if_saved``: again) or the run is a
        fast_dev_run."""
        if trainer.fast_dev_run or trainer.sanity_checking:
            return
        if self._last_global_step_saved == trainer.global_step and not even_if_saved:
            return
        self._save_last_checkpoint(trainer, self._monitor_candidates(trainer))

    def _save_checkpoint(self, trainer: L.Trainer, filepath: str) -> None:
        super()._save_checkpoint(trainer, filepath)
        self._last_save_time = time.monotonic()
        rank_zero_info(f"Saved step {trainer.global_step} to {filepath}")


def redo_cut_validation(fit_loop_state: dict) -> None:
    """Rewrite a fit loop's saved state so that the validation a stop cut short is made again on resume, whole.

    Lightning stops a validation at a SIGTERM once a batch is done, and a checkpoint saved then records that batch as
    completed; a run resumed from it counts the validation as made and trains on, so the curves lose that step's
    validation (and the outlier and sink measurements made with it). Recorded instead as stopped inside its first
    batch (batches ready and started one past those processed), the state Lightning restores as "restarted mid
    evaluation", the resumed run validates that step from its first batch before it trains on."""
    progress = fit_loop_state[VALIDATION_PROGRESS]
    before = {key: progress["total"][key] - progress["current"][key] for key in progress["total"]}
    progress["total"] = before | {"ready": before["ready"] + 1, "started": before["started"] + 1}
    progress["current"] = {"ready": 1, "started": 1, "processed": 0, "completed": 0}
    progress["is_last_batch"] = False


class RngStates(Callback):
    """Global torch / numpy / Python RNG states in the checkpoint (plain tensors and ints, loadable weights-only)."""

    def on_save_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict) -> None:
        name, keys, pos, has_gauss, cached_gaussian = np.random.get_state()
        version, python_state, gauss = random.getstate()
        checkpoint["rng_states"] = {
            "torch": torch.get_rng_state(),
            "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
            "numpy": {
                "name": name,
                "keys": torch.from_numpy(keys.astype(np.int64)),
                "pos": int(pos),
                "has_gauss": int(has_gauss),
                "cached_gaussian": float(cached_gaussian),
            },
            "python": {"version": version, "state": list(python_state), "gauss": gauss},
        }

    def on_load_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict) -> None:
        states = checkpoint.get("rng_states")
        if states is None:  # a checkpoint from before RNG states were saved: resume, but not bit-exactly
            return
        torch.set_rng_state(states["torch"])
        if states["cuda"] and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(states["cuda"])
        numpy = states["numpy"]
        keys = numpy["keys"].numpy().astype(np.uint32)
        np.random.set_state((numpy["name"], keys, numpy["pos"], numpy["has_gauss"], numpy["cached_gaussian"]))
        python = states["python"]
        random.setstate((python["version"], tuple(python["state"]), python["gauss"]))


def last_checkpoint_path(trainer: L.Trainer) -> str | None:
    """The run's ``last.ckpt`` if one was written (by ``LastCheckpoint``), else None."""
    for callback in trainer.checkpoint_callbacks:
        if isinstance(callback, LastCheckpoint) and callback.last_model_path:
            return callback.last_model_path if Path(callback.last_model_path).is_file() else None
    return None


def describe_last_checkpoint(trainer: L.Trainer, note: str = "") -> str:
    """Where the latest complete state is, in words."""
    path = last_checkpoint_path(trainer)
    if path is None:
        return "no checkpoint was saved"
    step = next(c._last_global_step_saved for c in trainer.checkpoint_callbacks if isinstance(c, LastCheckpoint))
    return f"last.ckpt holds step {step}{note}: resume with ckpt_path={path}"


def remove_partial_saves(directory: Path) -> list[Path]:
    """The temporary files of saves that a kill cut short (``AtomicCheckpointIO``'s ``.<name>.*.tmp``): never a
    checkpoint, and nothing else writes into a run's own ``checkpoints/`` while it trains, so a starting or resumed
    run removes them and says so."""
    removed = sorted(directory.glob(".*.ckpt.*.tmp")) if directory.is_dir() else []
    for path in removed:
        path.unlink(missing_ok=True)
        rank_zero_info(f"Removed {path.name}: a checkpoint save that was cut short (the checkpoint itself is whole)")
    return removed
