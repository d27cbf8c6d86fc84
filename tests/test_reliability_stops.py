"""How a run ends when it cannot finish: SIGTERM/SIGINT save last.ckpt, NaN stops before a bad update, a full disk
is an error. Each ends with one ``error:`` line naming the step and the checkpoint, and a non-zero exit."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest
import torch

from tests.reliability import train, train_until
from tests.test_reliability_checkpoints import tmpfs

pytestmark = pytest.mark.slow


def saved_step(run_dir: Path) -> int:
    return torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=False)["global_step"]


@pytest.mark.parametrize(("sig", "what"), [(signal.SIGTERM, "stopped by SIGTERM"), (signal.SIGINT, "interrupted")])
def test_a_signal_saves_the_current_step_and_exits_non_zero(
    sig: signal.Signals, what: str, tmp_path: Path, data_cache: Path
) -> None:
    output = train_until(["trainer.max_steps=500"], tmp_path, data_cache, "Saved step 4", sig)
    assert f"[exit {128 + sig}]" in output  # the shell's status for the signal: a caller can tell it from a failure
    step = saved_step(tmp_path)
    assert step >= 4
    assert f"error: trainer: {what} at step {step}; last.ckpt holds step {step}" in output
    assert "Traceback" not in output
    assert not (tmp_path / "results.json").exists()


def test_ctrl_c_before_training_stops_a_run_started_in_the_background(tmp_path: Path, data_cache: Path) -> None:
    """A script's background job starts with SIGINT ignored; a ``kill -INT`` while the run builds its model (before
    training, where its own handler takes over) was ignored and the run trained to its end."""
    output = train_until(["trainer.max_steps=500"], tmp_path, data_cache, "parameters; attention=", signal.SIGINT, True)
    assert "[exit 130]" in output and "Traceback" not in output
    assert not (tmp_path / "results.json").exists()


def test_nan_stops_before_the_update_and_keeps_the_last_finite_checkpoint(tmp_path: Path, data_cache: Path) -> None:
    done = train(
        ["optim.lr=1e6", "optim.warmup_steps=1", "callbacks.last_checkpoint.every_n_train_steps=1"],
        tmp_path,
        data_cache,
    )
    assert done.returncode == 1
    last_line = done.stderr.strip().splitlines()[-1]
    assert last_line.startswith("error: trainer: non-finite ") and "Traceback" not in done.stderr
    bad_step = int(last_line.split(" at step ")[1].split()[0])
    assert f"last.ckpt holds step {bad_step - 1}, the last finite state" in last_line
    checkpoint = torch.load(tmp_path / "checkpoints" / "last.ckpt", weights_only=False)
    assert checkpoint["global_step"] == bad_step - 1
    assert all(torch.isfinite(t).all() for t in checkpoint["state_dict"].values())
    assert not (tmp_path / "results.json").exists()


def test_nan_skip_drops_updates_up_to_its_limit(tmp_path: Path, data_cache: Path) -> None:
    skip = ["callbacks.nonfinite_guard.action=skip", "callbacks.nonfinite_guard.max_skipped=2"]
    done = train(["optim.lr=1e6", "optim.warmup_steps=1", *skip], tmp_path, data_cache)
    assert done.returncode == 1
    assert (done.stdout + done.stderr).count("Skipping the update of step") == 2
    assert done.stderr.strip().splitlines()[-1].startswith("error: trainer: non-finite ")


def test_a_full_disk_is_an_error_and_leaves_no_truncated_checkpoint(tmp_path: Path, data_cache: Path) -> None:
    with tmpfs(tmp_path / "disk", "size=256k") as disk:  # room for the first checkpoint (~580 kB) it is not
        dirs = [f"callbacks.{c}.dirpath={disk}" for c in ("last_checkpoint", "model_checkpoint")]
        done = train(["trainer.max_steps=8", *dirs], tmp_path / "run", data_cache)
        assert done.returncode == 1
        assert (
            done.stderr.strip()
            .splitlines()[-1]
            .startswith(f"error: checkpoint: could not write checkpoint {disk}/last.ckpt: No space left on device")
        )
        assert "Traceback" not in done.stderr
        assert list(disk.iterdir()) == []
