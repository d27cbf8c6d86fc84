"""``hydra/launcher=slurm`` on a real scheduler: the README's local cluster (tests/local_slurm.sh: Debian's SLURM
22.05, two slurmd on this host) runs a 2-job sweep, a 2-node DDP job that trains like one process on the same global
batch, a requeued job that resumes bit for bit under the same W&B run, a job past its requeue bound, and a table
whose cells are SLURM jobs. The fast tests check the launcher's resources against the trainer without SLURM."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from omegaconf import OmegaConf

from attnlab.cli.table import launcher_overrides
from attnlab.errors import ConfigError
from attnlab.models.checkpoint import load_checkpoint
from attnlab.slurm import resource_mismatch
from attnlab.training.loggers import run_id
from attnlab.training.run import run
from hydra_plugins.attnlab_launcher.slurm_launcher import RequeueLimit
from tests.conftest import ROOT, compose_config
from tests.test_ddp import ATOL_WEIGHTS, RTOL, STEPS, common, train_losses, write_corpus

README_SECTION = "## On a cluster"


def readme_lines() -> list[str]:
    """The commands of the README's local-cluster block (its first ```bash block), comments dropped."""
    text = (ROOT / "README.md").read_text()
    section = text[text.index(README_SECTION) :]
    block = section[section.index("```bash\n") + len("```bash\n") : section.index("\n```", section.index("```bash"))]
    return [line.split("  #")[0].strip() for line in block.splitlines() if line.strip()]


def readme_line(start: str) -> str:
    (line,) = [line for line in readme_lines() if line.startswith(start)]
    return line


# ------------------------------------------------------------------------------------------------ fast, no SLURM
def trainer(**keys: object) -> OmegaConf:
    return OmegaConf.create({"accelerator": "cpu", "devices": 1, "num_nodes": 1} | keys)


def test_resources_follow_the_trainer_and_a_typed_mismatch_is_named() -> None:
    agreed = {"nodes": 2, "tasks_per_node": 4, "gpus_per_node": 4}
    assert resource_mismatch(agreed, trainer(accelerator="gpu", devices=4, num_nodes=2)) is None
    assert resource_mismatch(agreed | {"gpus_per_node": None}, trainer(accelerator="gpu", devices=4, num_nodes=2))
    assert resource_mismatch({"nodes": 1, "tasks_per_node": 2}, trainer(devices=[0, 1])) is None
    cases = {
        "hydra.launcher.tasks_per_node": ({"nodes": 1, "tasks_per_node": 3}, trainer(devices=2)),
        "hydra.launcher.nodes": ({"nodes": 2, "tasks_per_node": 1}, trainer()),
        "trainer.devices": ({"nodes": 1, "tasks_per_node": "auto"}, trainer(devices="auto")),
        "hydra.launcher.gpus_per_node": ({"nodes": 1, "tasks_per_node": 2, "gpus_per_node": 1}, trainer(devices=2)),
    }
    for key, (params, trained) in cases.items():
        message = resource_mismatch(params, trained)
        assert message is not None and message.startswith(f"{key}: ") and "\n" not in message


def test_the_preset_takes_nodes_tasks_and_gpus_from_the_trainer(tmp_path: Path, data_cache: Path) -> None:
    overrides = ["hydra/launcher=slurm", "trainer=ddp", "trainer.devices=4", "trainer.num_nodes=3"]
    launcher = compose_config(overrides, tmp_path, data_cache).hydra.launcher
    assert (launcher.nodes, launcher.tasks_per_node, launcher.gpus_per_node) == (3, 4, 4)
    launcher = compose_config(["hydra/launcher=slurm", "trainer=ddp_cpu"], tmp_path, data_cache).hydra.launcher
    assert (launcher.nodes, launcher.tasks_per_node, launcher.gpus_per_node) == (1, 2, None)


@pytest.mark.slow
def test_a_mismatch_is_refused_in_one_line_before_anything_is_submitted(tmp_path: Path) -> None:
    """No sbatch is needed to see it: the launcher stops before it builds its executor."""
    command = [sys.executable, str(ROOT / "train.py"), "-m", "hydra/launcher=slurm", "trainer=cpu", "seed=1,2"]
    command += ["hydra.launcher.tasks_per_node=2", f"hydra.sweep.dir={tmp_path / 'sweep'}"]
    done = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 1
    assert done.stderr.strip().splitlines()[-1] == (
        "error: hydra.launcher.tasks_per_node: 2 tasks per node but trainer.devices=1 (Lightning would wait for "
        "ranks that never start); leave it to follow trainer.devices"
    )
    assert "Traceback" not in done.stderr and not (tmp_path / "sweep" / ".submitit").exists()


