"""W&B runs: names that tell runs apart (the seed; a sweep job's swept overrides), groups (the experiment, the sweep,
the table), tags (swept keys), one name per metric and no warnings from our settings. Runs are offline and read back
from their ``.wandb`` files."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import wandb
from hydra.core.hydra_config import HydraConfig
from hydra.utils import instantiate
from omegaconf import OmegaConf, open_dict, read_write
from wandb.errors import term

from attnlab.training.loggers import log_results, run_identity
from attnlab.training.sweeps import SWEPT_KEYS, SweepJob, SweepReport, current_job, swept_keys
from tests.conftest import ROOT
from tests.reliability import TINY_RUN
from tests.wandb_offline import wandb_runs


@pytest.fixture
def sweep_job(make_config, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """``sweep_job(swept, overrides)``: the config of job 0 of a ``-m`` sweep over the keys ``swept``, composed from
    ``overrides`` (the job's own, one value per key) into ``<tmp>/sweep/multirun_x/0_job``; Hydra's job state is put
    back afterwards, so no later test runs as a sweep job."""
    earlier = HydraConfig.instance().cfg

    def make(swept: list[str], overrides: list[str]):
        monkeypatch.setenv(SWEPT_KEYS, json.dumps(swept))
        output = tmp_path / "sweep" / "multirun_x" / "0_job"
        cfg = make_config(overrides, output)
        with read_write(cfg.hydra), open_dict(cfg):  # Hydra left it read-only
            cfg.hydra.mode = "MULTIRUN"
            cfg.hydra.overrides.task = overrides
            cfg.hydra.sweep.subdir = "0_job"
        HydraConfig().set_config(cfg)
        return cfg

    yield make
    HydraConfig.instance().cfg = earlier


def test_wandb_run_name_and_tags_carry_the_seed(make_config) -> None:
    cfg = make_config(["logger=wandb", "model=tiny-neox", "attention=ssa", "seed=7"])
    settings = OmegaConf.to_container(cfg.logger.wandb, resolve=True)
    assert settings["name"] == "tiny-neox-ssa-s7"
    assert {"ssa", "tiny-neox", "seed-7"} <= set(settings["tags"])


def test_a_single_run_keeps_its_name_and_is_grouped_by_experiment(make_config) -> None:
    cfg = make_config(["logger=wandb", "attention=vanilla", "experiment_name=abl"])
    assert current_job() is None
    settings = OmegaConf.to_container(cfg.logger.wandb, resolve=True)
    name, group, tags = run_identity(
        settings["name"], settings["group"], settings["tags"], settings["experiment"], None, settings["name_keys"]
    )
    assert (name, group) == ("tiny-vanilla-s1337", "abl") and not any(t.startswith("swept:") for t in tags)


def test_swept_keys_are_those_given_several_values() -> None:
    command = ["optim.lr=1e-3,2e-3", "logger=wandb", "seed=range(1,3)", "+x@pkg=1", "attention=choice(a,b)", "a=[1,2]"]
    assert swept_keys(command) == ["optim.lr", "seed", "attention"]
    assert swept_keys(["model=tiny,gpt2", "seed=1,2", "model=tiny"]) == ["seed"]  # the last value decides


def test_a_multirun_passes_its_swept_keys_to_its_jobs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The command line's sweeps and a config file's ``hydra.sweeper.params`` both count; the command line wins."""
    monkeypatch.delenv(SWEPT_KEYS, raising=False)
    monkeypatch.setenv("ATTNLAB_SWEEP_ID", "")  # set again by the callback; put back by monkeypatch
    hydra = {
        "sweep": {"dir": str(tmp_path / "sweep")},
        "sweeper": {"params": {"optim.beta2": "0.95,0.99", "seed": "1,2"}},
    }
    hydra["overrides"] = {"task": ["optim.lr=1e-3,2e-3", "logger=wandb", "seed=1"]}
    SweepReport().on_multirun_start(OmegaConf.create({"hydra": hydra}))
    assert json.loads(os.environ[SWEPT_KEYS]) == ["optim.beta2", "optim.lr"]


def test_a_sweep_job_is_named_by_its_swept_overrides(sweep_job) -> None:
    """Keys the name already shows (attention, seed) are not added again: the table engine's cells keep their names."""
    cfg = sweep_job(["optim.lr", "attention", "seed"], ["optim.lr=0.001", "logger=wandb", "attention=ssa", "seed=2"])
    job = current_job()
    assert job == SweepJob(
        Path(cfg.hydra.runtime.output_dir).parent,
        ("optim.lr", "attention", "seed"),
        {"optim.lr": "optim.lr=0.001", "attention": "attention=ssa", "seed": "seed=2"},
    )
    settings = OmegaConf.to_container(cfg.logger.wandb, resolve=True)
    name, group, tags = run_identity(
        settings["name"], settings["group"], settings["tags"], settings["experiment"], job, settings["name_keys"]
    )
    assert name == "tiny-ssa-s2-optim.lr=0.001" and group == "default-multirun_x"
    assert {"swept:optim.lr", "swept:attention", "swept:seed", "ssa"} <= set(tags)
    _, table_group, _ = run_identity(settings["name"], "table3-cpu", [], "table3-cpu-pretrain", job, ["attention"])
    assert table_group == "table3-cpu"  # the table engine's group stays


def test_a_sweep_jobs_offline_run_has_its_name_group_tags_one_name_per_metric_and_no_warning(
    sweep_job, capfd: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The run as W&B records it: its ``.wandb`` file; the results the run logged as metrics are not sent again
    under their results.json names (val_loss), and wandb prints no warning about our settings (``reinit``,
    ``anonymous``) however many runs came before in this process."""
    monkeypatch.setattr(term, "_printed_messages", set())  # warnings wandb prints once per process count here too
    cfg = sweep_job(["optim.lr"], ["optim.lr=0.002", "logger=wandb"])
    logger = instantiate(cfg.logger.wandb)
    try:
        logger.log_metrics({"val/loss": 6.5, "val/ppl": 665.1, "outliers/kurtosis_max": 3.0}, step=2)
        results = {"val_loss": 6.5, "val_ppl": 665.1, "unigram_ppl": 200.0, "monitor": {"outliers/kurtosis_max": 3.0}}
        log_results([logger], results)
    finally:
        wandb.finish()
    printed = capfd.readouterr()
    assert "WARNING" not in printed.out + printed.err
    (run,) = wandb_runs(Path(cfg.hydra.runtime.output_dir))
    assert run["name"] == "tiny-vanilla-s1337-optim.lr=0.002" and run["group"] == "default-multirun_x"
    assert {"swept:optim.lr", "vanilla", "seed-1337"} <= run["tags"] and run["job_type"] == "train"
    assert {"val/loss", "val/ppl", "outliers/kurtosis_max"} <= run["history"]
    assert run["summary"]["val/loss"] == 6.5 and run["summary"]["unigram_ppl"] == 200.0
    assert not {"val_loss", "val_ppl"} & run["summary"].keys()
    assert not [key for key in run["summary"] if key.startswith("monitor")]


@pytest.mark.slow
def test_an_lr_sweep_logs_one_named_run_per_job(tmp_path: Path, data_cache: Path) -> None:
    """``train.py -m optim.lr=1e-3,2e-3 logger=wandb``: two offline runs in the sweep's group, each named by its lr,
    with one name per metric, and no W&B warning in the output."""
    overrides = [*TINY_RUN, "trainer.max_steps=2", "trainer.val_check_interval=2", "print_config=false"]
    overrides += [f"paths.log_dir={tmp_path / 'outputs'}", f"paths.cache_dir={data_cache}", "experiment_name=lr"]
    command = [sys.executable, "train.py", "-m", "optim.lr=1e-3,2e-3", "logger=wandb", *overrides]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "wandb: WARNING" not in done.stdout + done.stderr
    (sweep,) = (tmp_path / "outputs" / "lr").glob("multirun_*")
    jobs = sorted(p for p in sweep.iterdir() if p.is_dir())
    runs = [run for job in jobs for run in wandb_runs(job)]
    assert [run["name"] for run in runs] == ["tiny-vanilla-s1337-optim.lr=0.001", "tiny-vanilla-s1337-optim.lr=0.002"]
    assert {run["group"] for run in runs} == {f"lr-{sweep.name}"}
    for job, run in zip(jobs, runs, strict=True):
        assert "swept:optim.lr" in run["tags"] and {"val/loss", "train/loss"} <= run["history"]
        assert not {"val_loss", "val_ppl"} & run["summary"].keys()
        results = json.loads((job / "results.json").read_text())
        assert run["summary"]["val/loss"] == pytest.approx(results["val_loss"])
