"""Where things go: outputs and the cache under the project root whichever directory a command starts from, debug
runs apart from the real ones; what a run prints and logs; `make clean` that keeps runs and results; no lock file
left beside a shared file."""

from __future__ import annotations

import csv
import multiprocessing
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra

from attnlab.eval.harness import append_csv
from tests.conftest import CONF, MICRO_DATA, MICRO_MODEL, ROOT

QUIET = ["logger=csv", "trainer=cpu", "callbacks.progress_bar.refresh_rate=0", *MICRO_MODEL, *MICRO_DATA]


def test_paths_are_anchored_to_the_directory_that_holds_conf(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose(config_name="train", overrides=["debug=fdr"], return_hydra_config=True)
    assert cfg.paths.root_dir == str(ROOT) and cfg.paths.cache_dir == str(ROOT / ".cache" / "attnlab")
    assert cfg.experiment_name == "debug"  # debug=fdr runs go to outputs/debug/, apart from the real runs
    assert Path(cfg.hydra.run.dir).parent == Path(cfg.hydra.sweep.dir).parent == ROOT / "outputs" / "debug"


@pytest.mark.slow
def test_a_run_started_elsewhere_writes_into_its_project_and_shows_its_config(tmp_path: Path, data_cache: Path) -> None:
    """A copy of the project (train.py + conf/) run from another directory: everything lands in the copy's outputs/,
    the config is printed as a tree first, and the summary the terminal ends with is also the end of train.log."""
    project, elsewhere = tmp_path / "project", tmp_path / "elsewhere"
    shutil.copytree(CONF, project / "conf")
    shutil.copy(ROOT / "train.py", project)
    elsewhere.mkdir()
    command = [sys.executable, str(project / "train.py"), "debug=fdr", *QUIET, f"paths.cache_dir={data_cache}"]
    done = subprocess.run(command, cwd=elsewhere, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert list(elsewhere.iterdir()) == []
    (run,) = (project / "outputs" / "debug").iterdir()
    resized = ", ".join(MICRO_MODEL)  # the summary names the preset's overrides
    tree, summary = done.stdout.split(f"\nattnlab: tiny ({resized}) + attention=vanilla")
    for branch in ("run", "optim", "model", "attention", "data", "trainer", "logger", "callbacks", "paths"):
        assert f"── {branch}\n" in tree, branch
    assert f"root_dir: {project}\n" in tree and f"output_dir: {run}\n" in tree and "fast_dev_run: true" in tree
    assert f"outputs: {run}\n" in summary
    log = (run / "train.log").read_text()
    assert log.rstrip().endswith(f"outputs: {run}") and "validation perplexity" in log
    printed = done.stdout + done.stderr  # Lightning's lines once, through Hydra's handlers (not also as "INFO: ...")
    assert printed.count("Running in `fast_dev_run` mode") == 1 and "Running in `fast_dev_run` mode" in log


@pytest.mark.skipif(shutil.which("make") is None, reason="needs make")
def test_make_clean_keeps_runs_and_results_and_clean_outputs_removes_runs(tmp_path: Path) -> None:
    shutil.copy(ROOT / "Makefile", tmp_path)
    (tmp_path / "experiments").mkdir()
    shutil.copy(ROOT / "experiments" / "clean_outputs.py", tmp_path / "experiments")
    made = [
        "outputs/default/run/.hydra/config.yaml",
        "outputs/runs/tiny-vanilla-s1-0123456789/.hydra/config.yaml",
        "experiments/results/table1/table1.md",
        ".cache/attnlab/corpus/wiki_sample.jsonl",
        ".pytest_cache/v/cache/lastfailed",
        ".ruff_cache/0.6/cache",
        "src/attnlab/__pycache__/runs.cpython-311.pyc",
        "notebooks/.ipynb_checkpoints/tables-checkpoint.ipynb",
    ]
    for name in made:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("x")

    def left() -> list[str]:
        return sorted(
            str(p.relative_to(tmp_path))
            for p in tmp_path.rglob("*")
            if p.is_file() and p.name not in ("Makefile", "clean_outputs.py")
        )

    def make(target: str) -> None:
        subprocess.run(["make", target], cwd=tmp_path, check=True, capture_output=True, timeout=60)

    make("clean")
    assert left() == sorted(made[:4])
    make("clean-data")
    assert left() == sorted(made[:3])
    (tmp_path / "outputs" / "mine").mkdir()
    (tmp_path / "outputs" / "mine" / "notes.txt").write_text("mine")
    make("clean-outputs")
    assert left() == ["experiments/results/table1/table1.md", "outputs/mine/notes.txt"]


def _append_rows(path: Path, worker: int) -> None:
    for i in range(10):
        extra = {f"column_{worker}": 1.0} if i == 5 else {}  # new columns make writers rewrite the whole table
        append_csv(path, {"run_id": f"{worker}-{i}", "ppl": float(i), **extra})


def test_parallel_evaluations_keep_every_row_and_leave_no_lock_file(tmp_path: Path) -> None:
    results = tmp_path / "eval" / "results.csv"
    context = multiprocessing.get_context("fork")  # the workers only append to a CSV
    workers = [context.Process(target=_append_rows, args=(results, w)) for w in range(4)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(timeout=60)
        assert worker.exitcode == 0
    rows = list(csv.DictReader(results.open(newline="")))
    assert sorted(r["run_id"] for r in rows) == sorted(f"{w}-{i}" for w in range(4) for i in range(10))
    assert {f"column_{w}" for w in range(4)} <= set(rows[0])
    assert [p.name for p in results.parent.iterdir()] == ["results.csv"]
