"""notebooks/analysis.ipynb runs top to bottom offline (it trains two tiny models: about a minute)."""

from __future__ import annotations

from pathlib import Path

import pytest

NOTEBOOK = Path(__file__).resolve().parents[1] / "notebooks" / "analysis.ipynb"


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_analysis_notebook_executes() -> None:
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    resources = {"metadata": {"path": str(NOTEBOOK.parent)}}
    nbclient.NotebookClient(notebook, timeout=600, kernel_name="python3", resources=resources).execute()
    printed = "".join(o.get("text", "") for c in notebook.cells if c.cell_type == "code" for o in c.outputs)
    assert "analysis of attention=ssa" in printed and "temperatures.html" in printed
