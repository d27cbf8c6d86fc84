"""experiments/emergence.py on two hand-made runs: the curves it tables and the figure it draws."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml

from tests.conftest import ROOT


def fake_run(sweep: Path, name: str, lr: str, kurtosis: list[float], entropy: bool = False, layers: int = 2) -> None:
    run = sweep / name
    (run / "csv").mkdir(parents=True)
    (run / ".hydra").mkdir()
    common = ["experiment=emergence", "ckpt_path=${resume_ckpt:}"]
    (run / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump([*common, f"optim.lr={lr}"]))
    model = {"name": "tiny", "n_layer": layers, "n_embd": 32, "n_head": 2, "block_size": 32}
    config = {
        "model": model,
        "attention": {"name": "vanilla"},
        "data": {"tokenizer_vocab_size": 512, "batch_size": 4, "block_size": 32},
    }
    (run / ".hydra" / "config.yaml").write_text(yaml.safe_dump(config))
    rows = []
    for i, k in enumerate(kurtosis):
        step = 250 * (i + 1) - 1
        rows.append({"step": step, "train/loss": 6.0})  # a training row: no validation metrics
        rows.append({"step": step, "outliers/kurtosis_max": k, "outliers/max_inf_norm": 10 * k})
        rows[-1] |= {"sinks/sink_share": 0.01, "val/loss": 6.0 - i / 10}
        if entropy:  # logged since 2026-11-27
            rows[-1] |= {"sinks/attention_entropy_normalized": 0.8 - i / 10}
    pd.DataFrame(rows).to_csv(run / "csv" / "metrics.csv", index=False)


@pytest.mark.slow
def test_curves_and_figure_of_a_search(tmp_path: Path) -> None:
    sweep, out = tmp_path / "search", tmp_path / "out"
    fake_run(sweep, "tiny-vanilla-s1-aaa", "0.002", [17.0, 35.0, 30.0])
    fake_run(sweep, "tiny-vanilla-s1-bbb", "0.006", [74.0, 121.0], entropy=True, layers=3)
    # the first run was extended past its horizon, from its own checkpoint: still the same setting
    extended = sweep / "tiny-vanilla-s1-aaa" / ".hydra" / "overrides.yaml"
    started = [o for o in yaml.safe_load(extended.read_text()) if not o.startswith("ckpt_path=")]
    extended.write_text(yaml.safe_dump([*started, "trainer.max_steps=12000", "ckpt_path=aaa/checkpoints/last.ckpt"]))
    # W8A8 of snapshots (emergence.py --evaluations, run before): drawn for the runs drawn, by their settings
    out.mkdir()
    evaluated = {"run": ["tiny-vanilla-s1-aaa", "tiny-vanilla-s1-aaa", "other-run", "tiny-vanilla-s1-aaa"]}
    evaluated |= {"step": [500, 750, 500, None], "w8a8_gap_pct": [1.5, 2.5, 9.0, 3.0]}
    pd.DataFrame(evaluated).to_csv(out / "evaluations.csv", index=False)
    done = subprocess.run(
        [sys.executable, "experiments/emergence.py", str(sweep), "--out", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    curves = pd.read_csv(out / "curves.csv")
    kurtosis = curves[curves["metric"] == "outliers/kurtosis_max"]
    assert set(kurtosis["setting"]) == {"optim.lr=0.002", "optim.lr=0.006"}  # only what differs between runs
    assert kurtosis.groupby("setting")["step"].max().to_dict() == {"optim.lr=0.002": 750, "optim.lr=0.006": 500}
    entropy = curves[curves["metric"] == "sinks/attention_entropy_normalized"]
    assert set(entropy["setting"]) == {"optim.lr=0.006"} and entropy["value"].tolist() == pytest.approx([0.8, 0.7])
    w8a8 = curves[curves["metric"] == "eval/w8a8_gap_pct"]
    assert w8a8[["setting", "step", "value"]].values.tolist() == [
        ["optim.lr=0.002", 500, 1.5],
        ["optim.lr=0.002", 750, 2.5],
    ]
    assert (out / "emergence.png").stat().st_size > 10_000
    assert "| optim.lr=0.006 |" in done.stdout and "121" in done.stdout  # each setting's last point
    model = json.loads((out / "setup.json").read_text())["model"]  # both sizes: the curves differ in it
    assert model.startswith("our tiny: 2 layers x 32 wide") and " / 3 layers x 32 wide" in model


@pytest.mark.slow
def test_seeds_of_one_setting_are_one_curve_and_the_title_facts_are_kept(tmp_path: Path) -> None:
    """A table's cells (run directories given one by one) differ in attention and seed: the seeds of one attention
    are one setting, also when one seed's cell was trained for another table (its experiment_name), and --render draws
    the figure again from curves.csv and setup.json alone."""
    cells = tmp_path / "runs"
    for name, seed, table in (("tiny-vanilla-s1-a", 1, "outliers"), ("tiny-vanilla-s2-b", 2, "gating")):
        fake_run(cells, name, "0.006", [50.0 * seed, 60.0 * seed])
        overrides = yaml.safe_load((cells / name / ".hydra" / "overrides.yaml").read_text())
        overrides += [f"seed={seed}", f"experiment_name={table}-gpu-pretrain"]
        overrides += ["print_config=false", "callbacks.last_checkpoint.every_n_train_steps=500"] if seed == 1 else []
        (cells / name / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump(overrides))
    out = tmp_path / "out"
    command = [sys.executable, "experiments/emergence.py", *map(str, sorted(cells.iterdir())), "--out", str(out)]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    curves = pd.read_csv(out / "curves.csv")
    assert set(curves["setting"]) == {"defaults"} and curves["run"].nunique() == 2
    assert "| defaults  |" in done.stdout and " 90 |" in done.stdout  # the mean of the seeds' last max kurtosis
    setup = json.loads((out / "setup.json").read_text())
    assert setup["tokens_per_step"] == 4 * 32
    assert setup["model"].startswith("our tiny: 2 layers x 32 wide") and setup["corpus"] == "?"
    (out / "emergence.png").unlink()
    done = subprocess.run([*command[:2], "--render", "--out", str(out)], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert (out / "emergence.png").stat().st_size > 10_000


def fake_evaluation(root: Path, name: str, checkpoint: Path, step: int | None, ppl: float, w8a8: float | None) -> Path:
    """An ``evaluate.py eval=analysis_cpu`` run directory: results.json names the checkpoint (and, since
    2026-11-27, its step), analysis.json holds the numbers."""
    eval_dir = root / name
    (eval_dir / "analysis").mkdir(parents=True)
    model = {"attnlab_checkpoint": str(checkpoint), "attnlab_attention": "vanilla"}
    model |= {"attnlab_checkpoint_step": step} if step is not None else {}
    (eval_dir / "results.json").write_text(json.dumps({"model": model}))
    summary = {"perplexity": ppl, "w8a8_perplexity": w8a8, "kurtosis_max": 60.0, "max_inf_norm": 170.0}
    summary |= {"sink_share": 0.005, "attention_entropy_normalized": 0.75}
    damage = {
        "residual_sum": {"clipped_share": 0.0, "step_over_median": 0.25},
        "norm_output": {"step_over_median": 0.5},
    }
    w8a8_section = {"clipped_share_max": 1e-4, "clipped_share_max_at": "context", "damage": damage}
    w8a8_section |= {"step_over_median_max": 4.1, "step_over_median_max_at": "ffn_hidden"}
    outliers = {"channel_ratio_max": 31.0, "channel_ratio_max_module": "blocks.1.norm_2", "outlier_dim": 7}
    outliers |= {"outlier_dim_modules": 9}
    sections = {"summary": summary, "w8a8": w8a8_section, "outliers": outliers}
    (eval_dir / "analysis" / "analysis.json").write_text(json.dumps(sections))
    return eval_dir


@pytest.mark.slow
def test_evaluations_of_checkpoints_are_one_row_each_with_their_run_setting_and_step(tmp_path: Path) -> None:
    """W8A8 on the runs' checkpoints: the run and setting come from the checkpoint's run directory, the step from
    results.json (left empty for an evaluation from before it was recorded); the gap is computed, not copied."""
    sweep = tmp_path / "search"
    fake_run(sweep, "tiny-vanilla-s1-aaa", "0.002", [17.0])
    fake_run(sweep, "tiny-vanilla-s1-bbb", "0.006", [74.0])
    evals = [
        fake_evaluation(
            tmp_path / "eval", "e2", sweep / "tiny-vanilla-s1-bbb" / "checkpoints" / "last.ckpt", 900, 300.0, 306.0
        ),
        fake_evaluation(
            tmp_path / "eval", "e1", sweep / "tiny-vanilla-s1-aaa" / "checkpoints" / "last.ckpt", 2681, 124.0, 124.5
        ),
        fake_evaluation(
            tmp_path / "eval", "e0", sweep / "tiny-vanilla-s1-aaa" / "checkpoints" / "last.ckpt", None, 130.0, 131.3
        ),
    ]
    out = tmp_path / "out"
    command = [sys.executable, "experiments/emergence.py", "--evaluations", *map(str, evals), "--out", str(out)]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    table = pd.read_csv(out / "evaluations.csv")
    assert table["evaluation"].tolist() == ["e1", "e0", "e2"]  # by setting, then step (unknown last)
    assert table["setting"].tolist() == ["optim.lr=0.002", "optim.lr=0.002", "optim.lr=0.006"]
    assert table["step"].iloc[0] == 2681 and pd.isna(table["step"].iloc[1])
    assert table["w8a8_gap_pct"].tolist() == pytest.approx([100 * 0.5 / 124, 1.0, 2.0])
    # the outliers table's check (kurtosis 60 >= 50 and a W8A8 gap >= 2%) and the gating table's (sink share >= 0.2)
    assert table["outliers_check"].tolist() == ["absent", "absent", "present"]
    assert table["attention_sink_check"].tolist() == ["absent"] * 3
    assert table["residual_sum_step_over_median"].tolist() == [0.25] * 3
    assert table["norm_output_step_over_median"].tolist() == [0.5] * 3
    assert table["channel_ratio_max"].tolist() == [31.0] * 3 and table["outlier_dim_modules"].tolist() == [9] * 3
    assert list(table.columns[:7]) == [
        "evaluation",
        "run",
        "setting",
        "step",
        "perplexity",
        "w8a8_perplexity",
        "w8a8_gap_pct",
    ]
    # a Hugging Face model (no checkpoint of ours) and a suite without W8A8: a row all the same, marked unknown
    hub = fake_evaluation(tmp_path / "eval", "e3", Path("unused.ckpt"), None, 50.0, None)
    record = json.loads((hub / "results.json").read_text())
    (hub / "results.json").write_text(json.dumps({"model": record["model"] | {"attnlab_checkpoint": None}}))
    done = subprocess.run([*command[:3], str(hub), "--out", str(out)], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    (row,) = pd.read_csv(out / "evaluations.csv").to_dict("records")
    assert row["run"] == "?" and row["setting"] == "?" and pd.isna(row["w8a8_gap_pct"])
    assert row["outliers_check"] == "not measured"
    done = subprocess.run([*command, "--render"], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 2 and "--evaluations tables evaluations alone" in done.stderr
