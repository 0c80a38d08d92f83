"""Row reductions over a row that is not a whole number of vectors (softmax over 197 or 1,214
columns): split into an aligned, vectorized main part and a tail that continues its fold
(``backends.cpu.reduction_split``), elementwise stages cut into whole vectors and one shorter
one. Compared with float64 references at 1, prime and odd sizes."""
from __future__ import annotations

import dataclasses
import re

import numpy as np
import pytest
import tvm
from tvm import s_tir, te, topi

import tvm_roller
from conftest import TARGET, assert_close, build_and_check, device, rand, run, softmax
from tvm_roller.backends.cpu.reduction_split import split_unaligned_reductions

_REDUCTIONS = {
    "sum": (lambda x: topi.sum(x, axis=-1), lambda a: a.sum(-1)),
    "max": (lambda x: topi.max(x, axis=-1), lambda a: a.max(-1)),
    "min": (lambda x: topi.min(x, axis=-1), lambda a: a.min(-1)),
    "prod": (lambda x: topi.prod(x, axis=-1), lambda a: a.prod(-1)),
}


@pytest.mark.parametrize("op", sorted(_REDUCTIONS))
@pytest.mark.parametrize("cols", [17, 37, 198])
def test_rewrite_alone_is_exact(op, cols):
    """The rewritten function, built by TVM's default lowering, computes the same fold."""
    x = te.placeholder((5, cols), "float32", name="x")
    make, ref = _REDUCTIONS[op]
    y = make(x)
    func = split_unaligned_reductions(te.create_prim_func([x, y]), 16)
    assert len(func.body.block.alloc_buffers) == 1  # the main part's buffer
    lib = tvm.compile(tvm.IRModule({"main": func}), target="llvm")
    a = rand((5, cols), seed=3)
    if op == "prod":
        a = (1.0 + 0.05 * a).astype("float32")  # a product of 198 values in range
    out = run(lib["main"], [a], y.shape, "float32")
    assert_close(out, ref(a.astype(np.float64)), 1e-5)


@pytest.mark.parametrize("cols", [1, 8, 16, 64])
def test_aligned_or_short_rows_unchanged(cols):
    x = te.placeholder((3, cols), "float32", name="x")
    func = te.create_prim_func([x, topi.sum(x, axis=-1)])
    assert split_unaligned_reductions(func, 16).same_as(func)


def test_symbolic_row_unchanged():
    n = te.var("n")
    x = te.placeholder((4, n), "float32", name="x")
    func = te.create_prim_func([x, topi.sum(x, axis=-1)])
    assert split_unaligned_reductions(func, 16).same_as(func)


@pytest.mark.parametrize("shape", [(12, 198, 198), (3, 1214), (2, 1500), (7, 17), (5, 1), (1, 31)])
def test_softmax_unaligned_rows(shape):
    x = te.placeholder(shape, "float32", name="x")
    build_and_check([x, topi.nn.softmax(x, axis=-1)], softmax)


@pytest.mark.parametrize("shape", [(197, 768), (13, 37), (1, 1)])
def test_layer_norm_unaligned_rows(shape):
    x = te.placeholder(shape, "float32", name="x")
    g = te.placeholder(shape[-1:], "float32", name="g")
    b = te.placeholder(shape[-1:], "float32", name="b")
    y = topi.nn.layer_norm(x, g, b, axis=[-1], epsilon=1e-5)

    def ref(a, gg, bb):
        mu = a.mean(-1, keepdims=True)
        return (a - mu) / np.sqrt(((a - mu) ** 2).mean(-1, keepdims=True) + 1e-5) * gg + bb

    build_and_check([x, g, b, y], ref)


def test_unaligned_softmax_is_vectorized():
    """Both reductions of a 198-wide softmax reach rfactor'ed vector lanes, and no stage keeps
    a predicated (scalarized) vector loop."""
    x = te.placeholder((12, 198, 198), "float32", name="x")
    func = te.create_prim_func([x, topi.nn.softmax(x, axis=-1)])
    sch = tvm_roller.schedule(func, TARGET, device=device())
    text = sch.mod.script()
    assert text.count("_main_rf") >= 4, text  # two rfactor'ed partial-sum buffers, each used
    assert "T.where" not in text, text


