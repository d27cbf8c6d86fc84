"""Inputs that used to fail silently or deep inside a library: a results.csv cut before its newline, a NaN
evaluation row, an empty or binary data file."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from attnlab.data import TextDataModule
from attnlab.errors import ConfigError
from attnlab.eval.harness import append_csv


def test_a_row_is_never_glued_onto_a_last_row_without_newline(tmp_path: Path) -> None:
    results = tmp_path / "results.csv"
    results.write_text("run_id,ppl\r\nfirst,12.5")  # the last row lacks its newline
    append_csv(results, {"run_id": "second", "ppl": 11.0})
    assert list(csv.DictReader(results.open(newline=""))) == [
        {"run_id": "first", "ppl": "12.5"},
        {"run_id": "second", "ppl": "11.0"},
    ]


def test_a_nan_metric_is_refused_not_tabled(tmp_path: Path) -> None:
    results = tmp_path / "results.csv"
    append_csv(results, {"checkpoint": "a.ckpt", "ppl": 11.0})
    with pytest.raises(ConfigError, match=r"checkpoint: b.ckpt scores non-finite ppl"):
        append_csv(results, {"checkpoint": "b.ckpt", "ppl": float("nan")})
    assert [r["checkpoint"] for r in csv.DictReader(results.open(newline=""))] == ["a.ckpt"]


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        (b"", "is empty"),
        (b"  \n\n ", "is empty"),
        (b"\x89PNG\r\n\x1a\n\x00\x00\xff\xfe", "is not UTF-8 text"),
        (b"text\x00with NUL", "contains NUL bytes"),
    ],
)
def test_an_unreadable_data_file_is_named(content: bytes, problem: str, tmp_path: Path) -> None:
    good, bad = tmp_path / "good.txt", tmp_path / "bad.txt"
    good.write_text("A paragraph.\n\nAnother one.\n")
    bad.write_bytes(content)
    data = TextDataModule(name="files", source="files", files=[str(tmp_path / "*.txt")], cache_dir=str(tmp_path))
    with pytest.raises(ConfigError, match=rf"data.files: {bad} {problem}"):
        data.prepare()


S = ["trainer=cpu", "model.n_layer=1", "model.n_head=2", "model.n_embd=32", "model.block_size=64"]
S += ["data.batch_size=4", "trainer.limit_val_batches=1", "optim.warmup_steps=2", "trainer.max_steps=2"]
BAD_VALUES = [  # (overrides, the key the one line must name)
    (["seed=-1"], "seed"),
    (["seed=99999999999"], "seed"),
    (["data.num_workers=-1"], "data.num_workers"),
    (["attention=clipped_softmax", "attention.alpha=abc"], "attention.alpha"),
    (["model.block_size=big"], "model.block_size"),
    (["attention=ssa", "attention.alpha_init=abc"], "attention.alpha_init"),
    (["trainer.precision=foo"], "trainer.precision"),
    (["trainer.strategy=foo"], "trainer.strategy"),
    (["callbacks.nonfinite_guard.action=foo"], "callbacks.nonfinite_guard.action"),
    (["callbacks.last_checkpoint.every_n_train_steps=-1"], "callbacks.last_checkpoint.every_n_train_steps"),
    (["data.val_fraction=1.5"], "data.val_fraction"),
    (["attention.variant_lr=-1"], "attention.variant_lr"),
    (["attention.variant_lr=0"], "attention.variant_lr"),
    (["data.tokenizer_vocab_size=0"], "data.tokenizer_vocab_size"),
    (["trainer.gradient_clip_val=-1"], "trainer.gradient_clip_val"),
    (["trainer.limit_val_batches=-1"], "trainer.limit_val_batches"),
    (["trainer.limit_val_batches=1.5"], "trainer.limit_val_batches"),
    (["callbacks.last_checkpoint.every_minutes=-1"], "callbacks.last_checkpoint.every_minutes"),
    (["callbacks.nonfinite_guard.max_skipped=-1"], "callbacks.nonfinite_guard.max_skipped"),
    (["trainer.devices=64"], "trainer.devices"),
    (["trainer.accelerator=cpu", "trainer.devices=0"], "trainer.devices"),
    (["data.block_size=0"], "data.block_size"),
    (["model.init_from=/nosuch.ckpt"], "model.init_from"),
    (["callbacks.outlier_monitor.batches=0"], "callbacks.outlier_monitor"),
    (["callbacks.outlier_monitor.sinks=maybe"], "callbacks.outlier_monitor.sinks"),
    (["model.n_head=5"], "model.n_embd"),
    (["attention=clipped_softmax", "attention.zeta=0.5"], "attention.zeta"),
    (["data.num_workers=abc"], "data.num_workers"),
    (["data.tokenizer_vocab_size=abc"], "data.tokenizer_vocab_size"),
    (["train_tokens=abc"], "train_tokens"),
    (["train_tokens=-5"], "train_tokens"),
    (["attention=ssa", "attention.hidden_ratio=inf"], "attention.hidden_ratio"),
    (["attention=clipped_softmax", "attention.zeta=inf"], "attention.zeta"),
    (["attention=gated_sdpa", "attention.init_std=inf"], "attention.init_std"),
    (["attention=ssa", "attention.alpha_init=nan"], "attention.alpha_init"),
    (["attention=ssmax", "attention.s_init=inf"], "attention.s_init"),
    (["optim.lr=inf"], "optim.lr"),
    (["model.rope_base=inf"], "model.rope_base"),
    (["trainer.gradient_clip_val=inf"], "trainer.gradient_clip_val"),
    (["model.vocab_size=1000000000000"], "model.vocab_size"),
    (["data.block_size=512"], "data.block_size"),
    (["experiment_name=" + "a" * 300], "experiment_name"),
]


@pytest.mark.parametrize(("overrides", "key"), BAD_VALUES, ids=lambda v: " ".join(v) if isinstance(v, list) else "")
def test_a_bad_value_is_refused_before_anything_is_written(make_config, overrides: list[str], key: str) -> None:
    """Each value is checked when the config is composed (train.py's Hydra callback runs this before it creates the
    run directory): one ConfigError naming the key."""
    from attnlab.validation import validate_train_config

    with pytest.raises(ConfigError) as refused:
        validate_train_config(make_config([*S, *overrides]))
    assert refused.value.key == key, str(refused.value)
    assert "\n" not in str(refused.value)


def test_the_defaults_and_every_table_cell_pass_the_checks(make_config) -> None:
    from attnlab.validation import validate_train_config

    validate_train_config(make_config([]))
    validate_train_config(make_config(S))


@pytest.mark.slow
@pytest.mark.parametrize(("overrides", "key"), BAD_VALUES[:8], ids=lambda v: " ".join(v) if isinstance(v, list) else "")
def test_train_py_refuses_a_bad_value_in_one_line_and_leaves_nothing(
    overrides: list[str], key: str, tmp_path: Path, data_cache: Path
) -> None:
    import subprocess
    import sys

    from tests.conftest import ROOT

    run_dir = tmp_path / "run"
    command = [sys.executable, "train.py", *S, *overrides, f"hydra.run.dir={run_dir}", f"paths.cache_dir={data_cache}"]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 1
    assert done.stderr.strip().splitlines() == [done.stderr.strip()] and done.stderr.startswith(f"error: {key}: ")
    assert not run_dir.exists()


def test_a_results_file_is_replaced_whole_or_not_at_all(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A crash or a full disk in the middle of a write leaves the old file and no temporary file."""
    import errno
    import os

    from attnlab.files import write_atomic

    target = tmp_path / "results.json"
    write_atomic(target, "old")

    def full_disk(*_args: object) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fsync", full_disk)
    with pytest.raises(OSError):
        write_atomic(target, "new" * 1000)
    assert target.read_text() == "old" and sorted(p.name for p in tmp_path.iterdir()) == ["results.json"]
    monkeypatch.undo()
    write_atomic(target, "new")
    assert target.read_text() == "new" and sorted(p.name for p in tmp_path.iterdir()) == ["results.json"]


