"""What a user of the installed package meets that the clone's tests do not: a per-user data cache, an export that
behaves as Hugging Face users expect, our own model on huggingface_hub's save/load for any attention variant, a
progress bar in tokens, lm-eval tasks that do not warn, and the TensorBoard and MLflow loggers."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
import torch
from hydra import compose

import attnlab
import attnlab.configs
from attnlab.configs import initialized
from attnlab.export import main as export_main
from attnlab.models import GPT, ModelConfig
from tests.conftest import MICRO_DATA, MICRO_MODEL, ROOT

transformers = pytest.importorskip("transformers")


def cache_dir_of(overrides: list[str]) -> str:
    with initialized("conf", job_name="train"):
        return compose(config_name="train", overrides=overrides, return_hydra_config=True).paths.cache_dir


@pytest.fixture
def installed(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """attnlab as ``pip install`` leaves it: configs from the package (``pkg://attnlab.conf``), started in an empty
    directory, with ``$XDG_CACHE_HOME`` at ``<tmp>/xdg``."""
    monkeypatch.setattr(attnlab.configs, "checkout", lambda: None)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.delenv("ATTNLAB_CACHE", raising=False)
    return tmp_path


def test_installed_the_cache_is_per_user_not_per_directory(installed: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A new working directory must not prepare the corpus and train the tokenizer again (HF's cache is per user
    too): ``$XDG_CACHE_HOME/attnlab``, else ``~/.cache/attnlab``; ``ATTNLAB_CACHE`` moves it, ``paths.cache_dir``
    wins over both. Outputs still go under the directory the command starts from."""
    assert cache_dir_of([]) == str(installed / "xdg" / "attnlab")
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert cache_dir_of([]) == str(Path.home() / ".cache" / "attnlab")
    monkeypatch.setenv("ATTNLAB_CACHE", str(installed / "mine"))
    assert cache_dir_of([]) == str(installed / "mine")
    assert cache_dir_of([f"paths.cache_dir={installed / 'cfg'}"]) == str(installed / "cfg")
    with initialized("conf", job_name="train"):
        cfg = compose(config_name="train", return_hydra_config=True)
        assert cfg.paths.log_dir == str(installed / "outputs")


def test_a_clone_keeps_its_own_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    """The clone's tests, tables and recorded cells read ``<repository>/.cache/attnlab`` as before."""
    monkeypatch.delenv("ATTNLAB_CACHE", raising=False)
    assert cache_dir_of([]) == str(ROOT / ".cache" / "attnlab")
    assert cache_dir_of(["paths.root_dir=/elsewhere"]) == "/elsewhere/.cache/attnlab"


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory, data_cache: Path) -> tuple[Path, dict]:
    """A micro run trained by ``attnlab.train`` and exported under umask 022: the directory and the run's results."""
    project = tmp_path_factory.mktemp("export")
    results = attnlab.train(
        [
            *["logger=csv", "trainer=cpu", "callbacks.progress_bar.refresh_rate=0", "print_config=false"],
            *MICRO_MODEL,
            *MICRO_DATA,
            *["trainer.max_steps=3", "trainer.limit_val_batches=2", f"paths.root_dir={project}"],
            f"paths.cache_dir={data_cache}",
        ]
    )
    previous = os.umask(0o022)
    try:
        export_main([results["last_checkpoint"], str(project / "hf")])
    finally:
        os.umask(previous)
    return project / "hf", results


@pytest.mark.slow
def test_the_export_truncates_and_pads_to_the_model(exported: tuple[Path, dict]) -> None:
    """``tok(long_text, truncation=True)`` stops at the model's context (not at 1e30), and a batch pads, so
    ``generate`` on a long prompt works instead of indexing past the position table."""
    directory, _ = exported
    tokenizer = transformers.AutoTokenizer.from_pretrained(directory)
    model = transformers.AutoModelForCausalLM.from_pretrained(directory).eval()
    long_text = "The history of the city begins with a river crossing. " * 40
    assert tokenizer.model_max_length == model.config.n_positions == 64
    ids = tokenizer(long_text, truncation=True, return_tensors="pt")["input_ids"]
    assert ids.shape == (1, 64)
    batch = tokenizer(["a short one", long_text], truncation=True, padding=True, return_tensors="pt")
    assert batch["input_ids"].shape == (2, 64) and tokenizer.pad_token == tokenizer.eos_token
    short = tokenizer(long_text, truncation=True, max_length=60, return_tensors="pt")
    out = model.generate(**short, max_new_tokens=4, do_sample=False)
    assert out.shape == (1, 64)


