"""attnlab.models.checkpoint and attnlab.run_directory: safe checkpoint loading, fine-tuning from our own
checkpoints, resume semantics, the schedule."""

from __future__ import annotations

import json
import math
import os
import pickle
import shutil
from pathlib import Path

import pytest
import torch

from attnlab.errors import ConfigError
from attnlab.models import GPT, ModelConfig, build_gpt
from attnlab.models.checkpoint import load_checkpoint
from attnlab.run_directory import release_run_directory, write_results
from attnlab.training.module import warmup_cosine
from attnlab.training.run import run
from tests.conftest import MICRO_DATA, MICRO_MODEL, compose_config

QUIET = ["logger=csv", "trainer=cpu", "callbacks.progress_bar.refresh_rate=0", *MICRO_MODEL, *MICRO_DATA]
SHORT = ["trainer.val_check_interval=2", "trainer.limit_val_batches=1", "optim.warmup_steps=1"]


@pytest.fixture(scope="module")
def pretrained(tmp_path_factory: pytest.TempPathFactory, data_cache: Path) -> Path:
    """A tiny vanilla pretraining run of 4 steps; its last.ckpt."""
    out = tmp_path_factory.mktemp("runs") / "pretrain"
    run(compose_config([*QUIET, *SHORT, "trainer.max_steps=4"], out, data_cache))
    return out / "checkpoints" / "last.ckpt"


class Payload:
    """Unpickling this would create a file: the proof that code from a checkpoint ran."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_a_crafted_checkpoint_runs_no_code(tmp_path: Path) -> None:
    crafted, marker = tmp_path / "evil.ckpt", tmp_path / "pwned"
    torch.save({"state_dict": {}, "payload": Payload(marker)}, crafted)
    with pytest.raises(ConfigError) as err:
        load_checkpoint(crafted)
    assert not marker.exists()
    assert str(crafted) in str(err.value) and "weights_only" not in str(err.value)


@pytest.mark.parametrize("damage", ["truncated", "empty", "text"])
@pytest.mark.slow
def test_a_corrupt_checkpoint_is_one_line_naming_the_file(pretrained: Path, tmp_path: Path, damage: str) -> None:
    broken = tmp_path / "broken.ckpt"
    data = pretrained.read_bytes()
    broken.write_bytes({"truncated": data[: len(data) // 2], "empty": b"", "text": b"not a checkpoint"}[damage])
    with pytest.raises(ConfigError) as err:
        load_checkpoint(broken)
    message = str(err.value)
    assert err.value.key == "ckpt_path" and str(broken) in message and "\n" not in message
    assert "weights_only" not in message


def test_pickle_payload_through_the_resume_path_runs_no_code(make_config, tmp_path: Path) -> None:
    crafted, marker = tmp_path / "evil.ckpt", tmp_path / "pwned"
    with crafted.open("wb") as fh:
        pickle.dump(Payload(marker), fh)
    with pytest.raises(ConfigError) as err:
        run(make_config([*QUIET, f"ckpt_path={crafted}"]))
    assert err.value.key == "ckpt_path" and not marker.exists()


@pytest.mark.slow
def test_init_from_our_checkpoint_starts_at_the_source_models_logits(pretrained: Path) -> None:
    """Exact variants reproduce the source model; SSA (its position term is small but on at fine-tune init) equals
    the source's weights with the variant swapped in at that init, as for ``hf:``."""
    saved = load_checkpoint(pretrained)
    source = saved.build_model().eval()
    idx = torch.randint(0, source.config.vocab_size, (2, 16))
    for attention in ("vanilla", "gated_sdpa", "ssa_tok_only", "ssa"):
        tuned = build_gpt({"init_from": str(pretrained), "dropout": 0.1}, attention).eval()
        assert tuned.config.n_embd == source.config.n_embd and tuned.config.dropout == 0.1
        assert tuned.attention_config["name"] == attention
        if attention != "ssa":
            torch.testing.assert_close(tuned(idx), source(idx), atol=1e-5, rtol=0)
            continue
        swapped = GPT(ModelConfig.from_dict(saved.spec["model"]), {"name": "ssa"})
        swapped.load_state_dict(saved.state_dict, strict=False)
        swapped.init_variant_for_finetuning()
        torch.testing.assert_close(tuned(idx), swapped.eval()(idx), atol=0, rtol=0)
        assert 0 < (tuned(idx) - source(idx)).abs().max() < 0.02


