"""Task sets end to end through lm-eval's ``simple_evaluate``: offline stand-ins for the Table 3 tasks, our passkey and
held-out tasks, the results JSON and the CSV that keeps every row."""

from __future__ import annotations

import csv
import json
import logging
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf
from tokenizers import Tokenizer

from attnlab.data.tokenizer import train_bpe_tokenizer
from attnlab.eval.harness import append_csv, evaluate_suite
from attnlab.eval.lm import AttnlabLM
from attnlab.models import GPT, ModelConfig
from tests.conftest import CONF, ROOT

FIXTURES = ROOT / "tests" / "eval_fixtures"


@pytest.fixture(scope="module")
def lm(wiki_docs: list[dict[str, str]]) -> AttnlabLM:
    tokenizer: Tokenizer = train_bpe_tokenizer((d["text"] for d in wiki_docs), 1024)
    torch.manual_seed(0)
    config = ModelConfig(n_layer=2, n_head=2, n_embd=32, block_size=192, vocab_size=tokenizer.get_vocab_size())
    return AttnlabLM(model=GPT(config, {"name": "vanilla"}), tokenizer=tokenizer, batch_size=4)


def suite(name: str) -> dict:
    return OmegaConf.to_container(OmegaConf.load(CONF / "eval" / f"{name}.yaml"), resolve=True)


