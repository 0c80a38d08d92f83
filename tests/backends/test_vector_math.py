"""roller's own vector exp / erf / tanh / sigmoid (backends/vector_math.py) in the CPU
lowering: float32 accuracy against float64 over the whole range (1e-6 relative wherever the
true value is a normal float32, with overflow, underflow, ±0, ±inf and NaN), kernels without
libm calls, softmax / GELU / SiLU / tanh built by ``tvm_roller.build`` against float64 numpy,
the analysis unchanged by the rewrite, and other dtypes left alone."""
from __future__ import annotations

import math
import re
import warnings

import numpy as np
import pytest
import tvm
from tvm import te, tirx, topi

import tvm_roller
from tvm_roller import planner
from tvm_roller.analysis.schedule import block_names
from tvm_roller.backends.vector_math import rewrite_vector_math
from tvm_roller.core.errors import FallbackWarning
from conftest import TARGET, device, rand, run

_F32_MAX = float(np.finfo(np.float32).max)
_F32_TINY = float(np.finfo(np.float32).tiny)  # smallest normal
_N = 1 << 15
_VECTOR_FMA = re.compile(r"vfn?madd\d+ps\s+[^\n]*%[yz]mm")
_LIBM_CALL = re.compile(r"call [^\n]*@(llvm\.)?(exp|expf|tanh|tanhf|erf|erff)(\.|\()")


def _erf64(v):
    return np.vectorize(math.erf, otypes=[np.float64])(v)


def _sigmoid64(v):
    with np.errstate(over="ignore"):
        return np.where(v >= 0, 1.0 / (1.0 + np.exp(-np.abs(v))),
                        np.exp(-np.abs(v)) / (1.0 + np.exp(-np.abs(v))))


_FUNCS = {  # name: (te op, float64 reference, ranges: (lo, hi, log-uniform magnitudes))
    "exp": (te.exp, np.exp, [(1e-30, 1e-3, True), (1e-3, 88.0, True), (-10.0, 10.0, False),
                             (-87.3, -80.0, False), (80.0, 88.72, False), (-110.0, -87.0, False),
                             (88.7, 90.0, False)]),
    "tanh": (te.tanh, np.tanh, [(1e-38, 1e-3, True), (1e-3, 0.7, True), (0.55, 0.7, False),
                                (-4.0, 4.0, False), (0.7, 30.0, True), (30.0, 3e38, True)]),
    "sigmoid": (te.sigmoid, _sigmoid64, [(1e-30, 1e-3, True), (-10.0, 10.0, False),
                                         (-87.3, -20.0, False), (1e-3, 100.0, True),
                                         (-120.0, -87.0, False), (100.0, 3e38, True)]),
    "erf": (te.erf, _erf64, [(1e-37, 1e-3, True), (1e-3, 6.0, True), (-5.0, 5.0, False),
                             (0.2, 0.8, False), (3.0, 4.5, False), (6.0, 3e38, True)]),
}
_SPECIALS = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1e-45, -1e-45, 88.72, 88.7229, 89.0,
                      -87.33, -103.0, -104.0, -200.0, 3e38, -3e38], np.float32)


