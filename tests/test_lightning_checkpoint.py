"""Lightning's conventions on our checkpoints: ``LanguageModel.load_from_checkpoint(path)`` rebuilds the module from
the checkpoint alone, and ``train.py ckpt_path=last`` resumes the newest ``last.ckpt`` of the same experiment."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from omegaconf import open_dict

from attnlab.errors import ConfigError
from attnlab.models.checkpoint import RECORD_KEY, load_checkpoint
from attnlab.training.module import LanguageModel
from attnlab.training.run import run
from attnlab.validation import OptimSpec, resolve_last_checkpoint, validate_train_config
from tests.conftest import MICRO_DATA, MICRO_MODEL, ROOT
from tests.reliability import TINY_RUN

QUIET = ["logger=csv", "trainer=cpu", "callbacks.progress_bar.refresh_rate=0", *MICRO_MODEL, *MICRO_DATA]
SHORT = ["trainer.val_check_interval=2", "trainer.limit_val_batches=1", "optim.warmup_steps=1"]
FIXTURE = ROOT / "tests" / "fixtures" / "fsdp_h100_step40.ckpt"


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory, data_cache: Path) -> Path:
    """last.ckpt of a 3-step run with a variant that has its own parameters and token features (ssa)."""
    from tests.conftest import compose_config

    out = tmp_path_factory.mktemp("trained")
    run(compose_config([*QUIET, *SHORT, "trainer.max_steps=3", "attention=ssa"], out, data_cache))
    return out / "checkpoints" / "last.ckpt"


@pytest.mark.slow
def test_load_from_checkpoint_rebuilds_the_module_from_the_checkpoint_alone(trained: Path) -> None:
    module = LanguageModel.load_from_checkpoint(trained)
    saved = load_checkpoint(trained)
    assert module.model.attention_config["name"] == "ssa" and module.schedule_steps == saved.spec["schedule_steps"]
    assert module.optim == OptimSpec(**saved.spec["optim"])
    assert module.run_record == torch.load(trained, map_location="cpu", weights_only=True)[RECORD_KEY]
    idx = torch.randint(0, module.model.config.vocab_size, (2, 16))
    with torch.no_grad():
        torch.testing.assert_close(module.eval()(idx), saved.build_model().eval()(idx), atol=0, rtol=0)


def test_load_from_checkpoint_reads_checkpoints_written_before_it_existed() -> None:
    """The FSDP fixture (no hyperparameters, only the record) loads, on the CPU."""
    module = LanguageModel.load_from_checkpoint(FIXTURE, map_location="cpu")
    assert module.model.config.n_layer == 2 and module.schedule_steps == 40
    with torch.no_grad():
        assert torch.isfinite(module.eval()(torch.zeros(1, 8, dtype=torch.long))).all()


@pytest.mark.slow
def test_a_checkpoint_without_the_record_is_one_clear_error(trained: Path, tmp_path: Path) -> None:
    raw = torch.load(trained, map_location="cpu", weights_only=True)
    del raw[RECORD_KEY]
    torch.save(raw, tmp_path / "bare.ckpt")
    with pytest.raises(ConfigError, match=r"^checkpoint: carries no attnlab record"):
        LanguageModel.load_from_checkpoint(tmp_path / "bare.ckpt")


def fake_run(log_dir: Path, experiment: str, run: str, mtime: float) -> Path:
    last = log_dir / experiment / run / "checkpoints" / "last.ckpt"
    last.parent.mkdir(parents=True)
    last.write_bytes(b"")
    os.utime(last, (mtime, mtime))
    return last


def test_last_is_the_newest_last_ckpt_of_the_same_experiment(make_config, tmp_path: Path) -> None:
    log_dir = tmp_path / "outputs"
    fake_run(log_dir, "exp", "2026-01-01_00-00-00_aaaaaa", 3_000)
    newest = fake_run(log_dir, "exp", "2025-12-31_00-00-00_bbbbbb", 4_000)  # resumed into later: newer file
    fake_run(log_dir, "other", "2026-01-02_00-00-00_cccccc", 9_000)  # another experiment
    fake_run(log_dir / "exp" / "multirun_2026-01-03_00-00-00_dddddd", "", "0_seed=1", 9_000)  # a sweep's job
    cfg = make_config(["experiment_name=exp", "ckpt_path=last"])
    with open_dict(cfg):
        cfg.paths.log_dir = str(log_dir)
    resolve_last_checkpoint(cfg)
    assert cfg.ckpt_path == str(newest)


def test_last_with_no_checkpoint_is_one_line_naming_the_experiment(make_config, tmp_path: Path) -> None:
    cfg = make_config(["experiment_name=fresh", "ckpt_path=last"])
    with pytest.raises(ConfigError) as err:
        validate_train_config(cfg)
    assert err.value.key == "ckpt_path" and "\n" not in str(err.value)
    assert str(err.value).startswith(
        "ckpt_path: last: no run of experiment_name=fresh has saved a checkpoints/last.ckpt"
    )


@pytest.mark.slow
def test_train_py_ckpt_path_last_resumes_the_experiments_latest_run(tmp_path: Path, data_cache: Path) -> None:
    """As a user runs it: two runs in outputs/<experiment>/<run id>/, the second resuming the first's last.ckpt."""
    common = [*TINY_RUN, f"paths.log_dir={tmp_path}", f"paths.cache_dir={data_cache}", "experiment_name=exp"]

    def train(*overrides: str) -> subprocess.CompletedProcess:
        command = [sys.executable, "train.py", *common, *overrides]
        return subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=600)

    first = train("trainer.max_steps=4")
    assert first.returncode == 0, first.stderr[-3000:]
    (first_dir,) = (tmp_path / "exp").iterdir()
    resumed = train("trainer.max_steps=6", "ckpt_path=last")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    (second_dir,) = set((tmp_path / "exp").iterdir()) - {first_dir}
    saved = yaml.safe_load((second_dir / ".hydra" / "config.yaml").read_text())
    assert saved["ckpt_path"] == str(first_dir / "checkpoints" / "last.ckpt")  # the run records what it resumed
    assert load_checkpoint(second_dir / "checkpoints" / "last.ckpt").global_step == 6
    missing = train("experiment_name=none", "ckpt_path=last")
    assert missing.returncode == 1 and missing.stderr.strip().splitlines()[-1].startswith(
        "error: ckpt_path: last: no run"
    )
