"""Crafted and garbled files given to the readers that are not model loaders (compare.py on a sweep directory, a
table config of bad YAML, a jobs.jsonl cut short), and what two processes sharing a table's cell leave: one line or
a listed problem, never a traceback, and a cell the other process holds is not reported as a failure."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from tests.conftest import ROOT


def finished_job(directory: Path, overrides: str, results: str) -> None:
    (directory / ".hydra").mkdir(parents=True)
    (directory / ".hydra" / "overrides.yaml").write_text(overrides)
    (directory / "results.json").write_text(results)


def compare(sweep: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "experiments/compare.py", str(sweep)], cwd=ROOT, capture_output=True, text=True, timeout=120
    )


def test_compare_lists_garbled_runs_of_a_sweep_and_tables_the_rest(tmp_path: Path) -> None:
    sweep, marker = tmp_path / "sweep", tmp_path / "pwned"
    good = {"attention": "vanilla", "model": "tiny", "val_loss": 3.0, "val_ppl": 20.0, "tokens_per_second": 9.0}
    good = json.dumps(good | {"parameters": 1000})
    finished_job(sweep / "0_seed=1", "- seed=1\n", good)
    finished_job(sweep / "1_seed=2", "- seed=2\n- [unclosed\n", good)
    finished_job(sweep / "2_seed=3", "- seed=3\n", json.dumps({"val_loss": 3.0}))
    finished_job(sweep / "3_seed=4", f'!!python/object/apply:os.system ["touch {marker}"]\n', good)
    finished_job(sweep / "4_seed=5", "- seed=5\n", "{not json")
    finished_job(sweep / "5_seed=6", "- seed=6\n", json.dumps({"attention": "a", "model": "m", "val_loss": "abc"}))
    (sweep / "jobs.jsonl").write_text('{"num": 0, "status": "completed"\n[1, 2]\n')
    table = compare(sweep)
    assert table.returncode == 0 and "Traceback" not in table.stderr, table.stderr
    assert "| vanilla" in table.stdout and "warning: 5 jobs of the sweep are not in the table" in table.stderr
    for problem in (
        "1_seed=2: .hydra/overrides.yaml does not read as YAML",
        "2_seed=3: results.json has no attention and model names",
        "3_seed=4: .hydra/overrides.yaml does not read as YAML",
        "4_seed=5: results.json does not read as JSON",
        "5_seed=6: results.json's val_loss is 'abc', not a number",
    ):
        assert problem in table.stdout
    assert not marker.exists()

    shutil.rmtree(sweep / "0_seed=1")
    nothing = compare(sweep)
    assert nothing.returncode == 1 and "Traceback" not in nothing.stderr
    assert nothing.stderr.strip().splitlines() == [
        f"error: no readable results.json under {sweep} (5 unreadable: 1_seed=2: .hydra/overrides.yaml does not read "
        "as YAML (while parsing a flow sequence))"
    ]


def test_a_table_config_of_bad_yaml_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from attnlab.cli.table import main

    conf = tmp_path / "conf"
    shutil.copytree(ROOT / "experiments" / "conf", conf)
    (conf / "table" / "broken.yaml").write_text("name: broken\nscales: [a\n  b: {\n")
    monkeypatch.setattr(sys, "argv", ["reproduce_table.py", "table=broken", "scale=cpu"])
    with pytest.raises(SystemExit) as refused:
        main(str(conf))
    assert str(refused.value.code) == (
        f"error: {conf}/table/broken.yaml, line 3: not valid YAML (expected ',' or ']', but got ':')"
    )


def job_return(tmp_path: Path, num: int, error: Exception | None):
    from hydra.core.utils import JobReturn, JobStatus
    from hydra.types import RunMode

    hydra = {"mode": RunMode.MULTIRUN, "job": {"num": num}, "runtime": {"output_dir": str(tmp_path / str(num))}}
    hydra["output_subdir"] = ".hydra"  # a job of rank 0 (the one that records it), as every real config has
    done = JobReturn(overrides=[f"seed={num}"], hydra_cfg=OmegaConf.create({"hydra": hydra}))
    done.status = JobStatus.FAILED if error else JobStatus.COMPLETED
    done._return_value = error
    return done


def test_a_cell_another_process_trains_is_not_a_failed_job(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """Two tables sharing a cell: the one whose job finds the cell's directory claimed reports it as held elsewhere
    and ends without an error (the other process's outcome is the cell's), while a real failure still fails."""
    from attnlab.errors import ConfigError
    from attnlab.run_directory import claim_run_directory, read_jobs, release_run_directory
    from attnlab.training.sweeps import SweepReport

    cell = tmp_path / "1"
    holder = subprocess.Popen(  # another process holds the cell's claim
        [
            sys.executable,
            "-c",
            f"from attnlab.run_directory import claim_run_directory as c; c(__import__('pathlib').Path("
            f"{str(cell)!r}), 'k'); print('held', flush=True); import time; time.sleep(60)",
        ],
        stdout=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(ConfigError) as in_use:
            claim_run_directory(cell, "hydra.sweep.dir")
        config = OmegaConf.create({"hydra": {"sweep": {"dir": str(tmp_path), "subdir": "x"}}})
        report = SweepReport()
        report.on_job_end(config, job_return(tmp_path, 0, None))
        report.on_job_end(config, job_return(tmp_path, 1, in_use.value))
        report.on_multirun_end(config)
        assert [job["status"] for job in read_jobs(tmp_path)] == ["completed", "held_elsewhere"]
        assert "job 1 (seed=1) not run here: another process trains it now" in capsys.readouterr().out
        report.on_job_end(config, job_return(tmp_path, 2, ConfigError("model.n_head", "bad")))
        with pytest.raises(SystemExit, match=r"error: 1 of 3 sweep jobs failed"):
            report.on_multirun_end(config)
    finally:
        holder.kill()
        holder.wait()
        release_run_directory(cell)


def test_a_garbled_line_of_jobs_jsonl_counts_as_unrecorded(tmp_path: Path) -> None:
    from attnlab.run_directory import read_jobs

    record = {"num": 1, "status": "completed", "overrides": ["seed=2"], "output_dir": "x"}
    (tmp_path / "jobs.jsonl").write_text(f'{{"num": 0, "sta\n{json.dumps(record)}\n{{"num": "a"}}\n\xff\n')
    assert read_jobs(tmp_path) == [record]


@pytest.mark.slow
def test_an_interrupted_forced_table_is_resumed_by_the_same_command(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """FORCE=1 names its fresh cells with a salt; the salt is kept until the table is written, so running the same
    command after an interruption resumes those cells instead of orphaning them under a new salt."""
    from attnlab.tables import reproduce
    from attnlab.tables.engine import Engine, TableInterrupted

    salts: list[str] = []

    def interrupted(engine: Engine, cells: list) -> None:
        salts.append(engine.salt)
        assert all(f"+cell_salt={engine.salt}" in cell.overrides for cell in cells)
        raise TableInterrupted(2)

    monkeypatch.setattr(Engine, "train", interrupted)
    dirs = {"runs_dir": tmp_path / "runs", "results_dir": tmp_path / "results", "root": ROOT}
    for _ in range(2):
        with pytest.raises(TableInterrupted):
            reproduce("table3", "smoke", force=True, **dirs)
    assert len(salts) == 2 and salts[0] == salts[1]
    assert (tmp_path / "runs" / ".force-table3-smoke").read_text().strip() == salts[0]
