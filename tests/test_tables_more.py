"""Tables 5-8 and the outlier, gating and pruning tables: shared cells across tables, the analysis columns, training
curves and the pruning report end to end at smoke scale."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pandas as pd
import pytest

from attnlab.cells import cell_name, identity
from attnlab.errors import ConfigError
from attnlab.tables import load_table, reproduce
from attnlab.tables.collect import column_map
from attnlab.tables.engine import Engine

ROOT = Path(__file__).resolve().parents[1]
ABLATIONS = ["table5", "table6", "table7", "table8"]
FROM_SCRATCH = ["outliers", "gating", "pruning", "variants"]


def cells(name: str, scale: str = "smoke", runs_dir: Path = Path("/unused")) -> dict:
    engine = Engine(load_table(name, ROOT), scale, root=ROOT, runs_dir=runs_dir)
    return {(c.stage, c.attention, c.seed): c.directory.name for c in engine.cells()}


@pytest.mark.slow
def test_ssa_ablation_tables_share_the_start_and_the_vanilla_fine_tune() -> None:
    """Tables 5-8 fine-tune from one start cell per seed and train each shared variant once; table7's pretrain block
    is table3's pretraining."""
    grids = {name: cells(name) for name in ABLATIONS}
    for key in [("start", "vanilla", 1), ("finetune", "vanilla", 1)]:
        assert len({grid[key] for grid in grids.values()}) == 1, key
    assert cells("table3")[("pretrain", "vanilla", 1)] == grids["table7"][("pretrain", "vanilla", 1)]
    assert grids["table7"][("pretrain", "vanilla", 1)] != grids["table7"][("start", "vanilla", 1)]
    cpu = load_table("table5", ROOT)["scales"]["cpu"]
    assert "trainer.max_steps=400" in cpu["stage_overrides"]["start"]


@pytest.mark.usefixtures("registry_corpus")
@pytest.mark.slow
def test_cpu_long_ablations_start_from_the_outliers_cells_and_share_table3s_fine_tunes() -> None:
    """At cpu_long every SSA table's start is the outliers table's vanilla cell, and the fine-tunes of the variants
    two tables have (vanilla, ssa, ssa_shared) are one cell each."""
    outliers, table3 = cells("outliers", "cpu_long"), cells("table3", "cpu_long")
    for name in ABLATIONS:
        grid = cells(name, "cpu_long")
        assert {stage for stage, _, _ in grid} == {"start", "finetune"}, name
        for (stage, attention, seed), directory in grid.items():
            if stage == "start":
                assert directory == outliers[("pretrain", "vanilla", seed)]
            elif attention in ("vanilla", "ssa", "ssa_shared") and seed <= 3:  # table3 runs 3 seeds, table7 5
                assert directory == table3[("finetune", attention, seed)], (name, attention)


def test_gpu_and_cpu_long_scales_are_one_protocol_on_two_machines() -> None:
    """The from-scratch gpu scale is cpu_long's cell and recipe (table_protocol/cpu_long.yaml's lists, interpolated
    as lists in lists and flattened by the engine) on one GPU, trained longer."""
    table = load_table("outliers", ROOT)
    gpu, cpu = (
        Engine(table, s, root=ROOT, runs_dir=Path("/unused")).stage_overrides("pretrain", "tiny")
        for s in ("gpu", "cpu_long")
    )
    assert all(isinstance(o, str) for o in gpu + cpu) and len(set(gpu)) == len(gpu)
    machine = {"trainer=gpu", "trainer.devices=1", "trainer.precision=32-true"}
    assert set(gpu) - set(cpu) == machine | {"trainer.max_steps=8000"}
    assert set(cpu) - set(gpu) == {"trainer=cpu", "trainer.max_steps=6000"}
    assert "data=registry_text" in gpu and "optim.weight_decay=0.5" in gpu