def test_a_new_column_replaces_results_csv_at_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A row with a new column rewrites the table through a temporary file: killed before the rename, the old
    table is whole (a SIGKILL in that window once emptied a 400,000-row file)."""
    import os

    results = tmp_path / "results.csv"
    for i in range(3):
        append_csv(results, {"checkpoint": f"{i}.ckpt", "ppl": float(i)})
    before = results.read_text()

    def killed(*_args: object) -> None:
        raise KeyboardInterrupt  # stands for the process dying between the write and the rename

    monkeypatch.setattr(os, "replace", killed)
    with pytest.raises(KeyboardInterrupt):
        append_csv(results, {"checkpoint": "3.ckpt", "ppl": 3.0, "acc": 0.5})
    assert results.read_text() == before and sorted(p.name for p in tmp_path.iterdir()) == ["results.csv"]
    monkeypatch.undo()
    append_csv(results, {"checkpoint": "3.ckpt", "ppl": 3.0, "acc": 0.5})
    rows = list(csv.DictReader(results.open(newline="")))
    assert [r["checkpoint"] for r in rows] == ["0.ckpt", "1.ckpt", "2.ckpt", "3.ckpt"] and rows[3]["acc"] == "0.5"


def test_a_row_that_does_not_fit_on_the_disk_is_undone(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import errno
    import os

    results = tmp_path / "results.csv"
    append_csv(results, {"checkpoint": "a.ckpt", "ppl": 1.0})
    before = results.read_text()
    real_fsync = os.fsync

    def full_disk(fd: int) -> None:
        real_fsync(fd)
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fsync", full_disk)
    with pytest.raises(ConfigError, match=r"results_csv: could not add a row to .* \(No space left on device\); it is"):
        append_csv(results, {"checkpoint": "b.ckpt", "ppl": 2.0})
    assert results.read_text() == before


def test_writers_that_wait_while_the_file_is_replaced_lose_no_row(tmp_path: Path) -> None:
    """Evaluations append concurrently while some add columns (each rewrite replaces the file): every row lands."""
    from concurrent.futures import ThreadPoolExecutor

    results = tmp_path / "results.csv"

    def add(i: int) -> None:
        append_csv(results, {"checkpoint": f"{i}.ckpt", "ppl": float(i), **({f"extra{i}": 1.0} if i % 5 == 0 else {})})

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(add, range(60)))
    rows = list(csv.DictReader(results.open(newline="")))
    assert sorted(r["checkpoint"] for r in rows) == sorted(f"{i}.ckpt" for i in range(60))


@pytest.mark.slow
def test_a_run_never_writes_into_another_runs_directory_or_deletes_a_users(tmp_path: Path, data_cache: Path) -> None:
    """A finished run's directory is refused (its last.ckpt, results.json and metrics stay), resuming it with its
    own checkpoint is allowed; a failing run in a user's existing directory removes only what it wrote."""
    import hashlib
    import subprocess
    import sys

    from tests.conftest import ROOT

    def train(*overrides: str) -> subprocess.CompletedProcess:
        command = [sys.executable, "train.py", *S, *overrides, f"paths.cache_dir={data_cache}", "print_config=false"]
        return subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300)

    finished = tmp_path / "finished"
    assert train(f"hydra.run.dir={finished}").returncode == 0
    digests = {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in finished.rglob("*") if p.is_file()}
    refused = train("seed=7", f"hydra.run.dir={finished}")
    assert refused.returncode == 1
    assert refused.stderr.strip() == (
        f"error: hydra.run.dir: {finished} holds a finished run (results.json); a new run would overwrite it. Choose "
        f"another directory, or continue that run with ckpt_path={finished}/checkpoints/last.ckpt"
    )
    assert {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in finished.rglob("*") if p.is_file()} == digests
    resumed = train("trainer.max_steps=3", f"hydra.run.dir={finished}", f"ckpt_path={finished}/checkpoints/last.ckpt")
    assert resumed.returncode == 0, resumed.stderr[-2000:]

    users = tmp_path / "mine"
    users.mkdir()
    (users / "notes.log").write_text("my own log")
    failed = train("data=text_files", "data.files=[/nosuch/*.txt]", f"hydra.run.dir={users}")
    assert failed.returncode == 1 and "error: data.files: no files match" in failed.stderr
    assert (
        sorted(p.name for p in users.iterdir()) == ["notes.log"] and (users / "notes.log").read_text() == "my own log"
    )