def test_traceable_schedule_replays_on_the_function():
    """With ``traceable`` (MetaSchedule records) the function is not rewritten: its trace
    replays on the function itself."""
    x = te.placeholder((6, 198), "float32", name="x")
    func = te.create_prim_func([x, topi.nn.softmax(x, axis=-1)])
    p = tvm_roller.planner.plan(func, TARGET, device=device())
    sch = tvm_roller.planner.apply(p, p.tiles[0], traceable=True)
    replay = s_tir.Schedule(p.analysis.func)  # the planned function (fast math applied)
    sch.trace.apply_to_schedule(replay, remove_postproc=False)
    tvm.ir.assert_structural_equal(replay.mod, sch.mod)


def test_int64_extents():
    """Relax's legalized functions index in int64: the split's bounds take that type."""
    x = te.placeholder((tvm.tirx.IntImm("int64", 3), tvm.tirx.IntImm("int64", 198)), "float32",
                       name="x")
    build_and_check([x, topi.nn.softmax(x, axis=-1)], softmax)


@pytest.mark.parametrize("rows,k,epilogue", [(1, 896, False), (97, 208, False),
                                             (4864 // 16, 96, True), (131, 64, True),
                                             (64, 4128, False), (11, 4880, True)])
def test_rows_of_dot_products_are_vectorized_and_exact(rows, k, epilogue):
    """y[n] = sum_k x[k] w[n, k] (a GEMV over a row-major matrix, alone or under an epilogue):
    each output element a row, its dot product through 16-lane partial sums: a row shorter
    than four pages read alone through two sets of partial sums (one sequential stream), a
    longer one beside the task's other rows through one."""
    import tvm
    from tvm import te

    from tvm_roller.planner import Context, ScheduleOptions, schedule_function

    x = te.placeholder((1, 1, k), name="x")
    w = te.placeholder((rows, k), name="w")
    r = te.reduce_axis((0, k), name="r")
    y = te.compute((1, 1, rows), lambda i, j, n: te.sum(x[i, j, r] * w[n, r], axis=r), name="y")
    outs = [y]
    if epilogue:
        outs = [te.compute((1, 1, rows), lambda i, j, n: te.sigmoid(y[i, j, n]) * y[i, j, n],
                           name="z")]
    func = te.create_prim_func([x, w, outs[0]])
    ctx = Context.make(TARGET, device())  # pinned: 16 float32 lanes
    res = schedule_function(func, ctx, "gemv", ScheduleOptions(), True)
    assert res.entry.status == "roller", res.entry.reason
    if rows * (k // 16) >= 2 and k % 16 == 0:
        assert "T.vectorized(16)" in res.kernel.script()
    if "y_rf[v_i, v_j, v_n, vr_1]" in res.kernel.script():  # as rows of dot products
        sums = 16 if k * 4 >= 4 * 4096 or k % 32 else 32
        assert f"y_rf = T.sblock_alloc_buffer((1, 1, {rows}, {sums}))" in res.kernel.script()
    rng = np.random.default_rng(rows)
    xs = rng.uniform(-1, 1, (1, 1, k)).astype("float32")
    ws = rng.uniform(-1, 1, (rows, k)).astype("float32")
    dev = tvm.cpu()
    got = tvm.runtime.tensor(np.zeros((1, 1, rows), "float32"), dev)
    lib = tvm.compile(tvm.IRModule({"main": res.kernel.with_attr("global_symbol", "main")}),
                      target=ctx.target)
    lib["main"](tvm.runtime.tensor(xs, dev), tvm.runtime.tensor(ws, dev), got)
    ref = xs[0, 0].astype("f8") @ ws.T.astype("f8")
    if epilogue:
        ref = ref / (1 + np.exp(-ref))
    np.testing.assert_allclose(got.numpy()[0, 0], ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("shape,groups", [((1, 64, 56, 56), 1), ((1, 6, 13, 17), 1),
                                          ((2, 8, 7, 9), 2), ((8, 16, 7, 32), 1),
                                          ((3, 6, 5, 7), 3)])
def test_group_norm_statistics_split_over_the_cores(shape, groups):
    """A group norm's two statistics (sum and sum of squares, one tuple reduction over
    C/G x H x W per group): over fewer groups than cores (PoolFormer's GroupNorm(1, C)) each
    reduction is split over the cores and vectorized, over more (a batch of 8) the groups run
    over the cores, each through vector partial sums, when the reduction is whole vectors; not
    one scalar loop. Exact against float64 at primes and odd sizes too."""
    from tvm import relax

    from tvm_roller.planner import Context, ScheduleOptions, schedule_function

    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType(shape, "float32"))
    g, b = (relax.Var(n, relax.TensorType((shape[1],), "float32")) for n in "gb")
    with bb.function("main", [x, g, b]):
        with bb.dataflow():
            y = bb.emit_output(relax.op.nn.group_norm(x, g, b, num_groups=groups,
                                                      channel_axis=1, axes=[2, 3]))
        bb.emit_func_output(y)
    mod = relax.transform.LegalizeOps()(bb.get())
    func = next(f for _, f in mod.functions_items() if isinstance(f, tvm.tirx.PrimFunc))
    dev = dataclasses.replace(device(), num_units=2)  # pinned: 2 cores, 16 float32 lanes
    res = schedule_function(func, Context.make(TARGET, dev), "group_norm", ScheduleOptions(),
                            True)
    assert res.entry.status == "roller", res.entry.reason
    per_group = shape[1] // groups * shape[2] * shape[3]
    script = res.kernel.script()
    rows = shape[0] * groups
    if rows < 2 and per_group % (2 * 16) == 0:
        assert "_rf_rf" in script and "T.parallel(T.int64(2))" in script
    elif rows >= 2 and per_group % 16 == 0:
        assert "x_red_temp_rf" in script and f"T.parallel(T.int64({rows}))" in script
    rng = np.random.default_rng(sum(shape))
    xs = rng.uniform(-1, 3, shape).astype("float32")
    gs, bs = (rng.uniform(0.5, 1.5, shape[1]).astype("float32") for _ in range(2))
    out = tvm.runtime.empty(shape, "float32", tvm.cpu())
    res.executable["main"](*(tvm.runtime.tensor(a) for a in (xs, gs, bs)), out)
    x64 = xs.astype("f8").reshape(shape[0], groups, -1)
    norm = (x64 - x64.mean(-1, keepdims=True)) / np.sqrt(x64.var(-1, keepdims=True) + 1e-5)
    ref = norm.reshape(shape) * gs[None, :, None, None] + bs[None, :, None, None]
    np.testing.assert_allclose(out.numpy(), ref, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("batch,rows,k", [(2, 97, 208), (3, 4864 // 16, 896), (8, 131, 64),
                                          (7, 64, 4128)])
def test_a_batch_of_dot_product_rows_shares_each_weight_row(batch, rows, k):
    """y[m, n] = sum_k x[m, k] w[n, k] for a few rows m (a decode step's sequences): the
    batch's loop inside the weight's rows (each weight row read from memory once for the
    whole batch), exact against float64."""
    from tvm_roller.planner import Context, ScheduleOptions, schedule_function

    x = te.placeholder((batch, k), name="x")
    w = te.placeholder((rows, k), name="w")
    r = te.reduce_axis((0, k), name="r")
    y = te.compute((batch, rows), lambda m, n: te.sum(x[m, r] * w[n, r], axis=r), name="y")
    func = te.create_prim_func([x, w, y])
    ctx = Context.make(TARGET, device())
    res = schedule_function(func, ctx, "batched_gemv", ScheduleOptions(), True)
    assert res.entry.status == "roller", res.entry.reason
    script = res.kernel.script()
    if "y_rf" in script:  # as rows of dot products: the weight's rows outside the batch's
        # (fused before them, or the tasks over the weight's rows and the batch under each)
        assert "m_n_fused" not in script
        assert "n_m_fused" in script or re.search(r"for n\w* in T\.parallel", script)
    rng = np.random.default_rng(batch * rows)
    xs = rng.uniform(-1, 1, (batch, k)).astype("float32")
    ws = rng.uniform(-1, 1, (rows, k)).astype("float32")
    dev = tvm.cpu()
    got = tvm.runtime.tensor(np.zeros((batch, rows), "float32"), dev)
    lib = tvm.compile(tvm.IRModule({"main": res.kernel.with_attr("global_symbol", "main")}),
                      target=ctx.target)
    lib["main"](tvm.runtime.tensor(xs, dev), tvm.runtime.tensor(ws, dev), got)
    # a float32 sum of k products: its rounding grows as sqrt(k)
    np.testing.assert_allclose(got.numpy(), xs.astype("f8") @ ws.T.astype("f8"), rtol=1e-5,
                               atol=1e-5 * max(1.0, np.sqrt(k / 256)))
