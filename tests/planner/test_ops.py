"""Correctness of roller-built kernels: every op class of the public suite, odd shapes, fp64.

Each test builds a small te/topi workload with ``tvm_roller.build`` (fixed target + preset device,
see conftest), runs it on random data and compares it with a float64 numpy reference.
"""
from __future__ import annotations

import warnings

import numpy as np
import pytest
import tvm
from tvm import te, topi
from tvm.s_tir.meta_schedule.testing import te_workload as W

import tvm_roller
from conftest import (F32_TOL, F32_TOL_LONG, F64_TOL, TARGET, assert_close, build_and_check,
                      conv2d_transpose_nhwc, conv_nlc, device, rand_inputs, rel_err, run, softmax)


def _ph(shape, name, dtype="float32"):
    return te.placeholder(shape, dtype, name=name)


# -- matmul / batch matmul ---------------------------------------------------------------------
@pytest.mark.parametrize("n,m,k", [
    (1, 7, 13), (17, 31, 3), (1, 1, 1), (1, 64, 1),  # odd / prime / degenerate
    (1, 64, 96),  # GEMV-like (M = 1)
    (37, 53, 29), (64, 48, 32), (100, 100, 100),
])
def test_matmul(n, m, k):
    build_and_check(W.matmul(n, m, k), lambda a, b: a @ b)


@pytest.mark.parametrize("b,n,m,k", [(2, 16, 24, 32), (3, 13, 17, 19), (1, 64, 48, 80)])
def test_batch_matmul(b, n, m, k):  # GMM: x[B,N,K] @ y[B,K,M]
    build_and_check(W.batch_matmul_nkkm(b, n, m, k), lambda x, y: x @ y)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_matmul_dtypes(dtype):
    build_and_check(W.matmul(24, 40, 56, dtype, dtype), lambda a, b: a @ b)


def test_matmul_bias_relu_epilogue():
    A, B, bias = _ph((20, 36), "A"), _ph((36, 44), "B"), _ph((44,), "bias")
    k = te.reduce_axis((0, 36), "k")
    C = te.compute((20, 44), lambda i, j: te.sum(A[i, k] * B[k, j], axis=k), name="C")
    D = te.compute((20, 44), lambda i, j: te.max(C[i, j] + bias[j], 0.0), name="D")
    build_and_check([A, B, bias, D], lambda a, b, c: np.maximum(a @ b + c, 0.0))


def test_matmul_relu():
    build_and_check(W.matmul_relu(16, 32, 48), lambda a, b: np.maximum(a @ b, 0.0))


def test_transpose_batch_matmul():  # TBG: q[B,L,H,D], v[B,L,H,D] -> c[B,H,L,L]
    build_and_check(W.transpose_batch_matmul(1, 32, 4, 32),
                    lambda q, v: np.einsum("bihd,bjhd->bhij", q, v))


# -- convolutions (channels last, as in the suite) --------------------------------------------
@pytest.mark.parametrize("args", [
    (1, 16, 8, 16, 3, 2, 1),  # stride 2, pad 1
    (1, 64, 32, 64, 5, 1, 2),
    (1, 33, 16, 32, 3, 2, 1, 1, 4),  # groups 4, odd length
    (2, 20, 8, 12, 3, 1, 0, 2, 1),  # dilation 2, batch 2
])
def test_conv1d_nlc(args):
    n, l, ci, co, k, s, p, *rest = args
    d, g = (rest + [1, 1])[:2]
    build_and_check(W.conv1d_nlc(*args),
                    lambda x, w: conv_nlc(x, w, s, p, d, g))


