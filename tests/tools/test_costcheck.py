"""The cost check: random valid rTiles (and that each one builds a correct kernel), the report's
statistics on synthetic data with known answers, and the CLI end to end on a small workload."""
from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
from tvm import te

import tvm_roller
from tvm_roller.analysis import analyze
from tvm_roller.planner import apply
from tvm_roller.tools.costcheck.dataset import Candidate
from tvm_roller.tools.costcheck.report import build_report
from tvm_roller.tools.costcheck.sample import random_tiles
from tvm_roller.analysis.traffic import accumulator_registers, input_bytes, output_bytes
from conftest import TARGET, assert_close, device, matmul_func, rand, run


def _gemm(m, n, k):
    return matmul_func(m, n, k)


def test_random_tiles_are_valid_distinct_and_deterministic():
    fa = analyze(_gemm(48, 96, 40))
    dev = device()
    tiles = random_tiles(fa, dev, 20, seed=3)
    assert 5 <= len(tiles) <= 20
    assert len({t.key() for t in tiles}) == len(tiles)
    lanes = dev.simd_lanes("float32")
    for t in tiles:
        for i, a in enumerate(fa.axes):
            assert a.extent % t.l2[i] == 0 and t.l2[i] % t.l1[i] == 0 and t.l1[i] % t.reg[i] == 0
        assert accumulator_registers(fa, t.reg, lanes) + 2 <= dev.num_vector_registers
        assert input_bytes(fa, t.l1) + output_bytes(fa, t.l1) <= dev.levels[0].capacity_bytes
        assert t.predicted_s > 0 and t.terms
    again = random_tiles(fa, dev, 20, seed=3)
    assert [t.key() for t in again] == [t.key() for t in tiles]


def test_random_tiles_build_correct_kernels():
    """Every sampled tile goes through the same lowering as roller's own: all must be correct."""
    func = _gemm(24, 37, 19)  # prime and odd extents
    p = tvm_roller.plan(func, TARGET, device=device())
    a, b = rand((24, 19), seed=1), rand((19, 37), seed=2)
    import tvm

    for t in random_tiles(p.analysis, p.device, 6, seed=0):
        lib = tvm.compile(apply(p, t).mod, target=p.target)
        assert_close(run(lib, [a, b], (24, 37), "float32"), a.astype(np.float64) @ b, 2e-5)


def test_random_tiles_empty_for_streaming_kinds():
    A = te.placeholder((8, 64), name="A")
    k = te.reduce_axis((0, 64), "k")
    S = te.compute((8,), lambda i: te.sum(A[i, k], axis=k), name="S")
    assert random_tiles(analyze(te.create_prim_func([A, S])), device(), 10) == []


def _cands(workload, preds, meas, cls="GMM"):
    return [Candidate(workload, cls, "roller" if i == 0 else "random", 0 if i == 0 else -1, {},
                      p, m, {"x": float(p), "y": float(i)})
            for i, (p, m) in enumerate(zip(preds, meas))]


def test_report_statistics_known_answers():
    perfect = _cands("A:0", [1, 2, 3, 4, 5, 6], [10, 20, 30, 40, 50, 60])
    reversed_ = _cands("B:0", [1, 2, 3, 4, 5, 6], [60, 50, 40, 30, 20, 10])
    single = _cands("C:0", [1], [5], cls="NRM")
    rep = build_report(perfect + reversed_ + single)
    rows = {r["op"]: r for r in rep["workloads"]}
    assert rows["A:0"]["spearman_model"] == pytest.approx(1.0)
    assert rows["A:0"]["kendall_model"] == pytest.approx(1.0)
    assert rows["A:0"]["top1_regret"] == pytest.approx(1.0)
    assert rows["B:0"]["spearman_model"] == pytest.approx(-1.0)
    assert rows["B:0"]["top1_regret"] == pytest.approx(6.0)
    assert rows["C:0"]["spearman_model"] is None and rows["C:0"]["top1_regret"] == 1.0
    s = rep["summary"]
    assert s["n_rankable"] == 2 and s["top1_within10_frac"] == pytest.approx(2 / 3)
    assert s["median_spearman_xgb"] is not None  # 3 workloads: XGBoost is cross-validated


def test_report_xgb_null_with_one_workload():
    rep = build_report(_cands("A:0", [1, 2, 3, 4], [1, 3, 2, 4]))
    row = rep["workloads"][0]
    assert row["spearman_xgb"] is None and row["kendall_xgb"] is None
    assert rep["summary"]["median_spearman_xgb"] is None


def test_cli_costcheck(tmp_path):
    out = tmp_path / "cc"
    proc = subprocess.run([sys.executable, "-m", "tvm_roller.tools.cli", "costcheck", "--ops",
                           "GMM:0,NRM:0", "--out", str(out), "--n-top", "3", "--n-random", "4",
                           "--repeat", "2"], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    rep = json.loads((out / "report.json").read_text())
    ops = [r["op"] for r in rep["workloads"]]
    assert ops == ["GMM:0", "NRM:0"]
    for r in rep["workloads"]:
        for key in ("op", "n_candidates", "spearman_model", "kendall_model", "spearman_xgb",
                    "kendall_xgb", "top1_regret"):
            assert key in r
        assert r["top1_regret"] >= 1.0
    for key in ("median_spearman_model", "median_spearman_xgb", "top1_within10_frac"):
        assert key in rep["summary"]
    assert (out / "predicted_vs_measured.png").stat().st_size > 0
    assert (out / "regret.png").stat().st_size > 0
    data = json.loads((out / "dataset.json").read_text())
    assert data["meta"]["target"] and data["candidates"]
