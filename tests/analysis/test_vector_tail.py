"""A product whose vector axis is not a whole number of vectors is planned as two parts (whole
vectors, tail) that read their inputs in place: which functions are taken, and the built result
against a float64 reference on random data (GEMVs, GEMMs, a batch product, a MetaSchedule record
planned whole)."""
from __future__ import annotations

import numpy as np
import pytest
from tvm import te, topi

import tvm_roller
from tvm_roller.analysis import vector_tail
from tvm_roller.planner.context import Context
from tvm_roller.planner.scheduling import schedule_candidates

from conftest import F32_TOL_LONG, TARGET, assert_close, device, rand, run

LANES = 16  # skylake-avx512's float32 lanes (``TARGET``)


def _matmul(m, n, k, transposed_b=False, batch=None, dtype="float32"):
    lead = (batch,) if batch else ()
    a = te.placeholder(lead + (m, k), dtype, name="A")
    b = te.placeholder((n, k) if transposed_b else (k, n), dtype, name="B")
    r = te.reduce_axis((0, k), "k")

    def prod(*ix):
        i, j = ix[-2:]
        return te.sum(a[ix[:-2] + (i, r)].astype("float32") *
                      (b[j, r] if transposed_b else b[r, j]).astype("float32"), axis=r)
    c = te.compute(lead + (m, n), prod, name="C")
    return [a, b, c]


def _func(tensors):
    return te.create_prim_func(tensors).with_attr("global_symbol", "main")


def test_split_into_whole_vectors_and_tail():
    dec = vector_tail.decompose(_func(_matmul(3, 37, 7)), LANES)
    assert dec is not None and dec.kind == "vector tail"
    assert [lb.split()[1] for lb in dec.labels] == ["0:32", "32:37"] and len(dec.groups) == 2
    assert "32 in whole 16-lane vectors + a 5-column tail" in dec.reason


@pytest.mark.parametrize("why,func", [
    ("whole vectors", _func(_matmul(3, 48, 7))),
    ("shorter than a vector", _func(_matmul(3, 13, 7))),
    ("bf16 operands (packed anyway)", _func(_matmul(3, 37, 7, dtype="bfloat16"))),
    ("B stored (N, K): not vectorized along N", _func(_matmul(3, 37, 7, transposed_b=True))),
    ("a constant B", _func(_matmul(3, 37, 7)).with_attr("layout_free_buffers", [1])),
    ("a bias epilogue (two blocks)", te.create_prim_func(
        [*(t := _matmul(3, 37, 7))[:2], topi.add(t[2], 1.0)])),
])
def test_not_taken(why, func):
    assert vector_tail.decompose(func, LANES) is None, why


def test_row_reduction_not_taken():
    """No input reused along the axis: a reduction that streams, nothing is padded."""
    x = te.placeholder((5, 37), name="x")
    k = te.reduce_axis((0, 5), "k")
    y = te.compute((37,), lambda j: te.sum(x[k, j], axis=k), name="y")
    assert vector_tail.decompose(te.create_prim_func([x, y]), LANES) is None


@pytest.mark.parametrize("m,n,k,transposed_b,batch", [
    (1, 257, 131, False, None),   # a GEMV: 256 + 1
    (1, 3001, 61, False, None),   # a prime N
    (37, 53, 131, False, None),   # every axis odd: M is padded, the output cropped per part
    (13, 19, 17, False, 3),       # a batch
])
def test_parts_match_float64(m, n, k, transposed_b, batch):
    ts = _matmul(m, n, k, transposed_b, batch)
    func = _func(ts)
    plan = tvm_roller.plan(func, TARGET, device=device())
    assert len(plan.parts) == 2, "planned whole"
    head, tail = (p.analysis.axes[p.analysis.vector_axis].extent for p in plan.parts)
    assert head % LANES == 0 and tail < LANES and head + tail == n
    a, b = rand([int(s) for s in ts[0].shape], seed=1), rand([int(s) for s in ts[1].shape], seed=2)
    bt = b.astype(np.float64).T if transposed_b else b.astype(np.float64)
    ref = a.astype(np.float64) @ bt
    lib = tvm_roller.build(func, TARGET, device=device())
    assert_close(run(lib, [a, b], ref.shape, "float32"), ref, F32_TOL_LONG)


def test_explain_shows_each_part():
    text = tvm_roller.explain(_func(_matmul(1, 257, 131)), TARGET, device=device())
    assert "256 in whole 16-lane vectors + a 1-column tail" in text
    assert " 0:256" in text and " 256:257" in text


def test_meta_schedule_record_plans_the_function_whole():
    func = _func(_matmul(7, 37, 19))
    found = schedule_candidates(func, Context.make(TARGET, device()), topk=1)
    assert found.schedules and found.error is None, found.entry.reason
