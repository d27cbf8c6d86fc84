"""Checkpoint writes: atomic in the destination directory, never through $TMPDIR, and a failed write is an error
that leaves the previous checkpoint (or none) and no temp file -- never a truncated file under a valid name."""

from __future__ import annotations

import errno
import os
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch

from attnlab.training import checkpointing
from attnlab.training.checkpointing import AtomicCheckpointIO, CheckpointWriteError

STATE = {"state_dict": {"w": torch.arange(1000.0)}, "global_step": 7}


@contextmanager
def tmpfs(where: Path, options: str) -> Iterator[Path]:
    """A tmpfs at ``where`` (root only); skips the test where the machine does not allow mounting."""
    where.mkdir(parents=True, exist_ok=True)
    if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(where)]).returncode:
        pytest.skip("needs root and mount -t tmpfs")
    try:
        yield where
    finally:
        subprocess.run(["umount", str(where)], check=True)


def test_save_is_a_rename_inside_the_destination_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    other_fs = Path("/dev/shm") if Path("/dev/shm").is_dir() else tmp_path / "tmpdir"
    tmpdir = Path(os.environ.get("ATTNLAB_TEST_TMPDIR", other_fs)) / f"attnlab-{os.getpid()}"
    tmpdir.mkdir(parents=True, exist_ok=True)
    monkeypatch.setenv("TMPDIR", str(tmpdir))
    monkeypatch.setattr("tempfile.tempdir", None)  # re-read $TMPDIR, as a fresh process would
    renames = []
    real_replace = os.replace
    monkeypatch.setattr(os, "replace", lambda src, dst: (renames.append((src, dst)), real_replace(src, dst)))
    target = tmp_path / "checkpoints" / "last.ckpt"
    try:
        AtomicCheckpointIO().save_checkpoint(STATE, target)
        assert not list(tmpdir.iterdir())  # nothing written to (or left in) $TMPDIR
    finally:
        tmpdir.rmdir()
    [(src, dst)] = renames
    assert Path(src).parent == target.parent and Path(dst) == target
    assert torch.load(target, weights_only=True)["global_step"] == 7
    assert [p.name for p in target.parent.iterdir()] == ["last.ckpt"]


def test_overwrite_keeps_the_old_file_until_the_new_one_is_complete(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tmp_path / "last.ckpt"
    AtomicCheckpointIO().save_checkpoint(STATE, target)

    def disk_full(obj: object, fh) -> None:  # writes part of the file, then the disk is full
        fh.write(b"x" * 100)
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(checkpointing.torch, "save", disk_full)
    with pytest.raises(CheckpointWriteError, match="No space left on device"):
        AtomicCheckpointIO().save_checkpoint({**STATE, "global_step": 8}, target)
    assert [p.name for p in tmp_path.iterdir()] == ["last.ckpt"]  # no temp file left behind
    assert torch.load(target, weights_only=True)["global_step"] == 7


def test_a_full_disk_leaves_no_file_named_like_a_checkpoint(tmp_path: Path) -> None:
    with tmpfs(tmp_path / "disk", "size=64k") as disk:
        big = {"w": torch.zeros(100_000)}  # 400 kB into 64 kB
        with pytest.raises(CheckpointWriteError, match="No space left on device"):
            AtomicCheckpointIO().save_checkpoint(big, disk / "checkpoints" / "last.ckpt")
        assert list((disk / "checkpoints").iterdir()) == []


def test_an_unwritable_directory_is_an_error(tmp_path: Path) -> None:
    with (
        tmpfs(tmp_path / "ro", "ro,size=64k") as read_only,
        pytest.raises(CheckpointWriteError, match="could not write checkpoint"),
    ):
        AtomicCheckpointIO().save_checkpoint(STATE, read_only / "last.ckpt")


@pytest.mark.slow
def test_the_end_of_fit_is_validated_and_saved_whatever_the_intervals(make_config, tmp_path: Path) -> None:
    """13 steps, validation every 5, last.ckpt every 4: results and last.ckpt are step 13's, not step 10's/12's."""
    from attnlab.training.run import run
    from tests.conftest import MICRO_DATA, MICRO_MODEL

    out = tmp_path / "run"
    intervals = [
        "trainer.max_steps=13",
        "trainer.val_check_interval=5",
        "callbacks.last_checkpoint.every_n_train_steps=4",
    ]
    quiet = ["trainer=cpu", "callbacks.progress_bar.refresh_rate=0", "trainer.limit_val_batches=2"]
    results = run(make_config([*MICRO_MODEL, *MICRO_DATA, *quiet, *intervals], out))
    assert results["steps"] == 13 and results["val_loss"] is not None
    assert results["last_checkpoint"] == str(out / "checkpoints" / "last.ckpt")
    assert torch.load(results["last_checkpoint"], weights_only=False)["global_step"] == 13
    best = torch.load(results["best_checkpoint"], weights_only=False)
    assert best["global_step"] == 13  # validated at the end: the loss still falls, so the last model is the best
    assert [p.name for p in (out / "checkpoints").iterdir() if p.name.startswith(".")] == []


def test_a_save_that_fails_after_a_crash_keeps_the_crash_and_the_last_checkpoint(
    make_config, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The emergency save on an exception can fail too (FSDP could not gather its optimizer state after a crash
    inside its forward): the run's own error must surface, and the last periodic checkpoint stay as it was."""
    from lightning.pytorch.strategies import Strategy

    from attnlab.training.module import LanguageModel
    from attnlab.training.run import run
    from tests.conftest import MICRO_DATA, MICRO_MODEL

    training_step, optimizer_state = LanguageModel.training_step, Strategy.optimizer_state

    def crashing_step(self: LanguageModel, batch: dict, batch_idx: int) -> torch.Tensor:
        if self.trainer.global_step == 6:
            raise RuntimeError("the run's own failure")
        return training_step(self, batch, batch_idx)

    def ungatherable_state(self: Strategy, optimizer: torch.optim.Optimizer) -> dict:
        if self.lightning_module.trainer.global_step == 6:
            raise KeyError("Parameter containing: tensor(...)")
        return optimizer_state(self, optimizer)

    monkeypatch.setattr(LanguageModel, "training_step", crashing_step)
    monkeypatch.setattr(Strategy, "optimizer_state", ungatherable_state)
    quiet = ["trainer=cpu", "callbacks.progress_bar.refresh_rate=0", "trainer.limit_val_batches=2"]
    steps = ["trainer.max_steps=20", "trainer.val_check_interval=50", "callbacks.last_checkpoint.every_n_train_steps=4"]
    with (
        pytest.warns(UserWarning, match="Could not save step 6 after RuntimeError: KeyError: .*last.ckpt holds step 4"),
        pytest.raises(RuntimeError, match="the run's own failure"),
    ):
        run(make_config([*MICRO_MODEL, *MICRO_DATA, *quiet, *steps], tmp_path / "run"))
    assert torch.load(tmp_path / "run" / "checkpoints" / "last.ckpt", weights_only=False)["global_step"] == 4
