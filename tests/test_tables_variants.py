"""The table of every attention variant against vanilla: ``make reproduce-variants SCALE=smoke`` end to
end (3 cells: vanilla, softpick with its papers' claims, stick-breaking with its own position setting), its
render from the committed CSVs, and the engine pieces it added (per-variant overrides, the costs report's
settings, re-evaluating cached evaluations that predate a headline)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pandas as pd
import pytest
from omegaconf import OmegaConf

from attnlab.errors import ConfigError
from attnlab.tables import load_table, render, reproduce
from attnlab.tables.collect import NO_PAPER_VALUE
from attnlab.tables.engine import Engine, predates_headlines
from attnlab.tables.figures import TableResults
from attnlab.tables.reports import costs_section
from attnlab.tables.sizes import config_parameters, model_parts
from attnlab.tables.stats import OPPOSITE, REPRODUCES, UNRESOLVED
from tests.test_plots import colliding_text

ROOT = Path(__file__).resolve().parents[1]
COLUMNS = ["perplexity", "sink_share", "kurtosis_max", "max_inf_norm", "w8a8_gap_pct", "attention_entropy"]
SMOKE_BLOCK, SMOKE_WIDTH = 32, 32  # the protocol's smoke model: learned positions are block x width parameters


def variants_table() -> dict:
    return load_table("variants", ROOT)


@pytest.fixture(scope="module")
def smoke(tmp_path_factory: pytest.TempPathFactory, data_cache: Path) -> dict:
    """``make reproduce-variants SCALE=smoke`` into a temporary directory."""
    tmp = tmp_path_factory.mktemp("variants")
    settings = {"root": ROOT, "runs_dir": tmp / "runs", "args": [f"paths.cache_dir={data_cache}"]}
    markdown = reproduce(variants_table(), "smoke", results_dir=tmp / "results", **settings)
    return {"markdown": markdown, "results": tmp / "results", "settings": settings}


def test_make_reproduce_variants_runs_this_table() -> None:
    dry = subprocess.run(["make", "-n", "reproduce-variants", "SCALE=smoke"], cwd=ROOT, capture_output=True, text=True)
    assert "experiments/reproduce_table.py scale=smoke" in dry.stdout and "table=variants" in dry.stdout


@pytest.mark.slow
def test_smoke_table_end_to_end(smoke: dict) -> None:
    """Every column, the phenomenon lines, softpick's claims judged, the costs section and effects.png."""
    results, markdown = smoke["results"], smoke["markdown"]
    assert markdown == (results / "variants.md").read_text()
    runs = pd.read_csv(results / "runs.csv")
    assert runs["attention"].tolist() == ["vanilla", "softpick", "stickbreaking"]
    assert runs[COLUMNS].notna().all().all() and runs["attention_entropy"].gt(0).all()
    effects = pd.read_csv(results / "effects.csv")
    assert len(effects) == 2 * len(COLUMNS) and set(effects["column"]) == set(COLUMNS)
    judged = effects[effects["verdict"] != NO_PAPER_VALUE]
    softpick_claims = ["sink_share", "kurtosis_max", "max_inf_norm", "w8a8_gap_pct"]  # the smoke scale's columns
    assert judged[["attention", "column"]].values.tolist() == [["softpick", column] for column in softpick_claims]
    assert set(judged["verdict_holm"]) <= {REPRODUCES, OPPOSITE, UNRESOLVED} and judged["p_holm"].notna().all()
    assert markdown.index("- outliers (pretrain, from scratch, vanilla): **") < markdown.index("## pretrain")
    assert "- attention sink (pretrain, from scratch, vanilla): **" in markdown
    assert "Zuhri et al. 2025" in markdown and "not run at this scale" in markdown  # the others' claims: listed
    assert "## What each variant costs beside vanilla" in markdown
    costs = pd.read_csv(results / "costs.csv").set_index("attention")
    assert costs.loc["vanilla", "step_ratio"] == 1.0 and costs["step_ratio"].gt(0).all()
    # stick-breaking drops the learned positions (its own override); softpick adds nothing
    assert costs.loc["stickbreaking", "parameters_added"] == -SMOKE_BLOCK * SMOKE_WIDTH
    assert costs.loc["softpick", "parameters_added"] == 0
    assert (results / "effects.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.slow
def test_stickbreaking_cells_take_their_own_overrides_in_a_sweep_of_their_own(smoke: dict) -> None:
    settings = smoke["settings"]
    engine = Engine(variants_table(), "smoke", root=ROOT, runs_dir=settings["runs_dir"], args=settings["args"])
    cells = {cell.attention: cell for cell in engine.cells()}
    composed = {name: engine.compose(list(cell.overrides)).model.pos_encoding for name, cell in cells.items()}
    assert composed == {"vanilla": "learned", "softpick": "learned", "stickbreaking": "none"}
    groups = engine.launch_groups(list(cells.values()))
    assert [[c.attention for c in group] for group in groups] == [["vanilla", "softpick"], ["stickbreaking"]]
    commands = [engine.sweep_command(group) for group in groups]
    assert "model.pos_encoding=none" not in commands[0] and "model.pos_encoding=none" in commands[1]
    recorded = OmegaConf.load(cells["stickbreaking"].directory / ".hydra" / "config.yaml")
    assert recorded.model.pos_encoding == "none"


@pytest.mark.slow
def test_the_table_renders_again_from_its_csvs(smoke: dict, tmp_path: Path) -> None:
    """``make reproduce-variants RENDER=1``: the Markdown (costs from costs.csv, not timed again) and effects.png."""
    shutil.copytree(smoke["results"], tmp_path, dirs_exist_ok=True)
    (tmp_path / "effects.png").unlink()
    markdown = render(variants_table(), "smoke", results_dir=tmp_path, root=ROOT)
    assert markdown == smoke["markdown"] and (tmp_path / "effects.png").is_file()
    engine = Engine(variants_table(), "smoke", root=ROOT, runs_dir=Path("/unused"))
    figure = TableResults(variants_table(), "smoke", tmp_path, engine.row_sizes()).effects_figure()
    titles = [ax.get_title() for ax in figure.axes if ax.get_visible()]
    assert titles == [*COLUMNS, "parameters added", "step time"] and colliding_text(figure) == []
    assert "table variants, smoke scale" in figure.get_suptitle() and "our tiny, 30,176 params" in figure.get_suptitle()
    (tmp_path / "costs.csv").unlink()
    with pytest.raises(ConfigError, match=r"render_only: .*no committed costs\.csv"):
        render(variants_table(), "smoke", results_dir=tmp_path, root=ROOT)


@pytest.mark.slow
def test_a_partial_table_holds_the_cells_trained_so_far_and_says_what_it_lacks(smoke: dict, tmp_path: Path) -> None:
    """``PARTIAL=1`` while a long table trains: no training, the finished cells' numbers, the missing cells named;
    its render from the committed CSVs says the same; nothing trained is a one-line error."""
    table = variants_table()
    table["scales"]["smoke"]["variants"] = ["vanilla", "softpick", "softmax1", "stickbreaking"]
    settings = smoke["settings"]
    engine = Engine(table, "smoke", root=ROOT, runs_dir=settings["runs_dir"], args=settings["args"])
    softmax1 = next(cell for cell in engine.cells() if cell.attention == "softmax1")
    markdown = reproduce(table, "smoke", results_dir=tmp_path, partial=True, **settings)
    assert not softmax1.directory.exists()  # nothing trained
    status = "**Partial: 3 of 4 cells** (written with `partial=true` while the others train; the reports wait for"
    assert markdown.startswith(f"# {table['title']} (smoke scale)\n\n{status}")
    assert "Not yet in it: softmax1 (pretrain, from scratch) seed 1." in markdown
    assert "## What each variant costs" not in markdown and not (tmp_path / "costs.csv").exists()
    assert pd.read_csv(tmp_path / "runs.csv")["attention"].tolist() == ["vanilla", "softpick", "stickbreaking"]
    complete = pd.read_csv(smoke["results"] / "effects.csv")  # the same cells' effects as in the whole table
    pd.testing.assert_frame_equal(pd.read_csv(tmp_path / "effects.csv"), complete)
    assert render(table, "smoke", results_dir=tmp_path, root=ROOT) == markdown
    empty = settings | {"runs_dir": tmp_path / "no-runs"}
    with pytest.raises(ConfigError, match=r"^partial: no cell of this table has finished training yet"):
        reproduce(table, "smoke", results_dir=tmp_path / "none", partial=True, **empty)


@pytest.mark.slow
def test_every_variant_builds_at_cpu_scale() -> None:
    """Each cpu cell's model is built (diff's even heads, fox's and stick-breaking's position encodings), so no
    variant stops the hours-long run halfway; the four shared with the outliers and gating tables are their cells."""
    table = variants_table()
    table["scales"]["cpu"]["seeds"] = [1]
    engine = Engine(table, "cpu", root=ROOT, runs_dir=Path("/unused"))
    cells = engine.cells()
    assert [c.attention for c in cells] == table["variants"] and len(cells) == 16
    for cell in cells:
        assert config_parameters(*model_parts(engine.compose(list(cell.overrides)))) > 0, cell
    outliers = Engine(
        load_table("outliers", ROOT) | {"scales": table["scales"]}, "cpu", root=ROOT, runs_dir=Path("/unused")
    )
    assert {c.directory for c in outliers.cells()} <= {c.directory for c in cells}


def test_the_costs_section_says_how_it_was_timed_and_reads_as_ratios() -> None:
    place = {"stage": "pretrain", "row": "from scratch", "rounds": 10, "device": "cpu", "threads": 2}
    costs = pd.DataFrame(
        [
            place
            | {"attention": "vanilla", "parameters": 30_176, "parameters_added": 0, "parameters_added_pct": 0.0}
            | {"step_ms": 100.0, "step_ratio": 1.0, "step_ratio_q1": 0.98, "step_ratio_q3": 1.03}
            | {"measured": "2026-11-26"},
            place
            | {"attention": "fox", "parameters": 30_242, "parameters_added": 66, "parameters_added_pct": 0.2187}
            | {"step_ms": 150.0, "step_ratio": 1.5, "step_ratio_q1": 1.45, "step_ratio_q3": 1.6}
            | {"measured": "2026-11-26"},
        ]
    )
    section = costs_section(costs, {"baseline": "vanilla", "paper_variant_names": {"fox": "FoX"}})
    assert section.startswith("## What each variant costs beside vanilla")
    assert "over 10 rounds" in section and "on cpu with 2 threads, 2026-11-26" in section
    (fox,) = [line for line in section.splitlines() if "fox (FoX)" in line]
    assert [c.strip() for c in fox.split("|")][4:8] == ["30242", "+66 (+0.22%)", "150.0", "1.50 [1.45, 1.60]"]


@pytest.mark.parametrize(
    ("change", "key"),
    [
        ({"variant_overrides": {"stick": ["model.pos_encoding=none"]}}, r"table\.variant_overrides\.stick"),
        (
            {"variant_overrides": {"stickbreaking": "model.pos_encoding=none"}},
            r"table\.variant_overrides\.stickbreaking",
        ),
    ],
)
def test_a_bad_variant_override_is_one_line_naming_the_key(change: dict, key: str) -> None:
    with pytest.raises(ConfigError, match=rf"^{key}: a list of train.py overrides for one of vanilla, "):
        Engine(variants_table() | change, "smoke", root=ROOT, runs_dir=Path("/unused"))


@pytest.mark.parametrize("rounds", [0, 2.5])
def test_bad_cost_rounds_stop_the_table_before_any_training(rounds: float) -> None:
    table = variants_table()
    table["scales"]["smoke"]["costs"] = {"rounds": rounds}
    with pytest.raises(
        ConfigError, match=rf"^table\.scales\.smoke\.costs\.rounds: a whole number >= 1 \(got {rounds}\)"
    ):
        Engine(table, "smoke", root=ROOT, runs_dir=Path("/unused"))


def test_a_cached_evaluation_from_before_a_headline_existed_is_evaluated_again() -> None:
    """The outliers and gating tables' cells were evaluated before the sinks metric had the attention entropy."""
    today = {"first_token_share": 0.1, "sink_share": 0.1, "max_activation": 1.0}
    today |= {"attention_entropy": 2.0, "attention_entropy_normalized": 0.9}
    assert not predates_headlines({"analysis": {"summary": today, "sinks": {}}})
    before = {k: v for k, v in today.items() if not k.startswith("attention_entropy")}
    assert predates_headlines({"analysis": {"summary": before, "sinks": {}}})
    assert not predates_headlines({"analysis": {"summary": before}})  # the sinks metric did not run: nothing missing
    assert not predates_headlines({"summary": {"heldout_word_ppl": 30.0}})  # a suite without analysis


@pytest.mark.slow
def test_options_added_since_keep_the_committed_cells_names() -> None:
    """Options added after the cpu table ran (fox's Pro block, stick-breaking's attend_current, the gates' reference
    options) name no new cell at the value that runs the old rule, so its records stay a cache of those cells; diff's
    default changed rule (the affine norm) named new cells, the ones committed since they were re-run (2026-11-28),
    and subln_affine=false finds the first release's cells as they were recorded before."""
    from attnlab.cells import cell_name

    engine = Engine(variants_table(), "cpu", root=ROOT, runs_dir=ROOT / "outputs" / "runs")
    runs = pd.read_csv(ROOT / "experiments/results/variants/cpu/runs.csv")
    recorded = {row.attention: Path(row.run).name for row in runs.itertuples() if row.seed == 1}

    def name(attention: str, *extra: str) -> str:
        overrides = [*engine.stage_overrides("pretrain", "tiny"), "model=tiny", f"attention={attention}"]
        return cell_name(engine.compose([*overrides, *engine.variant_overrides(attention), *extra, "seed=1"]))

    for attention in ("vanilla", "fox", "gated", "gated_sdpa", "stickbreaking", "ssa"):
        assert name(attention) == recorded[attention], attention
    assert name("diff") == recorded["diff"]
    assert name("diff", "attention.subln_affine=false") == "tiny-diff-s1-6ad3bfef1f"  # the first release's cell


@pytest.mark.slow
def test_a_scales_train_order_comes_first_and_a_half_trained_table_runs_in_few_sweeps(tmp_path: Path) -> None:
    """``train_order``: its variants' cells lead the first sweep, each variant's seeds in turn; once some cells are
    trained, a sweep is cut only where the next variant lacks other seeds (every sweep stays a Hydra product)."""
    table = variants_table()
    smoke = table["scales"]["smoke"]
    smoke.update(variants=["vanilla", "softpick", "diff", "stickbreaking"], seeds=[1, 2, 3], train_order=["diff"])
    engine = Engine(table, "smoke", root=ROOT, runs_dir=tmp_path)
    cells = engine.cells()
    sweeps = engine.launch_groups(cells)
    assert [(c.attention, c.seed) for c in sweeps[0][:4]] == [("diff", 1), ("diff", 2), ("diff", 3), ("vanilla", 1)]
    assert "attention=diff,vanilla,softpick" in engine.sweep_command(sweeps[0])

    def shapes(sweeps: list) -> list[tuple[list[str], list[int]]]:
        return [(list(dict.fromkeys(c.attention for c in s)), list(dict.fromkeys(c.seed for c in s))) for s in sweeps]

    assert shapes(sweeps) == [(["diff", "vanilla", "softpick"], [1, 2, 3]), (["stickbreaking"], [1, 2, 3])]
    trained = {("diff", 1), ("vanilla", 1), ("vanilla", 2)}
    pending = [c for c in cells if (c.attention, c.seed) not in trained]
    sweeps = engine.launch_groups(pending)
    assert shapes(sweeps) == [
        (["diff"], [2, 3]),
        (["vanilla"], [3]),
        (["softpick"], [1, 2, 3]),
        (["stickbreaking"], [1, 2, 3]),
    ]
    smoke["train_order"] = ["softpick", "diff"]
    trained = {("softpick", 1), ("diff", 1)}
    sweeps = Engine(table, "smoke", root=ROOT, runs_dir=tmp_path).launch_groups(
        [c for c in cells if (c.attention, c.seed) not in trained]
    )
    assert shapes(sweeps)[:2] == [(["softpick", "diff"], [2, 3]), (["vanilla"], [1, 2, 3])]
    for sweep, (attentions, seeds) in zip(sweeps, shapes(sweeps), strict=True):
        assert len(sweep) == len(attentions) * len(seeds)  # a product: one Hydra sweep runs exactly these cells

    smoke["train_order"] = ["softpick", "nope"]
    with pytest.raises(ConfigError, match=r"table\.scales\.smoke\.train_order: a list of distinct variants among"):
        Engine(table, "smoke", root=ROOT, runs_dir=tmp_path)


@pytest.mark.slow
def test_extra_seeds_pair_with_the_baselines_and_train_after_every_scale_seed(tmp_path: Path) -> None:
    """``extra_seeds``: more seeds for the variants whose claims 3 leave unresolved; the baseline trains each of
    them (the pair), no other variant does, and they train after every variant's scale seeds."""
    table = variants_table()
    smoke = table["scales"]["smoke"]
    smoke.update(seeds=[1, 2], extra_seeds={"softpick": [3, 4], "stickbreaking": [4]}, train_order=["softpick"])
    engine = Engine(table, "smoke", root=ROOT, runs_dir=tmp_path)
    assert engine.seeds("vanilla") == [1, 2, 3, 4] and engine.seeds("softpick") == [1, 2, 3, 4]
    assert engine.seeds("stickbreaking") == [1, 2, 4]
    cells = engine.cells()
    assert [(c.attention, c.seed) for c in cells] == [
        *[("vanilla", s) for s in (1, 2, 3, 4)],
        *[("softpick", s) for s in (1, 2, 3, 4)],
        *[("stickbreaking", s) for s in (1, 2, 4)],
    ]
    cell_keys = engine.keys()  # what a partial table lists as missing: the same cells
    assert [key[2:] for key in cell_keys] == [(c.attention, c.seed) for c in cells]
    assert len({c.directory for c in cells}) == len(cells)
    sweeps = [[(c.attention, c.seed) for c in sweep] for sweep in engine.launch_groups(cells)]
    assert sweeps == [
        [("softpick", 1), ("softpick", 2), ("vanilla", 1), ("vanilla", 2)],
        [("stickbreaking", 1), ("stickbreaking", 2)],
        [("softpick", 3), ("softpick", 4), ("vanilla", 3), ("vanilla", 4)],
        [("stickbreaking", 4)],
    ]
    for bad in ({"softpick": [2]}, {"nope": [5]}, {"softpick": 5}):
        smoke["extra_seeds"] = bad
        with pytest.raises(ConfigError, match=r"table\.scales\.smoke\.extra_seeds\.\w+: a variant of the table with"):
            Engine(table, "smoke", root=ROOT, runs_dir=tmp_path)
