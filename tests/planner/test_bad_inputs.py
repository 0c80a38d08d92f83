"""Inputs roller declines: each raises UnsupportedError saying why, and with ``fallback=True``
whatever TVM itself can build is built with TVM's default schedule under a FallbackWarning."""
from __future__ import annotations

import warnings

import numpy as np
import pytest
import tvm
from tvm import te

import tvm_roller
from tvm_roller import FallbackWarning, UnsupportedError

from conftest import F32_TOL, TARGET, assert_close, device, rand, run


def _build(func, target=TARGET, **kw):
    return tvm_roller.build(func, target, device=device(), **kw)


def _fallback(func, target=TARGET, match=None):
    """Build with fallback=True; exactly one FallbackWarning carrying the reason."""
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        lib = _build(func, target, fallback=True)
    fb = [w for w in rec if issubclass(w.category, FallbackWarning)]
    assert len(fb) == 1, [str(w.message) for w in rec]
    msg = str(fb[0].message)
    assert "roller declined" in msg and "TVM's default schedule" in msg
    if match:
        assert match in msg, msg
    return lib


def _declined(func, match, target=TARGET):
    with pytest.raises(UnsupportedError, match=match) as info:
        _build(func, target)
    assert isinstance(info.value, ValueError)  # UnsupportedError is a ValueError
    for api in (lambda: tvm_roller.schedule(func, target, device=device()),
                lambda: tvm_roller.explain(func, target, device=device())):
        with pytest.raises(UnsupportedError, match=match):
            api()
    return info.value


# -- data-dependent indexing (gathers) -----------------------------------------------------------
def test_gather_float_index_is_streamed():
    """out[i] = A[int(B[i])]: a gather is a memory-bound copy roller schedules (no decline)."""
    A = te.placeholder((16,), "float32", name="A")
    B = te.placeholder((8,), "float32", name="B")
    G = te.compute((8,), lambda i: A[B[i].astype("int32")], name="G")
    func = te.create_prim_func([A, B, G])
    assert tvm_roller.plan(func, TARGET, device=device()).analysis.kind == "elementwise"
    lib = _build(func)
    a = rand((16,), seed=1)
    b = np.array([3, 0, 15, 7, 7, 2, 9, 11], dtype="float32")
    assert_close(run(lib, [a, b], (8,), "float32"), a[b.astype(int)], 0.0)


def test_gather_rows_int32_index():
    """Embedding lookup: out[i, j] = A[idx[i], j] with odd sizes, rows in parallel."""
    A = te.placeholder((37, 23), "float32", name="A")
    idx = te.placeholder((11,), "int32", name="idx")
    G = te.compute((11, 23), lambda i, j: A[idx[i], j], name="G")
    func = te.create_prim_func([A, idx, G])
    lib = _build(func)
    a = rand((37, 23), seed=2)
    ix = np.array([36, 1, 4, 4, 0, 8, 13, 2, 29, 31, 7], dtype="int32")
    assert_close(run(lib, [a, ix], (11, 23), "float32"), a[ix], 0.0)


def test_gather_inside_reduction_declined():
    """A reduction over gathered values has no access pattern to tile by: declined, named."""
    A = te.placeholder((16,), "float32", name="A")
    idx = te.placeholder((8,), "int32", name="idx")
    k = te.reduce_axis((0, 8), "k")
    S = te.compute((1,), lambda i: te.sum(A[idx[k]], axis=k), name="S")
    func = te.create_prim_func([A, idx, S])
    err = _declined(func, "gather")
    assert "reduction" in str(err)
    lib = _fallback(func, match="gather")
    a = rand((16,), seed=2)
    ix = np.array([15, 1, 4, 4, 0, 8, 13, 2], dtype="int32")
    assert_close(run(lib, [a, ix], (1,), "float32"), np.array([a[ix].astype(np.float64).sum()]),
                 1e-6)


