"""The table engine end to end at smoke scale (real multiruns, evaluation, collector, W&B offline), and its pieces.

One smoke reproduction (table3's smoke scale: 4 cells of a few steps, logged to W&B offline) is shared by the
engine tests; the W&B runs are read back from their ``.wandb`` files (tests/wandb_offline.py).
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import math
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from attnlab import tables
from attnlab.errors import ConfigError
from attnlab.tables import reproduce
from attnlab.tables.as_run import read_cells
from attnlab.tables.engine import Engine
from attnlab.tables.stats import OPPOSITE, REPRODUCES, SMALLER, UNRESOLVED, decide, paired_test
from tests.reliability import as_background_job
from tests.wandb_offline import wandb_runs

ROOT = Path(__file__).resolve().parents[1]


def load_table(name: str) -> dict:
    return tables.load_table(name, ROOT)


def smoke_table() -> dict:
    return load_table("table3")


@pytest.fixture(scope="module")
def smoke_run(tmp_path_factory: pytest.TempPathFactory, data_cache: Path) -> dict:
    """``make reproduce-table3 SCALE=smoke ARGS=logger=wandb`` into a temporary directory (offline W&B)."""
    tmp = tmp_path_factory.mktemp("tables")
    settings = {
        "root": ROOT,
        "runs_dir": tmp / "runs",
        "results_dir": tmp / "results",
        "args": [f"paths.cache_dir={data_cache}", "logger=wandb"],
    }
    markdown = reproduce(smoke_table(), "smoke", **settings)
    return {"settings": settings, "markdown": markdown, "tmp": tmp}


@pytest.mark.slow
@pytest.mark.long  # the smoke table its module shares (~1 min), then its notebooks and renders: it starts first
def test_smoke_table_end_to_end(smoke_run: dict) -> None:
    results = smoke_run["settings"]["results_dir"]
    markdown = (results / "table3.md").read_text()
    assert markdown == smoke_run["markdown"]
    assert "not run at smoke scale" in markdown and "stand-in `continuation_acc_norm`" in markdown
    import pandas as pd

    runs = pd.read_csv(results / "runs.csv")
    assert len(runs) == 2 * 2 * 1  # stages x variants x seeds
    assert runs["continuation_acc_norm"].between(0, 1).all() and (runs["heldout_word_ppl"] > 1).all()
    effects = pd.read_csv(results / "effects.csv")
    assert set(effects["verdict"]) <= {REPRODUCES, OPPOSITE, SMALLER, UNRESOLVED}
    assert len(effects) == 2 * 1 * 4  # stages x variants x columns that ran
    finetuned = sorted((smoke_run["settings"]["runs_dir"]).glob("*/.hydra/overrides.yaml"))
    starts = [p.read_text() for p in finetuned if "model.init_from" in p.read_text()]
    assert len(starts) == 2 and all("vanilla-s1" in s for s in starts)
    lines = read_cells(results)  # each cell's as-run config, committed beside its records
    assert list(lines) == [Path(run).name for run in runs["run"]]
    for name, line in lines.items():
        assert name.endswith(line["digest"]) and line["identity"]["seed"] == line["seed"] == 1
        assert line["ran_with"]["commit"] and line["ran_with"]["device"] == "cpu x1" and line["ran_with"]["torch"]
        assert line["identity"]["data"]["source"] and f"attention={line['attention']}" in line["overrides"]
    starts = [o for line in lines.values() for o in line["overrides"] if o.startswith("model.init_from=")]
    assert len(starts) == 2 and all("vanilla-s1" in o for o in starts)


@pytest.mark.slow
def test_a_new_machine_extends_the_table_from_its_committed_records(
    smoke_run: dict, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """No run directories (a fresh clone): the committed cells whose as-run identity is today's are finished, so the
    table is written again without training or evaluating; a cell whose identity changed is named as stale first."""
    import shutil

    results = tmp_path / "results"
    shutil.copytree(smoke_run["settings"]["results_dir"], results)
    settings = {"root": ROOT, "runs_dir": tmp_path / "runs", "results_dir": results}
    args = [a for a in smoke_run["settings"]["args"] if a.startswith("paths.")]
    markdown = reproduce(smoke_table(), "smoke", **settings, args=args)
    assert markdown == smoke_run["markdown"] and not (tmp_path / "runs").exists()
    committed = (smoke_run["settings"]["results_dir"] / "cells.jsonl").read_text()
    assert (results / "cells.jsonl").read_text() == committed
    changed = [json.loads(line) for line in committed.splitlines()]
    changed[-1]["identity"]["optim"]["lr"] = 1.0  # as if it had run with another learning rate
    (results / "cells.jsonl").write_text("".join(json.dumps(line) + "\n" for line in changed))
    with caplog.at_level(logging.WARNING, logger="attnlab.tables"):
        partial = reproduce(smoke_table(), "smoke", **settings, args=args, partial=True)
    assert "**Partial: 3 of 4 cells**" in partial and not (tmp_path / "runs").exists()
    assert f"{changed[-1]['name']} (changed: optim.lr)" in caplog.text
    assert "will be trained again" in caplog.text


@pytest.mark.slow
def test_smoke_sweep_logs_one_wandb_run_per_job(smoke_run: dict) -> None:
    """Training runs (job type = stage) carry results.json's numbers; each evaluation is a run in the same group;
    the finished table is a run of its own there."""
    engine = Engine(smoke_table(), "smoke", **{k: v for k, v in smoke_run["settings"].items() if k != "results_dir"})
    for cell in engine.cells():
        (train,) = wandb_runs(cell.directory)
        assert train["group"] == "table3-smoke" and train["job_type"] == cell.stage
        assert train["name"] == f"{cell.model}-{cell.attention}-s{cell.seed}"
        assert {cell.model, cell.attention, "seed-1", "scale-smoke", "table3", "swept:attention"} <= train["tags"]
        results = json.loads((cell.directory / "results.json").read_text())
        for key in ("unigram_ppl", "parameters", "tokens_per_second"):
            assert train["summary"][key] == pytest.approx(results[key])
        assert train["summary"]["val/ppl"] == pytest.approx(results["val_ppl"]) and "val_ppl" not in train["summary"]
        (evaluation,) = wandb_runs(cell.directory / "eval" / "table3_cpu")
        assert evaluation["group"] == "table3-smoke" and evaluation["job_type"] == "eval"
        assert {cell.stage, "seed-1", "scale-smoke"} <= evaluation["tags"]
        assert evaluation["summary"]["heldout_word_ppl"] > 1
    (table,) = wandb_runs(smoke_run["settings"]["runs_dir"])
    assert table["group"] == "table3-smoke" and table["job_type"] == "table"
    assert table["summary"]["table/_type"] == "table-file" and any(k.startswith("verdicts/") for k in table["summary"])


@pytest.mark.slow
def test_rerun_recomputes_nothing(smoke_run: dict) -> None:
    runs_dir = smoke_run["settings"]["runs_dir"]
    cells = [p for p in runs_dir.iterdir() if p.name != "wandb"]  # runs_dir/wandb: the tables' own W&B runs

    def files() -> dict[Path, int]:  # W&B's service keeps appending to its debug logs (logs/) while the process lives
        return {p: p.stat().st_mtime_ns for c in cells for p in c.rglob("*") if p.is_file() and p.parent.name != "logs"}

    before = files()
    reproduce(smoke_table(), "smoke", **smoke_run["settings"])
    after = files()
    assert before == after and sorted(p for p in runs_dir.iterdir() if p.name != "wandb") == sorted(cells)


@pytest.mark.slow
def test_table4_shares_table3_cells_and_force_makes_new_ones(smoke_run: dict) -> None:
    settings = smoke_run["settings"]
    engine = Engine(smoke_table(), "smoke", root=ROOT, runs_dir=settings["runs_dir"], args=settings["args"])
    cells = engine.cells()
    assert all(c.finished for c in cells)
    table4 = Engine(load_table("table4"), "smoke", root=ROOT, runs_dir=settings["runs_dir"], args=settings["args"])
    pretrain = [c for c in table4.cells() if c.stage == "pretrain"]
    assert len(pretrain) == 1 and all(c.finished for c in pretrain)  # table3's vanilla cells, not trained again
    assert {c.directory for c in pretrain} <= {c.directory for c in cells}
    forced = Engine(smoke_table(), "smoke", root=ROOT, runs_dir=settings["runs_dir"], args=settings["args"], force=True)
    fresh = forced.cells()
    assert not {c.directory for c in fresh} & {c.directory for c in cells}
    assert not any(c.finished for c in fresh)


@pytest.mark.slow
def test_interrupted_cell_resumes_from_its_last_checkpoint(smoke_run: dict) -> None:
    settings = smoke_run["settings"]
    engine = Engine(smoke_table(), "smoke", root=ROOT, runs_dir=settings["runs_dir"], args=settings["args"])
    cell = next(c for c in engine.cells() if c.stage == "pretrain" and c.attention == "ssa" and c.seed == 1)
    (cell.directory / "results.json").unlink()  # as if killed after its last checkpoint
    engine.train([cell])
    assert cell.finished
    log = next(cell.directory.glob("*.log")).read_text()
    assert "Restoring states from the checkpoint path" in log or "Resuming" in log


@pytest.mark.slow
def test_passkey_lengths_beyond_the_window_are_one_error_line_in_attnlab_lm_eval(
    smoke_run: dict, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Through lm-eval's CLI too, prompts are never cut to fit: the smoke model's window is 256 tokens."""
    from attnlab.eval.__main__ import main

    engine = Engine(smoke_table(), "smoke", root=ROOT, runs_dir=smoke_run["settings"]["runs_dir"])
    checkpoint = engine.cells()[0].checkpoint
    argv = ["attnlab-lm-eval", "--model", "attnlab", "--model_args", f"checkpoint={checkpoint}", "--limit", "1"]
    argv += ["--tasks", "attnlab_passkey", "--metadata", '{"context_lengths": [200, 1024]}']
    monkeypatch.setattr(sys, "argv", argv)
    with pytest.raises(SystemExit) as stopped:  # sys.exit("error: ..."): that one line on stderr, exit status 1
        main()
    assert str(stopped.value.code).startswith("error: context_lengths: [1024] leave no room")


