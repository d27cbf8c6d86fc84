"""``make clean-outputs`` removes what attnlab wrote under outputs/ and keeps a folder of the user's, saying so."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.conftest import ROOT


def test_clean_outputs_keeps_a_users_folder_and_says_so(tmp_path: Path) -> None:
    outputs = tmp_path / "outputs"
    for run in (
        "default/2026-01-01_00-00-00_abc",
        "eval/2026-01-01_00-00-01_def",
        "runs/table3-cell",
        "x/multirun_1/0",
    ):
        (outputs / run / ".hydra").mkdir(parents=True)
    (outputs / "report").mkdir()
    (outputs / "report" / ".attnlab-report").write_text("{}")
    (outputs / ".report.staging-123-abc").mkdir()
    (outputs / "mine").mkdir()
    (outputs / "mine" / "notes.txt").write_text("mine")
    (outputs / "notes.md").write_text("mine too")
    done = subprocess.run(
        [sys.executable, "experiments/clean_outputs.py", "--outputs", str(outputs), str(tmp_path / "multirun")],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    assert sorted(p.name for p in outputs.iterdir()) == ["mine", "notes.md"]
    assert (outputs / "mine" / "notes.txt").read_text() == "mine"
    assert done.stdout.splitlines() == [
        f"removed from {outputs}: .report.staging-123-abc, default, eval, report, runs, x",
        f"kept {outputs / 'mine'}: not written by attnlab (remove it yourself if you mean to)",
        f"kept {outputs / 'notes.md'}: not written by attnlab (remove it yourself if you mean to)",
    ]