@pytest.mark.slow
def test_from_scratch_tables_share_their_cells() -> None:
    grids = {name: cells(name) for name in FROM_SCRATCH}
    assert len({grid[("pretrain", "vanilla", 1)] for grid in grids.values()}) == 1
    assert set(grids["pruning"].values()) <= set(grids["outliers"].values())


@pytest.mark.slow
def test_the_sink_tables_share_their_synthetic_cells_and_only_they_have_that_scale() -> None:
    """The gating and variants tables judge sink claims on Guo et al.'s task with one vanilla and one G1 per seed
    (5 seeds); the outliers and pruning tables, whose phenomena a 1-layer model on 64 characters cannot show, have no
    synthetic scale."""
    gating, variants = cells("gating", "synthetic"), cells("variants", "synthetic")
    shared = {key for key in gating.keys() & variants.keys() if gating[key] == variants[key]}
    assert {(attention, seed) for _, attention, seed in shared} == {
        (attention, seed) for attention in ("vanilla", "gated_sdpa") for seed in range(1, 6)
    }
    assert "synthetic" not in load_table("outliers", ROOT)["scales"] | load_table("pruning", ROOT)["scales"]


def test_a_synthetic_tables_model_size_counts_the_tasks_word_level_vocabulary() -> None:
    """The figures name our model's real size: on Bigram-Backcopy it embeds 64 characters and 2 specials, not the
    4096-token BPE that ``data.tokenizer_vocab_size`` names for text (58,432 parameters, as the cells recorded)."""
    engine = Engine(load_table("gating", ROOT), "synthetic", root=ROOT, runs_dir=Path("/unused"))
    assert engine.row_sizes() == {("pretrain", "repo plot"): ("tiny", 58_432)}


@pytest.mark.parametrize("name", ABLATIONS + FROM_SCRATCH)
@pytest.mark.slow
def test_paper_scale_composes(name: str) -> None:
    """Every paper-scale cell composes (fine-tunes from the hub checkpoints, or pretrains GPT-2 on SlimPajama)."""
    grid = cells(name, "paper")
    assert grid and all(stage in ("pretrain", "finetune") for stage, _, _ in grid)


@pytest.mark.parametrize("name", ["table3", "table4", *ABLATIONS, *FROM_SCRATCH])
@pytest.mark.usefixtures("registry_corpus")
@pytest.mark.slow
@pytest.mark.long  # ~10 tables x every scale composed: its module (~10 min in all) starts first
def test_every_scale_reports_each_model_under_one_paper_row(name: str) -> None:
    """The gating table once inherited the protocol's OPT-125m row beside its own repo-plot row: the same cells were
    reported twice. Each table names its rows; the engine refuses two rows on one model."""
    table = load_table(name, ROOT)
    for scale in table["scales"]:
        engine = Engine(table, scale, root=ROOT, runs_dir=Path("unused"))
        rows = {row: model for stage in engine.stages() for row, model in engine.rows(stage).items()}
        assert len(set(rows.values())) == len(rows) == len({c.row for c in engine.cells()})
    if name == "gating":
        assert all(list(settings["rows"]) == ["repo plot"] for settings in table["scales"].values())
    doubled = {**table, "scales": {"cpu": {**table["scales"]["cpu"], "rows": {"A": "tiny", "B": "tiny"}}}}
    with pytest.raises(ConfigError, match=r"table\.scales\.cpu\.rows: one model per paper row"):
        Engine(doubled, "cpu", root=ROOT, runs_dir=Path("unused"))


def test_unknown_report_is_a_config_error() -> None:
    table = load_table("pruning", ROOT) | {"reports": ["histogram"]}
    with pytest.raises(ConfigError, match=r"table\.reports: one of pruning"):
        Engine(table, "smoke", root=ROOT, runs_dir=Path("unused"))