def test_verdicts() -> None:
    tested = paired_test([-1.0, -1.2, -0.9], [0.0, 0.0, 0.0], paper_effect=-2.3)
    assert math.isclose(tested.mean, -31 / 30) and tested.high < 0
    assert decide(tested.mean, tested.p, tested.p_paper, direction=-2.3) == REPRODUCES
    assert decide(tested.mean, tested.p, tested.p_paper, direction=+0.5) == OPPOSITE
    tested = paired_test([-1.0, 1.5, 0.2], [0.0, 0.0, 0.0], paper_effect=-2.3)
    assert tested.low < 0 < tested.high and decide(tested.mean, tested.p, tested.p_paper, -2.3) == UNRESOLVED
    assert (paired_test([0.4], [0.0]).low, paired_test([0.4], [0.0]).high) == (-math.inf, math.inf)


@pytest.mark.slow
def test_paper_scale_composes_and_fails_fast_offline(tmp_path: Path) -> None:
    """Every paper-scale cell composes (the engine composes them first), then one line says what is missing."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "CUDA_VISIBLE_DEVICES": ""}
    command = [sys.executable, "experiments/reproduce_table.py", "scale=paper", f"runs_dir={tmp_path}/runs"]
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode != 0
    assert done.stderr.strip().splitlines()[-1].startswith("error: scale: paper needs GPUs")
    assert "Traceback" not in done.stderr and not (tmp_path / "runs").exists()


@pytest.mark.slow
def test_gpu_scale_composes_and_asks_only_for_a_gpu(tmp_path: Path) -> None:
    """The gpu scale needs no hub (its corpus, registry_text, is carried to the GPU machine as files): without a GPU,
    one line says so."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "CUDA_VISIBLE_DEVICES": ""}
    command = [sys.executable, "experiments/reproduce_table.py", "table=outliers", "scale=gpu"]
    places = [f"runs_dir={tmp_path}/runs", f"results_dir={tmp_path}/results"]  # no committed cells to take instead
    done = subprocess.run([*command, *places], cwd=ROOT, env=env, capture_output=True, text=True)
    assert done.returncode != 0 and "Traceback" not in done.stderr and not (tmp_path / "runs").exists()
    last = done.stderr.strip().splitlines()[-1]
    assert last == "error: scale: gpu needs GPUs (torch sees none); run it on a GPU, or use SCALE=cpu"


