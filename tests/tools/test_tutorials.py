"""The tutorial notebook runs top to bottom without a cell error (nbclient, python3 kernel)."""
from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

from conftest import REPO_ROOT as ROOT  # noqa: E402

# notebook -> strings its printed output must contain
NOTEBOOKS = {
    "01_roller_one_operator.ipynb": ["max relative error vs float64 numpy", "register tile",
                                     "bound by", "mcpu was not given", "speed-up"],
    "02_roller_records_in_metaschedule.ipynb": ["max relative error vs float64 numpy",
                                                "speed-up over TVM default", "mixing refused",
                                                "MLP max relative error",
                                                "trials mutated from roller's records"],
    "03_pytorch_model_with_roller.ipynb": ["max abs error vs PyTorch", "PyTorch's speed",
                                           "functions from cache", "scheduled by the rule"],
    "04_cost_check.ipynb": ["spearman model", "top-1 regret", "median_spearman_model",
                            "plots written to"],
    "05_cuda_schedule.ipynb": ["shared-memory (block) tile", "ptxas sm_90",
                               "replica max relative error vs float64 numpy",
                               "tensor-core instructions in the PTX: True",
                               "warp shuffles in the source: True", "kernels compiled by nvcc"],
    "06_fused_gemm_chains.ipynb": ["decision: fused", "max relative error vs float64 numpy",
                                   "tvm_roller.build chose: fused",
                                   "seq 512: chain 512x64 . 64x512 . 512x64, batch [12]: fused",
                                   "0 B spilled, problems: none"],
    "07_dynamic_shapes.ipynb": ["kernel(s), dispatched on the values at run time",
                                "planned at {'n': 512}", "built once in",
                                "max relative error vs float64 numpy", "'tir_var_upper_bound': {",
                                "seq 100: output (1, 100, 768), max relative error vs PyTorch",
                                "PrimFuncs scheduled by roller with buckets"],
    "08_llm_generation.ipynb": ["scheduled by roller", "cache kernels: ['kv-attention', "
                                "'kv-write']", "greedy tokens identical to HF generate: True",
                                "of DRAM", "plot written to"],
}


@pytest.mark.parametrize("name", sorted(NOTEBOOKS))
def test_tutorial_notebook_runs(name, monkeypatch):
    notebook = ROOT / "tutorials" / name
    # the kernel imports this checkout's tvm_roller, and uses the session's private cache
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(
        [str(ROOT)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]))
    nb = nbformat.read(str(notebook), as_version=4)
    client = nbclient.NotebookClient(nb, timeout=300, kernel_name="python3",
                                     resources={"metadata": {"path": str(notebook.parent)}})
    t0 = time.perf_counter()
    client.execute()  # raises CellExecutionError on the first failing cell
    elapsed = time.perf_counter() - t0

    outputs = "\n".join(
        o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])
        if o.get("output_type") == "stream")
    for expected in NOTEBOOKS[name]:
        assert expected in outputs, (expected, outputs[-2000:])
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])
              if o.get("output_type") == "error"]
    assert not errors
    assert elapsed < 120, f"{name} took {elapsed:.0f} s (meant to be < 60 s)"