def test_a_table_launcher_named_alone_is_the_preset() -> None:
    """``make reproduce-table3 LAUNCHER=slurm`` (or ``LAUNCHER="slurm hydra.launcher.partition=gpu"``)."""
    assert launcher_overrides("slurm hydra.launcher.partition=gpu") == [
        "hydra/launcher=slurm",
        "hydra.launcher.partition=gpu",
    ]
    assert launcher_overrides("hydra/launcher=joblib") == ["hydra/launcher=joblib"] and launcher_overrides("") == []


def test_a_job_past_its_requeues_fails_naming_the_bound() -> None:
    with pytest.raises(ConfigError) as err:
        RequeueLimit(restarts=4, max_requeues=3)(OmegaConf.create({}))
    assert err.value.key == "hydra.launcher.max_requeues" and "requeued 4 times" in str(err.value)


def test_the_wandb_run_id_is_kept_with_the_run(tmp_path: Path) -> None:
    first = run_id(tmp_path / "a")
    assert run_id(tmp_path / "a") == first != run_id(tmp_path / "b")


# ------------------------------------------------------------------------------------------------ slow, on SLURM
def unavailable() -> str | None:
    if shutil.which("slurmctld") is None or shutil.which("munged") is None:
        return "SLURM is not installed (.ci/run installs Debian's slurm-wlm and munge when it runs as root)"
    if os.geteuid() != 0:
        return "the local SLURM cluster (tests/local_slurm.sh) runs as root"
    return None


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimpleNamespace]:
    """The README's local cluster, started with its own line and stopped with its own line."""
    reason = unavailable()
    if reason:
        pytest.skip(reason)
    root = tmp_path_factory.mktemp("slurm")
    env = os.environ | {"ATTNLAB_SLURM_DIR": str(root / "cluster")}
    start = f"{readme_line('eval ')} && env -0"  # the README's line, then what it exported
    started = subprocess.run(["bash", "-c", start], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert started.returncode == 0, started.stderr
    env = dict(item.split("=", 1) for item in started.stdout.split("\0") if "=" in item)
    try:
        yield SimpleNamespace(env=env, root=root, corpus=write_corpus(root / "corpus.txt"))
    finally:
        subprocess.run(shlex.split(readme_line("tests/local_slurm.sh stop")), cwd=ROOT, env=env, timeout=60)


def readme_train(line: str, extra: list[str]) -> list[str]:
    """The README's ``python train.py ...`` line with this machine's Python and the test's settings."""
    words = shlex.split(line)
    assert words[:2] == ["python", "train.py"]
    return [sys.executable, str(ROOT / "train.py"), *words[2:], *extra]


@pytest.fixture
def start_sweep(cluster: SimpleNamespace) -> Iterator:
    """``start_sweep(command)``: a sweep in the background, its output in a file; stopped if the test ends first."""
    started: list[subprocess.Popen] = []

    def start(command: list[str]) -> subprocess.Popen:
        log = (cluster.root / f"sweep-{time.monotonic_ns()}.log").open("w")
        started.append(subprocess.Popen(command, cwd=cluster.root, env=cluster.env, stdout=log, stderr=log))
        return started[-1]

    yield start
    for process in started:
        process.kill()
        process.wait()


def sweep(cluster: SimpleNamespace, command: list[str], timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(command, cwd=cluster.root, env=cluster.env, capture_output=True, text=True, timeout=timeout)


def micro(cluster: SimpleNamespace, name: str, data_cache: Path) -> list[str]:
    return [
        *common(cluster.corpus),
        f"paths.log_dir={cluster.root / 'outputs'}",
        f"paths.cache_dir={data_cache}",
        f"hydra.sweep.dir={cluster.root / name}",
        "hydra.sweep.subdir=job${hydra.job.num}",
    ]


def jobs(sweep_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (sweep_dir / "jobs.jsonl").read_text().splitlines()]


@pytest.mark.slow
def test_a_two_job_sweep_runs_one_slurm_job_per_point(cluster: SimpleNamespace, data_cache: Path) -> None:
    command = readme_train(readme_line("python train.py -m hydra/launcher=slurm trainer=cpu"), [])
    done = sweep(cluster, [*command, *micro(cluster, "sweep", data_cache)])
    assert done.returncode == 0, done.stderr[-3000:]
    assert "2 of 2 jobs completed" in done.stdout
    sweep_dir = cluster.root / "sweep"
    assert [job["status"] for job in jobs(sweep_dir)] == ["completed", "completed"]  # one line per job, rank 0's
    array = {path.name.split("_")[0] for path in (sweep_dir / ".submitit").glob("*_*") if path.is_dir()}
    assert len(array) == 1 and len(list((sweep_dir / ".submitit").glob("*_[01]"))) == 2  # one array, a task per point
    for num in (0, 1):
        assert json.loads((sweep_dir / f"job{num}" / "results.json").read_text())["steps"] == STEPS


@pytest.fixture(scope="module")
def two_nodes(cluster: SimpleNamespace, data_cache: Path) -> SimpleNamespace:
    """The README's 2-node line (2 nodes x 1 gloo process, batch 4 each) and one process with batch 8 in this one."""
    command = readme_train(readme_line("python train.py -m hydra/launcher=slurm trainer=ddp_cpu"), [])
    done = sweep(cluster, [*command, *micro(cluster, "two_nodes", data_cache)])
    assert done.returncode == 0, done.stderr[-3000:]
    single = cluster.root / "single"
    overrides = [*common(cluster.corpus), "trainer=cpu", "data.batch_size=8"]
    run(compose_config(overrides, single, data_cache))
    return SimpleNamespace(ddp=cluster.root / "two_nodes" / "job0", single=single, overrides=overrides)


@pytest.mark.slow
def test_two_nodes_train_like_one_process_on_the_same_global_batch(two_nodes: SimpleNamespace) -> None:
    """Each rank its own half of every batch: were both to see the same blocks, the mean loss would not be the one
    process's (the fast test_ddp test shows the shards add up to its batches, nothing twice)."""
    log = (two_nodes.ddp / "train.log").read_text() + (two_nodes.ddp / "train_ddp_process_1.log").read_text()
    assert "GLOBAL_RANK: 0, MEMBER: 1/2" in log and "GLOBAL_RANK: 1, MEMBER: 2/2" in log
    assert not (two_nodes.ddp / ".hydra-1").exists()  # rank 1 wrote no .hydra/ of its own
    assert len(jobs(two_nodes.ddp.parent)) == 1  # nor a line in jobs.jsonl
    ddp, single = train_losses(two_nodes.ddp), train_losses(two_nodes.single)
    assert len(single) == STEPS and single[-1] < single[0]
    assert ddp == pytest.approx(single, rel=RTOL)
    results = json.loads((two_nodes.ddp / "results.json").read_text())
    assert results["train_tokens"] == STEPS * 2 * 4 * 32


@pytest.mark.slow
def test_the_two_node_checkpoint_resumes_in_one_process(two_nodes: SimpleNamespace, tmp_path: Path, data_cache: Path):
    """The 2-node job's last.ckpt holds the one process's weights (to fp32 rounding) and one process trains on from
    it. (Its data position is rank 0's: one process resumed from it draws other blocks than it would from its own
    checkpoint, so the losses after the resume are not compared.)"""
    ddp = load_checkpoint(two_nodes.ddp / "checkpoints" / "last.ckpt")
    single = load_checkpoint(two_nodes.single / "checkpoints" / "last.ckpt")
    assert ddp.global_step == single.global_step == STEPS
    for name, weight in single.state_dict.items():
        torch.testing.assert_close(ddp.state_dict[name], weight, rtol=0, atol=ATOL_WEIGHTS, msg=f"{name} differs")
    more = [*two_nodes.overrides, f"trainer.max_steps={STEPS + 3}", f"ckpt_path={ddp.path}"]
    results = run(compose_config(more, tmp_path / "from_ddp", data_cache))
    assert results["steps"] == STEPS + 3 and len(train_losses(tmp_path / "from_ddp")) == 3


def long_run(cluster: SimpleNamespace, name: str, data_cache: Path, *extra: str) -> list[str]:
    """A job long enough to be interrupted (60 steps), saving every 10 (so the test sees training under way), inside
    its first epoch (64 batches of 2): a run resumed mid-epoch draws a different order from the next epoch on, with or
    without SLURM (the data module's loader and sampler share one generator)."""
    return [
        sys.executable,
        str(ROOT / "train.py"),
        "-m",
        "hydra/launcher=slurm",
        "trainer=cpu",
        *micro(cluster, name, data_cache),
        "data.batch_size=2",
        "trainer.max_steps=60",
        "trainer.val_check_interval=60",
        "callbacks.last_checkpoint.every_n_train_steps=10",
        "callbacks.last_checkpoint.every_minutes=null",
        "ckpt_path=${resume_ckpt:}",
        *extra,
    ]


def job_id_once_training(sweep_dir: Path, timeout: float = 240) -> str:
    """The SLURM id of the sweep's only job (its submitit folder's name) once its first periodic last.ckpt is
    written."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        logs = sorted((sweep_dir / ".submitit").glob("*/*_log.out"))
        if logs and (sweep_dir / "job0" / "checkpoints" / "last.ckpt").is_file():
            return logs[0].parent.name
        time.sleep(0.2)
    raise AssertionError(f"job 0 of {sweep_dir} did not start training in {timeout} s")


def last_losses(run_dir: Path) -> dict[int, str]:
    """Step -> train/loss as logged, the later row for a step logged twice (before the stop and after the resume)."""
    import csv

    rows = csv.DictReader((run_dir / "csv" / "metrics.csv").open())
    return {int(row["step"]): row["train/loss"] for row in rows if row.get("train/loss")}


@pytest.mark.slow
def test_a_requeued_job_resumes_bit_for_bit_under_the_same_wandb_run(
    cluster: SimpleNamespace, start_sweep, data_cache: Path
) -> None:
    """``scontrol requeue`` (what preemption does) mid-run: the job saves at the end of its step, SLURM starts it
    again, it resumes from that last.ckpt and every later loss equals the uninterrupted job's, to the bit."""
    logged = ["trainer.log_every_n_steps=1", "logger=wandb"]
    requeued = start_sweep(long_run(cluster, "requeued", data_cache, *logged))
    reference = start_sweep(long_run(cluster, "reference", data_cache, *logged))
    job = job_id_once_training(cluster.root / "requeued")
    subprocess.run(["scontrol", "requeue", job], env=cluster.env, check=True)
    for process in (requeued, reference):
        assert process.wait(timeout=400) == 0, sorted(cluster.root.glob("sweep-*.log"))
    run_dir = cluster.root / "requeued" / "job0"
    log = (run_dir / "train.log").read_text()
    (resumed_at,) = map(int, re.findall(r"Resuming \S+ at step (\d+)", log))
    assert 10 <= resumed_at < 60  # saved on SLURM's SIGTERM, mid-run
    assert "Received SIGTERM" in log  # Lightning's, from SLURM
    ours, theirs = last_losses(run_dir), last_losses(cluster.root / "reference" / "job0")
    assert len(theirs) == 60 and ours == theirs
    wandb_id = (run_dir / "wandb" / "run_id").read_text().strip()
    attempts = sorted((run_dir / "wandb").glob("offline-run-*"))
    assert len(attempts) == 2 and all(path.name.endswith(f"-{wandb_id}") for path in attempts)


@pytest.mark.slow
def test_a_job_that_keeps_being_requeued_stops_and_the_summary_names_it(
    cluster: SimpleNamespace, start_sweep, data_cache: Path
) -> None:
    """The time-limit warning (USR2, ``signal_delay_s`` early) makes rank 0 ask SLURM for the requeue; with
    ``max_requeues=0`` the next start is refused and the sweep's summary says why; the checkpoint is kept."""
    process = start_sweep(long_run(cluster, "bounded", data_cache, "hydra.launcher.max_requeues=0"))
    job = job_id_once_training(cluster.root / "bounded")
    subprocess.run(["scancel", "--signal=USR2", job], env=cluster.env, check=True)
    assert process.wait(timeout=400) == 1
    output = "".join(path.read_text() for path in cluster.root.glob("sweep-*.log"))
    (record,) = [job for job in jobs(cluster.root / "bounded") if job["status"] == "failed"][-1:]
    assert record["error"].startswith("error: hydra.launcher.max_requeues: SLURM job")
    assert "requeued 1 times, more than the 0 allowed" in record["error"]
    assert f"job 0 ({' '.join(record['overrides'])}) failed: {record['error']}" in output
    assert (cluster.root / "bounded" / "job0" / "checkpoints" / "last.ckpt").is_file()


@pytest.mark.slow
@pytest.mark.long
def test_a_table_runs_its_cells_as_slurm_jobs_and_a_rerun_submits_nothing(cluster: SimpleNamespace, data_cache: Path):
    """The README's ``make reproduce-table3 SCALE=smoke LAUNCHER=slurm`` (its command, into temporary directories)."""
    words = shlex.split(readme_line("make reproduce-table3"))
    assert words[1:] == ["reproduce-table3", "SCALE=smoke", "LAUNCHER=slurm"]
    runs_dir = cluster.root / "runs"
    command = [sys.executable, str(ROOT / "experiments" / "reproduce_table.py"), "table=table3", "scale=smoke"]
    command += ["launcher=slurm", f"runs_dir={runs_dir}", f"results_dir={cluster.root / 'results'}"]
    command += [f"args='paths.cache_dir={data_cache}'", f"hydra.run.dir={cluster.root / 'table'}"]  # its own log
    done = sweep(cluster, command, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    submitted = sorted(p.name for p in (runs_dir / ".submitit").iterdir() if p.is_dir())  # a folder per job
    assert len([name for name in submitted if "_" in name]) == 4  # 2 arrays (pretrain, fine-tune) of 2 cells
    assert len(list(runs_dir.glob("*/results.json"))) == 4 and "| vanilla" in done.stdout
    again = sweep(cluster, command, timeout=300)
    assert again.returncode == 0, again.stderr[-3000:]
    assert sorted(p.name for p in (runs_dir / ".submitit").iterdir() if p.is_dir()) == submitted
