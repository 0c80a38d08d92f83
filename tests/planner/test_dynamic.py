"""Functions with symbolic extents (``tvm_roller.planner.buckets``): one compile serves every value of
the shape variables, each bucket's kernel matches a float64 reference (sizes 1, primes, odd,
at and above the bounds), the buckets follow the bounds or the user, and what cannot be
planned is a typed decline."""
from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import te, topi

import tvm_roller
from tvm_roller.planner import Context
from tvm_roller.planner import buckets as dynamic
from tvm_roller.analysis import symbolic
from tvm_roller.core.errors import UnsupportedError
from tvm_roller.core.rtile import worst_padding_waste

from conftest import F32_TOL_LONG, TARGET, device, rand, rel_err, run


def _matmul(k: int = 64, m: int = 48):
    n = te.var("n", "int64")
    A = te.placeholder((n, k), "float32", "A")
    B = te.placeholder((k, m), "float32", "B")
    r = te.reduce_axis((0, k), "r")
    C = te.compute((n, m), lambda i, j: te.sum(A[i, r] * B[r, j], axis=r), name="C")
    return te.create_prim_func([A, B, C])


def test_buckets_follow_the_bounds_and_the_user():
    assert dynamic.default_buckets(1, 512) == [1, 2, 4, 8, 16, 32, 64, 128, 256, 512]
    assert dynamic.default_buckets(5, 100) == [8, 16, 32, 64, 100]
    grid = dynamic.bucket_grid(["n"], {"n": (1, 2 ** 20)})
    assert len(grid["n"]) <= dynamic.MAX_BUCKETS and grid["n"][-1] == 2 ** 20
    assert dynamic.bucket_grid(["n"], {"n": (1, 512)}, {"n": [300, 64]})["n"] == [64, 300]
    two = dynamic.bucket_grid(["b", "n"], {"b": (1, 64), "n": (1, 4096)})
    assert len(two["b"]) * len(two["n"]) <= dynamic.MAX_BUCKETS
    with pytest.raises(ValueError):
        dynamic.bucket_grid(["n"], {"n": (1, 8)}, {"n": [0]})


def test_worst_padding_waste_over_a_bucket():
    assert worst_padding_waste(257, 512, 256) == pytest.approx(255 / 257)  # 257 -> 512
    assert worst_padding_waste(257, 512, 16) == pytest.approx(15 / 257)  # 257 -> 272
    assert worst_padding_waste(300, 300, 100) == 0.0
    assert worst_padding_waste(1, 1, 1) == 0.0


def test_bucket_task_tiles_weigh_the_run_time_padding():
    """The task tile along the dynamic rows is chosen with the padding it costs anywhere in
    the bucket counted in the prediction (the static policy's 256-row task tile at 512 rows
    would double the work at 257), and a default bucket that still pads too much is split,
    within the bucket budget; the user's buckets are kept as given."""
    dp = dynamic.plan_dynamic(_matmul(768, 768), Context.make(TARGET, device()), bounds={"n": (1, 512)})
    tiles = [c.plan.tiles[0] for c in dp.cases]
    assert all(any("bucket padding" in n for n in t.notes) for t in tiles)
    assert tiles[-1].bucket_waste <= 0.5
    big = dp.cases[-1].plan.analysis
    assert worst_padding_waste(big.dynamic_low[0], big.axes[0].extent, tiles[-1].l2[0]) \
        == pytest.approx(tiles[-1].bucket_waste)
    # refined until the budget is spent or every bucket pads little
    assert len(dp.cases) <= dynamic.MAX_BUCKETS
    planned = dynamic.plan_dynamic(_matmul(768, 768), Context.make(TARGET, device()),
                                   bounds={"n": (1, 512)}, buckets={"n": [16, 512]})
    # the given buckets as given (fewer kernels, a shorter compile: the user's choice)
    assert [c.ranges[0][1:] for c in planned.cases] == [(0, 16), (16, None)]
    assert all(any("bucket padding" in n for n in c.plan.tiles[0].notes) for c in planned.cases)