@pytest.mark.slow
def test_a_gpu_table_with_every_cell_recorded_is_written_again_on_a_cpu(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every committed cell's as-run line matches today's: nothing to train, so no GPU is asked for, and the table
    comes out byte for byte. The corpus is the one the cells recorded (a fresh clone has none built, and a rebuilt
    one can differ: Debian's packages move with stable's point releases)."""
    import shutil

    import attnlab.data.registry

    committed = ROOT / "experiments" / "results" / "outliers" / "gpu"
    lines = (committed / "cells.jsonl").read_text().splitlines()
    (fingerprint,) = {json.loads(line)["identity"]["data"]["corpus_sha256"] for line in lines}
    monkeypatch.setattr(attnlab.data.registry, "corpus_fingerprint", lambda cache_dir: fingerprint)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    shutil.copytree(committed, tmp_path / "results")
    with contextlib.redirect_stdout(io.StringIO()):
        reproduce("outliers", "gpu", root=ROOT, runs_dir=tmp_path / "runs", results_dir=tmp_path / "results")
    assert not (tmp_path / "runs").exists()
    for name in ("outliers.md", "outliers.csv", "effects.csv", "runs.csv", "cells.jsonl"):
        assert (tmp_path / "results" / name).read_bytes() == (committed / name).read_bytes(), name


def test_unknown_scale_is_one_line_error() -> None:
    with pytest.raises(ConfigError, match=r"scale: one of smoke, cpu, cpu_long, paper \(got huge\)"):
        Engine(load_table("table3"), "huge", root=ROOT, runs_dir=Path("unused"))


@pytest.mark.slow
def test_every_table_has_a_make_target_whose_help_names_its_scales() -> None:
    """``make help`` is where a user learns which ``SCALE=`` a table takes: it must match the table config."""
    help_lines = dict(re.findall(r"^reproduce-(\w+):.*?## (.*)$", (ROOT / "Makefile").read_text(), re.MULTILINE))
    for config in sorted((ROOT / "experiments" / "conf" / "table").glob("*.yaml")):
        named = re.search(r"SCALE=([\w|]+)", help_lines.get(config.stem, ""))
        assert named, f"make reproduce-{config.stem}: no help line naming its SCALE= values"
        assert set(named.group(1).split("|")) == set(load_table(config.stem)["scales"]), config.stem


@pytest.mark.parametrize(
    ("notebook", "printed"),
    [("tables.ipynb", "finetune: 4 column(s) plotted"), ("training_curves.ipynb", "steps to reach vanilla")],
)
@pytest.mark.slow
def test_notebooks_execute_on_the_smoke_results(
    smoke_run: dict, notebook: str, printed: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """notebooks/tables.ipynb and training_curves.ipynb run top to bottom on the smoke reproduction's CSVs and show
    their figures inline, writing no file beside the results."""
    import nbclient
    import nbformat

    path = ROOT / "notebooks" / notebook
    results = smoke_run["settings"]["results_dir"]
    monkeypatch.setenv("ATTNLAB_TABLE_RESULTS", str(results))
    monkeypatch.setenv("ATTNLAB_TABLE_SCALE", "smoke")
    before = sorted(results.iterdir())
    executed = nbformat.read(path, as_version=4)
    resources = {"metadata": {"path": str(path.parent)}}
    nbclient.NotebookClient(executed, timeout=300, kernel_name="python3", resources=resources).execute()
    text = "".join(o.get("text", "") for c in executed.cells if c.cell_type == "code" for o in c.outputs)
    images = [o for c in executed.cells if c.cell_type == "code" for o in c.outputs if "image/png" in o.get("data", {})]
    assert printed in text and images and sorted(results.iterdir()) == before


def test_a_bad_override_stops_the_table_before_any_cell_launches(tmp_path: Path) -> None:
    """`make reproduce-table3 ARGS=trainer.max_steps=-3` is one error naming the key, and no cell starts."""
    with pytest.raises(ConfigError, match=r"trainer\.max_steps"):
        reproduce(
            smoke_table(),
            "smoke",
            root=ROOT,
            runs_dir=tmp_path / "runs",
            results_dir=tmp_path / "results",
            args=["trainer.max_steps=-3"],
        )
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())


def test_a_sweep_handles_sigint_though_its_engine_started_with_it_ignored(tmp_path: Path) -> None:
    """An engine started as a script's background job ignores SIGINT; a sweep that inherited that dropped the Ctrl-C
    the engine passed on until its training began, and trained on where it began sooner (the sweep's own ``main``
    resets it too: this is the engine's share)."""
    from attnlab.tables.engine import run_sweep

    report = tmp_path / "sigint"
    probe = f"import pathlib, signal; pathlib.Path({str(report)!r}).write_text(repr(signal.getsignal(signal.SIGINT)))"
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        run_sweep([sys.executable, "-c", probe], tmp_path)
    finally:
        signal.signal(signal.SIGINT, previous)
    assert report.read_text() == repr(signal.default_int_handler)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("sig", "background"), [(signal.SIGINT, False), (signal.SIGINT, True), (signal.SIGTERM, False)]
)
def test_a_signal_to_a_table_stops_its_training_and_is_one_line(
    sig: signal.Signals, background: bool, tmp_path: Path, data_cache: Path
) -> None:
    """Ctrl-C at the terminal (SIGINT to the engine's process group) or SIGTERM to the engine alone, while a cell
    trains: the engine passes it on, waits for the sweep to save and stop, says what was interrupted and how to
    resume, and exits 128 + the signal; no training process outlives it and no later cell starts. ``background``:
    the table started as a script's background job, with SIGINT ignored (its sweeps inherited that and trained on)."""
    command = [sys.executable, "experiments/reproduce_table.py", "table=table3", "scale=smoke"]
    command += [f"runs_dir={tmp_path}/runs", f"results_dir={tmp_path}/results", f"args='paths.cache_dir={data_cache}'"]
    process = subprocess.Popen(
        as_background_job(command) if background else command,
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    deadline = time.monotonic() + 300
    while not list((tmp_path / "runs").glob("*/.hydra")) and time.monotonic() < deadline:
        time.sleep(0.2)
    if sig == signal.SIGINT:
        os.killpg(process.pid, sig)  # as the terminal does: to the engine's whole process group
    else:
        process.send_signal(sig)  # as `kill` or a scheduler does: to the engine alone
    _, stderr = process.communicate(timeout=300)
    assert process.returncode == 128 + sig, stderr[-3000:]
    last = stderr.strip().splitlines()[-1]
    assert last.startswith(f"interrupted ({sig.name}): table3 at scale smoke; finished cells are kept"), last
    assert "Traceback" not in stderr
    assert not training_processes(tmp_path)
    assert len(list((tmp_path / "runs").glob("*/.hydra"))) == 1  # the sweep stopped at its first cell


def training_processes(under: Path) -> list[str]:
    """Command lines of the running processes that name ``under`` (a table's training sweeps do)."""
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            text = cmdline.read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if str(under) in text and "attnlab.cli.train" in text:
            found.append(text)
    return found


@pytest.mark.slow
def test_report_site_on_the_smoke_table(smoke_run: dict, tmp_path: Path) -> None:
    """``make report`` on the smoke table: the reading, the table, its figures, CSVs and every cell's config."""
    import shutil

    from attnlab import report

    results = tmp_path / "results"
    shutil.copytree(smoke_run["settings"]["results_dir"], results / "table3" / "smoke")
    (results / "table3" / "README.md").write_text(  # its links are relative to it, as GitHub shows them
        "intro\n\n<!-- reading: table3 -->\n\n*Our reading*, see [the runs](smoke/runs.csv).\n\n<!-- /reading -->\n"
    )
    out = tmp_path / "site"
    index = report.build(results, out, ROOT)
    assert index == out / "index.html" and "table3-smoke.html" in index.read_text()
    page = (out / "table3-smoke.html").read_text()
    assert "<em>Our reading</em>" in page and 'href="data/table3/smoke/runs.csv"' in page
    assert "Is the paper&#39;s phenomenon there?" in page or "Is the paper's phenomenon there?" in page
    assert "verdict (Holm)" in page and 'class="verdict ' in page
    images = [line.split('src="')[1].split('"')[0] for line in page.splitlines() if '<img src="' in line]
    assert len(images) >= 2 and all((out / image).is_file() for image in images)  # ours vs paper per stage, curves
    import pandas as pd

    runs = pd.read_csv(results / "table3" / "smoke" / "runs.csv")
    for run in runs.itertuples():  # each cell links its config: the one it ran with, committed in cells.jsonl
        config = out / "configs" / "table3-smoke" / f"{Path(run.run).name}.yaml"
        assert f'href="configs/table3-smoke/{config.name}"' in page
        text = config.read_text()
        assert text.startswith("# the config this cell ran with, from experiments/results/table3/smoke/cells.jsonl")
        assert "commit:" in text and "recorded: when the cell finished" in text
        assert f"attention: {run.attention}" in text
    assert "(as run)" in page and "composed today" not in page


@pytest.mark.slow
def test_report_composes_configs_of_runs_not_here_and_never_overwrites_other_files(
    smoke_run: dict, tmp_path: Path
) -> None:
    import shutil

    import pandas as pd

    from attnlab import report

    results = tmp_path / "results" / "table3" / "smoke"
    shutil.copytree(smoke_run["settings"]["results_dir"], results)
    (results / "cells.jsonl").unlink()  # a table recorded before the engine committed as-run configs
    runs = pd.read_csv(results / "runs.csv")
    names = [f"outputs/runs/{Path(r).name}" for r in runs["run"]]  # directories not on this machine
    names[0] = "outputs/runs/renamed-since-0000000000"  # a cell whose identity changed after it ran
    runs.assign(run=names).to_csv(results / "runs.csv", index=False)
    out = tmp_path / "site"
    report.build(tmp_path / "results", out, ROOT)
    configs = out / "configs" / "table3-smoke"
    renamed, same = (
        (configs / f"{Path(names[0]).name}.yaml").read_text(),
        (configs / f"{Path(names[1]).name}.yaml").read_text(),
    )
    for text in (renamed, same):
        assert text.startswith("# composed from experiments/conf/table/table3.yaml, scale smoke by today's code")
    assert f"not {Path(names[0]).name}: something in its identity changed" in renamed
    assert "today's config names this cell" not in same
    assert f"name: {runs['attention'][1]}" in same and f"seed: {runs['seed'][1]}" in same
    report.build(tmp_path / "results", out, ROOT)  # an earlier report is replaced
    elsewhere = tmp_path / "mine"
    elsewhere.mkdir()
    (elsewhere / "notes.txt").write_text("mine")
    stopped = subprocess.run(
        [sys.executable, "experiments/report.py", "--results", str(tmp_path / "results"), "--out", str(elsewhere)],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert stopped.returncode == 1 and "Traceback" not in stopped.stderr
    assert stopped.stderr.strip().splitlines() == [
        f"error: --out: an empty directory or an earlier report ({elsewhere} holds other files)"
    ]
    assert [p.name for p in elsewhere.iterdir()] == ["notes.txt"]