def fake_checkpoint(path: Path, model: dict | None = None, step: object = 3, spec: object = None) -> Path:
    import torch

    weights = {"model.wte.weight": torch.zeros(10, 4), "model.blocks.0.attn.qkv.weight": torch.zeros(12, 4)}
    model = {"n_layer": 1, "n_head": 2, "n_embd": 4, "vocab_size": 10, "block_size": 8} | (model or {})
    record = {"spec": {"model": model, "attention": {"name": "vanilla"}} if spec is None else spec, "tokenizer": "{}"}
    torch.save({"state_dict": weights, "global_step": step, "attnlab": record | {"data": {}}}, path)
    return path


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        ({"model": {"n_layer": 10**6}}, "its record says model.n_layer=1000000 but its weights have 1"),
        ({"model": {"n_embd": 2**20}}, "its record says model.n_embd=1048576 but its weights have 4"),
        ({"model": {"vocab_size": 11}}, "its record says model.vocab_size=11 but its weights have 10"),
        ({"model": {"n_head": "two"}}, "its record's model.n_head: must be int, got 'two'"),
        ({"step": "abc"}, "its global_step 'abc' is not a step count"),
        ({"spec": {"attention": {}}}, "its record has no model or attention section"),
        ({"spec": "junk"}, "its attnlab record is malformed"),
    ],
)
def test_a_checkpoints_record_is_checked_against_its_weights_before_anything_is_built(
    tmp_path: Path, change: dict, problem: str
) -> None:
    """A record is data from a file: a size in it that its tensors contradict is refused in one line before a model
    of that size is allocated (a million layers took the machine's memory)."""
    from attnlab.models.checkpoint import load_checkpoint

    path = fake_checkpoint(tmp_path / "last.ckpt", **change)
    with pytest.raises(ConfigError, match=r"model\.init_from") as refused:
        load_checkpoint(path, key="model.init_from")
    assert problem in str(refused.value)
    assert load_checkpoint(fake_checkpoint(tmp_path / "good.ckpt")).global_step == 3


