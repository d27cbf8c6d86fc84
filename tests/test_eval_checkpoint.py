"""A training run's checkpoint evaluates on its own, even copied alone elsewhere: same architecture, variant,
weights, tokenizer and held-out split; train.py's ``eval.after_train`` and ``python evaluate.py`` both run the quick
task set on it."""

from __future__ import annotations

import csv
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from attnlab.attention import available_attention
from attnlab.attention.base import resolve_options
from attnlab.data.tokenizer import train_bpe_tokenizer
from attnlab.errors import ConfigError
from attnlab.eval.harness import AfterTraining
from attnlab.eval.lm import AttnlabLM
from attnlab.models import ModelConfig
from attnlab.models.checkpoint import RECORD_KEY, load_checkpoint
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
    cfg = compose_config(overrides, out, data_cache)
    results = run(cfg, AfterTraining(cfg))
    return out, results


@pytest.mark.slow
def test_checkpoint_round_trips_with_its_variant_weights_and_tokenizer(trained: tuple[Path, dict]) -> None:
    out, _ = trained
    ckpt = out / "checkpoints" / "last.ckpt"
    saved = load_checkpoint(ckpt)
    lm = AttnlabLM(checkpoint=str(ckpt))
    assert lm.model.config == ModelConfig.from_dict(saved.spec["model"])
    assert lm.model.attention_config["name"] == ATTENTION == saved.spec["attention"]["name"]
    assert type(lm.model.blocks[0].attn.variant) is resolve_options({"name": ATTENTION})[0]
    raw = torch.load(ckpt, map_location="cpu", weights_only=True)
    for name, value in lm.model.state_dict().items():
        assert torch.equal(raw["state_dict"][f"model.{name}"], value), name
    assert lm.tokenizer.to_str() == saved.tokenizer_json
    assert saved.data["name"] == "wiki_sample" and saved.data["seed"] == 1337 and saved.data["val_fraction"] == 0.1
    assert saved.spec["schedule_steps"] == 3 and saved.global_step == 3


@pytest.mark.slow
def test_training_evaluates_its_checkpoint_when_asked(trained: tuple[Path, dict]) -> None:
    out, results = trained
    summary = results["eval"]
    assert summary["heldout_word_ppl"] > 1 and 0 <= summary["passkey_200"] <= 1
    saved = json.loads((out / "eval" / "results.json").read_text())
    assert saved["passkey"]["per_length"] == {"200": summary["passkey_200"]}
    assert saved["summary"]["checkpoint"] == results["best_checkpoint"]


def run_evaluate(ckpt: Path, tmp_path: Path, *overrides: str) -> subprocess.CompletedProcess:
    """``evaluate.py`` on ``ckpt`` in a subprocess; its run directory: tmp_path/eval, its results: tmp_path/r.csv."""
    command = [sys.executable, "evaluate.py", f"ckpt_path={ckpt}", *overrides]
    command += [f"hydra.run.dir={tmp_path}/eval", f"results_csv={tmp_path}/r.csv"]
    return subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300)


@pytest.mark.slow
def test_evaluate_cli_runs_the_quick_task_set_on_a_checkpoint_copied_alone(
    trained: tuple[Path, dict], tmp_path: Path, data_cache: Path
) -> None:
    out, _ = trained
    alone = tmp_path / "elsewhere" / "copy.ckpt"
    alone.parent.mkdir()
    shutil.copy(out / "checkpoints" / "last.ckpt", alone)
    done = run_evaluate(alone, tmp_path, "eval=quick", "limit=2", *PASSKEY, f"paths.cache_dir={data_cache}")
    assert done.returncode == 0, done.stderr[-3000:]
    assert "attnlab eval [quick]" in done.stdout and "heldout_word_ppl" in done.stdout
    assert f"results: {tmp_path / 'eval' / 'results.json'}" in done.stdout and f"{tmp_path}/r.csv" in done.stdout
    log = (tmp_path / "eval" / "evaluate.log").read_text()  # what the terminal showed, kept with the results
    assert f"Evaluating {alone} on eval=quick" in log and "heldout_word_ppl" in log and "results.json" in log
    assert "── eval\n" in done.stdout  # the config, printed as a tree when the evaluation starts
    record = json.loads((tmp_path / "eval" / "results.json").read_text())
    assert set(record["versions"]) == {"attnlab_passkey", "attnlab_heldout"} and record["lm_eval_version"]
    assert record["model"]["attnlab_attention"] == ATTENTION
    assert record["model"]["attnlab_checkpoint_step"] == 3  # trainer.max_steps: which step a moving last.ckpt held
    (row,) = list(csv.DictReader((tmp_path / "r.csv").open()))
    assert row["suite"] == "quick" and float(row["heldout_word_ppl"]) > 1
    # the held-out split is the training run's, rebuilt from the data identity inside the checkpoint
    assert float(row["heldout_word_ppl"]) == pytest.approx(
        json.loads((out / "results.json").read_text())["eval"]["heldout_word_ppl"]
    )


