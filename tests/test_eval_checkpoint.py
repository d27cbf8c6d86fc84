"""A training run's checkpoint evaluates on its own: same architecture, variant, weights and tokenizer; train.py's
``eval.after_train`` hook and ``python evaluate.py`` both run the quick task set on it."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from tokenizers import Tokenizer

from attnlab.attention import available_attention
from attnlab.attention.base import resolve_options
from attnlab.eval.lm import AttnlabLM
from attnlab.models import ModelConfig
from attnlab.training.module import LanguageModel
from attnlab.training.run import run
from tests.conftest import MICRO_DATA, MICRO_MODEL, ROOT, compose_config

ATTENTION = "gated_sdpa" if "gated_sdpa" in available_attention() else "vanilla"
PASSKEY = ["eval.passkey.context_lengths=[200]", "eval.passkey.samples_per_length=2"]


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory, data_cache: Path) -> tuple[Path, dict]:
    """Three training steps, then the after-train evaluation (quick task set, 2 examples per task)."""
    out = tmp_path_factory.mktemp("eval-train") / "run"
    overrides = [
        "logger=csv",
        "trainer=cpu",
        "callbacks.progress_bar.refresh_rate=0",
        *MICRO_MODEL,
        *MICRO_DATA,
        "model.block_size=256",
        f"attention={ATTENTION}",
        "trainer.max_steps=3",
        "trainer.val_check_interval=3",
        "trainer.limit_val_batches=2",
        "eval=quick",
        "eval.after_train=true",
        "eval.limit=2",
        *PASSKEY,
    ]
    results = run(compose_config(overrides, out, data_cache))
    return out, results


def test_checkpoint_round_trips_with_its_variant_weights_and_tokenizer(trained: tuple[Path, dict]) -> None:
    out, _ = trained
    ckpt = out / "checkpoints" / "last.ckpt"
    lm = AttnlabLM(checkpoint=str(ckpt))
    hparams = torch.load(ckpt, map_location="cpu", weights_only=False)["hyper_parameters"]
    assert lm.model.config == ModelConfig.from_dict(hparams["model"])
    assert lm.model.attention_config["name"] == ATTENTION == hparams["attention"]["name"]
    assert type(lm.model.blocks[0].attn.variant) is resolve_options({"name": ATTENTION})[0]
    reference = LanguageModel.load_from_checkpoint(str(ckpt), map_location="cpu").model.eval()
    for name, value in reference.state_dict().items():
        assert torch.equal(lm.model.state_dict()[name], value), name
    assert lm.tokenizer.to_str() == Tokenizer.from_file(str(out / "tokenizer.json")).to_str()
    ids = torch.tensor([lm.tok_encode("The history of the city")])
    assert torch.equal(lm.model(ids), reference(ids))


def test_training_evaluates_its_checkpoint_when_asked(trained: tuple[Path, dict]) -> None:
    out, results = trained
    summary = results["eval"]
    assert summary["heldout_word_ppl"] > 1 and 0 <= summary["passkey_200"] <= 1
    saved = json.loads((out / "eval" / "results.json").read_text())
    assert saved["passkey"]["per_length"] == {"200": summary["passkey_200"]}
    assert saved["summary"]["checkpoint"] == results["best_checkpoint"]


def test_evaluate_cli_runs_the_quick_task_set(trained: tuple[Path, dict], tmp_path: Path, data_cache: Path) -> None:
    out, _ = trained
    command = [
        sys.executable,
        "evaluate.py",
        f"ckpt_path={out}/checkpoints/last.ckpt",
        "eval=quick",
        "limit=2",
        *PASSKEY,
        f"hydra.run.dir={tmp_path}/eval",
        f"paths.cache_dir={data_cache}",
        f"results_csv={tmp_path}/r.csv",
    ]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "attnlab eval [quick]" in done.stdout and "heldout_word_ppl" in done.stdout
    record = json.loads((tmp_path / "eval" / "results.json").read_text())
    assert set(record["versions"]) == {"passkey", "attnlab_heldout"} and record["lm_eval_version"]
    assert record["model"]["attnlab_attention"] == ATTENTION
    (row,) = list(csv.DictReader((tmp_path / "r.csv").open()))
    assert row["suite"] == "quick" and float(row["heldout_word_ppl"]) > 1
