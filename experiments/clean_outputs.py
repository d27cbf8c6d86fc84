"""``make clean-outputs``: remove what attnlab wrote under ``outputs/`` (runs, sweeps, table cells, evaluations, the
report, test artifacts) and keep anything else there, saying what it removed and what it kept: a folder of your own
in ``outputs/`` is never deleted without a word."""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
REPORT_MARKER = ".attnlab-report"  # (experiments/report.py's manifest)
ATTNLAB_FILES = (".report.staging-*", ".force-*")  # a killed report's staging directory, a forced table's salt


def written_by_attnlab(entry: Path) -> bool:
    """A run directory (``.hydra/``) up to three levels down (an experiment's runs, a sweep's jobs, table cells,
    evaluations), the report (its manifest), the tests' artifacts, or one of attnlab's own hidden files."""
    if any(entry.match(pattern) for pattern in ATTNLAB_FILES):
        return True
    if not entry.is_dir() or entry.is_symlink():
        return False
    if entry.name == "test-artifacts" or (entry / REPORT_MARKER).is_file() or (entry / ".hydra").is_dir():
        return True
    return any(any(entry.glob(f"{'*/' * depth}.hydra")) for depth in (1, 2, 3))  # multirun/<day>/<time>/<job>


def clean(outputs: Path) -> tuple[list[Path], list[Path]]:
    """Remove attnlab's entries of ``outputs``; returns (removed, kept). ``outputs`` itself goes when it is empty."""
    if not outputs.is_dir():
        return [], []
    removed, kept = [], []
    for entry in sorted(outputs.iterdir()):
        if written_by_attnlab(entry):
            shutil.rmtree(entry) if entry.is_dir() and not entry.is_symlink() else entry.unlink()
            removed.append(entry)
        else:
            kept.append(entry)
    if not kept:
        outputs.rmdir()
    return removed, kept


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--outputs", type=Path, nargs="+", default=[ROOT / "outputs", ROOT / "multirun"])
    args = parser.parse_args(argv)
    for outputs in args.outputs:
        removed, kept = clean(outputs)
        if removed:
            print(f"removed from {outputs}: {', '.join(entry.name for entry in removed)}")
        for entry in kept:
            print(f"kept {entry}: not written by attnlab (remove it yourself if you mean to)")


if __name__ == "__main__":
    main()
