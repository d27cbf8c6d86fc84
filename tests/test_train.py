"""Training end to end on the CPU: fast_dev_run, a short run whose loss falls, resuming, and bad inputs."""

from __future__ import annotations

import csv
import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

from attnlab.errors import ConfigError
from attnlab.training.run import run
from tests.conftest import MICRO_DATA, MICRO_MODEL, ROOT

QUIET = ["logger=csv", "trainer=cpu", "callbacks.progress_bar.refresh_rate=0", *MICRO_MODEL, *MICRO_DATA]


@pytest.mark.parametrize("model", ["tiny", "tiny-neox", "tiny-llama"])
@pytest.mark.slow
def test_fast_dev_run(make_config, model: str) -> None:
    results = run(make_config(["debug=fdr", f"model={model}", *QUIET]))
    assert results["model"] == model
    assert results["steps"] == 1
    assert results["val_loss"] is not None and results["unigram_ppl"] > 1
    assert results["corpus_sha256"] is None  # the embedded corpus: its package fixes its text


@pytest.mark.slow
def test_short_training_run_lowers_the_loss_and_writes_its_outputs(make_config, tmp_path: Path) -> None:
    out = tmp_path / "run"
    cfg = make_config(
        [
            *QUIET,
            "trainer.max_steps=60",
            "trainer.val_check_interval=30",
            "optim.lr=3e-3",
            "optim.warmup_steps=5",
            "trainer.limit_val_batches=8",
            "trainer.log_every_n_steps=5",
        ],
        out,
    )
    results = run(cfg)
    rows = list(csv.DictReader((out / "csv" / "metrics.csv").open()))
    train_losses = [float(r["train/loss"]) for r in rows if r.get("train/loss")]
    val_losses = [float(r["val/loss"]) for r in rows if r.get("val/loss")]
    assert len(val_losses) == 2 and val_losses[1] < val_losses[0]
    assert train_losses[-1] < train_losses[0] - 0.5
    assert results["val_ppl"] < results["unigram_ppl"]
    rates = [(int(r["step"]), float(r["train/tokens_per_sec"])) for r in rows if r.get("train/tokens_per_sec")]
    assert rates and all(rate > 0 for _, rate in rates)
    validation_rates = [int(r["step"]) for r in rows if r.get("validate/tokens_per_sec")]
    assert validation_rates == [29, 59]  # once per validation, at the training step it follows (not at 1..8)
    assert not [key for key in rows[0] if key.startswith("train/device/") or key in ("train/time", "train/samples")]
    assert any(r.get("lr-AdamW/decay") for r in rows)
    assert (out / "checkpoints" / "last.ckpt").is_file()
    assert list((out / "checkpoints").glob("best-*.ckpt"))
    saved = json.loads((out / "results.json").read_text())
    assert saved["val_loss"] == pytest.approx(results["val_loss"])
    # two validations of 8 batches and the checkpoints count in the fit's clock, not in the training steps' one
    assert results["train_loop_tokens_per_second"] > results["tokens_per_second"]


@pytest.mark.slow
def test_resume_from_last_checkpoint_continues_in_a_new_directory(make_config, tmp_path: Path) -> None:
    first_dir, second_dir = tmp_path / "first", tmp_path / "second"
    common = [*QUIET, "trainer.val_check_interval=3", "trainer.limit_val_batches=2"]
    run(make_config([*common, "trainer.max_steps=6", "attention=vanilla"], first_dir))
    last = first_dir / "checkpoints" / "last.ckpt"
    before = hashlib.sha256(last.read_bytes()).hexdigest()
    results = run(make_config([*common, "trainer.max_steps=10", f"ckpt_path={last}"], second_dir))
    assert results["steps"] == 10
    assert results["run_tokens"] == 4 * 4 * 32 and results["train_tokens"] == 10 * 4 * 32
    assert (second_dir / "checkpoints" / "last.ckpt").is_file()
    assert hashlib.sha256(last.read_bytes()).hexdigest() == before


