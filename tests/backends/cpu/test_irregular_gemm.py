"""Irregular GEMM extents (ViT 197, 49, 77, 127, Whisper 1500, primes): the policy pads an axis
to an aligned register tile when the waste is <= eps (``pad_einsum``), and the result stays
exact. Float64 numpy references on random data; the te, batch and Relax-legalized (T.int64,
batch dim 1, bias epilogue) forms.
"""
from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import te, topi

import tvm_roller
from tvm_roller.backends.cpu import policy
from tvm_roller.analysis import analyze
from tvm_roller.core.rtile import padding_waste

from conftest import F32_TOL_LONG, TARGET, assert_close, device, rand, run


def _mm(m, k, n, bias=False, batch=None):
    shp_a = ((batch,) if batch else ()) + (m, k)
    A = te.placeholder(shp_a, name="A")
    B = te.placeholder((k, n), name="B")
    if batch:
        r = te.reduce_axis((0, k), "k")
        C = te.compute((batch, m, n), lambda b, i, j: te.sum(A[b, i, r] * B[r, j], axis=r),
                       name="matmul")
    else:
        C = topi.nn.matmul(A, B)
    ts = [A, B]
    if bias:
        bv = te.placeholder((n,), name="bias")
        C = te.compute(C.shape, lambda *ix: C(*ix) + bv[ix[-1]], name="T_add")
        ts.append(bv)
    return ts + [C]


def _check(func, arrays, ref, out_shape):
    lib = tvm_roller.build(func, TARGET, device=device())
    out = run(lib, arrays, out_shape, "float32")
    assert_close(out, ref, F32_TOL_LONG)


def _check_te(m, k, n, bias=False, batch=None):
    ts = _mm(m, k, n, bias, batch)
    arrays = [rand([int(s) for s in t.shape], seed=i + 1) for i, t in enumerate(ts[:-1])]
    a64 = [a.astype(np.float64) for a in arrays]
    ref = a64[0] @ a64[1] + (a64[2] if bias else 0.0)
    _check(te.create_prim_func(ts), arrays, ref, ts[-1].shape)


@pytest.mark.parametrize("m,k,n", [
    (1, 64, 48), (1, 37, 100),        # M = 1 (GEMV), odd K/N
    (7, 13, 29), (13, 64, 64),        # primes
    (197, 96, 64), (49, 128, 48),     # ViT-like rows
    (77, 45, 33), (127, 64, 80),      # odd N, prime M
    (31, 17, 100),                    # N padded to whole vectors
])
@pytest.mark.parametrize("bias", [False, True])
def test_irregular_matmul(m, k, n, bias):
    _check_te(m, k, n, bias)


@pytest.mark.parametrize("m,k,n", [(197, 64, 96), (1, 32, 48), (23, 40, 19)])
def test_irregular_batch1_matmul_bias(m, k, n):
    _check_te(m, k, n, bias=True, batch=1)


def _relax_matmul_add(m, k, n):
    from tvm import relax

    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, m, k), "float32"))
    w = relax.Var("w", relax.TensorType((k, n), "float32"))
    b = relax.Var("b", relax.TensorType((n,), "float32"))
    with bb.function("main", [x, w, b]):
        with bb.dataflow():
            y = bb.emit(relax.op.matmul(x, w))
            z = bb.emit(relax.op.add(y, b))
            out = bb.emit_output(z)
        bb.emit_func_output(out)
    mod = tvm.transform.Sequential([relax.transform.LegalizeOps(),
                                    relax.transform.AnnotateTIROpPattern(),
                                    relax.transform.FuseOps(), relax.transform.FuseTIR()])(bb.get())
    funcs = [f for _, f in mod.functions.items() if isinstance(f, tvm.tirx.PrimFunc)]
    assert len(funcs) == 1
    # FuseTIR's functions are private: name one to build it alone
    return funcs[0].with_attr("global_symbol", "main")


@pytest.mark.parametrize("m,k,n", [(197, 96, 64), (13, 24, 40)])
def test_irregular_relax_legalized(m, k, n):
    func = _relax_matmul_add(m, k, n)
    assert "int64" in func.script()
    x, w, b = rand((1, m, k), seed=1), rand((k, n), seed=2), rand((n,), seed=3)
    ref = x.astype(np.float64) @ w.astype(np.float64) + b
    _check(func, [x, w, b], ref, (1, m, n))


@pytest.mark.slow
@pytest.mark.parametrize("m,k,n", [(197, 768, 768), (1500, 384, 384), (127, 768, 3072)])
def test_irregular_model_shapes(m, k, n):
    _check_te(m, k, n, bias=True)


# -- policy ------------------------------------------------------------------------------------
def _tile(m, k, n, **kw):
    fa = analyze(te.create_prim_func(_mm(m, k, n)))
    return fa, policy.construct_tiled(fa, device(), **kw)[0]


@pytest.mark.parametrize("m", [197, 127, 49, 77, 1500, 13])
def test_register_tile_not_degenerate(m):
    """A prime or odd M gets a real register tile (padded), not 1 row."""
    fa, t = _tile(m, 768, 768)
    i = 0
    assert t.reg[i] >= (2 if m < 32 else 4), t.reg
    pad = -(-m // t.reg[i]) * t.reg[i]
    assert padding_waste(m, pad) <= policy.PAD_EPS
    for lvl in (t.l1, t.l2):  # cache tiles divide the padded extent: no partial tile
        assert pad % lvl[i] == 0, (t.reg, t.l1, t.l2)
    if pad != m:
        assert any(f"{m} padded to {pad}" in note for note in t.notes), t.notes


def test_eps_zero_keeps_divisors():
    _, t = _tile(127, 768, 768, pad_eps=0.0)
    assert 127 % t.reg[0] == 0


@pytest.mark.parametrize("m,k,n", [(128, 768, 768), (128, 768, 3072), (128, 3072, 768)])
def test_regular_not_padded(m, k, n):
    fa, t = _tile(m, k, n)
    assert policy.padded_extents(fa, t.reg) == [a.extent for a in fa.axes], t.reg
    assert not any("padded to" in note for note in t.notes)


def test_explain_shows_padding():
    text = tvm_roller.explain(te.create_prim_func(_mm(197, 768, 768)), TARGET, device=device(),
                              topk=1)
    assert "alignment: axis" in text and "197 padded to" in text and "eps 10%" in text


@pytest.mark.parametrize("k,whole", [(1214, False), (3073, False), (607, True)])
def test_reduction_chunk_pads_k(k, whole):
    """A K with no L1-sized divisor (1,214 = 2 x 607, primes) gets an L1 chunk shorter than K
    by padding K (waste <= RED_PAD_EPS, zero-filled), said in the notes, unless the rows the
    register tile holds over all of K fit L1 (607: 6 x 607 floats), where the whole K is one
    chunk and nothing is copied (measured 37 us against 70 padded); the result is exact."""
    fa, t = _tile(96, k, 64)
    r = fa.reduction[0]
    assert (t.l1[r] == k) == whole, t.l1
    pad = -(-k // t.l1[r]) * t.l1[r]
    if pad != k:
        assert padding_waste(k, pad) <= policy.RED_PAD_EPS
        assert any(f"{k} padded to {pad} for {t.l1[r]}-long L1 chunks" in n for n in t.notes)
    _check_te(96, k, 64)
    _check_te(13, k, 17, bias=True)


def test_reduction_not_padded_without_eps():
    _, t = _tile(96, 1214, 64, pad_eps=0.0)
    assert 1214 % t.l1[2] == 0, t.l1
