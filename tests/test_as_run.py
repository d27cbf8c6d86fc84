"""Every committed number traceable to its cell's config: committed tables follow from their records byte for byte,
committed cells keep their names under today's configs, and the as-run lines (``cells.jsonl``) that let a table
reuse or retrain a committed cell knowingly."""

from __future__ import annotations

import contextlib
import io
import json
import shutil
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
import pytest

from attnlab.tables import load_table, render
from attnlab.tables.as_run import as_run, committed_cells, read_cells, shared_cells, stale, write_cells
from attnlab.tables.engine import Engine
from tests.conftest import ROOT

RESULTS = ROOT / "experiments" / "results"
COMMITTED = sorted(
    (runs.parent.parent.name, runs.parent.name)
    for runs in RESULTS.glob("*/*/runs.csv")
    if (ROOT / "experiments" / "conf" / "table" / f"{runs.parent.parent.name}.yaml").is_file()
)


@pytest.fixture(scope="module")
def results_copy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The committed results, copied once: rendering writes into the copy (siblings are read from it too)."""
    copy = tmp_path_factory.mktemp("results") / "results"
    shutil.copytree(RESULTS, copy)
    return copy


@pytest.mark.parametrize(("name", "scale"), COMMITTED, ids=[f"{n}-{s}" for n, s in COMMITTED])
@pytest.mark.slow
def test_a_committed_table_renders_from_its_records_byte_for_byte(name: str, scale: str, results_copy: Path) -> None:
    """``RENDER=1``: the Markdown and every CSV follow from the committed records alone (no training, no cells)."""
    out = results_copy / name / scale
    with contextlib.redirect_stdout(io.StringIO()):
        render(load_table(name, ROOT), scale, results_dir=out, root=ROOT, family=False)
    committed = [path for path in sorted((RESULTS / name / scale).iterdir()) if path.suffix in (".md", ".csv")]
    assert committed
    for path in committed:
        assert (out / path.name).read_bytes() == path.read_bytes(), f"{name}/{scale}/{path.name} no longer follows"


@pytest.mark.slow
def test_committed_cells_keep_their_names_under_todays_config(monkeypatch: pytest.MonkeyPatch) -> None:
    """Table 3 at cpu_long (a pretraining and the fine-tunes that start from it; its protocol has not changed since it
    ran): today's configs name every committed cell as it was named, so its records stay a cache of those cells.
    An option added to an identity group without its old value in ``cells.ADDED_SINCE`` fails here. The corpus is
    the one the cells recorded (a fresh clone has none; Debian's packages move with stable's point releases)."""
    import attnlab.data.registry

    lines = (RESULTS / "table3" / "cpu_long" / "cells.jsonl").read_text().splitlines()
    recorded = {json.loads(line)["identity"]["data"].get("corpus_sha256") for line in lines}
    (fingerprint,) = recorded - {None}  # the pretraining's; the fine-tunes read the embedded corpus
    monkeypatch.setattr(attnlab.data.registry, "corpus_fingerprint", lambda cache_dir: fingerprint)
    engine = Engine(load_table("table3", ROOT), "cpu_long", root=ROOT, runs_dir=ROOT / "outputs" / "runs")
    today = {(c.stage, c.row, c.attention, c.seed): c.directory.name for c in engine.cells()}
    runs = pd.read_csv(RESULTS / "table3" / "cpu_long" / "runs.csv")
    recorded = {(r.stage, r.row, r.attention, int(r.seed)): Path(r.run).name for r in runs.itertuples()}
    assert len(recorded) == 12 and recorded == {key: today[key] for key in recorded}


def test_a_name_does_not_depend_on_key_order_or_an_added_option_at_its_old_value() -> None:
    from omegaconf import OmegaConf

    from attnlab.cells import ADDED_SINCE, cell_name

    base = {"model": {"name": "tiny", "n_layer": 2}, "attention": {"name": "vanilla", "heads": 4}, "seed": 1}
    reordered = {"seed": 1, "attention": {"heads": 4, "name": "vanilla"}, "model": {"n_layer": 2, "name": "tiny"}}
    assert cell_name(OmegaConf.create(base)) == cell_name(OmegaConf.create(reordered))
    added = {**base, "attention": {**base["attention"], "qk_norm": ADDED_SINCE["attention.qk_norm"]}}
    assert cell_name(OmegaConf.create(added)) == cell_name(OmegaConf.create(base))
    changed = {**base, "attention": {**base["attention"], "qk_norm": True}}
    assert cell_name(OmegaConf.create(changed)) != cell_name(OmegaConf.create(base))


@dataclass
class FakeCell:
    stage: str
    row: str
    attention: str
    seed: int
    directory: Path
    identity: dict = field(default_factory=dict)
    finished: bool = False


def test_a_committed_cell_with_todays_identity_is_reused_and_a_changed_one_is_named_stale(tmp_path: Path) -> None:
    key = {"stage": "pretrain", "row": "R", "attention": "vanilla"}
    identity = {"model": {"name": "tiny", "n_layer": 2}, "seed": 1}
    results = {"commit": "abc+dirty", "torch": "2.13.0", "device": "cpu x1", "corpus_sha256": "f00", "steps": 60}
    lines = [
        as_run("tiny-vanilla-s1-aaaa", key | {"seed": 1}, ["model=tiny", "seed=1"], identity, results),
        as_run("tiny-vanilla-s2-bbbb", key | {"seed": 2}, ["seed=2"], identity | {"seed": 2}, {}),
    ]
    assert lines[0]["ran_with"]["commit"] == "abc+dirty" and lines[0]["trained"]["corpus_sha256"] == "f00"
    assert lines[1]["ran_with"]["commit"] is None  # a results.json from before the key: null, not guessed
    write_cells(lines, tmp_path)
    text = (tmp_path / "cells.jsonl").read_text()
    write_cells(lines, tmp_path)
    assert (tmp_path / "cells.jsonl").read_text() == text and read_cells(tmp_path)["tiny-vanilla-s1-aaaa"] == lines[0]
    runs = [{**key, "seed": s, "run": f"outputs/runs/{n}", "ppl": 9.0} for s, n in ((1, "tiny-vanilla-s1-aaaa"),)]
    runs.append({**key, "seed": 2, "run": "outputs/runs/tiny-vanilla-s2-bbbb", "ppl": 8.0})
    runs.append({**key, "seed": 3, "run": "outputs/runs/tiny-vanilla-s3-cccc", "ppl": 7.0})  # no as-run line
    runs.append({**key, "seed": 4, "run": "outputs/runs/tiny-vanilla-s4-ffff", "ppl": 6.0})  # no line, same name
    pd.DataFrame(runs).to_csv(tmp_path / "runs.csv", index=False)
    cells = [
        FakeCell("pretrain", "R", "vanilla", 1, tmp_path / "tiny-vanilla-s1-aaaa", identity),
        FakeCell("pretrain", "R", "vanilla", 2, tmp_path / "tiny-vanilla-s2-dddd", {**identity, "seed": 2, "x": 1}),
        FakeCell("pretrain", "R", "vanilla", 3, tmp_path / "tiny-vanilla-s3-eeee", {**identity, "seed": 3}),
        FakeCell("pretrain", "R", "vanilla", 4, tmp_path / "tiny-vanilla-s4-ffff", {**identity, "seed": 4}),
    ]
    reused, changed = committed_cells(cells, tmp_path)
    assert list(reused) == ["tiny-vanilla-s1-aaaa"] and reused["tiny-vanilla-s1-aaaa"]["ppl"] == 9.0
    assert list(changed.values()) == [
        "tiny-vanilla-s2-bbbb is now tiny-vanilla-s2-dddd (changed: x)",
        "tiny-vanilla-s3-cccc is now tiny-vanilla-s3-eeee (recorded before its as-run config was committed)",
        "tiny-vanilla-s4-ffff (recorded before its as-run config was committed)",
    ]
    assert list(changed) == ["tiny-vanilla-s2-dddd", "tiny-vanilla-s3-eeee", "tiny-vanilla-s4-ffff"]  # today's names
    assert stale({"a": {"b": 1}}, {"a": {"b": 2}, "c": 3}) == ["a.b", "c"] and stale(identity, identity) == []


def test_a_cell_another_table_committed_at_the_scale_is_shared_under_this_tables_row(tmp_path: Path) -> None:
    """The same cell (name and as-run identity) evaluated the same way is one cell, whichever table committed it: it is
    taken with this table's stage and row, never trained twice; a changed identity, another evaluation, a cell
    finished here or this table's own records are not taken from elsewhere."""
    identity = {"model": {"name": "tiny"}, "seed": 1}
    other = tmp_path / "outliers" / "cpu_long"
    other.mkdir(parents=True)
    names = ["tiny-vanilla-s1-aaaa", "tiny-vanilla-s2-bbbb", "tiny-vanilla-s3-cccc"]
    key = {"stage": "pretrain", "row": "OPT-125m", "attention": "vanilla"}
    records = [key | {"seed": seed, "run": f"outputs/runs/{n}", "ppl": 9.0 + seed} for seed, n in enumerate(names, 1)]
    pd.DataFrame(records).to_csv(other / "runs.csv", index=False)
    write_cells(
        [
            as_run(Path(r["run"]).name, key | {"seed": r["seed"]}, [], identity | {"seed": r["seed"]}, {})
            for r in records
        ],
        other,
    )
    (tmp_path / "pruning" / "cpu_long").mkdir(parents=True)  # evaluated otherwise: never read
    shutil.copy(other / "runs.csv", tmp_path / "pruning" / "cpu_long" / "runs.csv")
    mine = tmp_path / "variants" / "cpu_long"
    cells = [
        FakeCell("pretrain", "from scratch", "vanilla", 1, tmp_path / names[0], identity),
        FakeCell("pretrain", "from scratch", "vanilla", 2, tmp_path / names[1], {**identity, "seed": 2, "x": 1}),
        FakeCell("pretrain", "from scratch", "vanilla", 3, tmp_path / names[2], {**identity, "seed": 3}, finished=True),
    ]
    asked: list[str] = []

    def same_evaluation(table: str) -> bool:
        asked.append(table)
        return table == "outliers"

    shared = shared_cells(cells, mine, same_evaluation)
    assert list(shared) == [names[0]] and asked == ["outliers", "pruning"]
    taken = shared[names[0]]
    assert taken.record == records[0] | {"row": "from scratch"} and taken.line["row"] == "from scratch"
    assert taken.source == other and taken.source_key == ("pretrain", "OPT-125m", "vanilla", 1)
    assert shared_cells(cells, other, lambda table: True) == {}  # a table's own records are committed_cells'


