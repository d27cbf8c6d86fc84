"""Exact resume: a run killed with SIGKILL and resumed from last.ckpt logs the uninterrupted run's losses."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest
import torch

from tests.reliability import step_losses, train, train_until

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory, data_cache: Path) -> dict[int, float]:
    run_dir = tmp_path_factory.mktemp("uninterrupted")
    done = train(["trainer.max_steps=16"], run_dir, data_cache)
    assert done.returncode == 0, done.stderr[-3000:]
    return step_losses(run_dir)


def killed_run(run_dir: Path, cache_dir: Path) -> None:
    """SIGKILL at step 10 (no chance to save anything), after last.ckpt was written at step 8."""
    output = train_until(["trainer.max_steps=16"], run_dir, cache_dir, "Saved step 8", signal.SIGKILL)
    assert torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=False)["global_step"] == 8, output


def test_sigkill_then_resume_in_a_new_directory_repeats_the_uninterrupted_losses(
    uninterrupted: dict[int, float], tmp_path: Path, data_cache: Path
) -> None:
    first, second = tmp_path / "first", tmp_path / "second"
    killed_run(first, data_cache)
    resumed = train(["trainer.max_steps=16", f"ckpt_path={first}/checkpoints/last.ckpt"], second, data_cache)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    losses = step_losses(second)
    assert sorted(losses) == list(range(8, 16))
    assert losses == {step: uninterrupted[step] for step in range(8, 16)}  # bit-exact on CPU fp32


def test_resume_into_the_interrupted_directory_keeps_what_it_wrote(
    uninterrupted: dict[int, float], tmp_path: Path, data_cache: Path
) -> None:
    run_dir = tmp_path / "run"
    killed_run(run_dir, data_cache)
    before = step_losses(run_dir)
    resumed = train(["trainer.max_steps=16", f"ckpt_path={run_dir}/checkpoints/last.ckpt"], run_dir, data_cache)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    after = step_losses(run_dir)
    assert set(range(7)) <= set(before)  # the rows before the saved step's own were on disk with the checkpoint
    assert all(after.get(step) == loss for step, loss in before.items() if step < 8)  # the first part is kept
    assert sorted(after) == list(range(16)) or sorted(after) == [s for s in range(16) if s != 7]
    assert {step: after[step] for step in range(8, 16)} == {step: uninterrupted[step] for step in range(8, 16)}
    assert (run_dir / ".hydra-1" / "config.yaml").is_file()  # the first part's config, beside the resumed one's
    assert "ckpt_path" in (run_dir / ".hydra" / "overrides.yaml").read_text()


def test_ctrl_c_mid_step_then_resume_repeats_the_uninterrupted_losses(
    uninterrupted: dict[int, float], tmp_path: Path, data_cache: Path
) -> None:
    """Ctrl-C inside step 6 (its batch drawn, its update not yet made) finishes that step and saves it, as SIGTERM
    does, so the resumed run repeats the uninterrupted losses bit for bit. (A bare KeyboardInterrupt there saved
    step 5 with step 6's batch already drawn: the resumed run skipped it.)"""
    first, second = tmp_path / "first", tmp_path / "second"
    mid_step = ["+callbacks.sigint._target_=tests.reliability.SigintMidStep", "+callbacks.sigint.step=6"]
    done = train(["trainer.max_steps=16", *mid_step], first, data_cache)
    assert done.returncode == 130, done.stderr[-3000:]
    assert "Ctrl-C: stopping at the end of this step" in done.stdout + done.stderr
    assert (
        done.stderr.strip().splitlines()[-1].startswith("error: trainer: interrupted at step 6; last.ckpt holds step 6")
    )
    resumed = train(["trainer.max_steps=16", f"ckpt_path={first}/checkpoints/last.ckpt"], second, data_cache)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert step_losses(second) == {s: uninterrupted[s] for s in range(6, 16)}


MEASURED_RUN = ["trainer.max_steps=16", "callbacks.outlier_monitor.sinks=true"]


@pytest.fixture(scope="module")
def never_stopped(tmp_path_factory: pytest.TempPathFactory, data_cache: Path) -> Path:
    """A run with the outlier and sink measurements at each validation, never stopped."""
    run_dir = tmp_path_factory.mktemp("never_stopped")
    done = train(MEASURED_RUN, run_dir, data_cache)
    assert done.returncode == 0, done.stderr[-3000:]
    return run_dir


@pytest.mark.parametrize(
    ("stop_at", "every"),
    [(10, 4), (10, 5), (16, 4)],
    ids=["step-not-saved-before", "step-saved-before-its-validation", "the-last-step"],
)
def test_a_validation_a_sigterm_cut_short_is_made_on_resume(
    stop_at: int, every: int, never_stopped: Path, tmp_path: Path, data_cache: Path
) -> None:
    """SIGTERM in the validation of step 10 (one of its two batches done) stops the run with step 10 saved; the resumed
    run validates step 10 before it trains on, so the curves miss no point: the validation and the outlier and sink
    measurements at every interval, the same numbers as a run never stopped. (Lightning resumed past a validation it
    was stopped in, as if it had been made.) With last.ckpt every 5 steps, step 10 was saved before its validation
    began: that save, too, resumed past it, so the stop saves the step again. Stopped in the validation after the last
    step, the resumed run has nothing to train, and Lightning validated nothing: results.json had no validation."""
    run = [*MEASURED_RUN, f"callbacks.last_checkpoint.every_n_train_steps={every}"]
    first, second = tmp_path / "first", tmp_path / "second"
    mid_validation = [
        "+callbacks.sigterm._target_=tests.reliability.SigtermMidValidation",
        f"+callbacks.sigterm.step={stop_at}",
    ]
    stopped = train([*run, *mid_validation], first, data_cache)
    assert stopped.returncode == 128 + signal.SIGTERM, stopped.stderr[-3000:]
    assert torch.load(first / "checkpoints" / "last.ckpt", weights_only=False)["global_step"] == stop_at
    resumed = train([*run, f"ckpt_path={first}/checkpoints/last.ckpt"], second, data_cache)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    for column in ["val/loss", "outliers/kurtosis_max", "sinks/sink_share"]:
        expected = step_losses(never_stopped, column)
        assert stop_at - 1 in expected, column  # a validation is logged at its step's index
        made = {step: value for step, value in expected.items() if step >= stop_at - 1}
        assert step_losses(second, column) == made, column
    train_losses = step_losses(never_stopped)
    assert step_losses(second) == {step: loss for step, loss in train_losses.items() if step >= stop_at}
    final = [json.loads((run_dir / "results.json").read_text()) for run_dir in (never_stopped, second)]
    assert final[1]["val_loss"] == final[0]["val_loss"] and final[1]["monitor"] == final[0]["monitor"]
