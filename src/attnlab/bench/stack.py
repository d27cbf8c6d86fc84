"""What the framework costs: ``train.py`` (Hydra, Lightning, the callbacks and checkpoints) against a bare PyTorch
loop over the same model, data and batches, each timed from the start of fitting to its end.

``train.py`` runs as researchers run it, in a subprocess; its tokens/s is the one it reports (``results.json``:
tokens of this run over the seconds of ``trainer.fit``). The bare loop runs here: the same composed config, the
same DataModule, plain AdamW, no logging, no checkpoint.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from hydra import compose, initialize_config_dir
from omegaconf import DictConfig

import attnlab.resolvers  # noqa: F401  (the config's resolvers)
from attnlab.bench.timing import Progress
from attnlab.configs import plain
from attnlab.data import TextDataModule
from attnlab.models import build_gpt
from attnlab.nn_utils import next_token_loss
from attnlab.training.run import build_datamodule

ROOT = Path(__file__).resolve().parents[3]


def train_py_tokens_per_s(overrides: list[str], run_dir: Path) -> float:
    command = [sys.executable, str(ROOT / "train.py"), *overrides, f"hydra.run.dir={run_dir}"]
    subprocess.run(command, check=True, cwd=ROOT, capture_output=True)
    return json.loads((run_dir / "results.json").read_text())["tokens_per_second"]


def default_training(overrides: list[str]) -> tuple[DictConfig, dict, TextDataModule]:
    """``train.yaml`` with ``overrides``, its model config and its DataModule: what ``train.py`` would train on."""
    with initialize_config_dir(str(ROOT / "conf"), version_base="1.3"):
        cfg = compose("train", overrides=overrides)
    model_cfg = dict(plain(cfg.model))
    return cfg, model_cfg, build_datamodule(cfg, model_cfg)


def bare_loop_tokens_per_s(overrides: list[str], steps: int, device: torch.device) -> float:
    cfg, model_cfg, datamodule = default_training(overrides)
    torch.manual_seed(cfg.seed)
    datamodule.prepare_data()
    started = time.perf_counter()
    datamodule.setup("fit")
    model_cfg["vocab_size"] = datamodule.vocab_size
    model = build_gpt(model_cfg, plain(cfg.attention)).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.optim.lr, weight_decay=cfg.optim.weight_decay)
    tokens = 0
    for step, batch in enumerate(datamodule.train_dataloader(), 1):
        ids = batch["input_ids"].to(device).long()
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
            loss = next_token_loss(model, ids)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        tokens += ids[:, 1:].numel()
        if step == steps:
            break
    loss.item()  # waits for the last step on a GPU
    return tokens / (time.perf_counter() - started)


def stack_overhead(steps: int, repeats: int, device: torch.device, progress: Progress) -> list[dict[str, float]]:
    """Alternating train.py and bare-loop runs of ``steps`` steps each on the default model and data."""
    overrides = [
        f"trainer.max_steps={steps}",
        "trainer.limit_val_batches=0",
        "print_config=false",
        "trainer=gpu" if device.type == "cuda" else "trainer=cpu",
    ]
    rows = []
    with tempfile.TemporaryDirectory() as scratch:
        for repeat in range(1, repeats + 1):
            progress(f"stack: train.py, {steps} steps ({repeat}/{repeats})")
            framework = train_py_tokens_per_s(overrides, Path(scratch) / f"run{repeat}")
            progress(f"stack: bare loop, {steps} steps ({repeat}/{repeats})")
            bare = bare_loop_tokens_per_s(overrides, steps, device)
            rows.append({"repeat": repeat, "train.py": framework, "bare loop": bare, "overhead": bare / framework - 1})
    return rows