@pytest.mark.slow
def test_evaluate_cli_runs_an_analysis_suite_with_no_lm_eval_task(
    trained: tuple[Path, dict], tmp_path: Path, data_cache: Path
) -> None:
    """``evaluate.py eval=analysis_cpu`` (``tasks: []``), as the phenomena search's runs call it."""
    out, _ = trained
    suite = ("eval=analysis_cpu", "eval.analysis.metrics=[outliers,w8a8]", "eval.analysis.eval_max_tokens=512")
    done = run_evaluate(out / "checkpoints" / "last.ckpt", tmp_path, *suite, f"paths.cache_dir={data_cache}")
    assert done.returncode == 0, done.stderr[-3000:]
    assert "W8A8 perplexity" in done.stdout and "W8A8 damage" in done.stdout
    analysis = json.loads((tmp_path / "eval" / "results.json").read_text())["analysis"]
    assert analysis["w8a8"]["quantized_perplexity"] > 1 and "versions" not in analysis


@pytest.mark.slow
def test_checkpoint_written_before_the_record_still_evaluates(trained: tuple[Path, dict], tmp_path: Path) -> None:
    """The old layout: hyperparameters in the checkpoint, tokenizer.json and .hydra/config.yaml in the run."""
    out, _ = trained
    raw = torch.load(out / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)
    saved = raw.pop(RECORD_KEY)
    raw["hyper_parameters"] = {k: saved["spec"][k] for k in ("model", "attention", "optim")}
    legacy = tmp_path / "run" / "checkpoints" / "last.ckpt"
    legacy.parent.mkdir(parents=True)
    torch.save(raw, legacy)
    (tmp_path / "run" / "tokenizer.json").write_text(saved["tokenizer"])
    (tmp_path / "run" / ".hydra").mkdir()
    OmegaConf.save(
        {"data": {"name": "wiki_sample", "seed": 7, "val_fraction": 0.2}}, tmp_path / "run/.hydra/config.yaml"
    )
    lm = AttnlabLM(checkpoint=str(legacy))
    assert lm.tokenizer.to_str() == saved["tokenizer"] and lm.run_data == {
        "name": "wiki_sample",
        "seed": 7,
        "val_fraction": 0.2,
    }
    (tmp_path / "run" / "tokenizer.json").unlink()
    with pytest.raises(ConfigError, match="pass tokenizer="):
        AttnlabLM(checkpoint=str(legacy))


@pytest.mark.slow
def test_a_tokenizer_other_than_the_checkpoints_is_an_error(trained: tuple[Path, dict], tmp_path: Path) -> None:
    out, _ = trained
    other = tmp_path / "other.json"
    train_bpe_tokenizer(["a completely different corpus"] * 20, 300).save(str(other))
    with pytest.raises(ConfigError, match="not the tokenizer") as err:
        AttnlabLM(checkpoint=str(out / "checkpoints" / "last.ckpt"), tokenizer=str(other))
    assert err.value.key == "tokenizer"


def compose_evaluate(overrides: list[str]):
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        return compose(config_name="evaluate", overrides=overrides)


EVAL_BAD_VALUES = [  # (overrides, the key the one line must name)
    (["limit=-1"], "limit"),
    (["limit=abc"], "limit"),
    (["limit=1.5"], "limit"),
    (["batch_size=abc"], "batch_size"),
    (["batch_size=0"], "batch_size"),
    (["seed=-5"], "seed"),
    (["seed=99999999999"], "seed"),
    (["max_length=0"], "max_length"),
    (["max_length=abc"], "max_length"),
    (["dtype=foo"], "dtype"),
    (["device=cpu:1"], "device"),
    (["device=tpu"], "device"),
    (["eval.tasks=[]"], "eval.tasks"),
    (["eval=analysis_cpu", "eval.tasks=[lambada,'']"], "eval.tasks"),
    (["eval=analysis_cpu", "eval.analysis=null"], "eval.tasks"),  # with no analysis, nothing would be evaluated
    (["eval=passkey_cpu", "eval.passkey.samples_per_length=0"], "eval.passkey.samples_per_length"),
    (["eval=passkey_cpu", "eval.passkey.context_lengths=[128,-1]"], "eval.passkey.context_lengths"),
]


