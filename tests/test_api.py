"""The Python API: ``attnlab.train``, ``attnlab.evaluate`` and ``attnlab.load`` on Hydra's compose API (the console
scripts' jobs, in this process), ``attnlab.tables.reproduce`` by a table's name, and an ``import attnlab`` that stays
light."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

import attnlab
from attnlab.errors import ConfigError
from tests.conftest import MICRO_DATA, MICRO_MODEL, ROOT

QUIET = ["logger=csv", "trainer=cpu", "callbacks.progress_bar.refresh_rate=0", "print_config=false"]
TINY = [*QUIET, *MICRO_MODEL, "model.block_size=256", *MICRO_DATA, "trainer.max_steps=3", "trainer.limit_val_batches=2"]
PASSKEY = ["eval.passkey.context_lengths=[200]", "eval.passkey.samples_per_length=2"]


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory, data_cache: Path) -> tuple[Path, dict]:
    """``attnlab.train`` on the micro model: its project directory and what it returned."""
    project = tmp_path_factory.mktemp("api")
    results = attnlab.train([*TINY, f"paths.root_dir={project}", f"paths.cache_dir={data_cache}"])
    return project, results


@pytest.mark.slow
def test_train_returns_its_results_and_writes_the_run_as_the_console_script_does(trained: tuple[Path, dict]) -> None:
    project, results = trained
    run = Path(results["output_dir"])
    assert run.parent == project / "outputs" / "default" and results["steps"] == 3
    assert json.loads((run / "results.json").read_text())["val_loss"] == pytest.approx(results["val_loss"])
    assert (run / ".hydra" / "overrides.yaml").is_file() and (run / "checkpoints" / "last.ckpt").is_file()
    assert "validation perplexity" in (run / "train.log").read_text()  # Hydra's job log, named as train.py's


def test_a_bad_value_raises_before_anything_is_written(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"^optim\.lr"):
        attnlab.train([*TINY, "optim.lr=-1", f"paths.root_dir={tmp_path}"])
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
def test_each_call_is_its_own_run_and_last_resumes_into_a_new_one(trained: tuple[Path, dict], data_cache: Path) -> None:
    """A notebook or a Python sweep trains several times in one process: every call gets a run id (a directory) of
    its own, and ``ckpt_path=last`` continues the newest run in a new directory, leaving the old one as it was."""
    project, first = trained
    paths = [f"paths.root_dir={project}", f"paths.cache_dir={data_cache}"]
    second = attnlab.train([*TINY, "seed=2", *paths])
    longer = [o for o in TINY if not o.startswith("trainer.max_steps=")]
    resumed = attnlab.train([*longer, "seed=2", "ckpt_path=last", "trainer.max_steps=4", *paths])
    runs = [Path(r["output_dir"]) for r in (first, second, resumed)]
    assert len(set(runs)) == 3 and all((run / "results.json").is_file() for run in runs)
    assert all((run / "loss_curves.png").is_file() for run in runs)  # every run draws its losses
    logged = yaml.safe_load((runs[1] / "csv" / "hparams.yaml").read_text())  # what W&B's config panel shows too
    assert set(logged) == {"experiment_name", "seed", "model", "attention", "optim", "schedule_steps", "data"} | {
        "trainer",
        "train_tokens",
        "global_batch_tokens",
    }
    assert logged["seed"] == 2 and logged["model"]["n_embd"] == 32 and "_target_" not in str(logged)
    assert str(project) not in str(logged)  # no paths of this machine
    assert "Tip:" not in (runs[1] / "train.log").read_text()  # Lightning's litlogger / litmodels advertising
    assert resumed["steps"] == 4 and not list(runs[1].glob(".hydra-*"))  # resumed from the second run's last.ckpt
    assert json.loads((runs[1] / "results.json").read_text())["steps"] == 3


@pytest.mark.slow
def test_errors_are_config_errors_naming_the_key(trained: tuple[Path, dict], tmp_path: Path) -> None:
    """What the command line prints as one line, the library raises as ``ConfigError`` (never ``SystemExit``)."""
    project, results = trained
    with pytest.raises(ConfigError, match=r"^no_such_key: .*no_such_key"):
        attnlab.train([*TINY, "no_such_key=1", f"paths.root_dir={tmp_path}"])
    with pytest.raises(ConfigError, match=r"^model: .*model/huge"):
        attnlab.train([*TINY, "model=huge", f"paths.root_dir={tmp_path}"])
    with pytest.raises(ConfigError, match=r"^hydra\.run\.dir: .*holds a finished run"):
        attnlab.train([*TINY, f"hydra.run.dir={results['output_dir']}", f"paths.root_dir={project}"])
    with pytest.raises(ConfigError, match=r"^path: no such file or directory: outputs/api/doesnotexist"):
        attnlab.load("outputs/api/doesnotexist")
    with pytest.raises(ConfigError, match=r"^path: .* holds neither"):
        attnlab.load(tmp_path)
    with pytest.raises(ConfigError, match=r"^checkpoint: no such file: run/last\.ckpt"):
        attnlab.evaluate("run/last.ckpt")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
def test_evaluate_a_run_directory(trained: tuple[Path, dict], data_cache: Path) -> None:
    project, results = trained
    overrides = ["eval=quick", "limit=2", *PASSKEY, "print_config=false", f"paths.root_dir={project}"]
    overrides.append(f"paths.cache_dir={data_cache}")
    evaluation = attnlab.evaluate(results["output_dir"], overrides)
    (out,) = (project / "outputs" / "eval").glob("*/results.json")
    assert json.loads(out.read_text())["summary"] == evaluation["summary"]
    assert evaluation["summary"]["checkpoint"] == results["last_checkpoint"]
    assert evaluation["summary"]["heldout_word_ppl"] > 1 and (out.parent / "evaluate.log").is_file()


@pytest.mark.slow
def test_load_our_checkpoint_and_an_hf_directory(trained: tuple[Path, dict], tmp_path: Path) -> None:
    _, results = trained
    model, tokenizer = attnlab.load(results["output_dir"])  # a run directory: its last.ckpt
    same, _ = attnlab.load(results["last_checkpoint"])
    ids = torch.tensor([tokenizer.encode("The history of the city").ids])
    assert not model.training and model.config.n_layer == 2 and tokenizer.get_vocab_size() <= 512
    torch.testing.assert_close(model(ids), same(ids))

    import transformers

    hf_dir = tmp_path / "hf"  # a random HF GPT-2 of the same size, with the run's tokenizer beside it
    hf_config = transformers.GPT2Config(n_layer=2, n_head=2, n_embd=32, n_positions=64, vocab_size=512)
    transformers.GPT2LMHeadModel(hf_config).save_pretrained(hf_dir)
    tokenizer.save(str(hf_dir / "tokenizer.json"))
    converted, hf_tokenizer = attnlab.load(hf_dir, attention="gated_sdpa")
    assert converted.config.family == "gpt2" and converted.config.n_embd == 32 and not converted.training
    assert converted.attention_config["name"] == "gated_sdpa" and hf_tokenizer.get_vocab() == tokenizer.get_vocab()
    assert converted(ids).shape == (1, ids.shape[1], 512)


def test_tables_reproduce_by_name_takes_its_directories_from_reproduce_table_yaml() -> None:
    from attnlab.tables import table_config

    cfg = table_config("table3", "smoke")
    assert (cfg.root_dir, cfg.runs_dir) == (str(ROOT), str(ROOT / "outputs" / "runs"))
    assert cfg.results_dir == str(ROOT / "experiments" / "results" / "table3" / "smoke")
    with pytest.raises(ConfigError, match=r"^scale"):  # composed and checked before anything runs
        attnlab.tables.reproduce("table3", "huge")


def test_import_attnlab_stays_light() -> None:
    """The API's functions import training, evaluation and Hydra when called; ``attnlab.tables`` on first use."""
    code = (
        "import sys, attnlab; heavy = {'torch', 'hydra', 'lightning', 'lm_eval', 'attnlab.tables'} & set(sys.modules);"
        "print(sorted(heavy)); print(attnlab.tables.reproduce.__module__)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert done.stdout.split() == ["[]", "attnlab.tables"]
