"""The README's sample outputs are generated (experiments/readme_sample.py), never typed: the blocks are the
rendering of the recorded runs, and a fresh `make train` still prints the recorded numbers (slow)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from experiments import readme_sample, report

from tests.conftest import ROOT


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


def test_every_committed_table_has_a_reading_in_the_readme() -> None:
    """``make report`` shows the README's reading beside each table: none may be missing."""
    found = report.readings((ROOT / "README.md").read_text())
    committed = {page.name for page in report.discover(ROOT / "experiments" / "results")}
    assert committed - set(found) == set()
    assert all(text.strip() for text in found.values())


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
@pytest.mark.timeout(3600)
def test_make_train_still_prints_the_recorded_numbers(tmp_path: Path) -> None:
    """`make train`'s command (no overrides but where it writes) gives the perplexities recorded for this processor
    model, to the README's one decimal; on a processor with no record, the unigram baseline exactly (it is counted,
    not trained) and the validation perplexity within 1% of the README's (measured processors differ by 0.3%)."""
    recorded = json.loads((readme_sample.RECORDS / "train.json").read_text())
    command = [sys.executable, "train.py", f"hydra.run.dir={tmp_path}/run", f"paths.cache_dir={tmp_path}/cache"]
    command += ["callbacks.progress_bar.refresh_rate=0", "print_config=false"]  # what is shown, not what is computed
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=3500)
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
