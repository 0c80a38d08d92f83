"""float64 stays float64 end to end: RMS norm, layer norm, softmax, log-softmax, reductions and
the transcendental elementwise ops, built by roller in float64, agree with float64 numpy to
1e-12 (a float32 constant, intrinsic or accumulator anywhere on the path would leave ~1e-7),
and the scheduled function holds no float32 at all (the vector-math rewrite is float32's only).
Sizes 1, primes and odd; rows not a whole number of vectors."""
from __future__ import annotations

import math

import numpy as np
import pytest
import tvm
from tvm import te, tirx, topi

import tvm_roller
from conftest import F64_TOL, TARGET, assert_close, device, rand, run, softmax
from tvm_roller.core.errors import UnsupportedError

F64 = "float64"


def _c(v: float):
    return tirx.const(v, F64)


def _rms_norm(shape):
    """x * rsqrt(mean(x^2) + eps) * w over the last axis."""
    n = shape[-1]
    x = te.placeholder(shape, F64, name="x")
    w = te.placeholder((n,), F64, name="w")
    k = te.reduce_axis((0, n), "k")
    ss = te.compute(shape[:-1], lambda *i: te.sum(x[(*i, k)] * x[(*i, k)], axis=k), name="ss")
    y = te.compute(shape, lambda *i: x[i] * te.rsqrt(ss[i[:-1]] * _c(1.0 / n) + _c(1e-6))
                   * w[i[-1]], name="rms_norm")
    return [x, w, y], lambda a, b: a / np.sqrt((a * a).mean(-1, keepdims=True) + 1e-6) * b


def _layer_norm(shape):
    """Two passes (mean, then variance), gamma and beta."""
    n = shape[-1]
    x = te.placeholder(shape, F64, name="x")
    g = te.placeholder((n,), F64, name="gamma")
    b = te.placeholder((n,), F64, name="beta")
    k1, k2 = te.reduce_axis((0, n), "k1"), te.reduce_axis((0, n), "k2")
    mean = te.compute(shape[:-1], lambda *i: te.sum(x[(*i, k1)] * _c(1.0 / n), axis=k1),
                      name="mean")
    var = te.compute(shape[:-1], lambda *i: te.sum(
        (x[(*i, k2)] - mean[i]) * (x[(*i, k2)] - mean[i]) * _c(1.0 / n), axis=k2), name="var")
    y = te.compute(shape, lambda *i: (x[i] - mean[i[:-1]]) * te.rsqrt(var[i[:-1]] + _c(1e-5))
                   * g[i[-1]] + b[i[-1]], name="layer_norm")

    def ref(a, gamma, beta):
        return (a - a.mean(-1, keepdims=True)) / np.sqrt(a.var(-1, keepdims=True) + 1e-5) \
            * gamma + beta

    return [x, g, b, y], ref


def _softmax(shape):
    x = te.placeholder(shape, F64, name="x")
    return [x, topi.nn.softmax(x, axis=-1)], softmax


def _log_softmax(shape):
    x = te.placeholder(shape, F64, name="x")

    def ref(a):
        s = a - a.max(-1, keepdims=True)
        return s - np.log(np.exp(s).sum(-1, keepdims=True))

    return [x, topi.nn.log_softmax(x, axis=len(shape) - 1)], ref


_NORMS = {"rms_norm": _rms_norm, "layer_norm": _layer_norm, "softmax": _softmax,
          "log_softmax": _log_softmax}
_ROWS = [(91, 848), (31, 616), (1, 7), (13, 1), (3, 5, 97), (2, 1031)]


def _build_and_compare(tensors, ref, seed: int = 0):
    func = te.create_prim_func(tensors)
    lib = tvm_roller.build(func, TARGET, device=device())
    arrays = [rand([int(s) for s in t.shape], F64, seed + i) for i, t in enumerate(tensors[:-1])]
    out = run(lib, arrays, tensors[-1].shape, F64)
    assert_close(out, ref(*arrays), F64_TOL)
    return func