@pytest.mark.parametrize("args", [
    (1, 8, 8, 8, 16, 3, 1, 1),
    (1, 15, 15, 3, 24, 7, 2, 3),  # C2D:0-like stem: 3 channels, 7x7 stride 2
    (1, 14, 14, 32, 48, 3, 1, 1),
    (1, 8, 8, 16, 32, 3, 2, 1, 1, 4),  # GRP: groups 4, stride 2
    (1, 10, 10, 8, 16, 3, 1, 1, 2),  # DIL: dilation 2
    (2, 7, 9, 5, 7, 1, 1, 0),  # 1x1, batch 2, prime channels
])
def test_conv2d_nhwc(args):
    n, h, w_, ci, co, k, s, p, *rest = args
    d, g = (rest + [1, 1])[:2]
    build_and_check(W.conv2d_nhwc(*args), lambda x, w: conv_nlc(x, w, s, p, d, g))


@pytest.mark.parametrize("args", [(1, 4, 6, 6, 4, 16, 3, 1, 1), (1, 5, 7, 7, 3, 8, 3, 2, 1),
                                  (1, 6, 8, 8, 8, 16, 3, 1, 1, 2, 2)])  # dilation 2, groups 2
def test_conv3d_ndhwc(args):
    n, d_, h, w_, ci, co, k, s, p, *rest = args
    d, g = (rest + [1, 1])[:2]
    build_and_check(W.conv3d_ndhwc(*args), lambda x, w: conv_nlc(x, w, s, p, d, g))


@pytest.mark.parametrize("args", [(1, 8, 8, 16, 3, 1, 1), (1, 9, 9, 32, 3, 2, 1),
                                  (1, 12, 12, 24, 5, 1, 2, 2)])
def test_depthwise_conv2d_nhwc(args):  # DEP
    n, h, w_, c, k, s, p, *rest = args
    d = (rest + [1])[0]
    build_and_check(W.depthwise_conv2d_nhwc(*args),
                    lambda x, w: conv_nlc(x, w[0][:, :, None, :], s, p, d, groups=c))


@pytest.mark.parametrize("args", [(1, 4, 4, 16, 8, 4, 2, 1), (1, 8, 8, 16, 3, 4, 2, 1),
                                  (1, 5, 5, 8, 8, 3, 1, 0)])
def test_conv2d_transpose_nhwc(args):  # T2D
    n, h, w_, ci, co, k, s, p = args
    build_and_check(W.conv2d_transpose_nhwc(*args),
                    lambda x, w: conv2d_transpose_nhwc(x, w, s, p))


@pytest.mark.parametrize("args", [(1, 8, 8, 8, 8, 3, 2, 1), (1, 6, 6, 4, 8, 3, 1, 1)])
def test_conv2d_capsule(args):  # CAP
    build_and_check(W.conv2d_capsule_nhwijc(*args), _capsule_ref(*args))


def _capsule_ref(n, h, w_, ci, co, k, s, pad):
    """float64 capsule convolution reference (NHWIJC input, 4x4 capsules)."""
    def cap(x, w):
        xp = np.pad(x, [(0, 0), (pad, pad), (pad, pad), (0, 0), (0, 0), (0, 0)])
        oh, ow = (h + 2 * pad - k) // s + 1, (w_ + 2 * pad - k) // s + 1
        y = np.zeros((n, oh, ow, 4, 4, co))
        for a in range(k):
            for b in range(k):
                patch = xp[:, a:a + s * (oh - 1) + 1:s, b:b + s * (ow - 1) + 1:s]
                y += np.einsum("nhwikc,kjco->nhwijo", patch, w[a, b])
        return y
    return cap


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_conv2d_dtypes(dtype):
    build_and_check(W.conv2d_nhwc(1, 8, 8, 8, 16, 3, 1, 1, 1, 1, dtype, dtype),
                    lambda x, w: conv_nlc(x, w, 1, 1))


def test_conv2d_bias_bn_relu():  # CBR: args (data, kernel, bias, bn_offset, bn_scale)
    def ref(x, w, bias, off, scale):
        return np.maximum((conv_nlc(x, w, 2, 1) + bias) * scale + off, 0.0)

    build_and_check(W.conv2d_nhwc_bn_relu(1, 14, 14, 16, 32, 3, 2, 1), ref)