@pytest.mark.slow
def test_global_batch_in_tokens_sets_the_accumulation(make_config, tmp_path: Path) -> None:
    """4 x 32-token rows per batch: 256 tokens a step is 2 batches accumulated, and the token count says so."""
    import torch

    results = run(make_config([*QUIET, "trainer.max_steps=2", "global_batch_tokens=256"], tmp_path / "run"))
    assert results["steps"] == 2 and results["train_tokens"] == 2 * 256
    saved = torch.load(results["last_checkpoint"], map_location="cpu", weights_only=False)
    assert saved["loops"]["fit_loop"]["epoch_loop.batch_progress"]["total"]["completed"] == 4  # batches the loop read


@pytest.mark.slow
def test_compiled_training_saves_the_eager_models_checkpoint(make_config, tmp_path: Path) -> None:
    """compile=true trains through torch.compile; the checkpoint's keys are the model's own (no ``_orig_mod.``),
    so evaluate.py and resuming load it like any other, it computes what the eager run computes, and the outlier
    monitor's hooks still see the validation forwards (a graph compiled without them would skip them)."""
    import torch

    from attnlab.models.checkpoint import load_checkpoint

    common = [*QUIET, "trainer.max_steps=4", "trainer.val_check_interval=2", "trainer.limit_val_batches=3"]
    common.append("callbacks.outlier_monitor.batches=1")  # later validation batches run the compiled graph unhooked
    eager = run(make_config(common, tmp_path / "eager"))
    compiled = run(make_config([*common, "compile=true"], tmp_path / "compiled"))
    assert compiled["val_loss"] == pytest.approx(eager["val_loss"], rel=1e-3)
    logged = {}
    for name in ("eager", "compiled"):
        rows = csv.DictReader((tmp_path / name / "csv" / "metrics.csv").open())
        logged[name] = [float(r["outliers/max_inf_norm"]) for r in rows if r.get("outliers/max_inf_norm")]
    assert len(logged["eager"]) >= 2 and logged["compiled"] == pytest.approx(logged["eager"], rel=1e-3)
    state = torch.load(compiled["last_checkpoint"], map_location="cpu", weights_only=False)["state_dict"]
    assert state and not any("_orig_mod" in key for key in state)
    assert load_checkpoint(compiled["last_checkpoint"]).global_step == 4


@pytest.mark.slow
def test_fused_loss_trains_as_the_full_logits_do(make_config, tmp_path: Path) -> None:
    """fused_loss=true (the head and the cross-entropy in chunks, no full logits; a padded head here, whose extra
    rows must not reach the loss) trains the same model as the plain loss, up to the summation order."""
    common = [*QUIET, "trainer.max_steps=3", "trainer.val_check_interval=3", "trainer.limit_val_batches=2"]
    common.append("model.padded_vocab_size=600")  # 640 rows for the tokenizer's 512
    plain = run(make_config(common, tmp_path / "plain"))
    fused = run(make_config([*common, "fused_loss=true"], tmp_path / "fused"))
    assert fused["val_loss"] == pytest.approx(plain["val_loss"], rel=1e-5)


@pytest.mark.slow
def test_document_mask_trains_each_document_on_its_own(make_config, tmp_path: Path) -> None:
    """data.document_mask=true: the checkpoint records the separator, and the module rebuilt from it computes the
    loss of a packed block as the model does with the block's document ids, which differs from the unmasked loss."""
    import torch

    from attnlab.data.tokenizer import eos_token_id
    from attnlab.models.checkpoint import load_checkpoint
    from attnlab.models.gpt import document_ids
    from attnlab.nn_utils import next_token_loss
    from attnlab.training.module import LanguageModel

    overrides = [*QUIET, "trainer.max_steps=2", "trainer.limit_val_batches=2", "data.document_mask=true"]
    results = run(make_config(overrides, tmp_path / "run"))
    saved = load_checkpoint(results["last_checkpoint"])
    separator = eos_token_id(saved.tokenizer)
    assert saved.spec["document_separator"] == separator
    module = LanguageModel.load_from_checkpoint(results["last_checkpoint"]).eval()
    assert module.document_separator == separator
    vocab = saved.spec["model"]["vocab_size"]
    tokens = torch.randint(0, vocab, (2, 33), generator=torch.Generator().manual_seed(0))
    tokens[tokens == separator] = separator + 1
    tokens[:, 10] = separator
    with torch.no_grad():
        loss = module.loss({"input_ids": tokens})
        documents = document_ids(tokens[:, :-1], separator)
        assert loss == pytest.approx(next_token_loss(module.model, tokens, documents=documents).item(), rel=1e-6)
        assert abs(loss - next_token_loss(module.model, tokens)) > 1e-4
    resume_unmasked = [
        *QUIET,
        "trainer.max_steps=3",
        "trainer.limit_val_batches=2",
        f"ckpt_path={results['last_checkpoint']}",
    ]
    with pytest.raises(ConfigError) as err:  # resuming continues the same run: not without its mask
        run(make_config(resume_unmasked, tmp_path / "resumed"))
    assert err.value.key == "data.document_mask"


