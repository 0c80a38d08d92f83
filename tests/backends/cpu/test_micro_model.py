"""The micro-model's calibrated compute rate: the per-tile table the calibration measures, how a
tile's rate is read from it, and that the planner uses it."""
from __future__ import annotations

import dataclasses

import pytest
from tvm import te

from tvm_roller.analysis import analyze
from tvm_roller.backends.cpu.perf_model import (_measured_rate, micro_kernel_efficiency,
                                                predict_tiled)
from tvm_roller.backends.registry import backend_for
from tvm_roller.hardware import normalize_target
from tvm_roller.core.rtile import RTile
from tvm_roller.hardware.calibrate import tile_table_shapes

from conftest import device

# one core of a Zen 4 (GFLOP/s; tvm-roller calibrate --quick, 2026-12-01): four accumulators
# hide the FMA latency, fewer are latency-bound
TABLE = {"1x1": 29.5, "2x1": 59.0, "4x1": 117.6, "6x1": 118.0, "8x1": 117.9, "12x1": 117.9,
         "1x2": 58.8, "2x2": 103.4, "4x2": 118.0, "6x2": 117.9, "8x2": 117.8, "12x2": 117.5,
         "1x3": 85.2, "2x3": 111.7, "4x3": 116.4, "6x3": 115.3, "8x3": 114.9,
         "1x4": 91.5, "2x4": 113.0, "4x4": 117.9, "6x4": 117.8}


def _calibrated(dev):
    return dataclasses.replace(dev, cpu=dataclasses.replace(dev.cpu, tile_gflops=dict(TABLE)))


def _matmul(m, n, k):
    A = te.placeholder((m, k), "float32", name="A")
    B = te.placeholder((k, n), "float32", name="B")
    r = te.reduce_axis((0, k), "r")
    C = te.compute((m, n), lambda i, j: te.sum(A[i, r] * B[r, j], axis=r), name="C")
    return analyze(te.create_prim_func([A, B, C]))


def test_table_shapes_fit_the_register_file():
    for quick in (True, False):
        shapes = tile_table_shapes(32, quick)
        assert shapes and all(mr * nv + nv + 2 <= 32 for mr, nv in shapes)
        assert {nv for _, nv in shapes} == {1, 2, 3, 4}
    assert all(mr * nv + nv + 2 <= 16 for mr, nv in tile_table_shapes(16, False))


def test_measured_rate_interpolates_and_clamps():
    assert _measured_rate(TABLE, 2, 2) == pytest.approx(103.4)
    assert _measured_rate(TABLE, 3, 1) == pytest.approx((59.0 + 117.6) / 2)  # between 2 and 4
    assert _measured_rate(TABLE, 20, 1) == pytest.approx(117.9)  # beyond the last: the last
    assert _measured_rate(TABLE, 3, 7) == pytest.approx((113.0 + 117.9) / 2)  # widest measured
    assert _measured_rate({"2x1": 60.0}, 1, 1) == pytest.approx(30.0)  # below: latency-bound
    assert _measured_rate({"2x1": 60.0}, 2, 3) == pytest.approx(60.0)


def test_efficiency_follows_the_table_not_the_latency_rule():
    fa = _matmul(64, 64, 64)
    dev = device()
    cal = _calibrated(dev)
    # 1 row x 1 vector: one accumulator; the table says a quarter of the peak, the analytical
    # rule (8 FMA chains) an eighth
    one = micro_kernel_efficiency(fa, cal, [1, 16, 1], 16, 1, 2)
    assert one == pytest.approx(29.5 / (0.97 * 118.0), rel=1e-6)  # within 3% of best: best
    assert micro_kernel_efficiency(fa, dev, [1, 16, 1], 16, 1, 2) == pytest.approx(1 / 8)
    # 4 x 2 vectors reaches the peak in the table
    assert micro_kernel_efficiency(fa, cal, [4, 32, 1], 16, 8, 6) == pytest.approx(1.0)
    # 6 rows x 3 vectors measured 115.3: within the table's noise of the best, so the best
    assert micro_kernel_efficiency(fa, cal, [6, 48, 1], 16, 18, 9) == pytest.approx(1.0)
    # more loads per step than the GEMM kernel issues: slower than its table entry
    assert micro_kernel_efficiency(fa, cal, [1, 64, 1], 16, 4, 20) < \
        micro_kernel_efficiency(fa, cal, [1, 64, 1], 16, 4, 5)


