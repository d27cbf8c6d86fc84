"""A sweep survives its failures: a bad value fails its own job only, the multirun ends with a summary and a
non-zero exit, and experiments/compare.py lists the missing job under the table."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.conftest import MICRO_DATA, MICRO_MODEL, ROOT

UNBUFFERED = {**os.environ, "PYTHONUNBUFFERED": "1"}

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
    assert (done.stdout + done.stderr).count("jobs completed") == 1  # the summary once, not also through a log
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


def test_a_sweep_stopped_by_sigterm_saves_its_job_and_starts_no_other(tmp_path: Path, data_cache: Path) -> None:
    """SIGTERM while job 0 trains: job 0 saves its last.ckpt, job 1 never starts, and the exit status is 143 (128 +
    SIGTERM), so a caller such as the table engine can tell a stop from a failed job (exit 1)."""
    swept = tmp_path / "sweep"
    overrides = [*MICRO_MODEL, *MICRO_DATA, "trainer=cpu", "callbacks.progress_bar.refresh_rate=0"]
    overrides += ["trainer.max_steps=400", "callbacks.last_checkpoint.every_n_train_steps=4"]
    command = [sys.executable, "train.py", "-m", "seed=1,2", *overrides]
    command += [f"paths.cache_dir={data_cache}", f"hydra.sweep.dir={swept}"]
    process = subprocess.Popen(
        command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=UNBUFFERED
    )
    seen = []
    for line in process.stdout:
        seen.append(line)
        if "Saved step 4" in line:
            process.send_signal(signal.SIGTERM)
            break
    seen.extend(process.stdout)
    process.wait(timeout=120)
    output = "".join(seen)
    assert process.returncode == 143, output[-3000:]
    assert "stopped by SIGTERM" in output and "the sweep stops here" in output
    assert "Traceback" not in output
    assert [p.name for p in swept.glob("*/checkpoints/last.ckpt")] == ["last.ckpt"]  # job 0's only
    assert not list(swept.glob("1_*"))


def sweep(arguments: list[str], data_cache: Path) -> subprocess.CompletedProcess:
    overrides = [*MICRO_DATA, "trainer=cpu", "debug=fdr", "callbacks.progress_bar.refresh_rate=0"]
    command = [sys.executable, "train.py", "-m", *arguments, *overrides, f"paths.cache_dir={data_cache}"]
    return subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=600)


def test_the_readmes_sweep_without_a_sweep_dir_records_and_counts_its_own_jobs(
    tmp_path: Path, data_cache: Path
) -> None:
    """`train.py -m ...` as the README shows it: the sweep directory comes from paths.log_dir (an interpolation of
    the task config that a job's own Hydra config cannot resolve); every job is recorded and summarised."""
    micro_model = [o for o in MICRO_MODEL if not o.startswith("model.n_head=")]
    done = sweep(["model.n_head=2,4", *micro_model, f"paths.log_dir={tmp_path}/logs"], data_cache)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "2 of 2 jobs completed" in done.stdout
    assert len(list((tmp_path / "logs").glob("debug/multirun_*/jobs.jsonl"))) == 1  # debug=fdr: outputs/debug/


def test_two_sweeps_in_one_directory_each_count_their_own_jobs(tmp_path: Path, data_cache: Path) -> None:
    """The table engine runs every sweep in outputs/runs: a sweep's summary is about its own jobs, not every job
    that directory has ever recorded."""
    micro_model = [o for o in MICRO_MODEL if not o.startswith("model.n_head=")]
    shared = [*micro_model, f"hydra.sweep.dir={tmp_path}/shared"]
    first = sweep(["model.n_head=2,3", *shared], data_cache)
    assert first.returncode == 1 and "1 of 2 jobs completed" in first.stdout
    second = sweep(["model.n_head=4", *shared], data_cache)
    assert second.returncode == 0, second.stderr[-3000:]
    assert "1 of 1 jobs completed" in second.stdout and "failed" not in second.stdout


def test_a_sweep_over_many_long_overrides_keeps_its_directory_names_short(tmp_path: Path, data_cache: Path) -> None:
    long_values = [f"+note{i}={'x' * 60}" for i in range(5)]  # ~350 characters of overrides in the job's name
    done = sweep([*MICRO_MODEL, "seed=1,2", *long_values, f"hydra.sweep.dir={tmp_path}/sweep"], data_cache)
    assert done.returncode == 0, done.stderr[-3000:]
    names = sorted(p.name for p in (tmp_path / "sweep").iterdir() if p.is_dir())
    assert len(names) == 2 and all(len(name) <= 120 for name in names)
    assert [name.split("_")[0] for name in names] == ["0", "1"] and names[0] != names[1]


def test_a_joblib_worker_killed_fails_its_own_job_only(tmp_path: Path, data_cache: Path) -> None:
    """Hydra's joblib launcher lost the whole sweep, summary included, when one worker was killed (loky breaks its
    pool and every job in flight dies). The job that kills its worker is reported; the others finish, the one that
    died beside it continuing from its last.ckpt."""
    swept = tmp_path / "sweep"
    overrides = [*MICRO_MODEL, *MICRO_DATA, "trainer=cpu", "callbacks.progress_bar.refresh_rate=0"]
    overrides += ["trainer.max_steps=6", "trainer.limit_val_batches=1"]
    overrides += ["callbacks.last_checkpoint.every_n_train_steps=2"]
    overrides += ["+callbacks.kill._target_=tests.reliability.SigkillSweepJob", "+callbacks.kill.seed=2"]
    overrides += ["+callbacks.kill.step=3", "hydra/launcher=joblib", "hydra.launcher.n_jobs=2"]
    command = [sys.executable, "train.py", "-m", "seed=1,2,3", *overrides, "ckpt_path=${resume_ckpt:}"]
    command += [f"paths.cache_dir={data_cache}", f"hydra.sweep.dir={swept}"]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=900, env=UNBUFFERED)
    output = done.stdout + done.stderr
    assert done.returncode == 1, output[-3000:]
    assert "2 of 3 jobs completed" in done.stdout
    assert re.search(r"job 1 \(seed=2 [^)]*\) failed: error: its worker process died", done.stdout)
    finished = sorted(p.relative_to(swept).parts[0].split("_")[0] for p in swept.rglob("results.json"))
    assert finished == ["0", "2"]
    assert "TerminatedWorkerError" not in output and not list(swept.glob(".started-*"))
    assert "validated against ConfigStore schema" not in output  # our joblib.yaml matches the plugin's on purpose