# -- PyTorch-style layouts from topi -----------------------------------------------------------
def _nchw(x):
    return x.transpose(0, 2, 3, 1)


@pytest.mark.parametrize("n,ci,h,co,k,s,p", [(1, 8, 10, 16, 3, 1, 1), (2, 3, 11, 8, 3, 2, 1)])
def test_conv2d_nchw_topi(n, ci, h, co, k, s, p):
    X, Wt = _ph((n, ci, h, h), "X"), _ph((co, ci, k, k), "W")
    Y = topi.nn.conv2d_nchw(X, Wt, stride=s, padding=p, dilation=1)

    def ref(x, w):  # OIHW -> HWIO, NCHW -> NHWC, back
        return conv_nlc(_nchw(x), w.transpose(2, 3, 1, 0), s, p).transpose(0, 3, 1, 2)

    build_and_check([X, Wt, Y], ref)


def test_group_and_depthwise_conv2d_nchw_topi():
    X, Wg = _ph((1, 8, 12, 12), "X"), _ph((16, 2, 3, 3), "W")  # groups 4
    build_and_check([X, Wg, topi.nn.group_conv2d_nchw(X, Wg, 1, 1, 1, 4)],
                    lambda x, w: conv_nlc(_nchw(x), w.transpose(2, 3, 1, 0), 1, 1, 1, 4
                                          ).transpose(0, 3, 1, 2))
    X, Wd = _ph((1, 8, 12, 12), "X"), _ph((8, 1, 3, 3), "W")
    build_and_check([X, Wd, topi.nn.depthwise_conv2d_nchw(X, Wd, 2, 1, 1)],
                    lambda x, w: conv_nlc(_nchw(x), w.transpose(2, 3, 1, 0), 2, 1, 1, 8
                                          ).transpose(0, 3, 1, 2))


def test_conv_transpose_conv1d_conv3d_channels_first_topi():
    X, Wt = _ph((1, 8, 6, 6), "X"), _ph((8, 4, 4, 4), "W")  # IOHW weights
    Y = topi.nn.conv2d_transpose_nchw(X, Wt, (2, 2), (1, 1, 1, 1), "float32", (0, 0))
    build_and_check([X, Wt, Y], lambda x, w: conv2d_transpose_nhwc(
        _nchw(x), w.transpose(2, 3, 0, 1), 2, 1).transpose(0, 3, 1, 2))
    X, W1 = _ph((2, 8, 12), "X"), _ph((16, 8, 3), "W")
    build_and_check([X, W1, topi.nn.conv1d_ncw(X, W1, 2, 1, 1)], lambda x, w: conv_nlc(
        x.transpose(0, 2, 1), w.transpose(2, 1, 0), 2, 1).transpose(0, 2, 1))
    X, W3 = _ph((1, 4, 5, 6, 6), "X"), _ph((8, 4, 3, 3, 3), "W")
    build_and_check([X, W3, topi.nn.conv3d_ncdhw(X, W3, 1, 1, 1, 1)], lambda x, w: conv_nlc(
        x.transpose(0, 2, 3, 4, 1), w.transpose(2, 3, 4, 1, 0), 1, 1).transpose(0, 4, 1, 2, 3))


def test_dense_and_batch_matmul_topi():
    A, B = _ph((20, 40), "A"), _ph((30, 40), "B")  # dense: A @ B^T (torch.nn.Linear layout)
    build_and_check([A, B, topi.nn.dense(A, B)], lambda a, b: a @ b.T)
    A, B = _ph((4, 6, 40), "A"), _ph((4, 40, 20), "B")
    build_and_check([A, B, topi.nn.batch_matmul(A, B, transpose_b=False)], lambda a, b: a @ b)