@pytest.mark.slow
def test_the_export_is_readable_as_the_umask_allows(exported: tuple[Path, dict]) -> None:
    directory, _ = exported
    assert stat.S_IMODE(directory.stat().st_mode) == 0o755
    assert {stat.S_IMODE(p.stat().st_mode) for p in directory.iterdir()} == {0o644}


@pytest.mark.slow
def test_the_export_has_a_model_card(exported: tuple[Path, dict]) -> None:
    """What a hub user reads first: the variant, the data, the tokens seen, the val ppl and the training command."""
    directory, results = exported
    card = (directory / "README.md").read_text()
    assert card.startswith("---\n") and "library_name: transformers" in card
    assert "attention=vanilla" in card and "wiki_sample" in card
    assert f"{results['train_tokens']:,} tokens" in card and f"{results['val_ppl']:.2f}" in card
    assert "`attnlab-train logger=csv trainer=cpu" in card and "trainer.max_steps=3" in card


@pytest.mark.parametrize("attention", ["ssa", "gated_sdpa"])
def test_our_model_round_trips_any_attention_variant_through_save_pretrained(tmp_path: Path, attention: str) -> None:
    """The HF export refuses variants (no transformers layer computes them); huggingface_hub's mixin on our own
    model keeps them: the same logits after ``save_pretrained`` / ``from_pretrained``."""
    torch.manual_seed(0)
    config = ModelConfig(n_layer=2, n_head=2, n_embd=32, block_size=64, vocab_size=300)
    model = GPT(config, {"name": attention}).eval()
    with torch.no_grad():
        for param in model.parameters():
            param.add_(0.3 * torch.randn_like(param))
    model.save_pretrained(tmp_path / "ours")
    loaded = GPT.from_pretrained(tmp_path / "ours").eval()
    assert loaded.config == config and loaded.attention_config == {"name": attention}
    assert any(name for name, _ in loaded.variant_parameters())  # the variant's own weights came back too
    ids = torch.randint(0, 300, (2, 40), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        torch.testing.assert_close(loaded(ids), model(ids), atol=0, rtol=0)


def test_the_progress_bar_counts_tokens() -> None:
    """A run's speed is quoted in tokens/s (results.json, the summary line, W&B); the bar's rate says the same."""
    from attnlab.training.callbacks import TokenProgressBar

    bar = TokenProgressBar()
    bar.tokens_per_batch = 128
    tqdm = bar.init_train_tqdm()
    tqdm.total = 10
    tqdm.update(3)
    assert "384/1280" in str(tqdm) and "tok/s" in str(tqdm)
    tqdm.close()


def test_the_progress_bar_names_the_training_not_an_epoch(capsys: pytest.CaptureFixture) -> None:
    """Lightning names the bar ``Epoch <n>`` at each epoch start: a resumed step-based run would print "Epoch 1"."""
    from attnlab.training.callbacks import TokenProgressBar

    tqdm = TokenProgressBar().init_train_tqdm()
    tqdm.set_description("Epoch 1")  # what Lightning's on_train_epoch_start does
    tqdm.close()
    assert str(tqdm).startswith("Training") and "Epoch" not in capsys.readouterr().out


def test_our_lm_eval_tasks_state_each_metrics_aggregation() -> None:
    """lm-eval prints a warning per metric it has to give a default aggregation or direction, on every evaluation."""
    from lm_eval.tasks._yaml_loader import load_yaml

    for task in (ROOT / "src" / "attnlab" / "eval" / "tasks").glob("*.yaml"):
        for metric in load_yaml(task, resolve_func=False)["metric_list"]:  # lm-eval's own reader (!function tags)
            assert {"aggregation", "higher_is_better"} <= set(metric), f"{task.name}: {metric['metric']}"


TRAIN_MICRO = [
    *["trainer=cpu", "callbacks.progress_bar.refresh_rate=0", "print_config=false", *MICRO_MODEL, *MICRO_DATA],
    *["trainer.max_steps=2", "trainer.limit_val_batches=1", "trainer.val_check_interval=2"],
]


@pytest.mark.parametrize(
    ("logger", "modules"), [("tensorboard", {"tensorboard", "tensorboardX"}), ("mlflow", {"mlflow"})]
)
def test_an_optional_logger_without_its_package_is_one_line(
    logger: str, modules: set[str], tmp_path: Path, data_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import importlib.util

    from attnlab.errors import ConfigError

    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name in modules else find_spec(name, *a))
    with pytest.raises(
        ConfigError, match=rf"^logger: {logger} needs the .* package: pip install 'attnlab\[{logger}\]'"
    ):
        attnlab.train([*TRAIN_MICRO, f"logger={logger}", f"paths.root_dir={tmp_path}", f"paths.cache_dir={data_cache}"])
    assert not [path for path in tmp_path.rglob("*") if path.is_file()]  # nothing left behind


@pytest.mark.slow
def test_a_run_ends_with_one_checkpoint_file_and_names_its_resized_model(tmp_path: Path, data_cache: Path) -> None:
    """Its last validation is its best: the best checkpoint and last.ckpt are one file under two names (not 64 MB
    twice for model=tiny), and the summary line says how the model differs from its preset."""
    results = attnlab.train([*TRAIN_MICRO, "logger=csv", f"paths.root_dir={tmp_path}", f"paths.cache_dir={data_cache}"])
    checkpoints = Path(results["output_dir"]) / "checkpoints"
    best, last = Path(results["best_checkpoint"]), checkpoints / "last.ckpt"
    assert best.parent == checkpoints and best.stat().st_ino == last.stat().st_ino
    assert sorted(path.name for path in checkpoints.iterdir()) == sorted([best.name, "last.ckpt"])
    log = (Path(results["output_dir"]) / "train.log").read_text()
    assert "attnlab: tiny (model.n_layer=2, model.n_head=2, model.n_embd=32, model.block_size=64) + attention" in log


def test_logger_tensorboard_names_and_groups_runs_as_wandb(tmp_path: Path, data_cache: Path) -> None:
    if not (find_module("tensorboard") or find_module("tensorboardX")):
        pytest.skip("logger=tensorboard needs tensorboard or tensorboardX (pip install 'attnlab[tensorboard]')")
    paths = [f"paths.root_dir={tmp_path}", f"paths.cache_dir={data_cache}", "experiment_name=abl"]
    results = attnlab.train([*TRAIN_MICRO, "logger=tensorboard", "seed=3", *paths])
    (version,) = (tmp_path / "outputs" / "tensorboard" / "abl").iterdir()  # grouped by experiment, as W&B's runs
    assert version.name == f"tiny-vanilla-s3_{Path(results['output_dir']).name}"
    assert list(version.glob("events.out.tfevents.*")) and (Path(results["output_dir"]) / "csv").is_dir()


def test_logger_mlflow_names_and_groups_runs_as_wandb(tmp_path: Path, data_cache: Path) -> None:
    mlflow = pytest.importorskip("mlflow")
    paths = [f"paths.root_dir={tmp_path}", f"paths.cache_dir={data_cache}", "experiment_name=abl"]
    attnlab.train([*TRAIN_MICRO, "logger=mlflow", "attention=gated_sdpa", *paths])
    client = mlflow.MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'outputs' / 'mlflow.db'}")
    (run,) = client.search_runs([client.get_experiment_by_name("abl").experiment_id])
    assert run.info.run_name == "tiny-gated_sdpa-s1337" and run.data.tags["gated_sdpa"] == "true"
    assert "val/loss" in run.data.metrics and run.data.params["attention/name"] == "gated_sdpa"


def find_module(name: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(name) is not None