def test_calibrated_prediction_ranks_by_measured_rate():
    fa = _matmul(256, 256, 256)
    cal = _calibrated(device())

    def tile(reg):
        t = RTile(kind="tiled", axes=[a.name for a in fa.axes], extents=[256, 256, 256],
                  axis_kinds="SSR", reg=reg, l1=[reg[0] * 4, 64, 64], l2=[128, 256, 64],
                  vector_axis=1, vector_lanes=16)
        return predict_tiled(fa, cal, t)

    small, big = tile([1, 16, 1]), tile([4, 32, 1])
    assert small.terms["compute"] > 3 * big.terms["compute"]


def test_planner_uses_the_table():
    """The planner's predictions follow the device's table: a machine whose multi-row tiles
    measured a third of the best rate is predicted slower than the analytical model says."""
    backend = backend_for(normalize_target("llvm"))
    fa = backend.analyze(_matmul(128, 128, 128).func)
    rule = backend.rule_for(fa)
    slow = {k: (g if k.startswith("1x") else g / 3) for k, g in TABLE.items()}
    dev = device()
    plain = rule.construct(fa, dev, 1)[0]
    cal = rule.construct(fa, dataclasses.replace(
        dev, cpu=dataclasses.replace(dev.cpu, tile_gflops=slow)), 1)[0]
    assert cal.terms["compute"] > 1.5 * plain.terms["compute"]


def test_a_slice_that_overflows_its_level_is_not_reused_there():
    """A tile whose operand slice does not fit L1 (a convolution's whole window kept in
    registers) pays the register-level traffic from L2; the same tile with a fitting L1 slice
    does not."""
    fa = _matmul(64, 256, 4096)
    dev = device()

    def l2_term(l1_k):
        t = RTile(kind="tiled", axes=[a.name for a in fa.axes], extents=[64, 256, 4096],
                  axis_kinds="SSR", reg=[4, 64, 1], l1=[64, 64, l1_k], l2=[64, 256, l1_k],
                  vector_axis=1, vector_lanes=16, acc_level="reg")
        return predict_tiled(fa, dev, t).terms["L2"]

    # the 16 register tiles of an L1 tile share B's slice: 64 x 64 floats (16 KiB, half of
    # L1) is reused by all of them; 4096 x 64 (1 MiB) is read by each from L2
    assert l2_term(4096) > 4 * l2_term(64)


def test_accumulators_reloaded_per_reduction_chunk():
    fa = _matmul(256, 256, 1024)
    dev = device()

    def l1_term(chunk, acc_level):
        t = RTile(kind="tiled", axes=[a.name for a in fa.axes], extents=[256, 256, 1024],
                  axis_kinds="SSR", reg=[4, 64, 1], l1=[16, 64, chunk], l2=[128, 256, chunk],
                  vector_axis=1, vector_lanes=16, acc_level=acc_level)
        return predict_tiled(fa, dev, t).terms["L1"]

    assert l1_term(4, "task") > l1_term(256, "task")
    assert l1_term(4, "reg") < l1_term(4, "task")


def test_convolution_whose_filter_streams_gets_a_generic_tile():
    """A 3x3x3 conv3d over 512 channels (C3D:3): the convolution's own tile keeps the whole
    window (a 3.5 MiB filter slice) per register tile and would stream it from memory for every
    4 output rows; the micro-model ranks a reduction-chunked tile first and says why."""
    from tvm.s_tir.meta_schedule.testing import te_workload as W

    func = te.create_prim_func(W.conv3d_ndhwc(1, 16, 7, 7, 512, 512, 3, 1, 1))
    backend = backend_for(normalize_target("llvm"))
    fa = backend.analyze(func)
    tiles = backend.rule_for(fa).construct(fa, _calibrated(device()), 2)
    assert tiles[0].acc_level == "task" and tiles[1].acc_level == "reg"
    assert tiles[0].predicted_s < tiles[1].predicted_s
    assert any("generic tile is predicted" in n for n in tiles[1].notes)
