"""The README's sample outputs, generated from real runs instead of typed (``make readme-sample``).

    python experiments/readme_sample.py                  # run `make train`'s command, record it, rewrite README.md
    python experiments/readme_sample.py --run <run dir>  # record an existing run of `make train` (no overrides)
    python experiments/readme_sample.py --analysis       # also evaluate the run with eval=analysis (~1 min on a CPU)
    python experiments/readme_sample.py --render         # rewrite README.md from the recorded runs only

Each README block between ``<!-- sample:<name> -->`` and ``<!-- /sample:<name> -->`` is rendered from
``experiments/results/readme/<name>.json`` (``train``: the run's results.json; ``analysis``: the ``analysis`` part of
evaluate.py's results.json) with the functions the commands print with. tests/test_readme.py checks that README.md
is that rendering and (test-slow) that a fresh ``make train`` still prints the recorded numbers.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
RECORDS = ROOT / "experiments" / "results" / "readme"
SHOWN_ROOT = "/path/to/attnlab"  # the machine's checkout directory, as the README shows it
BLOCK = re.compile(r"(<!-- sample:(?P<name>\w+)[^>]*-->\n)(?P<body>.*?)(<!-- /sample:(?P=name) -->)", re.DOTALL)


def render_train(results: dict[str, Any]) -> str:
    from attnlab.training.run import summary

    return summary(results).strip("\n")


def render_analysis(analysis: dict[str, Any]) -> str:
    from attnlab.eval.analysis import format_summary

    return format_summary(analysis).strip("\n")


RENDER: dict[str, Callable[[dict[str, Any]], str]] = {"train": render_train, "analysis": render_analysis}


def render_readme(text: str, records: Path = RECORDS) -> str:
    """``text`` with every sample block replaced by the rendering of its record (a block without one: unchanged)."""

    def block(match: re.Match) -> str:
        record = records / f"{match['name']}.json"
        if not record.is_file():
            return match[0]
        body = RENDER[match["name"]](json.loads(record.read_text()))
        return f"{match[1]}```\n{body}\n```\n{match[4]}"

    return BLOCK.sub(block, text)


def recorded_for_cpu(cpu: str, records: Path = RECORDS) -> tuple[str, dict[str, Any]] | None:
    """``make train``'s perplexities as measured on this processor (``train_by_cpu.json``, keyed by a prefix of
    ``attnlab.numerics.cpu_identity``: the longest one wins), or None for a processor with none: a seed fixes the
    numbers per processor model, not across vendors (attnlab/numerics.py)."""
    by_cpu = json.loads((records / "train_by_cpu.json").read_text())
    keys = [key for key in by_cpu if cpu.startswith(key)]
    if not keys:
        return None
    key = max(keys, key=len)
    return key, by_cpu[key]


def record_for_cpu(results: dict[str, Any], records: Path = RECORDS) -> None:
    """Add (or replace) this run's processor model in ``train_by_cpu.json``."""
    path = records / "train_by_cpu.json"
    by_cpu = json.loads(path.read_text()) if path.is_file() else {}
    by_cpu[results["cpu"]] = {
        "val_ppl": results["val_ppl"],
        "unigram_ppl": results["unigram_ppl"],
        "measured": f"make readme-sample: torch {results['torch']}, {results['cpu_threads']} threads, "
        f"{results['cpu_kernels']} kernels, MKL branch {results['mkl_branch']}",
    }
    path.write_text(json.dumps(by_cpu, indent=2) + "\n")


def anonymous(value: Any) -> Any:
    """``value`` with this checkout's path shown as /path/to/attnlab (results name their files absolutely)."""
    return json.loads(json.dumps(value).replace(str(ROOT), SHOWN_ROOT))


def run(command: list[str]) -> str:
    """Run ``command`` in the repository, showing its output as it comes; returns what it printed on stdout."""
    process = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, text=True)
    printed = []
    for line in process.stdout:
        print(line, end="", flush=True)
        printed.append(line)
    if process.wait() != 0:
        raise SystemExit(f"error: {' '.join(command)} exited with {process.returncode}")
    return "".join(printed)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", type=Path, help="an existing run of `make train` (default: train one now)")
    parser.add_argument("--analysis", action="store_true", help="also record `evaluate.py eval=analysis` of the run")
    parser.add_argument("--render", action="store_true", help="only rewrite README.md from the recorded runs")
    args = parser.parse_args()
    if not args.render:
        run_dir = args.run
        if run_dir is None:
            printed = run([sys.executable, "train.py"])
            run_dir = Path(re.findall(r"^  outputs: (.+)$", printed, re.MULTILINE)[-1])
        overrides = (run_dir / ".hydra" / "overrides.yaml").read_text().strip()
        if overrides != "[]":  # the README shows `make train`
            raise SystemExit(f"error: --run: {run_dir} was trained with overrides {overrides}, not as make train")
        RECORDS.mkdir(parents=True, exist_ok=True)
        results = json.loads((run_dir / "results.json").read_text())
        (RECORDS / "train.json").write_text(json.dumps(anonymous(results), indent=2) + "\n")
        record_for_cpu(results)
        if args.analysis:
            out = run_dir / "eval" / "readme-analysis"
            ckpt = run_dir / "checkpoints" / "last.ckpt"
            run([sys.executable, "evaluate.py", f"ckpt_path={ckpt}", "eval=analysis", "results_csv=null",
                 f"hydra.run.dir={out}", "print_config=false"])  # fmt: skip
            analysis = json.loads((out / "results.json").read_text())["analysis"]
            (RECORDS / "analysis.json").write_text(json.dumps(anonymous(analysis), indent=2) + "\n")
    README.write_text(render_readme(README.read_text()))
    print(f"README.md: sample blocks rendered from {RECORDS}")


if __name__ == "__main__":
    main()