@pytest.mark.parametrize(
    ("overrides", "key"),
    [
        (["data.block_size=128", "model.block_size=64"], "data.block_size"),
        (["model.n_embd=30", "model.n_head=4"], "model.n_embd"),
        (["+attention.zeta=2"], "attention.zeta"),
        (["attention.name=nope"], "attention.name"),
        (["model.family=bert"], "model.family"),
        (["ckpt_path=/nope/last.ckpt"], "ckpt_path"),
        (["optim.schedule=linear"], "optim.schedule"),
        (["attention=temp_lookup"], "attention"),  # the synthetic tables' variants: not for language data
        (["compile=yes"], "compile"),
        (["fused_loss=1"], "fused_loss"),
        (["data.document_mask=true", "++data.document_separator=none"], "data.document_mask"),
        (["global_batch_tokens=200"], "global_batch_tokens"),  # not a multiple of 4 x 32
        (["global_batch_tokens=256", "trainer.accumulate_grad_batches=2"], "global_batch_tokens"),
    ],
)
def test_bad_config_names_the_key(make_config, overrides: list[str], key: str) -> None:
    with pytest.raises(ConfigError) as err:
        run(make_config([*QUIET, *overrides]))
    assert err.value.key == key


def train_cli(*overrides: str, tmp_path: Path) -> subprocess.CompletedProcess:
    command = [
        sys.executable,
        "train.py",
        f"hydra.run.dir={tmp_path}/run",
        f"paths.cache_dir={tmp_path}/cache",
        *overrides,
    ]
    return subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300)


@pytest.mark.slow
def test_cli_unknown_group_option_lists_the_available_ones(tmp_path: Path) -> None:
    done = train_cli("model=nope", tmp_path=tmp_path)
    assert done.returncode != 0
    assert done.stderr.startswith("error: model: no option 'nope'; allowed: ") and "tiny" in done.stderr


@pytest.mark.slow
def test_help_lists_only_what_train_py_composes(tmp_path: Path) -> None:
    """``--help`` once listed the table engine's groups (``table=table3`` then failed): they live with the engine."""
    done = train_cli("--help", tmp_path=tmp_path)
    groups = {line.split(":")[0] for line in done.stdout.split("== Config ==")[0].splitlines() if ": " in line}
    assert done.returncode == 0 and {"attention", "model", "data", "trainer", "eval", "logger"} <= groups
    assert not groups & {"table", "table_protocol"} and not any(g.startswith("synthetic_table") for g in groups)


@pytest.mark.slow
def test_cli_bad_value_exits_nonzero_with_one_clear_line(tmp_path: Path) -> None:
    done = train_cli("model.n_head=5", tmp_path=tmp_path)
    assert done.returncode != 0
    assert "error: model.n_embd: n_embd=256 must be divisible by model.n_head=5" in done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.slow
def test_run_ids_differ_between_processes_started_together() -> None:
    code = "import attnlab.resolvers as r; print(r.run_id())"
    ids = {subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout for _ in range(3)}
    assert len(ids) == 3