# -- non-constant division -----------------------------------------------------------------------
def test_division_by_scalar_parameter():
    A = te.placeholder((16,), "float32", name="A")
    n = te.var("n", "int32")
    D = te.compute((16,), lambda i: A[te.floordiv(i, n)], name="D")
    func = te.create_prim_func([A, n, D])
    err = _declined(func, "non-constant division")
    assert "// n" in str(err) or "n" in str(err)

    lib = _fallback(func, match="non-constant division")
    a = rand((16,), seed=3)
    dev = tvm.cpu(0)
    out = tvm.runtime.tensor(np.full(16, np.nan, "float32"), dev)
    lib(tvm.runtime.tensor(a, dev), 3, out)
    assert_close(out.numpy(), a[np.arange(16) // 3], 0.0)


def test_division_by_loop_variable():
    A = te.placeholder((8, 4), "float32", name="A")
    D = te.compute((8, 4), lambda i, j: A[te.floordiv(i, j + 1), j] * 2.0, name="D")
    func = te.create_prim_func([A, D])
    _declined(func, "non-constant division")

    lib = _fallback(func)
    a = rand((8, 4), seed=4)
    i, j = np.meshgrid(np.arange(8), np.arange(4), indexing="ij")
    assert_close(run(lib, [a], (8, 4), "float32"), 2.0 * a[i // (j + 1), j], 0.0)


def test_scalar_parameter_outside_indices():
    """A scalar used as a value (not in an index or an extent) is roller's, and exact."""
    A = te.placeholder((16,), "float32", name="A")
    s = te.var("s", "float32")
    D = te.compute((16,), lambda i: A[i] * s, name="D")
    func = te.create_prim_func([A, s, D])
    with warnings.catch_warnings():
        warnings.simplefilter("error", FallbackWarning)  # no fallback
        lib = _build(func)
    a = rand((16,), seed=5)
    dev = tvm.cpu(0)
    out = tvm.runtime.tensor(np.full(16, np.nan, "float32"), dev)
    lib(tvm.runtime.tensor(a, dev), 1.5, out)
    assert_close(out.numpy(), a * 1.5, 1e-7)


# -- symbolic shapes -----------------------------------------------------------------------------
def test_symbolic_shape_is_planned_per_bucket():
    """The static planner declines a symbolic extent; ``tvm_roller.build`` plans it per bucket
    of the variable (``tvm_roller.dynamic``), with no fallback, for any value."""
    n = te.var("n")
    A = te.placeholder((n, 32), "float32", name="A")
    B = te.placeholder((32, 24), "float32", name="B")
    k = te.reduce_axis((0, 32), "k")
    C = te.compute((n, 24), lambda i, j: te.sum(A[i, k] * B[k, j], axis=k), name="C")
    func = te.create_prim_func([A, B, C])
    with pytest.raises(UnsupportedError, match="symbolic shape"):
        tvm_roller.plan(func, TARGET, device=device())
    with warnings.catch_warnings():
        warnings.simplefilter("error", FallbackWarning)
        lib = _build(func, fallback=True)
    b = rand((32, 24), seed=6)
    for rows in (1, 5, 17, 4099):  # 4099: above the default upper bound
        a = rand((rows, 32), seed=rows)
        assert_close(run(lib, [a, b], (rows, 24), "float32"),
                     a.astype(np.float64) @ b.astype(np.float64), F32_TOL)


# -- empty and negative shapes -------------------------------------------------------------------
@pytest.mark.parametrize("m,n,k", [(0, 16, 16), (4, 0, 16), (4, 16, 0)])
def test_empty_tensor(m, n, k):
    from tvm.s_tir.meta_schedule.testing import te_workload as W

    func = te.create_prim_func(list(W.matmul(m, n, k)))
    _declined(func, "empty tensor")
    lib = _fallback(func, match="empty tensor")
    if m == 0 or n == 0:  # nothing to compute; the call must still work
        out = run(lib, [np.ones((m, k), "float32"), np.ones((k, n), "float32")], (m, n), "float32")
        assert out.shape == (m, n)
    # (m, n, 0): TVM's unscheduled build runs the T.init inside the empty k loop and leaves the
    # output unwritten, so there is nothing meaningful to compare here.


def test_negative_output_extent():
    """A 7x7 kernel with dilation 2 on a 9x9 input: the output would have -1 rows."""
    from tvm.s_tir.meta_schedule.testing import te_workload as W

    func = te.create_prim_func(list(W.conv2d_nhwc(1, 9, 9, 8, 32, 7, 2, 0, 2)))
    _declined(func, "empty tensor")


# -- dtypes --------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", ["float16"])
def test_unsupported_dtype(dtype):  # (bfloat16 is roller's: tests/backends/cpu/test_amx.py)
    A = te.placeholder((64,), dtype, name="A")
    B = te.placeholder((64,), dtype, name="B")
    C = te.compute((64,), lambda i: A[i] + B[i], name="C")
    func = te.create_prim_func([A, B, C])
    err = _declined(func, f"dtype {dtype}")
    assert "float32" in str(err)  # says what is supported

    lib = _fallback(func, match=f"dtype {dtype}")
    a, b = rand((64,), dtype, 8), rand((64,), dtype, 9)
    assert_close(run(lib, [a, b], (64,), dtype), a.astype(np.float64) + b, 1e-3)


@pytest.mark.parametrize("dtype", ["int8", "int32", "int64"])
def test_integer_elementwise_and_reduction_built_by_roller(dtype):
    """Memory-bound kernels on integer tensors (masks, indices) are roller's: exact results."""
    A = te.placeholder((13, 67), dtype, name="A")
    B = te.placeholder((13, 67), dtype, name="B")
    C = te.compute((13, 67), lambda i, j: A[i, j] - B[i, j], name="C")
    k = te.reduce_axis((0, 67), "k")
    M = te.compute((13,), lambda i: te.max(C[i, k], axis=k), name="M")
    func = te.create_prim_func([A, B, M])
    assert tvm_roller.plan(func, TARGET, device=device()).analysis.kind == "reduction"
    lib = _build(func)
    rng = np.random.default_rng(7)
    a = rng.integers(-50, 50, (13, 67)).astype(dtype)
    b = rng.integers(-50, 50, (13, 67)).astype(dtype)
    expect = (a.astype(np.int64) - b).astype(dtype).max(1)
    assert_close(run(lib, [a, b], (13,), dtype), expect, 0.0)


def test_bool_mask_select():
    """A bool mask selecting between two float tensors (Relax's attention-mask pattern)."""
    A = te.placeholder((7, 33), "float32", name="A")
    Mk = te.placeholder((7, 1), "bool", name="Mk")
    C = te.compute((7, 33), lambda i, j: tvm.tirx.Select(Mk[i, 0], A[i, j] * 2.0, A[i, j]), name="C")
    func = te.create_prim_func([A, Mk, C])
    lib = _build(func)
    a = rand((7, 33), "float32", 3)
    m = np.array([[True], [False], [True], [True], [False], [False], [True]])
    assert_close(run(lib, [a, m], (7, 33), "float32"), np.where(m, 2.0 * a, a), F32_TOL)


def test_integer_matmul_declined():
    """An integer GEMM is compute-bound: the tiled (FMA) backend declines it by dtype."""
    A = te.placeholder((32, 16), "int32", name="A")
    B = te.placeholder((16, 32), "int32", name="B")
    k = te.reduce_axis((0, 16), "k")
    C = te.compute((32, 32), lambda i, j: te.sum(A[i, k] * B[k, j], axis=k), name="C")
    func = te.create_prim_func([A, B, C])
    err = _declined(func, "compute-bound")
    assert "int32" in str(err)
    lib = _fallback(func, match="int32")
    rng = np.random.default_rng(5)
    a, b = rng.integers(-9, 9, (32, 16)).astype("int32"), rng.integers(-9, 9, (16, 32)).astype("int32")
    assert_close(run(lib, [a, b], (32, 32), "int32"), a.astype(np.int64) @ b, 0.0)


def test_unsupported_dtype_in_a_reduction():
    A = te.placeholder((16, 32), "float16", name="A")
    k = te.reduce_axis((0, 32), "k")
    S = te.compute((16,), lambda i: te.sum(A[i, k].astype("float32"), axis=k), name="S")
    func = te.create_prim_func([A, S])
    _declined(func, "dtype float16 of A")
    lib = _fallback(func)
    a = rand((16, 32), "float16", 10)
    assert_close(run(lib, [a], (16,), "float32"), a.astype(np.float64).sum(1), 1e-6)


# -- targets -------------------------------------------------------------------------------------
def _double():
    X = te.placeholder((64,), "float32", name="X")
    return te.create_prim_func([X, te.compute((64,), lambda i: X[i] * 2.0, name="S")])


@pytest.mark.parametrize("target", [{"kind": "c"}, "c"])
def test_c_target_has_no_backend_but_falls_back(target):
    func = _double()
    assert tvm_roller.hardware.normalize_target(target).kind.name == "c"
    _declined(func, "target kind 'c' has no roller backend", target)
    lib = _fallback(func, target, match="no roller backend")
    x = rand((64,), seed=11)
    assert_close(run(lib, [x], (64,), "float32"), 2.0 * x, 0.0)


@pytest.mark.parametrize("target", [{"kind": "cuda", "arch": "sm_86"}, {"kind": "cuda"}])
def test_cuda_target_without_preset(target):
    """A CUDA arch with no preset (or none at all: TVM defaults to sm_50) is refused by name;
    the fallback is dlight's default build."""
    func = _double()
    with pytest.raises(UnsupportedError, match="compute capability"):
        tvm_roller.build(func, target)
    with pytest.raises(UnsupportedError, match="is a cpu, the target is CUDA"):
        _build(func, target)
    with pytest.warns(FallbackWarning, match="compute capability"):
        assert tvm_roller.build(func, target, fallback=True) is not None


@pytest.mark.parametrize("target,match", [
    ({"kind": "no-such-kind"}, "invalid target"),
    ("llvm -mcpu=haswell -fast-math", "dict form"),
    (42, "cannot make a TVM target"),
])
def test_invalid_target(target, match):
    func = _double()
    for fb in (False, True):  # TVM can't build for these either: no fallback, no warning
        with warnings.catch_warnings():
            warnings.simplefilter("error", FallbackWarning)
            with pytest.raises(UnsupportedError, match=match):
                _build(func, target, fallback=fb)


# -- not a function at all -----------------------------------------------------------------------
def test_not_a_primfunc():
    X = te.placeholder((64,), "float32", name="X")
    Y = te.compute((64,), lambda i: X[i] * 2.0, name="Y")
    for fb in (False, True):
        with warnings.catch_warnings():
            warnings.simplefilter("error", FallbackWarning)
            with pytest.raises(UnsupportedError, match="expected a PrimFunc or IRModule"):
                _build(Y, fallback=fb)


def test_irmodule_with_two_functions():
    mod = tvm.IRModule({"a": _double().with_attr("global_symbol", "a"),
                        "b": _double().with_attr("global_symbol", "b")})
    _declined(mod, "one PrimFunc")
    lib = _fallback(mod)
    x = rand((64,), seed=12)
    for name in ("a", "b"):
        assert_close(run(lib[name], [x], (64,), "float32"), 2.0 * x, 0.0)


def test_supported_input_does_not_warn():
    with warnings.catch_warnings():
        warnings.simplefilter("error", FallbackWarning)
        lib = _build(_double(), fallback=True)
    x = rand((64,), seed=13)
    assert_close(run(lib, [x], (64,), "float32"), 2.0 * x, 0.0)