def test_specialize_evaluates_shapes_and_binds_scalars():
    f = _matmul()
    assert list(symbolic.shape_vars(f)) == ["n"]
    g = symbolic.specialize(f, {"n": 7})
    assert [int(d) for d in g.params[0].shape] == [7, 64]
    assert not symbolic.is_symbolic(g)
    with pytest.raises(UnsupportedError, match="no value"):
        symbolic.specialize(f, {})


@pytest.mark.parametrize("sizes", [(1, 2, 7, 13, 64, 97, 200, 211)])
def test_dynamic_matmul_matches_float64_at_every_size(sizes):
    f = _matmul()
    dp = dynamic.plan_dynamic(f, Context.make(TARGET, device()), bounds={"n": (1, 200)})
    assert len(dp.cases) > 1 and dp.cases[-1].ranges[-1][2] is None
    # the kernels pad the dynamic rows to their task tile
    assert all(c.plan.analysis.dynamic_axes == (0,) for c in dp.cases)
    lib = tvm_roller.build(f, TARGET, device=device(), bounds={"n": (1, 200)})
    for n in sizes:  # 211: above the bound (the last bucket's kernel takes it)
        a, b = rand((n, 64), seed=n), rand((64, 48), seed=n + 1)
        out = run(lib, [a, b], (n, 48), "float32")
        assert rel_err(out, a.astype("float64") @ b) < F32_TOL_LONG, n


def _i64(v: int):
    return tvm.tirx.IntImm("int64", v)


def test_dynamic_reduction_and_vector_axes():
    """Attention's two matmuls: the sequence is the vector axis of Q.K^T and the reduction
    axis of P.V (zero-padded to the K chunk). Every extent int64, as Relax writes them (a task
    that fuses an int32 batch axis with int64 symbolic ones trips TVM's region analysis)."""
    n, b3, d = te.var("n", "int64"), _i64(3), _i64(16)
    Q = te.placeholder((b3, n, d), "float32", "Q")
    K = te.placeholder((b3, d, n), "float32", "K")
    r = te.reduce_axis((_i64(0), d), "r")
    S = te.compute((b3, n, n), lambda b, i, j: te.sum(Q[b, i, r] * K[b, r, j], axis=r), "S")
    P = te.placeholder((b3, n, n), "float32", "P")
    V = te.placeholder((b3, n, d), "float32", "V")
    k = te.reduce_axis((_i64(0), n), "k")
    O = te.compute((b3, n, d), lambda b, i, j: te.sum(P[b, i, k] * V[b, k, j], axis=k), "O")
    scores = tvm_roller.build(te.create_prim_func([Q, K, S]), TARGET, device=device(),
                              bounds={"n": (1, 128)})
    mix = tvm_roller.build(te.create_prim_func([P, V, O]), TARGET, device=device(),
                           bounds={"n": (1, 128)})
    for size in (1, 5, 31, 64, 127):
        q, kt = rand((3, size, 16), seed=size), rand((3, 16, size), seed=size + 1)
        out = run(scores, [q, kt], (3, size, size), "float32")
        assert rel_err(out, np.matmul(q.astype("float64"), kt)) < F32_TOL_LONG, size
        p, v = rand((3, size, size), seed=size + 2), rand((3, size, 16), seed=size + 3)
        out = run(mix, [p, v], (3, size, 16), "float32")
        assert rel_err(out, np.matmul(p.astype("float64"), v)) < F32_TOL_LONG, size


def test_dynamic_softmax_over_the_dynamic_axis():
    """Attention's scale, mask and softmax over the dynamic key axis: the reductions over a
    symbolic extent stay correct at sizes no vector width divides (their lanes vectorized
    through rfactor would not be)."""
    n = te.var("n", "int64")
    X = te.placeholder((_i64(2), n, n), "float32", "X")
    M = te.placeholder((_i64(1), n, n), "float32", "M")
    Y = te.compute((_i64(2), n, n), lambda b, i, j: X[b, i, j] * 0.125 + M[0, i, j], name="Y")
    Z = topi.nn.softmax(Y, axis=-1)
    lib = tvm_roller.build(te.create_prim_func([X, M, Z]), TARGET, device=device(),
                           bounds={"n": (1, 320)})
    assert dynamic.representative(64) == 61 and dynamic.representative(2) == 2
    for size in (1, 3, 17, 64, 70, 300, 331):
        x, m = rand((2, size, size), seed=size) * 4, rand((1, size, size), seed=size + 1)
        out = run(lib, [x, m], (2, size, size), "float32")
        y = x.astype("float64") * 0.125 + m
        e = np.exp(y - y.max(-1, keepdims=True))
        assert rel_err(out, e / e.sum(-1, keepdims=True)) < F32_TOL_LONG, size