def _no_float32(func) -> None:
    script = tvm_roller.schedule(func, TARGET, device=device()).mod.script()
    assert "float32" not in script, "a float32 value on the float64 path"


@pytest.mark.parametrize("shape", _ROWS)
@pytest.mark.parametrize("op", sorted(_NORMS))
def test_row_ops(op, shape):
    tensors, ref = _NORMS[op](shape)
    _no_float32(_build_and_compare(tensors, ref, seed=len(shape)))


def _mean(x, ax):
    s = topi.sum(x, axis=ax)
    count = math.prod(int(x.shape[a]) for a in ((ax,) if isinstance(ax, int) else ax))
    return te.compute(s.shape, lambda *i: s[i] * _c(1.0 / count), name="mean")


_REDUCE = {
    "sum": (lambda x, ax: topi.sum(x, axis=ax), lambda a, ax: a.sum(ax)),
    "max": (lambda x, ax: topi.max(x, axis=ax), lambda a, ax: a.max(ax)),
    "mean": (_mean, lambda a, ax: a.mean(ax)),
}


@pytest.mark.parametrize("shape,axis", [((1021,), 0), ((7, 333), 1), ((37, 11), 0),
                                        ((3, 1, 97), (0, 2)), ((1, 5), 1)])
@pytest.mark.parametrize("op", sorted(_REDUCE))
def test_reductions(op, shape, axis):
    make, ref = _REDUCE[op]
    x = te.placeholder(shape, F64, name="x")
    _no_float32(_build_and_compare([x, make(x, axis)], lambda a: ref(a, axis)))


def _erf(a):
    return np.vectorize(math.erf)(a)


_ELEMENTWISE = {
    "exp": (te.exp, np.exp),
    "tanh": (te.tanh, np.tanh),
    "sigmoid": (te.sigmoid, lambda a: 1.0 / (1.0 + np.exp(-a))),
    "erf": (te.erf, _erf),
    "gelu": (lambda v: _c(0.5) * v * (_c(1.0) + te.erf(v * _c(math.sqrt(0.5)))),
             lambda a: 0.5 * a * (1.0 + _erf(a * math.sqrt(0.5)))),
}


@pytest.mark.parametrize("shape", [(1,), (3, 37), (5, 1, 61)])
@pytest.mark.parametrize("op", sorted(_ELEMENTWISE))
def test_elementwise(op, shape):
    """The ops the float32 path rewrites into vector polynomials keep libm here."""
    f, ref = _ELEMENTWISE[op]
    x = te.placeholder(shape, F64, name="x")
    y = te.compute(shape, lambda *i: f(x[i] * _c(3.0)), name="y")
    _no_float32(_build_and_compare([x, y], lambda a: ref(a * 3.0)))


def test_kv_cache_kernels_are_float32_only():
    """The KV-cache kernels' constants are float32's: another element type is declined, not
    mixed with them."""
    from tvm_roller.backends.cpu.kv_cache import CacheLayout

    with pytest.raises(UnsupportedError, match="float32"):
        CacheLayout(2, 2, 64, 128, 4, 64, F64)
    assert CacheLayout(2, 2, 64, 128, 4, 64).dtype == "float32"


@pytest.mark.parametrize("op", ["exp", "tanh", "sigmoid", "erf"])
def test_vector_math_refuses_float64(op):
    """roller's vector polynomials are float32's (constants, exponent-bit tricks): a float64
    argument is refused, never computed at float32's precision."""
    from tvm_roller.backends import vector_math

    x = te.placeholder((3,), F64, name="x")
    with pytest.raises(TypeError, match="float64"):
        getattr(vector_math, op)(x[0] * _c(2.0))
    y = te.placeholder((3,), "float32", name="y")
    assert getattr(vector_math, op)(y[0]) is not None