@pytest.mark.slow
def test_pruning_and_outlier_tables_end_to_end(
    tmp_path: Path, data_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The pruning table at smoke scale (2 cells, the analysis suite), then the outlier table on the same cells:
    analysis columns, outlier curves while training, the pruning report, W8A8 calibrated on training text. Cells
    trained and evaluated elsewhere make a table here even at a scale that needs a GPU (a cell whose pruning curves
    did not come back is named); a missing evaluation asks for the GPU."""
    settings = {"root": ROOT, "runs_dir": tmp_path / "runs", "args": [f"paths.cache_dir={data_cache}"]}
    markdown = reproduce(load_table("pruning", ROOT), "smoke", results_dir=tmp_path / "pruning", **settings)
    results = tmp_path / "pruning"
    runs = pd.read_csv(results / "runs.csv")
    assert set(runs["attention"]) == {"vanilla", "gated"}
    assert {"perplexity", "max_inf_norm", "w8a8_perplexity", "first_token_share", "pruned50_random_ppl"} <= set(runs)
    assert runs["gate_mean"].notna().tolist() == [False, True]
    curves = pd.read_csv(results / "curves.csv")
    assert set(curves["metric"]) == {"outliers/max_inf_norm", "outliers/kurtosis_mean"}
    assert (curves["value"] > 0).all() and curves.groupby("attention")["step"].nunique().min() >= 2
    pruning = pd.read_csv(results / "pruning_curves.csv")
    assert set(pruning["order"]) == {"importance", "random"} and set(pruning["repeat"]) == {0, 1}
    assert (results / "pruning_curves.png").is_file()
    assert "## Head pruning" in markdown and "## While training" in markdown and "no paper value" in markdown
    record = json.loads(next((tmp_path / "runs").glob("tiny-vanilla-*/eval/analysis_cpu/results.json")).read_text())
    assert record["analysis"]["w8a8"]["calibration"] == "calibration_tokens"
    before = {p: p.stat().st_mtime for p in (tmp_path / "runs").glob("*/eval/analysis_cpu/results.json")}
    outliers = reproduce(load_table("outliers", ROOT), "smoke", results_dir=tmp_path / "outliers", **settings)
    assert {p: p.stat().st_mtime for p in (tmp_path / "runs").glob("*/eval/analysis_cpu/results.json")} == before
    assert "Gated attention" in outliers and "NOT verified" in outliers
    effects = pd.read_csv(tmp_path / "outliers" / "effects.csv")
    # W8A8 perplexity is shown, not judged: the claim is about the gap
    assert set(effects["column"]) == {"fp_ppl", "max_inf_norm", "kurtosis_mean", "w8a8_gap_pct"}
    assert {"p", "p_holm", "verdict_holm"} <= set(effects)
    # the phenomenon check comes first, computed from vanilla's own numbers (derived: the W8A8 gap)
    checks = pd.read_csv(tmp_path / "outliers" / "phenomena.csv")
    assert checks[["phenomenon", "variant"]].values.tolist() == [
        ["outliers", "vanilla"],
        ["massive activations", "vanilla"],
    ]
    vanilla = pd.read_csv(tmp_path / "outliers" / "runs.csv").query("attention == 'vanilla'").iloc[0]
    status = "present" if vanilla["kurtosis_max"] >= 50 and vanilla["w8a8_gap_pct"] >= 2 else "absent"
    massive = "present" if vanilla["max_inf_norm"] >= 100 else "absent"
    assert checks["status"].tolist() == [status, massive]
    line = f"- outliers (pretrain, OPT-125m, vanilla): **{status}**: kurtosis_max {vanilla['kurtosis_max']:.4g}"
    assert line in outliers and outliers.index(line) < outliers.index("## pretrain")
    assert {"sink_share", "val_ppl", "unigram_ppl"} <= set(runs) and runs["unigram_ppl"].gt(1).all()
    monkeypatch.setattr("torch.cuda.is_available", lambda: False)
    gpu_only = load_table("pruning", ROOT)
    gpu_only["scales"]["smoke"]["requires"] = {"gpu": True}  # as if these cells had come back from a GPU machine
    carried = reproduce(gpu_only, "smoke", results_dir=tmp_path / "carried", **settings)
    assert carried == markdown.replace(str(tmp_path / "pruning"), str(tmp_path / "carried"))
    next((tmp_path / "runs").glob("tiny-gated-*/eval/analysis_cpu/analysis/pruning.csv")).unlink()  # not carried
    carried = reproduce(gpu_only, "smoke", results_dir=tmp_path / "carried", **settings)
    note = "No pruning curves for gated seed 1 (their `analysis/pruning.csv` is not here): the curves below leave"
    assert note in carried and "No pruning curves" not in markdown
    next((tmp_path / "runs").glob("tiny-gated-*/eval/analysis_cpu/results.json")).unlink()
    with pytest.raises(ConfigError, match=r"scale: smoke needs GPUs \(torch sees none\)"):
        reproduce(gpu_only, "smoke", results_dir=tmp_path / "carried", **settings)


def smoke(name: str, tmp_path: Path, data_cache: Path) -> pd.DataFrame:
    """``make reproduce-<name> SCALE=smoke`` into ``tmp_path``: its runs.csv."""
    settings = {"root": ROOT, "runs_dir": tmp_path / "runs", "args": [f"paths.cache_dir={data_cache}"]}
    markdown = reproduce(load_table(name, ROOT), "smoke", results_dir=tmp_path / name, **settings)
    assert markdown == (tmp_path / name / f"{name}.md").read_text()
    return pd.read_csv(tmp_path / name / "runs.csv")


@pytest.mark.slow
def test_table6_smoke_fine_tunes_from_the_start_cell(tmp_path: Path, data_cache: Path) -> None:
    runs = smoke("table6", tmp_path, data_cache)
    assert runs[["stage", "attention"]].values.tolist() == [
        ["start", "vanilla"],
        ["finetune", "vanilla"],
        ["finetune", "temp_q_pos"],
    ]
    start = runs.loc[runs["stage"] == "start", "run"].item()
    for overrides in (tmp_path / "runs").glob("*/.hydra/overrides.yaml"):
        if "finetune" in overrides.read_text() or "model.init_from" in overrides.read_text():
            assert f"model.init_from={start}/checkpoints/last.ckpt" in overrides.read_text()
    assert "temp_q_pos (q: pos)" in (tmp_path / "table6" / "table6.md").read_text()


@pytest.mark.slow
@pytest.mark.parametrize("name", ["table5", "table7", "table8", "gating"])
def test_smoke_scale_end_to_end(name: str, tmp_path: Path, data_cache: Path) -> None:
    runs = smoke(name, tmp_path, data_cache)
    assert len(runs) >= 2 and runs.filter(like="perplexity").notna().all().all()
    effects = pd.read_csv(tmp_path / name / "effects.csv")
    assert len(effects) and set(effects["attention"]) <= set(load_table(name, ROOT)["variants"])


@pytest.mark.slow
def test_table3_paper_scale_fine_tunes_the_llama_rows_it_never_pretrains() -> None:
    """The paper's fine-tune block has Llama (7B) and Llama3-8b rows (its pretrain block does not): stage_rows."""
    engine = Engine(load_table("table3", ROOT), "paper", root=ROOT, runs_dir=Path("unused"))
    grid = engine.cells()
    rows = {stage: {c.row for c in grid if c.stage == stage} for stage in ("pretrain", "finetune")}
    assert rows["pretrain"] == {"GPT2", "Pythia-160m", "Pythia-410m"}
    assert rows["finetune"] == rows["pretrain"] | {"Llama (7B)", "Llama3-8b"}
    llama = [c for c in grid if c.row == "Llama3-8b"]
    assert {c.attention for c in llama} == {"vanilla", "ssa", "ssa_shared"} and {c.model for c in llama} == {
        "llama3-8b"
    }
    assert load_table("table3", ROOT)["paper"]["finetune"]["Llama (7B)"]["ssa"][0] == 19.305
    for cell in (c for c in grid if c.stage == "finetune" and c.attention == "vanilla"):
        # the official checkpoints, as the paper fine-tunes (not our pretraining cells)
        assert engine.compose(list(cell.overrides)).model.init_from.startswith("hf:"), cell.overrides
    twice = {**engine.settings, "stage_rows": {"finetune": {"Other": "gpt2"}}}
    table = load_table("table3", ROOT)
    with pytest.raises(ConfigError, match=r"one model per paper row"):
        Engine({**table, "scales": {**table["scales"], "paper": twice}}, "paper", root=ROOT, runs_dir=Path("unused"))


@pytest.mark.usefixtures("registry_corpus")
@pytest.mark.slow
def test_table3_cpu_long_fine_tunes_every_variant_from_the_outliers_tables_vanilla_cells() -> None:
    """cpu_long pretrains only vanilla (``stage_variants``), and those cells are the outliers table's: trained once,
    with its sink monitor and corpus; each fine-tune starts from its seed's cell, on the embedded corpus."""
    engine = Engine(load_table("table3", ROOT), "cpu_long", root=ROOT, runs_dir=Path("/unused"))
    grid = engine.cells()
    pretrain = {c.seed: c.directory.name for c in grid if c.stage == "pretrain"}
    assert {c.attention for c in grid if c.stage == "pretrain"} == {"vanilla"}
    assert {c.attention for c in grid if c.stage == "finetune"} == {"vanilla", "ssa", "ssa_shared"}
    outliers = Engine(load_table("outliers", ROOT), "cpu_long", root=ROOT, runs_dir=Path("/unused")).cells()
    shared = {c.seed: c for c in outliers if c.attention == "vanilla"}
    assert pretrain == {seed: shared[seed].directory.name for seed in (1, 2, 3)}
    # the same overrides, callbacks included: whichever table trains the cell, the other reads the same files
    assert all(set(c.overrides) == set(shared[c.seed].overrides) for c in grid if c.stage == "pretrain")
    for cell in (c for c in grid if c.stage == "finetune"):
        cfg = engine.compose(list(cell.overrides))
        assert Path(cfg.model.init_from).parent.parent.name == pretrain[cell.seed]
        assert cfg.data.name == "wiki_sample" and cfg.trainer.max_steps == 1000
    table = load_table("table3", ROOT)
    bad = {**table["scales"]["cpu_long"], "stage_variants": {"pretrain": ["temp_q"]}}
    with pytest.raises(ConfigError, match=r"table\.scales\.cpu_long\.stage_variants\.pretrain: a stage of"):
        Engine({**table, "scales": {**table["scales"], "cpu_long": bad}}, "cpu_long", root=ROOT, runs_dir=Path("u"))


def test_a_scale_restates_a_stand_in_and_keeps_the_others() -> None:
    table = load_table("table3", ROOT)
    standins = {c["paper"]: c["standin"] for c in column_map(table, "cpu_long")}
    assert "pretrain: registry_text" in standins["wikitext"]
    assert {c["paper"]: c["standin"] for c in column_map(table, "cpu")}["wikitext"].endswith("embedded corpus")
    assert standins["piqa"] is None and column_map(table, "paper")[0]["standin"] is None


def test_fine_tune_cells_keep_their_names_when_the_runs_directory_moves() -> None:
    """A fine-tune cell starts from an earlier cell's checkpoint, an absolute path: its name once held that path, so
    a moved checkout (or a cluster node mounting outputs elsewhere) re-trained every finished fine-tune cell."""
    here, there = cells("table6", runs_dir=Path("/a/outputs/runs")), cells("table6", runs_dir=Path("/b/runs"))
    assert here == there
    assert any(stage == "finetune" for stage, _, _ in here)


@pytest.mark.slow
def test_a_fine_tune_cell_is_named_by_its_start() -> None:
    """Two starts that differ (another seed's start cell, or a user's own file) give two names."""
    engine = Engine(load_table("table6", ROOT), "smoke", root=ROOT, runs_dir=Path("/unused"))
    overrides = [o for o in engine.cells()[-1].overrides if not o.startswith("model.init_from=")]
    starts = ["/x/runs/cell-a/checkpoints/last.ckpt", "/y/runs/cell-b/checkpoints/last.ckpt", "/x/my.ckpt"]
    names = {start: cell_name(engine.compose([*overrides, f"model.init_from={start}"])) for start in starts}
    names[None] = engine.cells()[-1].directory.name
    assert len(set(names.values())) == 4
    assert (
        cell_name(engine.compose([*overrides, "model.init_from=/z/cell-a/checkpoints/last.ckpt"]))
        == names["/x/runs/cell-a/checkpoints/last.ckpt"]
    )


@pytest.mark.slow
@pytest.mark.parametrize(("name", "scale"), [("table3", "cpu"), ("variants", "cpu_long")])
@pytest.mark.usefixtures("registry_corpus")
def test_seeds_sharing_a_composition_are_the_cells_each_would_compose_alone(name: str, scale: str) -> None:
    """A variant's seeds share one composition (seed and fine-tune start set in place): every cell's name, identity,
    data cache and W&B project are those its own overrides compose to, fine-tune starts (table3 at cpu) and extra
    seeds (variants at cpu_long) included."""
    engine = Engine(load_table(name, ROOT), scale, root=ROOT, runs_dir=Path("/unused"))
    cells = engine.cells()
    assert len({cell.seed for cell in cells}) >= 3 and len({cell.directory for cell in cells}) == len(cells)
    for cell in cells:
        alone = engine.compose(list(cell.overrides))
        assert (cell.directory.name, cell.identity) == (cell_name(alone), identity(alone))
        wandb = (alone.get("logger") or {}).get("wandb")
        assert (cell.cache_dir, cell.wandb_project) == (str(alone.paths.cache_dir), wandb.project if wandb else None)


@pytest.mark.slow
def test_a_long_table_says_which_cells_it_trains_and_the_time_left(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Each sweep's line names its cells among all the table trains now and, after the first, the time left."""
    import logging

    import attnlab.tables.engine as engine_module

    engine = Engine(load_table("table3", ROOT), "cpu", root=ROOT, runs_dir=tmp_path)
    cells = engine.cells()
    (cells[0].directory).mkdir(parents=True)
    (cells[0].directory / "results.json").write_text("{}")  # finished before: not counted

    def train_sweep(command: list[str], _cwd: Path) -> None:
        """What the sweep leaves: each of its cells finished."""
        attentions = next(o for o in command if o.startswith("attention=")).split("=", 1)[1].split(",")
        seeds = next(o for o in command if o.startswith("seed=")).split("=", 1)[1].split(",")
        fixed = {o for o in command if "=" in o}
        for cell in cells:
            same = {o for o in cell.overrides if not o.startswith(("attention=", "seed="))} <= fixed
            if same and cell.attention in attentions and str(cell.seed) in seeds and not cell.finished:
                cell.directory.mkdir(parents=True, exist_ok=True)
                (cell.directory / "results.json").write_text("{}")

    monkeypatch.setattr(engine_module, "run_sweep", train_sweep)
    with caplog.at_level(logging.INFO, logger="attnlab.tables.engine"):
        engine.train(cells)
    lines = [r.getMessage() for r in caplog.records if r.name == "attnlab.tables.engine"]
    total = len(cells) - 1
    assert lines[0] == f"{total} of {len(cells)} cells to train (1 finished before)"
    sweeps = [line for line in lines[1:] if " cell(s) (" in line]
    assert len(sweeps) >= 2 and re.search(rf"\(cells? 1(-\d+)? of {total}\)", sweeps[0])
    assert all(re.search(rf"of {total}, about \d+ (h \d+ )?min left\)", line) for line in sweeps[1:])