def _samples(lo, hi, log, rng):
    if log:  # magnitudes log-uniform in [lo, hi], both signs
        m = np.exp(rng.uniform(math.log(lo), math.log(hi), _N // 2))
        return np.concatenate([m, -m]).astype(np.float32)
    return rng.uniform(lo, hi, _N).astype(np.float32)


def _max_rel_normal(out, ref) -> float:
    """Max relative error where the true value is a normal float32 (and finite)."""
    ok = (np.abs(ref) >= _F32_TINY) & (np.abs(ref) <= _F32_MAX)
    assert ok.any()
    return float(np.max(np.abs(out[ok].astype(np.float64) - ref[ok]) / np.abs(ref[ok])))


def _elementwise(fn, shape, dtype="float32"):
    A = te.placeholder(shape, dtype, name="A")
    B = te.compute(shape, lambda *i: fn(A(*i)), name="B")
    return te.create_prim_func([A, B])


@pytest.fixture(scope="module")
def kernels():
    """One roller-built elementwise kernel per function (built once for the module)."""
    return {name: tvm_roller.build(_elementwise(op, (_N,)), TARGET, device=device())
            for name, (op, _, _) in _FUNCS.items()}


@pytest.mark.parametrize("name", sorted(_FUNCS))
def test_accuracy_over_the_float32_range(kernels, name):
    _, ref, ranges = _FUNCS[name]
    rng = np.random.default_rng(7)
    for lo, hi, log in ranges:
        x = _samples(lo, hi, log, rng)
        out = run(kernels[name], [x], (_N,), "float32")
        with np.errstate(over="ignore", under="ignore"):
            truth = ref(x.astype(np.float64))
        err = _max_rel_normal(out, truth)
        assert err <= 1e-6, f"{name} on [{lo}, {hi}]: max relative error {err:.3g}"
        # where the truth overflows the result is inf; where it is below half the smallest
        # subnormal the result is 0 (with the right sign)
        big = np.abs(truth) > _F32_MAX * (1 + 2 ** -24)
        assert np.all(np.isinf(out[big]) & (np.sign(out[big]) == np.sign(truth[big])))
        tiny = np.abs(truth) < 2.0 ** -150
        assert np.all(out[tiny] == 0.0)


@pytest.mark.parametrize("name", sorted(_FUNCS))
def test_special_values(kernels, name):
    _, ref, _ = _FUNCS[name]
    x = np.resize(_SPECIALS, _N)
    out = run(kernels[name], [x], (_N,), "float32")[:len(_SPECIALS)]
    with np.errstate(all="ignore"):
        truth = ref(_SPECIALS.astype(np.float64))
    for xi, o, t in zip(_SPECIALS, out, truth):
        if np.isnan(t):
            assert np.isnan(o), (name, xi, o)
        elif np.isinf(t) or abs(t) > _F32_MAX:
            assert o == t if np.isinf(t) else np.isinf(o), (name, xi, o, t)
        elif abs(t) < _F32_TINY:  # subnormal results: within one subnormal step
            assert abs(float(o) - t) <= 2.0 ** -149, (name, xi, o, t)
        else:
            assert abs(float(o) - t) <= 1e-6 * abs(t), (name, xi, o, t)
        if t == 0.0 and np.isfinite(xi) and name != "exp":  # odd functions keep the sign of -0
            assert np.signbit(o) == np.signbit(t) or name == "sigmoid", (name, xi, o)


@pytest.mark.parametrize("name", sorted(_FUNCS))
def test_no_libm_calls_and_vector_code(kernels, name):
    ex = kernels[name]
    ll = ex.mod.inspect_source("ll")
    assert not _LIBM_CALL.search(ll), _LIBM_CALL.search(ll).group(0)
    # the polynomial runs on whole vectors (skylake-avx512 prefers 256-bit ones)
    assert _VECTOR_FMA.search(ex.mod.inspect_source("asm"))


@pytest.mark.parametrize("name", sorted(_FUNCS))
def test_tvm_vectorizes_the_expressions_itself(name):
    """TVM's VectorizeLoop keeps the vectorized loop whole (it scalarizes a loop holding an op
    it cannot vectorize, e.g. ``T.isnan``, leaving it to LLVM's loop vectorizer or to none)."""
    from tvm import s_tir

    sch = s_tir.Schedule(rewrite_vector_math(_elementwise(_FUNCS[name][0], (64,))))
    _, inner = sch.split(sch.get_loops(sch.get_sblock("B"))[0], [None, 16])
    sch.vectorize(inner)
    lower = tvm.ir.transform.Sequential([
        s_tir.transform.LowerInitBlock(), s_tir.transform.ConvertBlocksToOpaque(),
        s_tir.transform.LowerOpaqueBlock(), tirx.transform.FlattenBuffer(),
        tirx.transform.VectorizeLoop(True)])
    text = lower(sch.mod).script()
    assert "T.Ramp" in text and "_s in" not in text, text


def test_unrewritten_kernel_calls_libm():
    """The check above can see a libm call: the plain TVM build of exp has one."""
    ex = tvm.compile(tvm.IRModule({"main": _elementwise(te.exp, (64,))}), TARGET)
    assert _LIBM_CALL.search(ex.mod.inspect_source("ll"))


# -- roller's kernels ----------------------------------------------------------------------------
def _softmax64(a):
    e = np.exp(a - a.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def _assert_rel(out, ref, tol=1e-5, pointwise=True):
    """Max relative error per element (``pointwise``) or over the largest magnitude."""
    diff = np.abs(out.astype(np.float64) - ref)
    err = np.max(diff / np.maximum(np.abs(ref), _F32_TINY)) if pointwise else \
        np.max(diff) / np.max(np.abs(ref))
    assert err <= tol, err


@pytest.mark.parametrize("shape", [(1, 1), (1, 13), (7, 97), (13, 1), (97, 7), (3, 256),
                                   (64, 128), (2, 5, 33)])
def test_softmax_builds_accurate_without_libm(shape):
    A = te.placeholder(shape, "float32", name="A")
    func = te.create_prim_func([A, topi.nn.softmax(A, axis=-1)])
    ex = tvm_roller.build(func, TARGET, device=device())
    x = rand(shape, seed=3) * 20.0  # a range where exp's relative accuracy matters
    _assert_rel(run(ex, [x], shape, "float32"), _softmax64(x.astype(np.float64)))
    assert not _LIBM_CALL.search(ex.mod.inspect_source("ll"))


@pytest.mark.parametrize("idx", [0, 1])
def test_suite_softmax(idx):
    from tvm_roller.tools.suite import workloads as W

    func = W.create("SFM", idx)
    p = planner.plan(func, TARGET, device=device())
    assert (p.analysis.kind, p.rule.name) == ("reduction", "streaming")  # unchanged by rewrite
    ex = tvm_roller.build(func, TARGET, device=device())
    (shape, _), _ = W.arg_specs(func)
    x = rand(shape, seed=1) * 10.0
    _assert_rel(run(ex, [x], shape, "float32"), _softmax64(x.astype(np.float64)))
    assert not _LIBM_CALL.search(ex.mod.inspect_source("ll"))
    # the max and sum reductions run on whole vectors too: their partial (rfactor) blocks keep
    # a vectorized lane loop under the row loop, over a contiguous buffer of partial results
    sch = planner.apply(p, p.tiles[0])
    rf = [n for n in block_names(sch) if n.endswith("_rf")]
    assert sorted(rf) == ["T_softmax_expsum_rf", "T_softmax_maxelem_rf"], rf
    for name in rf:
        blk = sch.get_sblock(name)
        assert int(sch.get(sch.get_loops(blk)[-1]).kind) == 2, name  # ForKind.VECTORIZED
        lane = [iv.var for iv in sch.get(blk).iter_vars
                if iv.iter_type == 0 and int(iv.dom.extent) == p.tiles[0].vector_lanes]
        assert len(lane) == 1 and sch.get(blk).body.indices[-1].same_as(lane[0]), name


def _gelu_erf(v):
    return 0.5 * v * (1.0 + te.erf(v * 0.7071067811865476))


def _gelu_tanh(v):
    return 0.5 * v * (1.0 + te.tanh(0.7978845608028654 * (v + 0.044715 * v * v * v)))


# GELU's 1 + erf(x / sqrt 2) (or 1 + tanh) cancels for x << 0: even a correctly rounded float32
# erf leaves only a few correct digits there, so GELU is compared over its largest magnitude
_EPILOGUES = {
    "gelu_erf": (_gelu_erf, lambda a: 0.5 * a * (1.0 + _erf64(a / math.sqrt(2.0)))),
    "gelu_tanh": (_gelu_tanh, lambda a: 0.5 * a * (1.0 + np.tanh(
        0.7978845608028654 * (a + 0.044715 * a ** 3)))),
    "silu": (lambda v: v * te.sigmoid(v), lambda a: a * _sigmoid64(a)),
    "sigmoid": (te.sigmoid, _sigmoid64),
    "tanh": (te.tanh, np.tanh),
}


@pytest.mark.parametrize("shape", [(1,), (7,), (13, 97), (97, 13), (3, 7, 5)])
@pytest.mark.parametrize("name", sorted(_EPILOGUES))
def test_elementwise_builds_accurate(name, shape):
    fn, ref = _EPILOGUES[name]
    func = _elementwise(fn, shape)
    assert planner.plan(func, TARGET, device=device()).analysis.kind == "elementwise"
    ex = tvm_roller.build(func, TARGET, device=device())
    x = rand(shape, seed=5) * 4.0
    _assert_rel(run(ex, [x], shape, "float32"), ref(x.astype(np.float64)),
                pointwise=not name.startswith("gelu"))
    assert not _LIBM_CALL.search(ex.mod.inspect_source("ll"))


def test_matmul_gelu_epilogue():
    """The tiled path: a GELU folded into a matmul's write-back."""
    A, B = te.placeholder((33, 40), name="A"), te.placeholder((40, 19), name="B")
    C = topi.nn.matmul(A, B)
    D = te.compute(C.shape, lambda i, j: _gelu_erf(C[i, j]), name="D")
    func = te.create_prim_func([A, B, D])
    assert planner.plan(func, TARGET, device=device()).analysis.kind == "tiled"
    ex = tvm_roller.build(func, TARGET, device=device())
    a, b = rand((33, 40), seed=1), rand((40, 19), seed=2)
    c = a.astype(np.float64) @ b
    _assert_rel(run(ex, [a, b], (33, 19), "float32"),
                0.5 * c * (1.0 + _erf64(c / math.sqrt(2.0))), pointwise=False)
    assert not _LIBM_CALL.search(ex.mod.inspect_source("ll"))


def test_declined_function_falls_back_with_vector_math():
    """A function roller declines (a symbolic shape) is built unscheduled, without libm too."""
    n = te.var("n")
    A = te.placeholder((n,), "float32", name="A")
    func = te.create_prim_func([A, te.compute((n,), lambda i: te.exp(A[i]), name="B")])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FallbackWarning)
        ex = tvm_roller.build(func, TARGET, fallback=True, device=device())
    assert not _LIBM_CALL.search(ex.mod.inspect_source("ll"))
    x = rand((37,), seed=2) * 30.0
    _assert_rel(run(ex, [x], (37,), "float32"), np.exp(x.astype(np.float64)), 1e-6)


# -- what is left alone --------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", ["float64", "float16"])
def test_other_dtypes_untouched(dtype):
    func = _elementwise(lambda v: te.exp(v) + te.tanh(v) + te.sigmoid(v) + te.erf(v), (8,), dtype)
    assert rewrite_vector_math(func).same_as(func)


def test_float64_keeps_libm_precision():
    func = _elementwise(te.exp, (97,), "float64")
    ex = tvm_roller.build(func, TARGET, device=device())
    x = rand((97,), "float64", seed=4) * 80.0
    out = run(ex, [x], (97,), "float64")
    np.testing.assert_allclose(out, np.exp(x), rtol=1e-14)


def test_rewrite_replaces_only_the_math_calls():
    from tvm_roller.analysis.visit import post_order_visit

    func = _elementwise(lambda v: te.exp(v) * tirx.sqrt(v) + te.tanh(te.sigmoid(v)), (4,))
    ops = set()
    post_order_visit(rewrite_vector_math(func).body,
                     lambda n: ops.add(n.op.name) if isinstance(n, tvm.ir.expr.Call) else None)
    assert "tirx.sqrt" in ops and not ops & {"tirx.exp", "tirx.tanh", "tirx.sigmoid", "tirx.erf"}
