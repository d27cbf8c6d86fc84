"""What a run does when it cannot go on normally: a non-finite loss or gradient, a signal, a failed checkpoint write.

Each ends the run with one line saying what happened and which step ``last.ckpt`` holds, and a non-zero exit.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities.exceptions import SIGTERMException
from torch import Tensor

from attnlab.errors import require, require_choice
from attnlab.training.checkpointing import (
    CheckpointWriteError,
    NonFiniteError,
    describe_last_checkpoint,
)

log = logging.getLogger(__name__)

ON_NONFINITE = ("stop", "skip")


class RunStopped(RuntimeError):
    """The run ended early (signal, non-finite values, a failed write); the message is the one line to print.

    ``signal_number``: the signal that stopped it from outside (SIGTERM, SIGINT), so a sweep must stop too rather
    than start its next job, and the process exits with the shell's status for it (128 + the signal).
    """

    def __init__(self, message: str, signal_number: int | None = None) -> None:
        super().__init__(message)
        self.signal_number = signal_number

    @property
    def interrupted(self) -> bool:
        return self.signal_number is not None

    @property
    def exit_status(self) -> int:
        return 1 if self.signal_number is None else 128 + self.signal_number


class NonFiniteGuard(Callback):
    """Before every optimizer step: stop on a NaN/Inf loss or gradient, or (``action=skip``) drop that batch's
    update, stopping once more than ``max_skipped`` batches were dropped. Parameters never take a non-finite step.
    """

    def __init__(self, action: str = "stop", max_skipped: int = 10) -> None:
        require_choice(action, ON_NONFINITE, "callbacks.nonfinite_guard.action")
        require(
            isinstance(max_skipped, int) and max_skipped >= 0,
            "callbacks.nonfinite_guard.max_skipped",
            f"must be an integer >= 0, got {max_skipped!r}",
        )
        self.action, self.max_skipped = action, max_skipped
        self.skipped = 0
        self._losses_finite: list[Tensor] = []  # one flag per micro-batch since the last optimizer step

    def on_before_backward(self, trainer: L.Trainer, pl_module: L.LightningModule, loss: Tensor) -> None:
        self._losses_finite.append(torch.isfinite(loss.detach()).all())

    def on_before_optimizer_step(
        self, trainer: L.Trainer, pl_module: L.LightningModule, optimizer: torch.optim.Optimizer
    ) -> None:
        grads = [p.grad for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
        grad_norms = torch.stack(torch._foreach_norm(grads)) if grads else torch.zeros(1)
        losses = torch.stack(self._losses_finite) if self._losses_finite else torch.ones(1, dtype=torch.bool)
        self._losses_finite = []
        loss_finite = bool(losses.all())  # a few flags synced per optimizer step, not one per tensor
        finite = trainer.strategy.reduce_boolean_decision(
            loss_finite and bool(torch.isfinite(grad_norms).all()), all=True
        )
        if finite:
            return
        what = "loss" if not loss_finite else "gradient"
        step = trainer.global_step + 1  # the step this update would have made
        if self.action == "skip" and self.skipped < self.max_skipped:
            self.skipped += 1
            log.warning(
                "Skipping the update of step %d: non-finite %s (%d/%d)", step, what, self.skipped, self.max_skipped
            )
            optimizer.zero_grad(set_to_none=True)  # parameters without a gradient are left alone by the optimizer
            return
        raise NonFiniteError(step, what)


def at_last_step(trainer: L.Trainer) -> bool:
    """Whether the fit has made its last optimizer step (``max_steps`` -1: no step limit)."""
    return 0 <= trainer.max_steps <= trainer.global_step


class ValidateAtEnd(Callback):
    """Ask for a validation after the last optimizer step, so the final metrics are the final model's."""

    def on_train_batch_end(self, trainer: L.Trainer, *args: object, **kwargs: object) -> None:
        if at_last_step(trainer):
            trainer.should_stop = True  # Lightning validates when a stop is requested (training_epoch_loop)


def final_validation_missing(trainer: L.Trainer) -> bool:
    """Whether a fit ended at its last step without validating: resumed there (a stop had cut that step's
    validation short, or the run had finished), it trained nothing, and Lightning validates only after a step it
    trains, so ``results.json`` would report no validation."""
    validates = trainer.limit_val_batches != 0
    return validates and at_last_step(trainer) and "val/loss" not in trainer.callback_metrics


class CtrlCAtStepEnd(Callback):
    """Ctrl-C stops as SIGTERM does: it is turned into Lightning's own SIGTERM handling, which stops at the end of
    the running step, so last.ckpt holds a whole step and the resumed run repeats the uninterrupted losses (a bare
    KeyboardInterrupt lands mid-step). A second Ctrl-C stops at once, with what Lightning sees at that moment."""

    def __init__(self) -> None:
        self.pressed = False
        self._previous: Any = None

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if threading.current_thread() is threading.main_thread():  # only it may set signal handlers
            self._previous = signal.signal(signal.SIGINT, self._on_sigint)

    def _on_sigint(self, _signal_number: int, _frame: object) -> None:
        if self.pressed:
            raise KeyboardInterrupt
        self.pressed = True
        log.info("Ctrl-C: stopping at the end of this step and saving it (Ctrl-C again stops at once)")
        os.kill(os.getpid(), signal.SIGTERM)

    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)
            self._previous = None


def ctrl_c_pressed(trainer: L.Trainer) -> bool:
    return any(isinstance(c, CtrlCAtStepEnd) and c.pressed for c in trainer.callbacks)


@contextmanager
def stop_cleanly(trainer: L.Trainer) -> Iterator[None]:
    """Turn the ways a fit ends early into ``RunStopped`` with one line naming the step and the checkpoint."""
    try:
        yield
    except SIGTERMException as exc:
        if ctrl_c_pressed(trainer):
            message = f"trainer: interrupted at step {trainer.global_step}; {describe_last_checkpoint(trainer)}"
            raise RunStopped(message, signal.SIGINT) from exc
        raise RunStopped(
            f"trainer: stopped by SIGTERM at step {trainer.global_step}; {describe_last_checkpoint(trainer)}",
            signal.SIGTERM,
        ) from exc
    except SystemExit as exc:  # Lightning turns Ctrl-C (SIGINT) into sys.exit(1) after its on_exception hooks
        if not trainer.interrupted:
            raise
        message = f"trainer: interrupted at step {trainer.global_step}; {describe_last_checkpoint(trainer)}"
        raise RunStopped(message, signal.SIGINT) from exc
    except NonFiniteError as exc:
        hint = "callbacks.nonfinite_guard.action=skip drops such updates, or lower optim.lr"
        raise RunStopped(
            f"trainer: {exc} ({hint}); {describe_last_checkpoint(trainer, ', the last finite state')}"
        ) from exc
    except CheckpointWriteError as exc:
        raise RunStopped(f"checkpoint: {exc.strerror}; {describe_last_checkpoint(trainer)}") from exc