@pytest.mark.slow
def test_train_py_fine_tunes_from_our_checkpoint_with_its_tokenizer(pretrained: Path, make_config, tmp_path) -> None:
    out = tmp_path / "tuned"
    overrides = [*QUIET, *SHORT, "trainer.max_steps=2", "attention=ssa", f"model.init_from={pretrained}"]
    results = run(make_config([*overrides, "model.n_layer=3"], out))  # the architecture is the checkpoint's
    tuned, source = load_checkpoint(out / "checkpoints" / "last.ckpt"), load_checkpoint(pretrained)
    assert results["steps"] == 2 and tuned.spec["attention"]["name"] == "ssa"
    assert tuned.spec["model"]["n_layer"] == source.spec["model"]["n_layer"] == 2
    assert tuned.tokenizer_json == source.tokenizer_json


@pytest.mark.slow
def test_resume_rejects_a_changed_model_attention_or_optimiser(pretrained: Path, make_config) -> None:
    for override, key in [
        ("model.n_layer=3", "model.n_layer"),
        ("attention=ssa", "attention.name"),
        ("optim.lr=1e-4", "optim.lr"),
        ("optim.schedule=constant", "optim.schedule"),
    ]:
        with pytest.raises(ConfigError, match=r"model\.init_from=") as err:
            run(make_config([*QUIET, *SHORT, "trainer.max_steps=6", f"ckpt_path={pretrained}", override]))
        assert err.value.key == key


@pytest.mark.slow
def test_a_fine_tune_resumes_after_its_runs_directory_moved(pretrained: Path, make_config, tmp_path: Path) -> None:
    """``init_from`` is an absolute path: a moved checkout once refused to resume its own fine-tune. The same start
    run at a new place continues; another start run is still refused."""
    old, new = tmp_path / "a" / "runs", tmp_path / "b" / "runs"
    start = old / "start-cell" / "checkpoints" / "last.ckpt"
    start.parent.mkdir(parents=True)
    shutil.copy(pretrained, start)
    tune = [*QUIET, *SHORT, "attention=ssa"]
    run(make_config([*tune, "trainer.max_steps=2", f"model.init_from={start}"], old / "tuned"))
    release_run_directory(old / "tuned")  # as train.py's process ends
    shutil.move(old.parent, new.parent)
    resume = f"ckpt_path={new / 'tuned' / 'checkpoints' / 'last.ckpt'}"
    moved_start = new / "start-cell" / "checkpoints" / "last.ckpt"
    results = run(make_config([*tune, "trainer.max_steps=4", f"model.init_from={moved_start}", resume], new / "tuned"))
    assert results["steps"] == 4
    other = new / "other-cell" / "checkpoints" / "last.ckpt"
    other.parent.mkdir(parents=True)
    shutil.copy(pretrained, other)
    with pytest.raises(ConfigError) as err:
        run(make_config([*tune, "trainer.max_steps=6", f"model.init_from={other}", resume], new / "tuned"))
    assert err.value.key == "model.init_from"


@pytest.mark.slow
def test_resume_keeps_the_schedule_horizon_when_max_steps_grows(pretrained: Path, make_config, tmp_path) -> None:
    out = tmp_path / "resumed"
    results = run(make_config([*QUIET, *SHORT, "trainer.max_steps=8", f"ckpt_path={pretrained}"], out))
    resumed = load_checkpoint(out / "checkpoints" / "last.ckpt")
    assert results["steps"] == 8 and resumed.spec["schedule_steps"] == 4
    assert Path(results["last_checkpoint"]).parent == out / "checkpoints"
    assert results["best_checkpoint"] is None or Path(results["best_checkpoint"]).parent == out / "checkpoints"


def test_schedule_matches_the_formula_and_stays_flat_after_the_horizon() -> None:
    factor = warmup_cosine(warmup_steps=3, total_steps=10, min_ratio=0.1)
    assert [factor(s) for s in range(3)] == pytest.approx([1 / 3, 2 / 3, 1.0])
    assert factor(3) == pytest.approx(1.0)
    assert factor(6) == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 3 / 7)))
    assert factor(10) == factor(50) == pytest.approx(0.1)
    assert warmup_cosine(2, 10, 0.1, "constant")(9) == 1.0


def test_results_json_is_strict_with_non_finite_values_flagged(tmp_path: Path) -> None:
    path = tmp_path / "results.json"
    write_results(path, {"val_loss": float("nan"), "eval": {"ppl": float("inf"), "acc": 0.5}, "steps": 3})
    saved = json.loads(path.read_text(), parse_constant=lambda token: pytest.fail(f"bare {token}"))
    assert saved == {
        "val_loss": None,
        "eval": {"ppl": None, "acc": 0.5},
        "steps": 3,
        "non_finite": ["val_loss", "eval.ppl"],
    }