@pytest.mark.slow
def test_table3_task_set_runs_end_to_end_on_local_fixtures(lm: AttnlabLM, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(ROOT)  # the fixtures' data_files are relative to the repository root
    table3 = {**suite("table3"), "include_path": [str(FIXTURES)], "include_defaults": False, "bootstrap_iters": 10}
    results_csv = tmp_path / "results.csv"
    append_csv(results_csv, {"run_id": "earlier", "suite": "other", "only_in_old_rows": 1.5})
    record = evaluate_suite(lm, table3, tmp_path / "out", seed=3, results_csv=results_csv, run_id="now")

    results = record["results"]["results"]
    assert results["wikitext"]["word_perplexity,none"] > 1
    for task in ("lambada_standard", "lambada_openai"):
        assert results[task]["perplexity,none"] > 1 and 0 <= results[task]["acc,none"] <= 1
    assert {"acc,none", "acc_norm,none"} <= set(results["hellaswag"]) and "acc_norm,none" in results["arc_challenge"]
    assert record["results"]["n-samples"]["hellaswag"]["effective"] == 3
    assert set(record["versions"]) == set(table3["tasks"]) and record["lm_eval_version"]

    row = record["summary"]
    columns = [
        "wikitext",
        "lmb_std_ppl",
        "lmb_oai_ppl",
        "lmb_std",
        "lmb_oai",
        "piqa",
        "hella",
        "wino",
        "arc_e",
        "arc_c",
    ]
    assert all(isinstance(row[c], float) for c in columns)
    accuracies = [row[c] for c in table3["average"]]
    assert row["avg"] == pytest.approx(sum(accuracies) / len(accuracies))
    assert row["hella"] == results["hellaswag"]["acc_norm,none"] and row["wino"] == results["winogrande"]["acc,none"]

    saved = json.loads((tmp_path / "out" / "results.json").read_text())
    assert saved["summary"]["avg"] == pytest.approx(row["avg"])
    assert saved["torch_threads"] == torch.get_num_threads()  # W8A8 depends on the summation order they set
    rows = list(csv.DictReader(results_csv.open()))
    assert [r["run_id"] for r in rows] == ["earlier", "now"]
    assert rows[0]["only_in_old_rows"] == "1.5" and float(rows[1]["avg"]) == pytest.approx(row["avg"])


def test_quick_task_set_runs_passkey_and_heldout_offline(lm: AttnlabLM, tmp_path: Path, data_cache: Path) -> None:
    quick = {**suite("quick"), "passkey": {"context_lengths": [128, 176], "samples_per_length": 2, "seed": 1}}
    record = evaluate_suite(lm, quick, tmp_path, limit=4, cache_dir=str(data_cache))
    results = record["results"]["results"]
    assert results["attnlab_heldout"]["word_perplexity,none"] > 1
    assert set(record["passkey"]["per_length"]) == {128, 176}
    assert 0 <= record["passkey"]["overall"] <= 1
    assert {"passkey", "passkey_128", "passkey_176", "heldout_word_ppl", "heldout_bpb"} <= set(record["summary"])
    assert record["results"]["n-samples"]["attnlab_passkey"]["effective"] == 4


def test_evaluation_says_where_it_wrote_its_results(lm: AttnlabLM, tmp_path: Path, data_cache: Path, capsys) -> None:
    quick = {**suite("quick"), "passkey": {"context_lengths": [128], "samples_per_length": 1, "seed": 1}}
    results_csv = tmp_path / "results.csv"
    evaluate_suite(lm, quick, tmp_path / "out", limit=2, cache_dir=str(data_cache), results_csv=results_csv)
    printed = capsys.readouterr().out
    assert printed.rstrip().endswith(f"results: {tmp_path / 'out' / 'results.json'}\n  one row added to {results_csv}")


def test_an_evaluation_outside_a_git_repository_prints_no_git_error_nor_lm_eval_warning(
    lm: AttnlabLM,
    tmp_path: Path,
    data_cache: Path,
    monkeypatch: pytest.MonkeyPatch,
    capfd: pytest.CaptureFixture,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """lm-eval records ``git describe`` of the current directory, where git prints ``fatal: not a git repository``;
    and it warns about each metric of our tasks that states no aggregation or direction."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path.parent))  # (a tmp inside a repository is outside it)
    quick = {**suite("quick"), "passkey": {"context_lengths": [128], "samples_per_length": 1, "seed": 1}}
    evaluate_suite(lm, quick, tmp_path / "out", limit=2, cache_dir=str(data_cache))
    assert "fatal" not in capfd.readouterr().err
    warned = [r.getMessage() for r in caplog.records if r.name.startswith("lm_eval") and r.levelno >= logging.WARNING]
    assert not warned


def test_passkey_lengths_beyond_the_window_are_rejected(lm: AttnlabLM, tmp_path: Path) -> None:
    from attnlab.errors import ConfigError

    too_long = {**suite("passkey"), "passkey": {"context_lengths": [100, 190]}}
    with pytest.raises(ConfigError, match=r"\[190\]"):
        evaluate_suite(lm, too_long, tmp_path)


@pytest.mark.slow
def test_analysis_suite_delegates_or_says_it_is_missing(lm: AttnlabLM, tmp_path: Path, monkeypatch) -> None:
    import sys

    from attnlab.errors import ConfigError

    monkeypatch.setitem(sys.modules, "attnlab.eval.analysis", None)  # as if not importable
    with pytest.raises(ConfigError, match="analysis not available"):
        evaluate_suite(lm, suite("analysis"), tmp_path)


@pytest.mark.slow
def test_an_lm_eval_task_in_an_attnlab_suite_offline_is_one_line_and_leaves_no_file(
    lm: AttnlabLM, tmp_path: Path, data_cache: Path
) -> None:
    """``eval.tasks=[lambada_openai]`` with the default (attnlab-only) suite: once "no such task" (the suite did not
    index lm-eval's registry), and offline a raw ConnectionError; now the task is found and the missing hub is one
    line, with no tokenizer copy left behind."""
    from attnlab.errors import ConfigError

    quick = {**suite("quick"), "tasks": ["lambada_openai"]}
    with pytest.raises(ConfigError) as err:
        evaluate_suite(lm, quick, tmp_path / "out", limit=2, cache_dir=str(data_cache))
    assert err.value.key == "eval.tasks" and "hub" in str(err.value) and "\n" not in str(err.value)
    assert "no such task" not in str(err.value)
    assert not list((tmp_path / "out").glob("*"))


def test_a_run_on_its_own_text_is_scored_on_its_own_held_out_documents(
    lm: AttnlabLM, tmp_path: Path, data_cache: Path, monkeypatch
) -> None:
    """data=text_files (as registry_text): the held-out perplexity task and the analysis read the run's own split of
    its corpus, as training made it, not the embedded corpus's articles; a run on the hub keeps the embedded split."""
    from attnlab.eval.harness import run_documents

    corpus = tmp_path / "notes.txt"
    corpus.write_text("\n\n".join(f"Note {i}: the mill by the river turns all day long." for i in range(10)))
    data = {"name": "text_files", "source": "files", "files": [str(corpus)], "val_fraction": 0.2, "seed": 3}
    documents = run_documents(data, str(data_cache))
    assert (len(documents["train"]), len(documents["test"])) == (8, 2)
    assert all(text.startswith("Note ") for text in documents["test"]["text"])
    monkeypatch.setattr(lm, "run_data", data)
    heldout_only = {**suite("quick"), "tasks": ["attnlab_heldout"]}
    record = evaluate_suite(lm, heldout_only, tmp_path / "out", limit=None, cache_dir=str(data_cache))
    assert record["results"]["n-samples"]["attnlab_heldout"]["effective"] == 2
    hub = {"name": "wikitext2", "source": "hub", "path": "Salesforce/wikitext", "seed": 1337, "val_fraction": 0.1}
    embedded = {"name": "wiki_sample", "source": "wiki_sample", "seed": 1337, "val_fraction": 0.1}
    assert (
        run_documents(hub, str(data_cache))["test"]["text"] == run_documents(embedded, str(data_cache))["test"]["text"]
    )