def test_a_joblib_sweep_stopped_by_sigterm_saves_every_job_in_flight_and_leaves_no_worker(
    tmp_path: Path, data_cache: Path
) -> None:
    """Hydra's joblib launcher died at SIGTERM and left its workers training, orphaned (a resumed sweep then trained
    the same cells twice). Now: both jobs in flight save their last.ckpt, the third never starts, the exit status is
    143 as in one process, and no worker outlives the sweep."""
    swept = tmp_path / "sweep"
    overrides = [*MICRO_MODEL, *MICRO_DATA, "trainer=cpu", "callbacks.progress_bar.refresh_rate=0"]
    overrides += ["trainer.max_steps=4000", "callbacks.last_checkpoint.every_n_train_steps=4"]
    overrides += ["hydra/launcher=joblib", "hydra.launcher.n_jobs=2"]
    command = [sys.executable, "train.py", "-m", "seed=1,2,3", *overrides, "ckpt_path=${resume_ckpt:}"]
    command += [f"paths.cache_dir={data_cache}", f"hydra.sweep.dir={swept}"]
    process = subprocess.Popen(
        command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=UNBUFFERED
    )
    seen: list[str] = []
    both_saved = threading.Event()

    def read() -> None:  # a reader of its own: an orphaned worker would hold the pipe open for its whole training
        for line in process.stdout:
            seen.append(line)
            if sum("Saved step 4 " in line for line in seen) == 2:
                both_saved.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    assert both_saved.wait(timeout=300), "".join(seen)[-3000:]
    workers = subprocess.run(["pgrep", "-P", str(process.pid)], capture_output=True, text=True).stdout.split()
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(timeout=120)
        alive = []
        for pid in map(int, workers):  # the workers (and loky's resource tracker) end with the sweep
            for _ in range(50):
                if not pid_exists(pid):
                    break
                time.sleep(0.2)
            else:
                alive.append(pid)
    finally:
        for pid in map(int, workers):
            if pid_exists(pid):
                os.kill(pid, signal.SIGKILL)
    assert len(workers) >= 2 and alive == [], f"workers {alive} outlived the sweep"
    reader.join(timeout=30)
    output = "".join(seen)
    assert process.returncode == 143, output[-3000:]
    assert "Stopped by SIGTERM" in output and "the sweep stops here" in output and "Traceback" not in output
    assert sorted(p.parts[-3].split("_")[0] for p in swept.glob("*/checkpoints/last.ckpt")) == ["0", "1"]
    assert not list(swept.glob("2_*")) and not list(swept.glob(".started-*"))


def pid_exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True