def test_adaptive_pool_is_declined_and_falls_back():
    """Gap: topi's adaptive pooling uses a nested block (a reduction inside the window loop),
    which roller does not analyse. It must say so, and the fallback must be right."""
    X = _ph((1, 4, 8, 8), "X")
    Y = topi.nn.adaptive_pool(X, (3, 3), "avg")
    func = te.create_prim_func([X, Y])
    with pytest.raises(tvm_roller.UnsupportedError, match="nested blocks"):
        tvm_roller.build(func, TARGET, device=device())
    with pytest.warns(tvm_roller.FallbackWarning, match="nested blocks"):
        lib = tvm_roller.build(func, TARGET, fallback=True, device=device())
    x = rand_inputs([X, Y])[0]
    ref = np.zeros((1, 4, 3, 3))
    for i in range(3):
        for j in range(3):
            h0, h1 = (i * 8) // 3, -(-((i + 1) * 8) // 3)
            w0, w1 = (j * 8) // 3, -(-((j + 1) * 8) // 3)
            ref[:, :, i, j] = x[:, :, h0:h1, w0:w1].astype(np.float64).mean(axis=(2, 3))
    assert_close(run(lib, [x], Y.shape, "float32"), ref, F32_TOL)


@pytest.mark.parametrize("pool,kernel,stride,pad", [
    ("max", 2, 2, 0), ("avg", 3, 1, 1), ("max", 3, 2, 1),
])
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_pool2d_topi(pool, kernel, stride, pad, layout):
    shape = (1, 8, 10, 10) if layout == "NCHW" else (1, 10, 10, 8)
    X = _ph(shape, "X")
    Y = topi.nn.pool2d(X, (kernel, kernel), (stride, stride), (1, 1), (pad,) * 4, pool,
                       layout=layout, count_include_pad=True)

    def ref(x):
        xh = _nchw(x) if layout == "NCHW" else x
        fill = -np.inf if pool == "max" else 0.0
        xp = np.pad(xh, [(0, 0), (pad, pad), (pad, pad), (0, 0)], constant_values=fill)
        o = (xh.shape[1] + 2 * pad - kernel) // stride + 1
        wins = np.stack([xp[:, a:a + stride * (o - 1) + 1:stride, b:b + stride * (o - 1) + 1:stride]
                         for a in range(kernel) for b in range(kernel)])
        y = wins.max(0) if pool == "max" else wins.sum(0) / (kernel * kernel)
        return y.transpose(0, 3, 1, 2) if layout == "NCHW" else y

    # roller handles pooling (max/avg are commutative reductions over the window)
    build_and_check([X, Y], ref)


# -- memory-bound classes ----------------------------------------------------------------------
@pytest.mark.parametrize("b,m,n", [(2, 16, 32), (1, 64, 128), (4, 33, 17)])
def test_norm_bmn(b, m, n):  # NRM: sqrt of the sum of squares per batch
    build_and_check(W.norm_bmn(b, m, n), lambda a: np.sqrt((a * a).sum(axis=(1, 2))))


@pytest.mark.parametrize("m,n", [(16, 48), (64, 100), (1, 256), (12, 33)])
def test_softmax(m, n):  # SFM
    build_and_check(W.softmax_mn(m, n), lambda a: softmax(a, axis=1))


def test_layer_norm_topi():
    L, g, b = _ph((16, 40), "L"), _ph((40,), "g"), _ph((40,), "b")
    Y = topi.nn.layer_norm(L, g, b, axis=[1], epsilon=1e-5)

    def ref(x, gamma, beta):
        mu = x.mean(axis=1, keepdims=True)
        var = ((x - mu) ** 2).mean(axis=1, keepdims=True)
        return (x - mu) / np.sqrt(var + 1e-5) * gamma + beta

    build_and_check([L, g, b, Y], ref)


def test_elementwise_broadcast():
    a, b = _ph((8, 1, 32), "a"), _ph((1, 16, 32), "b")
    build_and_check([a, b, topi.add(a, b)], lambda x, y: x + y)
    a, b = _ph((8, 1, 33), "a"), _ph((33,), "b")
    build_and_check([a, b, topi.exp(topi.multiply(a, b))], lambda x, y: np.exp(x * y))


