"""Fine-tuning a Hugging Face checkpoint with a variant swapped in, end to end through train.py's job (offline)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import ClassVar

import lightning as L
import pytest
import torch

from attnlab.data.tokenizer import train_bpe_tokenizer
from attnlab.models.builder import from_hf
from attnlab.models.checkpoint import load_checkpoint
from attnlab.training.module import LanguageModel
from attnlab.training.run import run
from attnlab.validation import OptimSpec

transformers = pytest.importorskip("transformers")
VOCAB = 320


@pytest.fixture(scope="module")
def gpt2_checkpoint(tmp_path_factory: pytest.TempPathFactory, wiki_docs) -> Path:
    """A tiny random GPT2LMHeadModel with its own tokenizer.json, saved as on the hub."""
    directory = tmp_path_factory.mktemp("tiny-gpt2")
    torch.manual_seed(0)
    config = transformers.GPT2Config(vocab_size=VOCAB, n_positions=64, n_embd=32, n_layer=2, n_head=2)
    transformers.GPT2LMHeadModel(config).save_pretrained(directory)
    train_bpe_tokenizer((d["text"] for d in wiki_docs), VOCAB).save(str(directory / "tokenizer.json"))
    return directory


class TrainModeProbe(L.Callback):
    """Records, at every training batch, the modules that are not in train mode (their dropout would be off)."""

    seen: ClassVar[list[list[str]]] = []

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, *args: object) -> None:
        TrainModeProbe.seen.append([name for name, m in pl_module.named_modules() if not m.training])


@pytest.mark.parametrize("attention", ["ssa", "gated_sdpa"])
@pytest.mark.slow
def test_finetune_experiment_runs_with_the_papers_settings(make_config, gpt2_checkpoint, tmp_path, attention):
    out = tmp_path / attention
    overrides = [
        "experiment=finetune/gpt2",
        f"attention={attention}",
        f"model.init_from=hf:{gpt2_checkpoint}",
        "model.dropout=0.1",
        "data=wiki_sample",
        "data.block_size=32",
        "data.batch_size=4",
        "trainer=cpu",
        "logger=csv",
        "train_tokens=1000",
        "trainer.val_check_interval=4",
        "trainer.limit_val_batches=2",
        "callbacks.progress_bar.refresh_rate=0",
        "+callbacks.mode_probe._target_=tests.test_finetune.TrainModeProbe",
    ]
    TrainModeProbe.seen.clear()
    results = run(make_config(overrides, out))
    assert results["steps"] == math.ceil(1000 / (4 * 32))
    # every module trains in train mode: the pretrained model arrives in eval mode and Lightning keeps the mode it
    # finds, which fine-tuned with dropout off
    assert len(TrainModeProbe.seen) == results["steps"] and not any(TrainModeProbe.seen)

    saved = load_checkpoint(out / "checkpoints" / "last.ckpt")
    module = LanguageModel(saved.build_model(), OptimSpec(**saved.spec["optim"]), saved.spec["schedule_steps"], {})
    assert saved.spec["attention"]["name"] == attention
    assert module.model.config.n_layer == 2 and module.model.config.vocab_size == VOCAB
    assert module.model.config.extra["init_from"] == f"hf:{gpt2_checkpoint}"
    # the checkpoint's own tokenizer (not the preset's "gpt2"), and our dropout
    assert module.model.config.tokenizer == str(gpt2_checkpoint) and module.model.config.dropout == 0.1
    opt = module.configure_optimizers()["optimizer"]
    by_name = {g["name"]: g for g in opt.param_groups}
    assert by_name["variant"]["lr"] == pytest.approx(1e-2) and by_name["decay"]["lr"] == pytest.approx(1e-6)
    assert all(g["weight_decay"] == 0.0 for g in opt.param_groups)
    # the pretrained weights moved only slightly at lr 1e-6: fine-tuning started from them, not from scratch
    start = from_hf(str(gpt2_checkpoint), attention=attention).state_dict()
    for name, value in module.model.state_dict().items():
        if ".variant." not in name and name in start and value.is_floating_point():
            assert torch.allclose(value, start[name], atol=1e-4), name