@pytest.mark.parametrize(
    ("overrides", "key"), EVAL_BAD_VALUES, ids=lambda v: " ".join(v) if isinstance(v, list) else ""
)
def test_evaluate_refuses_a_bad_value_before_anything_is_written(overrides: list[str], key: str) -> None:
    """evaluate.py's Hydra callback runs these checks before it creates the run directory."""
    from attnlab.config_checks import check_evaluate_config

    with pytest.raises(ConfigError) as refused:
        check_evaluate_config(compose_evaluate(overrides))
    assert refused.value.key == key, str(refused.value)
    assert "\n" not in str(refused.value)
    check_evaluate_config(compose_evaluate([]))  # the defaults pass


@pytest.mark.parametrize("suite", ["analysis", "analysis_cpu"])
def test_an_analysis_suite_needs_no_lm_eval_task(suite: str) -> None:
    """``eval=analysis`` has ``tasks: []``: its analysis is the whole set (the check once refused it)."""
    from attnlab.config_checks import check_evaluate_config

    cfg = compose_evaluate([f"eval={suite}"])
    assert cfg.eval.tasks == [] and cfg.eval.analysis is not None
    check_evaluate_config(cfg)


@pytest.mark.skipif(torch.cuda.is_available(), reason="the check is for a machine without a GPU")
def test_evaluate_on_cuda_without_a_gpu_is_one_line() -> None:
    from attnlab.config_checks import check_evaluate_config

    with pytest.raises(ConfigError, match=r"cuda asks for a GPU and torch sees none"):
        check_evaluate_config(compose_evaluate(["device=cuda"]))
    check_evaluate_config(compose_evaluate(["device=cuda"]), machine=False)  # the form alone is fine


@pytest.mark.parametrize(
    ("overrides", "line"),
    [
        (["eval.tasks=[nosuch_task]"], "error: eval.tasks: 'nosuch_task': no such task in "),
        (["limit=-1"], "error: limit: must be null (all examples), a count >= 1 or a fraction in (0, 1), got -1"),
    ],
)
@pytest.mark.slow
def test_evaluate_py_refuses_in_one_line_and_leaves_nothing(
    trained: tuple[Path, dict], overrides: list[str], line: str, tmp_path: Path
) -> None:
    """A task name is checked against lm-eval's index once it is built, still before any file is written."""
    out, _ = trained
    done = run_evaluate(out / "checkpoints" / "last.ckpt", tmp_path, *overrides, "print_config=false")
    assert done.returncode == 1
    assert done.stderr.strip().splitlines()[-1].startswith(line), done.stderr[-2000:]
    assert "Traceback" not in done.stderr
    assert not (tmp_path / "eval").exists() and not (tmp_path / "r.csv").exists()


@pytest.mark.slow
def test_a_window_past_learned_positions_is_refused(trained: tuple[Path, dict]) -> None:
    """Learned position embeddings stop at block_size; rotary models may be scored past it (length extrapolation)."""
    out, _ = trained
    lm = AttnlabLM(checkpoint=str(out / "checkpoints" / "last.ckpt"))
    longer = lm.model.config.block_size + 1
    if lm.model.config.pos_encoding == "learned":
        with pytest.raises(ConfigError, match=r"^max_length: "):
            AttnlabLM(checkpoint=str(out / "checkpoints" / "last.ckpt"), max_length=longer)
    else:
        assert AttnlabLM(checkpoint=str(out / "checkpoints" / "last.ckpt"), max_length=longer).max_length == longer


def test_an_after_train_suite_the_model_cannot_run_stops_before_training(tmp_path: Path, data_cache: Path) -> None:
    """``eval=quick eval.after_train=true`` on a 64-token model: the passkey lengths (128+) once failed only after the
    whole run had trained; now before the first step, naming the key."""
    overrides = ["logger=csv", "trainer=cpu", "callbacks.progress_bar.refresh_rate=0", *MICRO_MODEL, *MICRO_DATA]
    overrides += ["eval=quick", "eval.after_train=true", "trainer.max_steps=3"]
    cfg = compose_config(overrides, tmp_path / "run", data_cache)
    with pytest.raises(ConfigError) as err:
        run(cfg, AfterTraining(cfg))
    assert err.value.key == "eval.passkey.context_lengths" and "64-token window" in str(err.value)
    assert not (tmp_path / "run" / "checkpoints").exists()