@pytest.mark.slow
def test_multirun_sweep_gives_one_directory_per_job_and_a_comparison_table(tmp_path: Path, data_cache: Path) -> None:
    """``train.py -m`` from any directory: each job in its own subdirectory, collected by experiments/compare.py."""
    logs = f"paths.log_dir={tmp_path / 'outputs'}"
    overrides = [*QUIET, "debug=fdr", f"paths.cache_dir={data_cache}", logs, "experiment_name=sweep"]
    command = [sys.executable, str(ROOT / "train.py"), "-m", "attention=vanilla,gated_sdpa", *overrides]
    done = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    (sweep,) = (tmp_path / "outputs" / "sweep").glob("multirun_*")
    jobs = sorted(p.name for p in sweep.iterdir() if p.is_dir())
    assert [j.split("_", 1)[0] for j in jobs] == ["0", "1"] and "attention=gated_sdpa" in jobs[1]
    table = subprocess.run(
        [sys.executable, str(ROOT / "experiments" / "compare.py"), str(sweep), "--out", str(tmp_path / "table")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert table.returncode == 0, table.stderr
    rows = (tmp_path / "table" / "table.md").read_text().splitlines()[2:]
    assert [row.split("|")[1].strip() for row in rows] == ["vanilla", "gated_sdpa"]


@pytest.mark.parametrize(
    ("override", "key"),
    [
        ("seed=abc", "seed"),
        ("optim.lr=abc", "optim.lr"),
        ("data.batch_size=0", "data.batch_size"),
        ("trainer.val_check_interval=0", "trainer.val_check_interval"),
        ("trainer.accumulate_grad_batches=0", "trainer.accumulate_grad_batches"),
        ("optim.min_lr_ratio=2", "optim.min_lr_ratio"),
        ("optim.weight_decay=-1", "optim.weight_decay"),
        ("trainer.max_steps=0", "trainer.max_steps"),
        ("experiment_name=../../x", "experiment_name"),
        ("ckpt_path=/nonexistent/last.ckpt", "ckpt_path"),
        ("attention=temp_lookup", "attention"),
        ("attention=value_select", "attention"),
    ],
)
@pytest.mark.slow
def test_cli_bad_value_is_one_line_and_writes_nothing(tmp_path: Path, override: str, key: str) -> None:
    """Checked before Hydra creates the run directory: started from a/b, nothing appears anywhere under tmp_path."""
    start = tmp_path / "a" / "b"
    start.mkdir(parents=True)
    paths = [f"paths.cache_dir={tmp_path}/cache", f"paths.log_dir={tmp_path}/outputs"]  # where a run would write
    command = [sys.executable, str(ROOT / "train.py"), *paths, override]
    done = subprocess.run(command, cwd=start, capture_output=True, text=True, timeout=300)
    assert done.returncode != 0
    assert done.stderr.strip().splitlines()[-1].startswith(f"error: {key}: ")
    assert "Traceback" not in done.stderr
    assert [p for p in tmp_path.rglob("*") if p not in (tmp_path / "a", start)] == []


def test_a_failed_log_write_prints_no_traceback(monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    """What a SIGTERM landing mid-write does to Lightning's "Received SIGTERM" line (its handler logs): the stream
    raises "reentrant call". train.py drops that record instead of printing logging's traceback."""
    import logging

    from attnlab.console import no_logging_tracebacks

    class Reentered:
        def write(self, text: str) -> None:
            raise RuntimeError("reentrant call inside <_io.BufferedWriter name='<stderr>'>")

        def flush(self) -> None:
            pass

    logger = logging.getLogger("attnlab.test.reentrant")
    logger.addHandler(logging.StreamHandler(Reentered()))
    monkeypatch.setattr(logging, "raiseExceptions", True)
    logger.error("received SIGTERM")
    assert "Traceback" in capsys.readouterr().err  # what the stop message used to be interleaved with
    no_logging_tracebacks()
    logger.error("received SIGTERM")
    assert capsys.readouterr().err == ""


@pytest.mark.slow
def test_a_resumed_run_removes_the_partial_saves_a_kill_left(make_config, tmp_path: Path) -> None:
    """A SIGKILL during a save leaves its temporary file beside last.ckpt; resuming removes it (last.ckpt is whole)."""
    directory = tmp_path / "run"
    common = [*QUIET, "trainer.val_check_interval=3", "trainer.limit_val_batches=2"]
    run(make_config([*common, "trainer.max_steps=3"], directory))
    checkpoints = directory / "checkpoints"
    orphan = checkpoints / ".last.ckpt.k1ll3d.tmp"
    orphan.write_bytes(b"PK\x03\x04 cut short")
    resumed = run(make_config([*common, "trainer.max_steps=5", f"ckpt_path={checkpoints / 'last.ckpt'}"], directory))
    assert resumed["steps"] == 5 and not orphan.exists() and (checkpoints / "last.ckpt").is_file()