@pytest.mark.usefixtures("registry_corpus")
@pytest.mark.slow
def test_a_partial_table_that_reads_run_directories_refuses_to_drop_committed_cells(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The pruning table at cpu_long reads its cells' run directories. On a machine that holds only one committed
    cell's, a partial table would hold that cell alone and drop the other committed ones: it refuses in one line
    naming ``partial`` and those cells (not the one it has) before evaluating anything, and the committed files stay
    as they were."""
    import attnlab.data.registry
    from attnlab.errors import ConfigError
    from attnlab.tables import reproduce

    lines = (RESULTS / "pruning" / "cpu_long" / "cells.jsonl").read_text().splitlines()
    (fingerprint,) = {json.loads(line)["identity"]["data"]["corpus_sha256"] for line in lines}
    monkeypatch.setattr(attnlab.data.registry, "corpus_fingerprint", lambda cache_dir: fingerprint)
    results = tmp_path / "results" / "pruning" / "cpu_long"
    shutil.copytree(RESULTS / "pruning" / "cpu_long", results)
    before = {path.name: path.read_bytes() for path in results.iterdir()}
    runs = tmp_path / "runs"
    here, *elsewhere = [json.loads(line)["name"] for line in lines]
    assert elsewhere  # the committed table has more than the one cell this machine holds
    (runs / here).mkdir(parents=True)
    (runs / here / "results.json").write_text("{}")  # finished here: the partial table would hold it alone
    monkeypatch.setattr("attnlab.tables.engine.evaluate_cell", lambda *a, **k: pytest.fail("evaluated a cell"))
    with pytest.raises(ConfigError) as refused:
        reproduce("pruning", "cpu_long", root=ROOT, runs_dir=runs, results_dir=results, partial=True)
    message = str(refused.value)
    assert refused.value.key == "partial" and f"{len(elsewhere)} committed cell(s) have no finished one" in message
    assert all(name in message for name in elsewhere) and here not in message
    assert {path.name: path.read_bytes() for path in results.iterdir()} == before


@pytest.mark.usefixtures("registry_corpus")
@pytest.mark.slow
def test_a_partial_table_takes_another_tables_committed_cells_without_training(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The variants table at cpu_long on a machine with no run directories: the cells the outliers table committed
    under its row OPT-125m that are also the variants table's (vanilla's, and gated's seeds 1-3 as they finish) make
    its partial table (with their as-run lines and curves) and nothing trains. The corpus fingerprint is the one
    those cells recorded."""
    import attnlab.data.registry
    from attnlab.tables import reproduce

    lines = (RESULTS / "outliers" / "cpu_long" / "cells.jsonl").read_text().splitlines()
    (fingerprint,) = {json.loads(line)["identity"]["data"]["corpus_sha256"] for line in lines}
    monkeypatch.setattr(attnlab.data.registry, "corpus_fingerprint", lambda cache_dir: fingerprint)
    results = tmp_path / "results"
    shutil.copytree(RESULTS / "outliers" / "cpu_long", results / "outliers" / "cpu_long")
    monkeypatch.setattr("attnlab.tables.engine.run_sweep", lambda *a: pytest.fail("trained a shared cell"))
    markdown = reproduce(
        "variants",
        "cpu_long",
        root=ROOT,
        runs_dir=tmp_path / "runs",
        results_dir=results / "variants" / "cpu_long",
        partial=True,
    )
    grid = Engine(load_table("variants", ROOT), "cpu_long", root=ROOT, runs_dir=tmp_path / "runs").cells()
    assert len(grid) == 40  # 10 variants x 3 seeds, and seeds 4-5 of G1, softpick, gated, softmax1 and vanilla
    names = {cell.directory.name for cell in grid}
    committed = pd.read_csv(RESULTS / "outliers" / "cpu_long" / "runs.csv")
    committed = committed[[Path(run).name in names for run in committed["run"]]]
    assert (committed["attention"] == "vanilla").sum() >= 3
    assert f"**Partial: {len(committed)} of {len(grid)} cells**" in markdown
    runs = pd.read_csv(results / "variants" / "cpu_long" / "runs.csv")
    assert runs["row"].unique().tolist() == ["from scratch"]
    assert runs["perplexity"].tolist() == committed["perplexity"].tolist()
    shared = [cell for cell in map(json.loads, lines) if cell["name"] in names]
    assert [line["digest"] for line in shared] == [
        line["digest"] for line in read_cells(results / "variants" / "cpu_long").values()
    ]
    curves = pd.read_csv(results / "variants" / "cpu_long" / "curves.csv")
    paired = (committed["attention"] != "vanilla").any()  # effects.png draws a variant paired with vanilla
    assert (results / "variants" / "cpu_long" / "effects.png").exists() == paired
    theirs = pd.read_csv(RESULTS / "outliers" / "cpu_long" / "curves.csv")
    theirs = theirs.merge(committed[["attention", "seed"]], on=["attention", "seed"])
    assert set(curves["row"]) == {"from scratch"} and len(curves) == len(theirs)
