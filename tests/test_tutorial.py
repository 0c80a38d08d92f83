"""The tutorial notebook runs top to bottom without a cell error (nbclient, python3 kernel)."""
from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOK = ROOT / "tutorials" / "01_roller_one_operator.ipynb"


def test_tutorial_notebook_runs(monkeypatch):
    # the kernel imports this checkout's tvm_roller, and uses the session's private cache
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(
        [str(ROOT)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]))
    nb = nbformat.read(str(NOTEBOOK), as_version=4)
    client = nbclient.NotebookClient(nb, timeout=300, kernel_name="python3",
                                     resources={"metadata": {"path": str(NOTEBOOK.parent)}})
    t0 = time.perf_counter()
    client.execute()  # raises CellExecutionError on the first failing cell
    elapsed = time.perf_counter() - t0

    outputs = "\n".join(
        o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])
        if o.get("output_type") == "stream")
    assert "max relative error vs float64 numpy" in outputs
    assert "register tile" in outputs and "bound by" in outputs
    assert "mcpu was not given" in outputs  # the completed target is explained
    assert "speed-up" in outputs
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])
              if o.get("output_type") == "error"]
    assert not errors
    assert elapsed < 120, f"the tutorial took {elapsed:.0f} s (meant to be < 60 s)"
