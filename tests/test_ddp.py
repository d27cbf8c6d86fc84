"""DDP on the CPU (gloo, 2 processes, trainer=ddp_cpu): the same losses and weights as one process on the same global
batch, one run directory for both ranks, and a checkpoint that evaluates in a single process to the same loss."""

from __future__ import annotations

import csv
import json
import random
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import lightning as L
import pytest
import torch
from datasets import Dataset
from hydra.utils import instantiate
from omegaconf import OmegaConf

from attnlab.data import TextDataModule
from attnlab.errors import ConfigError
from attnlab.eval.lm import AttnlabLM
from attnlab.models.checkpoint import load_checkpoint
from attnlab.run_directory import KeepEarlierRunConfig
from attnlab.training.run import run
from tests.conftest import MICRO_MODEL, ROOT, compose_config

STEPS = 5  # optimizer steps, all inside the first epoch (the corpus has 129 training blocks, 16 steps of 8)
# DDP against one process differs by fp32 rounding only (two half-batch means averaged by the all-reduce vs one
# mean). Losses: relative 1e-5 (measured <= 2e-7: per step, validation, the checkpoint evaluated alone). Weights:
# absolute 1e-5 (they are 0.007 to 1; measured 1.5e-6, in the attention key bias: its gradient is zero up to
# rounding, as softmax ignores a shift common to all scores, and AdamW's division by the gradient's root mean
# square makes steps of that rounding).
RTOL = 1e-5
ATOL_WEIGHTS = 1e-5


def write_corpus(path: Path, paragraphs: int = 64, words: int = 40) -> Path:
    """Blank-line separated paragraphs of seeded pseudo-words: 129 training and 17 validation blocks of 33 tokens."""
    rng = random.Random(0)
    vocab = ["".join(rng.choice("abcdefghij") for _ in range(rng.randint(2, 6))) for _ in range(300)]
    path.write_text("\n\n".join(" ".join(rng.choice(vocab) for _ in range(words)) + "." for _ in range(paragraphs)))
    return path


def common(corpus: Path) -> list[str]:
    return [
        "logger=csv",
        "callbacks.progress_bar.refresh_rate=0",
        "print_config=false",
        "experiment_name=ddp",
        *MICRO_MODEL,
        "data=text_files",
        f"data.files=['{corpus}']",
        "data.block_size=32",
        "data.tokenizer_vocab_size=512",
        f"trainer.max_steps={STEPS}",
        f"trainer.val_check_interval={STEPS}",
        "trainer.log_every_n_steps=1",
        "optim.warmup_steps=2",
    ]


def train_losses(run_dir: Path) -> list[float]:
    rows = csv.DictReader((run_dir / "csv" / "metrics.csv").open())
    return [float(row["train/loss"]) for row in rows if row.get("train/loss")]


# ------------------------------------------------------------------------------------------------ fast, one process
def micro_datamodule(blocks: int, batch_size: int, world_size: int, rank: int) -> TextDataModule:
    """A TextDataModule over ``blocks`` numbered blocks, as rank ``rank`` of ``world_size`` sees it."""
    datamodule = TextDataModule(name="numbers", source="files", files=["unused"], batch_size=batch_size, seed=3)
    rows = Dataset.from_dict({"input_ids": [[i, i] for i in range(blocks)]}).with_format("torch")
    datamodule.train_dataset, datamodule.val_dataset = rows, rows  # prepare() then has nothing to do
    if world_size > 1:
        datamodule.trainer = SimpleNamespace(world_size=world_size, global_rank=rank)
    return datamodule


def block_ids(loader) -> list[list[int]]:
    return [batch["input_ids"][:, 0].tolist() for batch in loader]


@pytest.mark.parametrize(("blocks", "world_size"), [(103, 2), (50, 3)])
def test_ranks_batches_add_up_to_the_single_process_batch(blocks: int, world_size: int) -> None:
    """Step k of N processes with batch 4 covers what one process's step k with batch N x 4 covers, as many steps;
    validation splits the blocks between the processes without scoring any twice."""
    single = block_ids(micro_datamodule(blocks, 4 * world_size, 1, 0).train_dataloader())
    ranks = [block_ids(micro_datamodule(blocks, 4, world_size, r).train_dataloader()) for r in range(world_size)]
    assert all(len(batches) == len(single) for batches in ranks)
    for step, batch in enumerate(single):
        assert sorted(batch) == sorted(i for batches in ranks for i in batches[step])
    shares = [block_ids(micro_datamodule(blocks, 4, world_size, r).val_dataloader()) for r in range(world_size)]
    assert sorted(i for share in shares for batch in share for i in batch) == list(range(blocks))


