"""Every report entry carries its roofline bound, and the bound is what its definition says; the
kernel's loop-nest facts (``analysis.kernel_facts``) say what the bound does not see."""
from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import relax, te

import tvm_roller.relax as rr
from tvm_roller.analysis.kernel_facts import kernel_facts
from tvm_roller.planner.context import Context
from tvm_roller.planner.scheduling import schedule_function

from conftest import TARGET, device


@pytest.fixture(scope="module")
def ctx():
    return Context.make(TARGET, device())


def _gemm(n, m, k):
    a, b = te.placeholder((n, k), name="A"), te.placeholder((k, m), name="B")
    r = te.reduce_axis((0, k), "r")
    c = te.compute((n, m), lambda i, j: te.sum(a[i, r] * b[r, j], axis=r), name="C")
    return te.create_prim_func([a, b, c])


@pytest.mark.parametrize("n,m,k", [(1, 67, 13), (97, 61, 53), (256, 256, 256)])
def test_gemm_bound_is_flops_or_bytes(ctx, n, m, k):
    e = schedule_function(_gemm(n, m, k), ctx).entry
    dev = ctx.device
    flops_s = 2 * n * m * k / (dev.peak_gflops["float32"] * 1e9)
    nbytes = 4 * (n * k + k * m + n * m)
    level = next(lv for lv in dev.levels
                 if lv.capacity_bytes * (1 if lv.shared else dev.num_units) >= nbytes)
    bytes_s = nbytes / (level.bandwidth_gbs * (1 if level.shared else dev.num_units) * 1e9)
    assert e.bound_s == pytest.approx(max(flops_s, bytes_s), rel=1e-9)
    assert e.bound_by == ("compute" if flops_s >= bytes_s else level.name)
    # the model's prediction is for a real kernel: never under the bound, and not absurd (a
    # launch's fixed microseconds on top of work near the bound)
    assert e.bound_s <= e.predicted_s * (1 + 1e-6) < 50 * e.bound_s + 20e-6
    # (1×67×13 is planned as 64 + 3 columns, each too small to run on two cores)
    assert e.facts["parallel_regions"] >= (n * m * k > 10_000) and e.facts["vector_lanes"] >= 1
    # a multiply-add is two operations: the arithmetic at the peak is the FLOP bound (padding
    # adds what the padded register tile computes)
    assert e.facts["arith_ops"] >= 2 * n * m * k
    assert e.facts["arith_s"] == pytest.approx(e.facts["arith_ops"] / (dev.peak_gflops["float32"]
                                                                      * 1e9))


def test_fallback_entries_carry_a_bound_too(ctx):
    a = te.placeholder((37,), name="A")
    idx = te.placeholder((11,), "int32", name="idx")
    k = te.reduce_axis((0, 11), "k")  # a reduction over gathered values: roller declines it
    s = te.compute((1,), lambda i: te.sum(a[idx[k]], axis=k), name="S")
    e = schedule_function(te.create_prim_func([a, idx, s]), ctx).entry
    assert e.status == "fallback" and e.fallback == "decline"
    assert e.bound_s == pytest.approx((37 + 11 + 1) * 4 / (
        ctx.device.levels[0].bandwidth_gbs * ctx.device.num_units * 1e9), rel=1e-9)


def _scheduled(ctx, *tensors):
    return schedule_function(te.create_prim_func(list(tensors)), ctx).kernel


def test_facts_tell_strided_gathered_and_contiguous(ctx):
    x = te.placeholder((33, 65), name="X")
    t = te.compute((65, 33), lambda i, j: x[j, i], name="T")  # a transpose: one side strided
    facts = kernel_facts(_scheduled(ctx, x, t))
    assert facts.strided and max(facts.strided.values()) in (33, 65)
    idx, emb = te.placeholder((7,), "int64", name="I"), te.placeholder((101, 33), name="E")
    g = te.compute((7, 33), lambda i, j: emb[idx[i], j], name="G")
    assert kernel_facts(_scheduled(ctx, idx, emb, g)).gathers == ["E"]
    h = te.placeholder((128, 12, 64), name="H")  # head split: 64-element runs stay contiguous
    s = te.compute((12, 128, 64), lambda a, b, c: h[b, a, c], name="S")
    facts = kernel_facts(_scheduled(ctx, h, s))
    assert not facts.strided and facts.vector_lanes >= 8 and facts.parallel_regions == 1


def test_relax_report_numbers_present_and_plausible():
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((31, 64), "float32"))
    w = relax.Var("w", relax.TensorType((64, 47), "float32"))
    with bb.function("main", [x, w]):
        with bb.dataflow():
            y = bb.emit(relax.op.nn.gelu(relax.op.matmul(x, w)))
            z = bb.emit_output(relax.op.nn.softmax(y, axis=-1))
        bb.emit_func_output(z)
    report: list = []
    ex = rr.compile(bb.get(), TARGET, report)
    assert report and all(e["bound_s"] and e["bound_s"] > 0 and e["bound_by"] for e in report)
    for e in report:
        if e["status"] == "roller":
            assert e["bound_s"] <= e["predicted_s"] * (1 + 1e-6) and e["facts"]
    rng = np.random.default_rng(0)
    xs, ws = rng.standard_normal((31, 64)), rng.standard_normal((64, 47))
    vm = relax.VirtualMachine(ex, tvm.cpu())
    got = vm["main"](tvm.runtime.tensor(xs.astype("float32")),
                     tvm.runtime.tensor(ws.astype("float32"))).numpy()
    h = xs @ ws
    g = 0.5 * h * (1 + np.vectorize(__import__("math").erf)(h / np.sqrt(2)))
    ref = np.exp(g - g.max(-1, keepdims=True))
    np.testing.assert_allclose(got, ref / ref.sum(-1, keepdims=True), rtol=1e-4, atol=1e-6)
