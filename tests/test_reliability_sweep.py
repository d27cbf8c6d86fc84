"""A sweep survives its failures: a bad value fails its own job only, the multirun ends with a summary and a
non-zero exit, and experiments/compare.py lists the missing job under the table."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import MICRO_DATA, MICRO_MODEL, ROOT

pytestmark = pytest.mark.slow


def test_a_failed_job_is_its_own_and_the_sweep_reports_it(tmp_path: Path, data_cache: Path) -> None:
    sweep = tmp_path / "sweep"
    micro_model = [o for o in MICRO_MODEL if not o.startswith("model.n_head=")]
    overrides = [*micro_model, *MICRO_DATA, "trainer=cpu", "debug=fdr", "callbacks.progress_bar.refresh_rate=0"]
    command = [sys.executable, "train.py", "-m", "model.n_head=2,3,4", *overrides]
    command += [f"paths.cache_dir={data_cache}", f"hydra.sweep.dir={sweep}"]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 1
    assert "Sweep" in done.stdout and "2 of 3 jobs completed" in done.stdout
    error = "error: model.n_embd: n_embd=32 must be divisible by model.n_head=3"
    assert re.search(rf"job 1 \(model.n_head=3 [^)]*\) failed: {error}", done.stdout)
    assert done.stderr.strip().splitlines()[-1] == f"error: 1 of 3 sweep jobs failed (details: {sweep}/jobs.jsonl)"
    assert "Traceback" not in done.stderr
    finished = sorted(p.relative_to(sweep).parts[0].split("_")[0] for p in sweep.rglob("results.json"))
    assert finished == ["0", "2"]

    table = subprocess.run(
        [sys.executable, "experiments/compare.py", str(sweep)], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert table.returncode == 0, table.stderr
    assert "warning: 1 jobs of the sweep are not in the table" in table.stderr
    assert re.search(rf"- job 1 \(model.n_head=3 [^)]*\): {error}", table.stdout)
