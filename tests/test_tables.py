"""The table engine end to end at smoke scale (real multiruns, evaluation, collector), and its pieces."""

from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from attnlab.errors import ConfigError
from attnlab.tables import reproduce
from attnlab.tables.collect import INCONCLUSIVE, OPPOSITE, REPRODUCES, paired_interval, verdict
from attnlab.tables.engine import Engine

ROOT = Path(__file__).resolve().parents[1]


def load_table(name: str) -> dict:
    return OmegaConf.to_container(OmegaConf.load(ROOT / "conf" / "table" / f"{name}.yaml"), resolve=True)


def smoke_table() -> dict:
    """Table 3 at smoke scale with one row and one variant, so the end-to-end test stays within about a minute."""
    table = load_table("table3")
    table["scales"]["smoke"]["rows"] = {"Pythia-160m": "tiny-neox"}
    table["variants"] = ["vanilla", "ssa"]
    return table


@pytest.fixture(scope="module")
def smoke_run(tmp_path_factory: pytest.TempPathFactory, data_cache: Path) -> dict:
    tmp = tmp_path_factory.mktemp("tables")
    settings = {
        "root": ROOT,
        "runs_dir": tmp / "runs",
        "results_dir": tmp / "results",
        "args": [f"paths.cache_dir={data_cache}"],
    }
    markdown = reproduce(smoke_table(), "smoke", **settings)
    return {"settings": settings, "markdown": markdown, "tmp": tmp}


def test_smoke_table_end_to_end(smoke_run: dict) -> None:
    results = smoke_run["settings"]["results_dir"]
    markdown = (results / "table3.md").read_text()
    assert markdown == smoke_run["markdown"]
    assert "not run at smoke scale" in markdown and "stand-in `continuation_acc_norm`" in markdown
    import pandas as pd

    runs = pd.read_csv(results / "runs.csv")
    assert len(runs) == 2 * 2 * 2  # stages x variants x seeds
    assert runs["continuation_acc_norm"].between(0, 1).all() and (runs["heldout_word_ppl"] > 1).all()
    effects = pd.read_csv(results / "effects.csv")
    assert set(effects["verdict"]) <= {REPRODUCES, OPPOSITE, INCONCLUSIVE}
    assert len(effects) == 2 * 1 * 4  # stages x variants x columns that ran
    finetuned = sorted((smoke_run["settings"]["runs_dir"]).glob("*/.hydra/overrides.yaml"))
    starts = [p.read_text() for p in finetuned if "model.init_from" in p.read_text()]
    assert len(starts) == 2 * 2 and all("vanilla-s" in s for s in starts)


def test_rerun_recomputes_nothing(smoke_run: dict) -> None:
    runs_dir = smoke_run["settings"]["runs_dir"]
    before = {p: p.stat().st_mtime_ns for p in runs_dir.rglob("*") if p.is_file()}
    reproduce(smoke_table(), "smoke", **smoke_run["settings"])
    after = {p: p.stat().st_mtime_ns for p in runs_dir.rglob("*") if p.is_file()}
    assert before == after


def test_table4_shares_table3_cells_and_force_makes_new_ones(smoke_run: dict) -> None:
    settings = smoke_run["settings"]
    engine = Engine(smoke_table(), "smoke", root=ROOT, runs_dir=settings["runs_dir"], args=settings["args"])
    cells = engine.cells()
    assert all(c.finished for c in cells)
    table4 = Engine(load_table("table4"), "smoke", root=ROOT, runs_dir=settings["runs_dir"], args=settings["args"])
    pretrain = [c for c in table4.cells() if c.stage == "pretrain"]
    assert len(pretrain) == 2 and all(c.finished for c in pretrain)  # table3's vanilla cells, not trained again
    assert {c.directory for c in pretrain} <= {c.directory for c in cells}
    forced = Engine(smoke_table(), "smoke", root=ROOT, runs_dir=settings["runs_dir"], args=settings["args"], force=True)
    fresh = forced.cells()
    assert not {c.directory for c in fresh} & {c.directory for c in cells}
    assert not any(c.finished for c in fresh)


def test_interrupted_cell_resumes_from_its_last_checkpoint(smoke_run: dict) -> None:
    settings = smoke_run["settings"]
    engine = Engine(smoke_table(), "smoke", root=ROOT, runs_dir=settings["runs_dir"], args=settings["args"])
    cell = next(c for c in engine.cells() if c.stage == "pretrain" and c.attention == "ssa" and c.seed == 1)
    (cell.directory / "results.json").unlink()  # as if killed after its last checkpoint
    engine.train([cell])
    assert cell.finished
    log = next(cell.directory.glob("*.log")).read_text()
    assert "Restoring states from the checkpoint path" in log or "Resuming" in log


def test_verdicts() -> None:
    mean, low, high = paired_interval([-1.0, -1.2, -0.9])
    assert math.isclose(mean, -31 / 30) and high < 0
    assert verdict(low, high, paper_diff=-2.3) == REPRODUCES
    assert verdict(low, high, paper_diff=+0.5) == OPPOSITE
    mean, low, high = paired_interval([-1.0, 1.5, 0.2])
    assert low < 0 < high and verdict(low, high, paper_diff=-2.3) == INCONCLUSIVE
    assert paired_interval([0.4])[1:] == (-math.inf, math.inf)


def test_paper_scale_composes_and_fails_fast_offline(tmp_path: Path) -> None:
    """Every paper-scale cell composes (the engine composes them first), then one line says what is missing."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "CUDA_VISIBLE_DEVICES": ""}
    command = [sys.executable, "experiments/reproduce_table.py", "scale=paper", f"runs_dir={tmp_path}/runs"]
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode != 0
    assert done.stderr.strip().splitlines()[-1].startswith("error: scale: paper needs GPUs")
    assert "Traceback" not in done.stderr and not (tmp_path / "runs").exists()


def test_unknown_scale_is_one_line_error() -> None:
    with pytest.raises(ConfigError, match="scale: one of smoke, cpu, paper"):
        Engine(load_table("table3"), "huge", root=ROOT, runs_dir=Path("unused"))
