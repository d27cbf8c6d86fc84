"""The README's sample outputs are generated (experiments/readme_sample.py), never typed: the blocks are the
rendering of the recorded runs, and a fresh `make train` still prints the recorded numbers (slow)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from experiments import readme_numbers, readme_sample

from attnlab import report
from attnlab.errors import ConfigError
from tests.conftest import ROOT, user_environment


def test_readme_samples_are_the_recorded_runs_rendered() -> None:
    text = (ROOT / "README.md").read_text()
    blocks = [m["name"] for m in readme_sample.BLOCK.finditer(text)]
    assert blocks == ["train", "analysis"]
    assert all((readme_sample.RECORDS / f"{name}.json").is_file() for name in blocks)
    assert readme_sample.render_readme(text) == text, "README.md differs from its records: make readme-sample"


def test_a_block_is_rewritten_from_its_record(tmp_path: Path) -> None:
    results = {"model": "tiny", "attention": "vanilla", "steps": 3, "run_tokens": 96, "train_seconds": 2.0}
    results |= {"tokens_per_second": 48.0, "val_ppl": 123.45, "unigram_ppl": 400.0, "output_dir": "/path/to/x"}
    (tmp_path / "train.json").write_text(json.dumps(results))
    text = "intro\n<!-- sample:train (generated) -->\n```\ntyped 544.1\n```\n<!-- /sample:train -->\nrest\n"
    rendered = readme_sample.render_readme(text, records=tmp_path)
    assert "typed" not in rendered and "validation perplexity 123.5  vs  unigram baseline 400.0" in rendered
    assert rendered.startswith("intro\n<!-- sample:train (generated) -->\n```\nattnlab: tiny") and rendered.endswith(
        "```\n<!-- /sample:train -->\nrest\n"
    )


def test_every_committed_table_has_a_reading_beside_its_results() -> None:
    """``make report`` shows each table's reading (``experiments/results/<table>/README.md``) on its pages: none may be
    missing, and the README links each of them."""
    results = ROOT / "experiments" / "results"
    found = report.readings(results)
    committed = {page.name for page in report.discover(results)}
    assert committed - set(found) == set()
    assert all(text.strip() for text in found.values())
    readme = (ROOT / "README.md").read_text()
    assert all(f"(experiments/results/{name}/README.md)" in readme for name in committed if name in found)


def test_a_readings_links_are_relative_to_its_readme_and_point_into_the_site(tmp_path: Path) -> None:
    """As GitHub shows a results README, its links are relative to it; the report's page points them at its copies
    and shows the reading once (the README itself is not a results file of the page)."""
    results = tmp_path / "results"
    (results / "t9" / "cpu").mkdir(parents=True)
    (results / "t9" / "cpu" / "t9.md").write_text("# Table 9\n")
    (results / "t9" / "cpu" / "fig.png").write_bytes(b"not a real png")
    (results / "emergence").mkdir()
    (results / "emergence" / "curves.csv").write_text("step\n1\n")
    (results / "emergence" / "README.md").write_text("<!-- reading: emergence -->\nThe *search*.\n<!-- /reading -->\n")
    (results / "t9" / "README.md").write_text(
        "# Table 9\n\n<!-- reading: t9 -->\n![the figure](cpu/fig.png), [the curves](../emergence/curves.csv) and "
        "[the data](../../../docs/data.md)\n<!-- /reading -->\n"
    )
    report.build(results, tmp_path / "site", ROOT)
    page = (tmp_path / "site" / "t9-cpu.html").read_text()
    assert 'src="data/t9/cpu/fig.png"' in page and 'href="data/emergence/emergence/curves.csv"' in page
    assert 'href="docs/data.md"' in page  # a repository page the site does not copy keeps its repository path
    search = (tmp_path / "site" / "emergence-emergence.html").read_text()
    assert (
        search.count("<em>search</em>") == 1
        and not (tmp_path / "site" / "data" / "emergence" / "emergence" / "README.md").exists()
    )


def test_the_readme_overview_is_the_committed_results_rendered() -> None:
    text = (ROOT / "README.md").read_text()
    assert report.readme_with_overview(text, ROOT / "experiments" / "results") == text, (
        "README.md's overview of the tables is stale: python experiments/report.py --readme"
    )


def test_the_overview_states_each_phenomenon_and_what_survives_holm(tmp_path: Path) -> None:
    """Hand-made results: a table checked at two stages, one effect surviving Holm, one not; a partial table; and a
    table with no paper effect to judge, which the overview leaves out."""
    table = tmp_path / "results" / "table9" / "cpu"
    table.mkdir(parents=True)
    (table / "table9.md").write_text("# Table 9\n\n**Partial: 4 of 6 cells** (written with `partial=true`)\n")
    (table / "phenomena.csv").write_text(
        "stage,row,phenomenon,variant,status,evidence\n"
        "pretrain,GPT2,outliers,vanilla,present,kurtosis_max 80 (>= 50 needed; 3 seed(s))\n"
        "finetune,GPT2,outliers,vanilla,absent,kurtosis_max 20 (>= 50 needed; 3 seed(s))\n"
        "finetune,GPT2,attention sink,vanilla,not measured,sink_share not measured (needs >= 0.2)\n"
    )
    (table / "effects.csv").write_text(
        "stage,row,attention,column,diff_pct,paper_pct,verdict,verdict_holm\n"
        "finetune,GPT2,ssa,wikitext,-0.0041,-2.7,reproduces,reproduces\n"
        "finetune,GPT2,gated,wikitext,1.53,-4.1,opposite,unresolved\n"
        "finetune,GPT2,temp_q,wikitext,0.2,-4.1,smaller than the paper's,smaller than the paper's\n"
    )
    pruning = tmp_path / "results" / "pruning" / "cpu"
    pruning.mkdir(parents=True)
    (pruning / "effects.csv").write_text(
        "stage,row,attention,column,diff_pct,paper_pct,verdict,verdict_holm\n"
        "pretrain,OPT,gated,full_ppl,5.0,,no paper value,no paper value\n"
    )
    readme = "intro\n<!-- overview (generated) -->\nold\n<!-- /overview -->\nrest\n"

    written = report.readme_with_overview(readme, tmp_path / "results", root=tmp_path)

    lines = written.splitlines()
    assert lines[:2] == ["intro", "<!-- overview (generated) -->"] and lines[-2:] == ["<!-- /overview -->", "rest"]
    assert "old" not in lines and not any(line.startswith("| pruning") for line in lines)
    assert (
        "| table9 | [cpu](results/table9/cpu/) (partial: 4 of 6 cells) "
        "| outliers: **present/absent** (pretrain kurtosis_max 80; finetune kurtosis_max 20); "
        "attention sink: **not measured** | 1 / 0 / 1 / 1 | `ssa` wikitext: -0.004% (paper -2.7%), reproduces |"
    ) in lines
    with pytest.raises(ConfigError, match=r"README\.md: an <!-- overview"):
        report.readme_with_overview("no block\n", tmp_path / "results", root=tmp_path)


def test_the_numbers_to_expect_are_looked_up_by_processor_model(tmp_path: Path) -> None:
    by_cpu = {"AuthenticAMD": {"val_ppl": 533.1}, "GenuineIntel family 6 model 207": {"val_ppl": 534.6}}
    (tmp_path / "train_by_cpu.json").write_text(json.dumps(by_cpu))
    assert readme_sample.recorded_for_cpu("AuthenticAMD family 25 model 17", tmp_path) == (
        "AuthenticAMD",
        {"val_ppl": 533.1},
    )
    assert readme_sample.recorded_for_cpu("GenuineIntel family 6 model 207", tmp_path)[1]["val_ppl"] == 534.6
    assert readme_sample.recorded_for_cpu("GenuineIntel family 6 model 143", tmp_path) is None
    results = {"cpu": "GenuineIntel family 6 model 143", "val_ppl": 535.0, "unigram_ppl": 1422.4, "torch": "2.13.0"}
    readme_sample.record_for_cpu(results | {"cpu_threads": 2, "cpu_kernels": "AVX2", "mkl_branch": "AVX2"}, tmp_path)
    assert readme_sample.recorded_for_cpu("GenuineIntel family 6 model 143", tmp_path)[1]["val_ppl"] == 535.0
    assert readme_sample.recorded_for_cpu("AuthenticAMD family 25 model 1", tmp_path)[1] == {"val_ppl": 533.1}


def test_the_readme_sample_is_the_record_of_its_processor() -> None:
    recorded = json.loads((readme_sample.RECORDS / "train.json").read_text())
    cpu = recorded.get("cpu", "AuthenticAMD")  # the sample predates the record's cpu field: a 2-core AMD EPYC
    assert readme_sample.recorded_for_cpu(cpu)[1]["val_ppl"] == recorded["val_ppl"]


@pytest.mark.slow
@pytest.mark.long
@pytest.mark.timeout(3600)
def test_make_train_still_prints_the_recorded_numbers(tmp_path: Path) -> None:
    """`make train`'s command (no overrides but where it writes; the user's thread count, not a test worker's share)
    gives the perplexities recorded for this processor model, to the README's one decimal; on a processor with no
    record, the unigram baseline exactly (it is counted, not trained) and the validation perplexity within 1% of the
    README's (measured processors differ by 0.3%)."""
    recorded = json.loads((readme_sample.RECORDS / "train.json").read_text())
    command = [sys.executable, "train.py", f"hydra.run.dir={tmp_path}/run", f"paths.cache_dir={tmp_path}/cache"]
    command += ["callbacks.progress_bar.refresh_rate=0", "print_config=false"]  # what is shown, not what is computed
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=3500, env=user_environment())
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads((tmp_path / "run" / "results.json").read_text())
    assert [results[k] for k in ("steps", "run_tokens", "parameters")] == [
        recorded[k] for k in ("steps", "run_tokens", "parameters")
    ]
    assert f"{results['unigram_ppl']:.1f}" == f"{recorded['unigram_ppl']:.1f}"
    found = readme_sample.recorded_for_cpu(results["cpu"])
    if found is None:
        assert results["val_ppl"] == pytest.approx(recorded["val_ppl"], rel=0.01), f"no record for {results['cpu']}"
    else:
        cpu, expected = found
        assert f"{results['val_ppl']:.1f}" == f"{expected['val_ppl']:.1f}", f"recorded for {cpu}: {expected}"