def test_a_ddp_rank_leaves_rank_zeros_config_in_place(tmp_path: Path) -> None:
    """Lightning starts rank 1 with hydra.run.dir=<rank 0's directory> hydra.output_subdir=null: rank 0's .hydra/
    stays, where resuming into a run directory moves the earlier one aside."""
    (tmp_path / ".hydra").mkdir()
    (tmp_path / ".hydra" / "config.yaml").write_text("seed: 1\n")
    rank_one = OmegaConf.create({"hydra": {"run": {"dir": str(tmp_path)}, "output_subdir": None}})
    KeepEarlierRunConfig().on_run_start(rank_one)
    assert (tmp_path / ".hydra" / "config.yaml").is_file() and not (tmp_path / ".hydra-1").exists()
    resumed = OmegaConf.create({"hydra": {"run": {"dir": str(tmp_path)}, "output_subdir": ".hydra"}})
    KeepEarlierRunConfig().on_run_start(resumed)
    assert (tmp_path / ".hydra-1" / "config.yaml").is_file()


def test_ddp_in_a_sweep_is_refused_before_any_process_starts(
    tmp_path: Path, data_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Lightning would re-run the whole ``-m`` command for rank 1; the job stops with the key instead."""
    monkeypatch.setattr(L.Trainer, "fit", lambda *args, **kwargs: pytest.fail("fit would start rank 1"))
    monkeypatch.setattr("attnlab.training.run.in_multirun", lambda: True)  # a -m job
    cfg = compose_config([*common(write_corpus(tmp_path / "corpus.txt")), "trainer=ddp_cpu"], tmp_path, data_cache)
    with pytest.raises(ConfigError) as err:
        run(cfg)
    assert err.value.key == "trainer.devices"


# ------------------------------------------------------------------------------------------------ slow, 2 processes
@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory, data_cache: Path) -> SimpleNamespace:
    """The same 5 steps twice: ``python train.py trainer=ddp_cpu`` (2 processes, batch 4 each) and one process with
    batch 8 (in this process)."""
    root = tmp_path_factory.mktemp("ddp")
    overrides = common(write_corpus(root / "corpus.txt"))
    logs = root / "outputs"
    command = [sys.executable, str(ROOT / "train.py"), *overrides, "trainer=ddp_cpu", "data.batch_size=4"]
    command += [f"paths.log_dir={logs}", f"paths.cache_dir={data_cache}"]
    done = subprocess.run(command, cwd=root, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-4000:]
    single_dir = root / "single"
    run(compose_config([*overrides, "trainer=cpu", "data.batch_size=8"], single_dir, data_cache))
    return SimpleNamespace(logs=logs, typed=command[2:], single=single_dir)


@pytest.fixture(scope="module")
def ddp_dir(runs: SimpleNamespace) -> Path:
    dirs = list((runs.logs / "ddp").iterdir())
    assert len(dirs) == 1, dirs
    return dirs[0]


@pytest.mark.slow
def test_both_ranks_write_into_one_run_directory(runs: SimpleNamespace, ddp_dir: Path) -> None:
    assert [p.name for p in runs.logs.iterdir()] == ["ddp"]
    assert (ddp_dir / ".hydra" / "config.yaml").is_file() and not list(ddp_dir.glob(".hydra-*"))
    typed = OmegaConf.load(ddp_dir / ".hydra" / "overrides.yaml")
    assert list(typed) == runs.typed  # rank 0's, not rank 1's (which adds hydra.run.dir=...)
    assert "GLOBAL_RANK: 1, MEMBER: 2/2" in (ddp_dir / "train_ddp_process_1.log").read_text()
    assert "GLOBAL_RANK: 0, MEMBER: 1/2" in (ddp_dir / "train.log").read_text()
    results = json.loads((ddp_dir / "results.json").read_text())
    assert results["steps"] == STEPS and results["train_tokens"] == STEPS * 2 * 4 * 32
    assert (ddp_dir / "checkpoints" / "last.ckpt").is_file()


@pytest.mark.slow
def test_two_processes_train_like_one_on_the_same_global_batch(runs: SimpleNamespace, ddp_dir: Path) -> None:
    """Per-step losses (the mean over both ranks), the final weights and the validation loss of 2 x batch 4 match
    1 x batch 8 to fp32 rounding."""
    ddp, single = train_losses(ddp_dir), train_losses(runs.single)
    assert len(single) == STEPS and single[-1] < single[0]  # it trains
    assert ddp == pytest.approx(single, rel=RTOL)
    ddp_weights = load_checkpoint(ddp_dir / "checkpoints" / "last.ckpt").state_dict
    single_weights = load_checkpoint(runs.single / "checkpoints" / "last.ckpt").state_dict
    assert ddp_weights.keys() == single_weights.keys()
    for name, weight in single_weights.items():
        torch.testing.assert_close(ddp_weights[name], weight, rtol=0, atol=ATOL_WEIGHTS, msg=f"{name} differs")
    val = [json.loads((d / "results.json").read_text())["val_loss"] for d in (ddp_dir, runs.single)]
    assert val[0] == pytest.approx(val[1], rel=RTOL)


@pytest.mark.slow
def test_the_ddp_checkpoint_evaluates_in_one_process_to_the_runs_validation_loss(ddp_dir: Path) -> None:
    """last.ckpt through the eval API (AttnlabLM, lm-eval's loglikelihood path) on every validation block gives
    the loss both ranks together reported for the model in memory (results.json, after the last step)."""
    datamodule = instantiate(OmegaConf.load(ddp_dir / ".hydra" / "config.yaml").data)
    datamodule.prepare()
    blocks = [row["input_ids"].tolist() for row in datamodule.val_dataset]
    assert len(blocks) % 2 == 1  # the ranks' shares differ by one: nothing may be scored twice
    lm = AttnlabLM(checkpoint=str(ddp_dir / "checkpoints" / "last.ckpt"), batch_size=4)
    scores = lm._loglikelihood_tokens([(None, block[:1], block[1:]) for block in blocks], disable_tqdm=True)
    loss = -sum(logprob for logprob, _ in scores) / sum(len(block) - 1 for block in blocks)
    in_memory = json.loads((ddp_dir / "results.json").read_text())["val_loss"]
    assert loss == pytest.approx(in_memory, rel=RTOL)


@pytest.mark.slow
def test_an_fsdp_checkpoint_from_a_gpu_evaluates_in_one_cpu_process(tmp_path: Path, data_cache: Path) -> None:
    """``tests/fixtures/fsdp_h100_step40.ckpt``: ``train.py trainer=fsdp trainer.devices=1`` on an H100 (bf16-mixed,
    per-block FSDP units with activation checkpointing, full state dict; 2026-11-22), 2 x 4 x 64 model, vocab 4096,
    40 steps, optimizer state dropped to keep the file small. Scored here in fp32 on every validation block of the
    embedded corpus it gives the validation loss the GPU run reported (7.03018), to bf16's rounding."""
    cfg = compose_config(["data.tokenizer_vocab_size=4096"], tmp_path, data_cache)
    datamodule = instantiate(cfg.data, tokenizer=None)
    datamodule.prepare()
    blocks = [row["input_ids"].tolist() for row in datamodule.val_dataset]
    checkpoint = ROOT / "tests" / "fixtures" / "fsdp_h100_step40.ckpt"
    assert load_checkpoint(checkpoint).global_step == 40
    lm = AttnlabLM(checkpoint=str(checkpoint), batch_size=8)
    assert lm.tokenizer.get_vocab() == datamodule.tokenizer.get_vocab()
    scores = lm._loglikelihood_tokens([(None, block[:1], block[1:]) for block in blocks], disable_tqdm=True)
    loss = -sum(logprob for logprob, _ in scores) / sum(len(block) - 1 for block in blocks)
    assert loss == pytest.approx(7.03018, rel=1e-4)


def test_fsdp_wraps_each_block_and_is_refused_on_the_cpu(make_config) -> None:
    """Lightning's FSDPStrategy needs GPUs, so FSDP cannot run in CI: what can be checked here is the wrapping it is
    given (one unit per transformer block, recomputed in backward, a full state dict that loads anywhere) and that
    asking for it on the CPU is one line naming the key, before anything starts."""
    from lightning.pytorch.strategies import FSDPStrategy

    from attnlab.models.gpt import Block
    from attnlab.training.strategies import fsdp

    strategy = fsdp()
    assert isinstance(strategy, FSDPStrategy) and strategy._state_dict_type == "full"
    assert strategy.kwargs["auto_wrap_policy"]._module_classes == {Block}
    assert strategy._activation_checkpointing_kwargs["auto_wrap_policy"]._module_classes == {Block}
    assert strategy.kwargs["use_orig_params"]  # parameter names as in the model (optimizer groups, checkpoints)
    with pytest.raises(ConfigError) as err:
        run(make_config(["trainer=fsdp", "trainer.accelerator=cpu", *MICRO_MODEL]))
    assert err.value.key == "trainer.accelerator"