def test_transpose():
    A = _ph((33, 17), "A")
    build_and_check([A, topi.transpose(A)], lambda a: a.T)


def test_reduction_with_epilogue():
    A = _ph((24, 40), "A")
    k = te.reduce_axis((0, 40), "k")
    R = te.compute((24,), lambda i: te.sum(A[i, k] * A[i, k], axis=k), name="R")
    E = te.compute((24,), lambda i: te.max(R[i] * 2.0 - 1.0, 0.0) + te.exp(R[i] * -0.1), name="E")

    def ref(a):
        r = (a * a).sum(axis=1)
        return np.maximum(r * 2.0 - 1.0, 0.0) + np.exp(-0.1 * r)

    build_and_check([A, E], ref)


def test_column_and_full_reduction():
    A = _ph((4, 16, 8), "A")
    k = te.reduce_axis((0, 16), "k")
    build_and_check([A, te.compute((4, 8), lambda b, j: te.sum(A[b, k, j], axis=k), name="cs")],
                    lambda a: a.sum(axis=1))
    V = _ph((1000,), "V")
    build_and_check([V, topi.sum(V)], lambda v: np.array(v.sum()), tol=F32_TOL_LONG)


def test_long_reduction_fp32():
    # K = 1024 terms: float32 accumulation error grows, hence the looser tolerance
    build_and_check(W.matmul(8, 32, 1024), lambda a, b: a @ b, tol=F32_TOL_LONG)


# -- every ranked candidate, not only the best, must be correct --------------------------------
@pytest.mark.parametrize("name,tensors,ref", [
    ("mm", W.matmul(127, 129, 67), lambda a, b: a @ b),
    ("c2d", W.conv2d_nhwc(1, 14, 14, 16, 32, 3, 1, 1), lambda x, w: conv_nlc(x, w, 1, 1)),
    ("t2d", W.conv2d_transpose_nhwc(1, 8, 8, 32, 16, 4, 2, 1),
     lambda x, w: conv2d_transpose_nhwc(x, w, 2, 1)),
])
def test_topk_candidates_all_correct(name, tensors, ref):
    func = te.create_prim_func(list(tensors))
    schs = tvm_roller.schedule(func, TARGET, topk=3, device=device())
    assert isinstance(schs, list) and 1 <= len(schs) <= 3
    arrays = rand_inputs(tensors)
    expect = ref(*[a.astype(np.float64) for a in arrays])
    for rank, sch in enumerate(schs):
        lib = tvm.compile(sch.mod, tvm.target.Target(TARGET))
        out = run(lib, arrays, tensors[-1].shape, "float32")
        err = rel_err(out, expect)
        assert err <= F32_TOL, f"candidate #{rank + 1}: relative max error {err:.3g}"


@pytest.mark.parametrize("preset,cores", [("x86-avx512", 2), ("x86-avx2", 8), ("arm-neon", 4)])
def test_other_device_models(preset, cores):
    """Plans for other vector widths / core counts still compute the right thing here."""
    dev = tvm_roller.hardware.preset(preset).with_units(cores)
    build_and_check(W.matmul(37, 53, 29), lambda a, b: a @ b, dev=dev)
    build_and_check(W.conv2d_nhwc(1, 9, 9, 8, 20, 3, 2, 1), lambda x, w: conv_nlc(x, w, 2, 1),
                    dev=dev)
    build_and_check(W.softmax_mn(10, 70), lambda a: softmax(a, axis=1), dev=dev)


def test_default_device_model_from_target():
    """Without ``device=`` the model comes from the target (private cache: no calibration)."""
    with warnings.catch_warnings():
        warnings.simplefilter("error", tvm_roller.FallbackWarning)
        func = te.create_prim_func(list(W.matmul(33, 48, 20)))
        lib = tvm_roller.build(func, TARGET)
    a, b = rand_inputs(W.matmul(33, 48, 20))
    assert_close(run(lib, [a, b], (33, 48), "float32"), a.astype(np.float64) @ b, F32_TOL)


