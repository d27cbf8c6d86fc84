"""notebooks/analysis.ipynb runs top to bottom offline: it trains two small train.py runs (vanilla, ssa) and
analyses their checkpoints (a few minutes on the CPU)."""

from __future__ import annotations

from pathlib import Path

import pytest

NOTEBOOK = Path(__file__).resolve().parents[1] / "notebooks" / "analysis.ipynb"


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_analysis_notebook_executes(tmp_path: Path, monkeypatch) -> None:
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    monkeypatch.setenv("ATTNLAB_NOTEBOOK_OUTPUTS", str(tmp_path))  # the notebook's own train.py runs go here
    monkeypatch.delenv("ATTNLAB_RUNS", raising=False)
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    resources = {"metadata": {"path": str(NOTEBOOK.parent)}}
    nbclient.NotebookClient(notebook, timeout=900, kernel_name="python3", resources=resources).execute()
    printed = "".join(o.get("text", "") for c in notebook.cells if c.cell_type == "code" for o in c.outputs)
    assert "analysis of attention=ssa" in printed and "temperatures.html" in printed
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ssa", "vanilla"]  # read from train.py's own runs
    assert all((tmp_path / name / "checkpoints" / "last.ckpt").is_file() for name in ("ssa", "vanilla"))