def test_a_gpu_trainer_without_a_gpu_is_one_line(make_config) -> None:
    import torch

    from attnlab.validation import validate_train_config

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    with pytest.raises(ConfigError, match=r"^trainer\.accelerator: gpu asks for a GPU and torch sees none"):
        validate_train_config(make_config([*S, "trainer.accelerator=gpu"]))
    validate_train_config(make_config([*S, "trainer.accelerator=gpu"]), check_machine=False)  # a launcher's GPUs


@pytest.mark.parametrize(
    "command",
    [
        ["train.py", "trainer=cpu", "hydra.run.dir=/sys/attnlab-test/run"],
        ["train.py", "-m", "trainer=cpu", "seed=1,2", "hydra.sweep.dir=/sys/attnlab-test/sweep"],
        ["evaluate.py", "ckpt_path=README.md", "hydra.run.dir=/sys/attnlab-test/eval"],
    ],
    ids=["train", "sweep", "evaluate"],
)
@pytest.mark.slow
def test_a_run_directory_that_cannot_be_written_is_one_line(command: list[str]) -> None:
    """/sys refuses new entries even to root: a read-only filesystem, found before Hydra writes its files there."""
    import subprocess
    import sys

    from tests.conftest import ROOT

    done = subprocess.run([sys.executable, *command, "print_config=false"], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 1
    assert done.stderr.strip().splitlines() == [done.stderr.strip()], done.stderr[-2000:]
    assert done.stderr.startswith("error: hydra.") and ": cannot write in /sys/attnlab-test/" in done.stderr


def test_a_full_disk_at_start_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import errno
    import os

    from attnlab.run_directory import check_writable

    def full(*_args: object) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(ConfigError, match=r"^hydra.run.dir: cannot write in .*: No space left on device$"):
        check_writable(tmp_path / "run", "hydra.run.dir")
    assert not list((tmp_path / "run").iterdir())  # the probe is gone


def test_metrics_csv_gets_a_new_column_by_replacing_it_whole(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Lightning rewrites metrics.csv in place when a metric first appears (validation's, mid-run): a kill then would
    leave it cut short. Ours writes the new file beside it and renames it; a failed write leaves the old one."""
    import os

    from attnlab.training.rundir import ResumableCSVLogger

    logger = ResumableCSVLogger(save_dir=str(tmp_path), name="csv", version="")
    for step in range(3):
        logger.log_metrics({"train/loss": 5.0 - step}, step=step)
    logger.save()
    path = tmp_path / "csv" / "metrics.csv"
    before = path.read_text()
    logger.log_metrics({"val/loss": 4.0}, step=3)

    def fail(*_args: object) -> None:
        raise OSError(28, "No space left on device")

    with monkeypatch.context() as patched:
        patched.setattr(os, "replace", fail)
        with pytest.raises(OSError):
            logger.save()
    assert path.read_text() == before and [p.name for p in path.parent.iterdir()] == ["metrics.csv"]
    logger.save()
    rows = list(csv.DictReader(path.open()))
    assert [r["train/loss"] for r in rows] == ["5.0", "4.0", "3.0", ""] and rows[-1]["val/loss"] == "4.0"


def float_options() -> list[tuple[str, str]]:
    """(variant, option) for every float option of every variant, found from the Options dataclasses."""
    import dataclasses
    import typing

    from attnlab.attention import available_attention
    from attnlab.attention.base import resolve_options

    found = []
    for name in available_attention():
        _, options = resolve_options({"name": name})
        hints = typing.get_type_hints(type(options))
        for field in dataclasses.fields(options):
            if hints[field.name] is float or float in typing.get_args(hints[field.name]):
                found.append((name, field.name))
    return found


@pytest.mark.slow
def test_every_float_option_of_every_variant_is_refused_non_finite(make_config) -> None:
    """NaN and infinity are refused for each float option by the same type check, with the key named, at
    composition (not as a training NaN that names the trainer)."""
    import dataclasses

    from omegaconf import OmegaConf, open_dict

    from attnlab.attention.base import resolve_options
    from attnlab.config_checks import check_model_and_attention

    cfg = make_config(S)
    options = float_options()
    assert {("clipped_softmax", "zeta"), ("ssa", "alpha_init"), ("ssmax", "s_init")} <= set(options)
    for name, option in options:
        preset = dataclasses.asdict(resolve_options({"name": name})[1])
        for bad in (float("inf"), float("nan"), float("-inf")):
            with open_dict(cfg):
                cfg.attention = OmegaConf.create({**preset, option: bad})
            with pytest.raises(ConfigError) as refused:
                check_model_and_attention(cfg)
            assert refused.value.key == f"attention.{option}" and "must be a finite number" in str(refused.value)