@pytest.mark.slow
def test_every_number_a_reading_quotes_is_in_the_committed_results() -> None:
    """The readings' signed percentages, intervals and p-values come from the tables' files, checked by a script
    (experiments/readme_numbers.py), not by eye: in the README, docs/ and each table's results README."""
    pages = readme_numbers.pages()
    assert ROOT / "experiments" / "results" / "table5" / "README.md" in pages and ROOT / "README.md" in pages
    found = readme_numbers.check_pages(pages, ROOT / "experiments" / "results")
    assert found == [], "\n".join(map(str, found))


def test_a_quoted_number_that_is_in_no_file_is_named(tmp_path: Path) -> None:
    """Hand-made results: an interval off in its last digit, a p-value no test gave and a percentage are named with
    their line; the right ones, a number marked as not from a table and a reading of no engine table pass."""
    results = tmp_path / "experiments" / "results"
    (tmp_path / "experiments" / "conf" / "table").mkdir(parents=True)
    (tmp_path / "experiments" / "conf" / "table" / "t9.yaml").write_text("name: t9\n")
    (results / "t9" / "cpu").mkdir(parents=True)
    (results / "t9" / "cpu" / "effects.csv").write_text(
        "stage,row,attention,column,diff,ci_low,ci_high,p,diff_pct,paper_pct,p_holm\n"
        "pre,R,a,ppl,-2.0,-3.04,-0.96,0.0123,-10.0,-6.4,0.0492\n"
    )
    (results / "t9" / "cpu" / "runs.csv").write_text(
        "stage,row,attention,seed,ppl\npre,R,vanilla,1,20.0\npre,R,a,1,18.0\npre,R,vanilla,2,20.0\npre,R,a,2,18.0\n"
    )
    readme = (
        "<!-- reading: t9 -->\n"
        "a -10.0% [-3.04, -0.96] (paper -6.4%), p 0.0123, Holm p 0.0492\n"
        "a [-3.1, -0.96] and p 0.013 and +12.5%\n"
        "a run took +7% longer (not from a table)\n"
        "<!-- /reading -->\n<!-- reading: bench -->\n+99.9%\n<!-- /reading -->\n"
    )
    found = [str(m) for m in readme_numbers.check(readme, results)]
    assert found == [
        "README.md:3: percentage +12.5% is in none of the reading's tables' files",
        "README.md:3: p-value 0.013 is in none of the reading's tables' files",
        "README.md:3: interval bound -3.1 [-3.1, -0.96] is in none of the reading's tables' files",
    ]