def test_two_shape_variables():
    b, n = te.var("b", "int64"), te.var("n", "int64")
    X = te.placeholder((b, n, 32), "float32", "X")
    W = te.placeholder((32, 40), "float32", "W")
    r = te.reduce_axis((0, 32), "r")
    Y = te.compute((b, n, 40), lambda i, j, c: te.sum(X[i, j, r] * W[r, c], axis=r), "Y")
    f = te.create_prim_func([X, W, Y])
    dp = dynamic.plan_dynamic(f, Context.make(TARGET, device()), bounds={"b": (1, 4), "n": (1, 64)})
    assert set(dp.variables) == {"b", "n"} and len(dp.cases) <= dynamic.MAX_BUCKETS
    lib = tvm_roller.build(f, TARGET, device=device(), bounds={"b": (1, 4), "n": (1, 64)})
    for bb, nn in ((1, 1), (3, 7), (4, 64), (2, 33)):
        x, w = rand((bb, nn, 32), seed=bb * nn), rand((32, 40), seed=1)
        out = run(lib, [x, w], (bb, nn, 40), "float32")
        assert rel_err(out, x.astype("float64") @ w) < F32_TOL_LONG, (bb, nn)


def test_explain_lists_the_buckets_and_an_unbounded_variable():
    text = tvm_roller.explain(_matmul(), TARGET, device())
    assert "kernel(s), dispatched on the values at run time" in text
    assert "no upper bound" in text and "n >= " in text
    assert "largest bucket" in text


def test_a_variable_only_inside_expressions_is_a_typed_decline():
    n = te.var("n", "int64")
    X = te.placeholder((n + 1, 8), "float32", "X")
    Y = te.compute((n + 1, 8), lambda i, j: X[i, j] * 2.0, name="Y")
    f = te.create_prim_func([X, Y])
    with pytest.raises(UnsupportedError, match="only inside shape expressions"):
        dynamic.plan_dynamic(f, Context.make(TARGET, device()))
    # (TVM's own build cannot define n either: there is nothing to fall back to)


def test_a_static_function_still_goes_through_the_static_planner():
    A = te.placeholder((5, 7), "float32", "A")
    B = te.compute((5, 7), lambda i, j: A[i, j] + 1.0, name="B")
    f = te.create_prim_func([A, B])
    with pytest.raises(ValueError, match="static shapes"):
        dynamic.plan_dynamic(f, Context.make(TARGET, device()))
    lib = tvm_roller.build(f, TARGET, device=device())
    a = rand((5, 7))
    assert rel_err(run(lib, [a], (5, 7), "float32"), a.astype("float64") + 1) < 1e-6


def test_partial_sums_over_a_symbolic_extent_are_refused():
    """The guard behind the representative sizes: a softmax recorded where the key axis is a
    multiple of the vector width vectorizes its sums through rfactor, which over the symbolic
    axis would sum past its end (TVM drops the split's predicate): the replay refuses it."""
    from tvm import s_tir

    from tvm_roller.analysis.schedule import plain_splits
    from tvm_roller.planner import lower

    n = te.var("n", "int64")
    X = te.placeholder((_i64(4), n, n), "float32", "X")
    f = te.create_prim_func([X, topi.nn.softmax(X, axis=-1)])
    dp = dynamic.plan_dynamic(f, Context.make(TARGET, device()), bounds={"n": (1, 256)})
    case = dp.cases[-1]
    with plain_splits():  # recorded at the planned 256 itself, not at a representative
        trace = lower(case.plan, case.plan.tiles[0], traceable=True).schedule.trace
    sch = s_tir.Schedule(case.plan.backend.scheduling_form(f))
    trace.apply_to_schedule(sch, remove_postproc=False)
    with pytest.raises(UnsupportedError, match="partial sums"):
        dynamic._refuse_symbolic_partial_sums(sch, case)
