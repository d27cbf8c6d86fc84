"""attnlab-compare (attnlab/compare.py, python experiments/compare.py in a clone): a sweep's runs -> one table and,
beside it, a figure of the loss curves over seeds; a single run's figure, which every training run draws."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml

from attnlab import compare
from tests.conftest import ROOT


def fake_sweep(sweep: Path, seeds: int = 2) -> None:
    """A finished sweep as train.py leaves it: results.json, .hydra/overrides.yaml and csv/metrics.csv per job."""
    for num, (attention, seed) in enumerate((a, s) for a in ("ssa", "vanilla") for s in range(1, seeds + 1)):
        job = sweep / f"{num}_attention={attention},seed={seed}"
        (job / ".hydra").mkdir(parents=True)
        (job / "csv").mkdir()
        overrides = [f"attention={attention}", f"seed={seed}", "trainer.max_steps=20"]
        (job / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump(overrides))
        offset = 0.1 * seed + (0.5 if attention == "ssa" else 0.0)
        rows = [{"step": step, "train/loss": 8 - step / 4 + offset} for step in range(0, 20, 5)]
        rows += [{"step": step, "val/loss": 7.5 - step / 5 + offset} for step in (9, 19)]
        rows.append({"step": 19, "val/loss": 3.0 + offset})  # resumed into the same run: the later row counts
        pd.DataFrame(rows).to_csv(job / "csv" / "metrics.csv", index=False)
        results = {"attention": attention, "model": "tiny", "val_loss": 3.0 + offset, "val_ppl": 20.0}
        results |= {"unigram_ppl": 400.0, "tokens_per_second": 1000.0, "parameters": 1234}
        (job / "results.json").write_text(json.dumps(results))


def test_loss_curves_read_each_runs_metrics_with_the_later_row_of_a_repeated_step(tmp_path: Path) -> None:
    fake_sweep(tmp_path)
    curves = compare.loss_curves(compare.collect(tmp_path))
    assert set(curves["setting"]) == {"ssa", "vanilla"} and set(curves["metric"]) == {"train/loss", "val/loss"}
    final = curves[(curves["metric"] == "val/loss") & (curves["step"] == 20)]  # logged at 0-based step 19
    assert len(final) == 4 and sorted(final["loss"].round(3)) == [3.1, 3.2, 3.6, 3.7]


@pytest.mark.slow
def test_compare_writes_the_figure_beside_its_table(tmp_path: Path) -> None:
    """The installed command (a pip user has no experiments/)."""
    fake_sweep(tmp_path / "sweep")
    out = tmp_path / "results"
    command = [str(Path(sys.executable).with_name("attnlab-compare")), str(tmp_path / "sweep"), "--out", str(out)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert sorted(p.name for p in out.iterdir()) == ["curves.png", "table.csv", "table.md"]
    assert (out / "curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert str(out / "curves.png") in done.stdout
    again = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert again.returncode != 0 and "never overwritten" in again.stderr


def test_runs_without_logged_losses_give_a_table_and_no_figure(tmp_path: Path) -> None:
    fake_sweep(tmp_path / "sweep", seeds=1)
    for metrics in (tmp_path / "sweep").rglob("metrics.csv"):
        metrics.unlink()
    out = tmp_path / "results"
    command = [sys.executable, str(ROOT / "experiments" / "compare.py"), str(tmp_path / "sweep"), "--out", str(out)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert sorted(p.name for p in out.iterdir()) == ["table.csv", "table.md"] and "no curves.png" in done.stderr


def test_a_single_run_draws_its_own_curves(tmp_path: Path) -> None:
    fake_sweep(tmp_path, seeds=1)
    run = next(tmp_path.glob("1_*"))
    written = compare.run_figure(run, json.loads((run / "results.json").read_text()))
    assert written == run / "loss_curves.png" and written.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    (run / "csv" / "metrics.csv").unlink()
    (run / "loss_curves.png").unlink()
    assert compare.run_figure(run, {"attention": "vanilla", "model": "tiny"}) is None
