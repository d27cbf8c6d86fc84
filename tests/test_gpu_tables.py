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