# -- the suite's own shapes (heavy) ------------------------------------------------------------
def _suite_ref(cls, p):
    if cls == "GMM":
        return lambda x, y: x @ y
    if cls in ("C1D", "C2D", "C3D", "GRP", "DIL"):
        base = {"C1D": 1, "C2D": 2, "GRP": 2, "DIL": 2, "C3D": 3}[cls] + 4  # index of stride
        full = tuple(p) + (1, 0, 1, 1)[len(p) - base:]  # defaults: stride, pad, dilation, groups
        s, pad, d, g = full[base:base + 4]
        return lambda x, w: conv_nlc(x, w, s, pad, d, g)
    if cls == "DEP":
        full = tuple(p) + (1, 0, 1)[len(p) - 5:]  # defaults: stride, pad, dilation
        s, pad, d = full[5:8]
        return lambda x, w: conv_nlc(x, w[0][:, :, None, :], s, pad, d, groups=p[3])
    if cls == "T2D":
        return lambda x, w: conv2d_transpose_nhwc(x, w, p[6], p[7])
    if cls == "CAP":
        return _capsule_ref(*p)
    if cls == "NRM":
        return lambda a: np.sqrt((a * a).sum(axis=(1, 2)))
    if cls == "SFM":
        return lambda a: softmax(a, axis=1)
    if cls == "CBR":
        s, pad = p[6], p[7]
        return lambda x, w, bias, off, scale: np.maximum(
            (conv_nlc(x, w, s, pad) + bias) * scale + off, 0.0)
    if cls == "TBG":
        return lambda q, v: np.einsum("bihd,bjhd->bhij", q, v)
    raise KeyError(cls)


_SUITE = [(c, i) for c in ("C1D", "C2D", "C3D", "GMM", "GRP", "DIL", "DEP", "T2D", "CAP", "NRM",
                           "SFM", "CBR", "TBG") for i in range(4)]


@pytest.mark.slow
@pytest.mark.parametrize("cls,idx", _SUITE, ids=[f"{c}:{i}" for c, i in _SUITE])
def test_suite_workload(cls, idx):
    fn, shapes = W.CONFIGS[cls]
    p = shapes[idx]
    tensors = fn(*p)
    build_and_check(tensors, _suite_ref(cls, p), tol=F32_TOL_LONG)


def test_schedule_is_parallel_and_vectorized():
    """Sanity: the kernels above are roller's constructed schedules, not TVM's default loops."""
    for tensors in (W.matmul(128, 128, 128), W.conv2d_nhwc(1, 14, 14, 32, 48, 3, 1, 1),
                    W.softmax_mn(64, 128)):
        sch = tvm_roller.schedule(te.create_prim_func(list(tensors)), TARGET, device=device())
        text = sch.mod.script()
        assert "T.parallel" in text and "T.vectorized" in text, text


def test_irmodule_and_tvmscript_inputs():
    from tvm.script import ir as I
    from tvm.script import tirx as T

    @I.ir_module
    class Mod:
        @T.prim_func(s_tir=True)
        def main(A: T.Buffer((48, 40), "float32"), B: T.Buffer((40, 36), "float32"),
                 C: T.Buffer((48, 36), "float32")):
            T.func_attr({"tirx.noalias": True})
            for i, j, k in T.grid(48, 36, 40):
                with T.sblock("C"):
                    vi, vj, vk = T.axis.remap("SSR", [i, j, k])
                    with T.init():
                        C[vi, vj] = T.float32(0)
                    C[vi, vj] = C[vi, vj] + A[vi, vk] * B[vk, vj]

    a, b = rand_inputs([_ph((48, 40), "A"), _ph((40, 36), "B"), None])
    for func in (Mod, Mod["main"]):
        lib = tvm_roller.build(func, TARGET, device=device())
        assert_close(run(lib, [a, b], (48, 36), "float32"),
                     a.astype(np.float64) @ b.astype(np.float64), F32_TOL)
