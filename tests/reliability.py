"""Helpers for the reliability tests: run train.py as a user would, in a subprocess, and read what it logged."""

from __future__ import annotations

import csv
import os
import signal
import subprocess
import sys
from pathlib import Path

from lightning.pytorch.callbacks import Callback

from tests.conftest import MICRO_DATA, MICRO_MODEL, ROOT

# every step logged, last.ckpt every 4 steps, validation every 5
TINY_RUN = [
    *MICRO_MODEL,
    *MICRO_DATA,
    "trainer=cpu",
    "callbacks.progress_bar.refresh_rate=0",
    "trainer.limit_val_batches=2",
    "trainer.log_every_n_steps=1",
    "trainer.val_check_interval=5",
    "callbacks.last_checkpoint.every_n_train_steps=4",
    "optim.warmup_steps=3",
]


def train_command(overrides: list[str], run_dir: Path, cache_dir: Path) -> list[str]:
    return [
        sys.executable,
        "train.py",
        *TINY_RUN,
        *overrides,
        f"hydra.run.dir={run_dir}",
        f"paths.cache_dir={cache_dir}",
    ]


def train(overrides: list[str], run_dir: Path, cache_dir: Path, **kwargs) -> subprocess.CompletedProcess:
    """``python train.py`` to completion (or failure); output captured as text."""
    return subprocess.run(
        train_command(overrides, run_dir, cache_dir), cwd=ROOT, capture_output=True, text=True, timeout=600, **kwargs
    )


def as_background_job(command: list[str]) -> list[str]:
    """``command`` started as a script's ``command &`` starts it (without job control): with SIGINT ignored."""
    return ["bash", "-c", 'trap "" INT; exec "$@"', "bash", *command]


def train_until(
    overrides: list[str], run_dir: Path, cache_dir: Path, line: str, sig: signal.Signals, background: bool = False
) -> str:
    """Start train.py (``background``: as a script's background job), send ``sig`` once its output contains ``line``;
    returns everything it printed."""
    command = train_command(overrides, run_dir, cache_dir)
    proc = subprocess.Popen(
        as_background_job(command) if background else command,
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    seen = []
    for text in proc.stdout:
        seen.append(text)
        if line in text:
            proc.send_signal(sig)
            break
    seen.extend(proc.stdout)
    proc.wait(timeout=120)
    seen.append(f"[exit {proc.returncode}]")
    return "".join(seen)


def step_losses(run_dir: Path, column: str = "train/loss") -> dict[int, float]:
    """``{step: train/loss}`` (or another ``column``) from the run's csv/metrics.csv."""
    rows = csv.DictReader((run_dir / "csv" / "metrics.csv").open())
    return {int(r["step"]): float(r[column]) for r in rows if r.get(column)}


class SigintMidStep(Callback):
    """Sends this process SIGINT from inside optimizer step ``step``, after its batch was drawn and before the update:
    the moment a Ctrl-C is most likely to land (``+callbacks.sigint._target_=tests.reliability.SigintMidStep``)."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_before_optimizer_step(self, trainer: object, pl_module: object, optimizer: object) -> None:
        if trainer.global_step + 1 == self.step:
            os.kill(os.getpid(), signal.SIGINT)


class SigtermMidValidation(Callback):
    """Sends this process SIGTERM after the first batch of the validation at optimizer step ``step``, with more of its
    batches to come: a scheduler's stop landing in a validation
    (``+callbacks.sigterm._target_=tests.reliability.SigtermMidValidation +callbacks.sigterm.step=10``)."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_validation_batch_end(
        self, trainer: object, pl_module: object, outputs: object, batch: object, batch_idx: int
    ) -> None:
        if not trainer.sanity_checking and trainer.global_step == self.step and batch_idx == 0:
            os.kill(os.getpid(), signal.SIGTERM)


class SigkillSweepJob(Callback):
    """SIGKILLs its own process after optimizer step ``step`` in the sweep job run with ``seed=<seed>``: a worker
    taken by the OOM killer (``+callbacks.kill._target_=tests.reliability.SigkillSweepJob +callbacks.kill.seed=2``)."""

    def __init__(self, seed: int, step: int) -> None:
        self.seed, self.step = seed, step

    def on_train_batch_end(self, trainer: object, *args: object) -> None:
        from hydra.core.hydra_config import HydraConfig

        if trainer.global_step >= self.step and f"seed={self.seed}" in HydraConfig.get().overrides.task:
            os.kill(os.getpid(), signal.SIGKILL)
