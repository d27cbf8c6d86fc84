"""experiments/gpu_tables.sh's sweep mode on the CPU: what a GPU call brings back is the sweep's curves, archived."""

from __future__ import annotations

import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from tests.conftest import ROOT

TINY = "trainer.val_check_interval=2 trainer.limit_val_batches=1 model.n_layer=1 model.n_embd=32 model.n_head=2"


@pytest.mark.slow
def test_a_sweep_comes_back_as_its_runs_curves_and_configs(tmp_path: Path) -> None:
    """Two runs of experiment=emergence (weight decay swept) side by side: the archive holds each run's metrics and
    overrides, and the summary its exit status. The sweep's runs go to a scratch checkout's outputs/sweep."""
    checkout = tmp_path / "checkout"
    (checkout / "experiments").mkdir(parents=True)
    (checkout / "experiments" / "gpu_tables.sh").write_text((ROOT / "experiments" / "gpu_tables.sh").read_text())
    sweep = f"experiment=emergence trainer.max_steps=4 {TINY} data.batch_size=2 optim.weight_decay=0.5,1.0"
    out = tmp_path / "out"
    env = os.environ | {"SWEEP": sweep, "JOBS": "2", "LIMIT": "300", "OUT": str(out), "PYTHON": sys.executable}
    env |= {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    done = subprocess.run(["bash", str(checkout / "experiments" / "gpu_tables.sh")], env=env, capture_output=True)
    assert done.returncode == 0, done.stdout.decode()[-2000:] + done.stderr.decode()[-2000:]
    assert (out / "summary.txt").read_text().startswith("sweep: exit 0 after")
    with tarfile.open(out / "results.tgz") as archive:
        names = archive.getnames()
        overrides = [archive.extractfile(n).read().decode() for n in names if n.endswith(".hydra/overrides.yaml")]
    assert sum(n.endswith("csv/metrics.csv") for n in names) == 2
    assert sorted("optim.weight_decay=1.0" in text for text in overrides) == [False, True]
    assert all(n.startswith("outputs/sweep/tiny-vanilla-s1-") for n in names)


FAKE_TABLE = """#!/usr/bin/env bash
# python for gpu_tables.sh: -c runs the real one; a table call is logged, a full one outlives LIMIT, a partial one
# writes its table
[[ $1 == -c ]] && exec "$REAL_PYTHON" "$@"
echo "$*" >>"$CALLS"
[[ $* == *partial=true* ]] || exec sleep 60
mkdir -p experiments/results/variants/gpu && echo "partial" >experiments/results/variants/gpu/variants.md
"""


@pytest.mark.parametrize("eval_limit", ["60", "0"])
@pytest.mark.slow
def test_a_table_cut_at_its_limit_comes_back_as_the_partial_table_of_its_finished_cells(
    tmp_path: Path, eval_limit: str
) -> None:
    """A cut cell's checkpoint stays on the GPU machine, so a table that LIMIT cuts is written at once as a partial
    table (its finished cells evaluated there) and archived; EVAL_LIMIT=0 skips that. The table command is a stand-in
    that outlives LIMIT; the engine's partial tables have their own tests."""
    checkout = tmp_path / "checkout"
    (checkout / "experiments").mkdir(parents=True)
    (checkout / "experiments" / "gpu_tables.sh").write_text((ROOT / "experiments" / "gpu_tables.sh").read_text())
    python = tmp_path / "python"
    python.write_text(FAKE_TABLE)
    python.chmod(0o755)
    out, calls = tmp_path / "out", tmp_path / "calls.txt"
    env = os.environ | {"TABLES": "variants", "LIMIT": "3", "EVAL_LIMIT": eval_limit, "ARGS": "compile=true"}
    env |= {"OUT": str(out), "PYTHON": str(python), "REAL_PYTHON": sys.executable, "CALLS": str(calls)}
    done = subprocess.run(["bash", str(checkout / "experiments" / "gpu_tables.sh")], env=env, capture_output=True)
    assert done.returncode == 1  # the table is not whole
    summary = (out / "summary.txt").read_text().splitlines()
    assert summary[0].startswith("variants at gpu: exit 124 after")
    made = calls.read_text().splitlines()
    assert "partial=true" not in made[0] and "args='compile=true'" in made[0]
    if eval_limit == "0":
        assert len(made) == 1 and len(summary) == 1 and not (out / "results.tgz").exists()
        return
    assert len(made) == 2 and "partial=true" in made[1] and "args='compile=true'" in made[1]
    assert summary[1].startswith("variants at gpu: cut at LIMIT; its finished cells as a partial table: exit 0")
    with tarfile.open(out / "results.tgz") as archive:
        assert archive.extractfile("experiments/results/variants/gpu/variants.md").read() == b"partial\n"
