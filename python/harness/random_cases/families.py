"""Seeded random cases of the op families roller schedules, and the TE computes behind them.

A :class:`~.case.Case` is drawn from ``np.random.default_rng([seed, index, ...])`` alone, so case
``i`` of a seed is the same whatever ``n`` is (a failure found in a big run is re-run with
``--only i``). Families take turns in a per-block shuffled order, so every family gets its share.

About a third of the extents are drawn as 1, a prime or an odd number: the sizes hardware
alignment likes least. Sizes are capped by multiply-adds and tensor elements so a CPU case
builds and runs in about a second, TVM's unscheduled float64 reference included.

``make_func(case, dtype)`` rebuilds the PrimFunc; ``dtype="float64"`` gives the same compute
in float64 throughout, the reference's version. The ``attention`` family is drawn here too but
is no PrimFunc: a Relax model for the CPU (``attention`` builds it, ``check_cpu`` checks it).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np
from tvm import te, tirx, topi

from harness.random_cases.case import Case, Param

MAX_MACS = 1 << 24  # multiply-adds of one case
MAX_ELEMS = 1 << 20  # elements of its largest tensor
_SPECIAL = 1 / 3  # share of extents drawn as 1, a prime or an odd number
_PRIMES = tuple(p for p in range(2, 4100) if all(p % q for q in range(2, int(p ** 0.5) + 1)))
_DRAW_TRIES = 500

Params = Dict[str, Param]


@dataclass(frozen=True)
class Dtypes:
    """The case's element types: ``data`` of the inputs, ``acc`` of reductions and outputs that
    accumulate (float32 for float16 matmuls: a tensor-core kernel's usual contract), and
    ``data_b`` of a matmul's second operand when it differs from the first (uint8 x int8)."""

    data: str
    acc: str
    data_b: str = ""

    @property
    def b(self) -> str:
        """The element type of a matmul's second operand."""
        return self.data_b or self.data


@dataclass(frozen=True)
class Built:
    """A case's TE compute: placeholders then the one output, and the number of terms each
    output element sums (the tolerance grows with its square root)."""

    tensors: Tuple[te.Tensor, ...]
    reduction: int = 1


# -- drawing -------------------------------------------------------------------------------------
class Draw:
    """The random choices of one case (a thin layer over a numpy Generator)."""

    def __init__(self, rng: np.random.Generator, target: str):
        self.rng = rng
        self.target = target

    def int(self, lo: int, hi: int) -> int:
        """Uniform in [lo, hi]."""
        return int(self.rng.integers(lo, hi + 1))

    def pick(self, options: Sequence):
        return options[int(self.rng.integers(len(options)))]

    def chance(self, p: float) -> bool:
        return bool(self.rng.random() < p)

    def ext(self, lo: int, hi: int) -> int:
        """An extent in [lo, hi]: a third of the time 1, a prime or an odd number; otherwise a
        power of two, a multiple of 8 or anything."""
        if self.chance(_SPECIAL):
            kind = self.int(0, 2)
            if kind == 0 and lo <= 1:
                return 1
            cands = ([p for p in _PRIMES if lo <= p <= hi] if kind <= 1 else
                     list(range(lo | 1, hi + 1, 2)))
        else:
            kind = self.int(0, 2)
            cands = ([1 << e for e in range(13) if lo <= 1 << e <= hi] if kind == 0 else
                     list(range(-(-lo // 8) * 8, hi + 1, 8)) if kind == 1 else [])
        return self.pick(cands) if cands else self.int(lo, hi)

    def shape(self, rank: int, lo: int, hi: int) -> Tuple[int, ...]:
        return tuple(self.ext(lo, hi) for _ in range(rank))


def fmt(shape: Sequence[int]) -> str:
    """``(3, 5, 7) -> "3x5x7"`` (params hold strings, not lists)."""
    return "x".join(str(int(s)) for s in shape)


def dims(text: str) -> Tuple[int, ...]:
    """``"3x5x7" -> (3, 5, 7)``; ``"" -> ()``."""
    return tuple(int(s) for s in text.split("x")) if text else ()


def axes(text: str) -> Tuple[int, ...]:
    """``"0,2" -> (0, 2)``."""
    return tuple(int(s) for s in text.split(",")) if text else ()


def _fits(macs: int, *tensor_shapes: Sequence[int]) -> bool:
    return macs <= MAX_MACS and all(math.prod(s) <= MAX_ELEMS for s in tensor_shapes)


# -- TE helpers ----------------------------------------------------------------------------------
def _dtype(x) -> str:
    """A TE expression's element type (a tensor element has ``dtype``, an expression ``ty``)."""
    dt = getattr(x, "dtype", None)
    return str(dt if dt is not None else x.ty.dtype)


def _cast(x, dtype: str):
    return x if _dtype(x) == dtype else x.astype(dtype)


def _c(value: float, dtype: str):
    return tirx.const(value, dtype)


def _act(x, name: str):
    """relu, the tanh form of gelu, sigmoid, tanh, or none."""
    dt = _dtype(x)
    if name == "relu":
        return te.max(x, _c(0.0, dt))
    if name == "gelu":
        inner = _c(0.7978845608, dt) * (x + _c(0.044715, dt) * x * x * x)
        return _c(0.5, dt) * x * (_c(1.0, dt) + te.tanh(inner))
    if name == "sigmoid":
        return te.sigmoid(x)
    if name == "tanh":
        return te.tanh(x)
    if name == "scale":
        return x * _c(0.5, dt)
    if name == "none":
        return x
    raise ValueError(f"unknown activation {name!r}")


def _matmul(a: te.Tensor, b: te.Tensor, acc: str, trans_b: bool, name: str) -> te.Tensor:
    """``a[..., M, K] . b[..., K, N]`` (``b[..., N, K]`` when ``trans_b``), same batch dims."""
    *batch, m, kk = (int(s) for s in a.shape)
    n = int(b.shape[-2] if trans_b else b.shape[-1])
    k = te.reduce_axis((0, kk), "k")

    def body(*idx):
        *bi, i, j = idx
        bv = b[(*bi, j, k)] if trans_b else b[(*bi, k, j)]
        return te.sum(_cast(a[(*bi, i, k)], acc) * _cast(bv, acc), axis=k)

    return te.compute((*batch, m, n), body, name=name)


# -- matmul, batch matmul, GEMV ------------------------------------------------------------------
def _draw_matmul(d: Draw) -> Optional[Params]:
    m, n, k = d.ext(1, 512), d.ext(1, 512), d.ext(1, 512)
    if not _fits(m * n * k, (m, k), (k, n), (m, n)):
        return None
    return {"M": m, "N": n, "K": k, "trans_b": d.int(0, 1)}


def _build_matmul(p: Mapping[str, Param], dt: Dtypes) -> Built:
    m, n, k, tb = int(p["M"]), int(p["N"]), int(p["K"]), bool(p["trans_b"])
    a = te.placeholder((m, k), dt.data, name="A")
    b = te.placeholder((n, k) if tb else (k, n), dt.b, name="B")
    return Built((a, b, _matmul(a, b, dt.acc, tb, "C")), k)


def _draw_batch_matmul(d: Draw) -> Optional[Params]:
    bs, m, n, k = d.ext(1, 16), d.ext(1, 256), d.ext(1, 256), d.ext(1, 256)
    if not _fits(bs * m * n * k, (bs, m, k), (bs, k, n), (bs, m, n)):
        return None
    return {"B": bs, "M": m, "N": n, "K": k, "trans_b": d.int(0, 1)}


def _build_batch_matmul(p: Mapping[str, Param], dt: Dtypes) -> Built:
    bs, m, n, k, tb = (int(p[x]) for x in ("B", "M", "N", "K", "trans_b"))
    a = te.placeholder((bs, m, k), dt.data, name="A")
    b = te.placeholder((bs, n, k) if tb else (bs, k, n), dt.b, name="B")
    return Built((a, b, _matmul(a, b, dt.acc, bool(tb), "C")), k)


def _draw_gemv(d: Draw) -> Optional[Params]:
    n, k = d.ext(1, 2048), d.ext(1, 2048)
    if not _fits(n * k, (n, k)):
        return None
    return {"form": d.pick(("dense", "gemv", "vecmat")), "N": n, "K": k}


def _build_gemv(p: Mapping[str, Param], dt: Dtypes) -> Built:
    """dense with M=1 (``x[1,K] . W[N,K]^T``), a matrix times a vector, a vector times one."""
    form, n, kk = str(p["form"]), int(p["N"]), int(p["K"])
    k = te.reduce_axis((0, kk), "k")
    if form == "dense":
        x = te.placeholder((1, kk), dt.data, name="X")
        w = te.placeholder((n, kk), dt.data, name="W")
        y = te.compute((1, n), lambda i, j: te.sum(_cast(x[i, k], dt.acc) * _cast(w[j, k], dt.acc),
                                                   axis=k), name="Y")
        return Built((x, w, y), kk)
    if form == "gemv":
        a = te.placeholder((n, kk), dt.data, name="A")
        x = te.placeholder((kk,), dt.data, name="x")
        y = te.compute((n,), lambda j: te.sum(_cast(a[j, k], dt.acc) * _cast(x[k], dt.acc),
                                              axis=k), name="y")
        return Built((a, x, y), kk)
    x = te.placeholder((kk,), dt.data, name="x")
    b = te.placeholder((kk, n), dt.data, name="B")
    y = te.compute((n,), lambda j: te.sum(_cast(x[k], dt.acc) * _cast(b[k, j], dt.acc), axis=k),
                   name="y")
    return Built((x, b, y), kk)


# -- convolutions --------------------------------------------------------------------------------
def _out_len(size: int, k: int, stride: int, dilation: int, pad: int) -> int:
    return (size + 2 * pad - dilation * (k - 1) - 1) // stride + 1


def _draw_groups(d: Draw, ci: int, co: int) -> Tuple[int, int]:
    """(groups, co): mostly 1; sometimes depthwise (co a multiple of ci); sometimes a common
    divisor of both channel counts."""
    if ci > 1 and d.chance(0.2):
        return ci, ci * d.pick((1, 1, 2))
    common = [g for g in range(2, min(ci, co) + 1) if ci % g == 0 and co % g == 0]
    if common and d.chance(0.25):
        return d.pick(common), co
    return 1, co


def _draw_conv(d: Draw, nd: int, n_hi: int, s_hi: int, c_hi: int, k_hi: int,
               stride_hi: int, dil_hi: int, layouts: Sequence[str]) -> Optional[Params]:
    n = d.int(1, n_hi)
    spatial = d.shape(nd, 1, s_hi)
    ci = d.ext(1, c_hi)
    groups, co = _draw_groups(d, ci, d.ext(1, c_hi))
    k = d.int(1, k_hi)
    kernel = (k,) * nd if d.chance(0.7) else tuple(d.int(1, k_hi) for _ in range(nd))
    stride, dilation = d.int(1, stride_hi), d.int(1, dil_hi) if d.chance(0.4) else 1
    pad = d.int(0, max(kernel) // 2 * dilation) if d.chance(0.7) else 0
    out = [_out_len(s, kk, stride, dilation, pad) for s, kk in zip(spatial, kernel)]
    if min(out) < 1:
        return None
    macs = n * math.prod(out) * co * (ci // groups) * math.prod(kernel)
    if not _fits(macs, (n, ci, *spatial), (n, co, *out), (co, ci // groups, *kernel)):
        return None
    return {"layout": d.pick(layouts), "N": n, "S": fmt(spatial), "CI": ci, "CO": co,
            "kernel": fmt(kernel), "stride": stride, "dilation": dilation, "pad": pad,
            "groups": groups}


def _build_conv(p: Mapping[str, Param], dt: Dtypes) -> Built:
    """N-d grouped convolution, channels last (``NLC/NHWC/NDHWC``, weight ``[*K, CI/g, CO]``) or
    first (``NCL/NCHW/NCDHW``, weight ``[CO, CI/g, *K]``); zero padding is its own stage."""
    last = str(p["layout"]).endswith("C")
    n, ci, co, g = int(p["N"]), int(p["CI"]), int(p["CO"]), int(p["groups"])
    spatial, kernel = dims(str(p["S"])), dims(str(p["kernel"]))
    s, dil, pad = int(p["stride"]), int(p["dilation"]), int(p["pad"])
    nd, cpg, cog = len(spatial), ci // g, co // g
    out = tuple(_out_len(x, k, s, dil, pad) for x, k in zip(spatial, kernel))
    x = te.placeholder((n, *spatial, ci) if last else (n, ci, *spatial), dt.data, name="X")
    w = te.placeholder((*kernel, cpg, co) if last else (co, cpg, *kernel), dt.data, name="W")
    if pad:
        sp = [0, *([pad] * nd), 0] if last else [0, 0, *([pad] * nd)]
        x_p = topi.nn.pad(x, sp, name="pad")
    else:
        x_p = x
    rc = te.reduce_axis((0, cpg), "rc")
    rk = [te.reduce_axis((0, k), f"r{i}") for i, k in enumerate(kernel)]

    def body(*idx):
        b = idx[0]
        o, c = (idx[1:-1], idx[-1]) if last else (idx[2:], idx[1])
        ch = c // cog * cpg + rc
        pos = [oi * s + r * dil for oi, r in zip(o, rk)]
        xv = x_p[(b, *pos, ch)] if last else x_p[(b, ch, *pos)]
        wv = w[(*rk, rc, c)] if last else w[(c, rc, *rk)]
        return te.sum(_cast(xv, dt.acc) * _cast(wv, dt.acc), axis=[rc, *rk])

    y = te.compute((n, *out, co) if last else (n, co, *out), body, name="conv")
    return Built((x, w, y), cpg * math.prod(kernel))


def _draw_conv1d(d: Draw) -> Optional[Params]:
    return _draw_conv(d, 1, 4, 64, 64, 7, 3, 3, ("NLC", "NCL"))


def _draw_conv2d_nhwc(d: Draw) -> Optional[Params]:
    return _draw_conv(d, 2, 4, 32, 64, 5, 3, 2, ("NHWC",))


def _draw_conv2d_nchw(d: Draw) -> Optional[Params]:
    return _draw_conv(d, 2, 4, 32, 64, 5, 3, 2, ("NCHW",))


def _draw_conv3d(d: Draw) -> Optional[Params]:
    return _draw_conv(d, 3, 2, 12, 32, 3, 2, 2, ("NDHWC", "NDHWC", "NCDHW"))


def _draw_conv_transpose(d: Draw) -> Optional[Params]:
    nd = d.int(1, 2)
    n = d.int(1, 2)
    spatial = d.shape(nd, 1, 64 if nd == 1 else 16)
    ci, co = d.ext(1, 64 if nd == 1 else 32), d.ext(1, 64 if nd == 1 else 32)
    k, stride = d.int(1, 5), d.int(1, 3)
    pad = d.int(0, k - 1)
    out = [(x - 1) * stride - 2 * pad + k for x in spatial]
    if min(out) < 1:
        return None
    macs = n * math.prod(out) * co * ci * k ** nd
    if not _fits(macs, (n, *spatial, ci), (n, *out, co)):
        return None
    return {"N": n, "S": fmt(spatial), "CI": ci, "CO": co, "kernel": k, "stride": stride,
            "pad": pad}


def _build_conv_transpose(p: Mapping[str, Param], dt: Dtypes) -> Built:
    """Transposed convolution, channels last, weight ``[*K, CI, CO]``: the input padded by
    ``ceil(q / s)`` (``q = k - 1 - pad``), then a stride-1 convolution over the virtually
    dilated input (zero between strided samples) with the flipped kernel."""
    n, ci, co = int(p["N"]), int(p["CI"]), int(p["CO"])
    spatial = dims(str(p["S"]))
    k, s, pad = int(p["kernel"]), int(p["stride"]), int(p["pad"])
    nd = len(spatial)
    q = k - 1 - pad
    pb = -(-q // s)
    border = pb * s - q  # dilated coordinate t reads padded position (t + border) / s
    out = tuple((x - 1) * s - 2 * pad + k for x in spatial)
    x = te.placeholder((n, *spatial, ci), dt.data, name="X")
    w = te.placeholder((*([k] * nd), ci, co), dt.data, name="W")
    x_p = topi.nn.pad(x, [0, *([pb] * nd), 0], name="pad") if pb else x
    rc = te.reduce_axis((0, ci), "rc")
    rk = [te.reduce_axis((0, k), f"r{i}") for i in range(nd)]

    def body(b, *rest):
        o, c = rest[:-1], rest[-1]
        t = [oi + r + border for oi, r in zip(o, rk)]
        xv = _cast(x_p[(b, *[ti // s for ti in t], rc)], dt.acc)
        if s > 1:
            xv = te.if_then_else(te.all(*[ti % s == 0 for ti in t]), xv, _c(0.0, dt.acc))
        wv = _cast(w[(*[k - 1 - r for r in rk], rc, c)], dt.acc)
        return te.sum(xv * wv, axis=[rc, *rk])

    y = te.compute((n, *out, co), body, name="conv_transpose")
    return Built((x, w, y), ci * k ** nd)


# -- pooling, softmax, layernorm, reductions -----------------------------------------------------
def _draw_pool(d: Draw) -> Optional[Params]:
    n, h, w, c = d.int(1, 4), d.ext(1, 32), d.ext(1, 32), d.ext(1, 64)
    kh = d.int(1, 4)
    kw = kh if d.chance(0.7) else d.int(1, 4)
    stride = d.int(1, 3)
    pad = d.int(0, min(kh, kw) // 2) if d.chance(0.5) else 0
    oh, ow = (h + 2 * pad - kh) // stride + 1, (w + 2 * pad - kw) // stride + 1
    if min(oh, ow) < 1 or not _fits(n * oh * ow * c * kh * kw, (n, h, w, c)):
        return None
    return {"kind": d.pick(("max", "avg")), "layout": d.pick(("NHWC", "NCHW")), "N": n, "H": h,
            "W": w, "C": c, "kernel": fmt((kh, kw)), "stride": stride, "pad": pad}


def _build_pool(p: Mapping[str, Param], dt: Dtypes) -> Built:
    """2-D max or average pooling (padding never makes a window empty: pad <= kernel // 2; the
    average counts the padding, as ``count_include_pad``)."""
    last = str(p["layout"]) == "NHWC"
    n, h, w, c = (int(p[x]) for x in ("N", "H", "W", "C"))
    kh, kw = dims(str(p["kernel"]))
    s, pad, kind = int(p["stride"]), int(p["pad"]), str(p["kind"])
    oh, ow = (h + 2 * pad - kh) // s + 1, (w + 2 * pad - kw) // s + 1
    x = te.placeholder((n, h, w, c) if last else (n, c, h, w), dt.data, name="X")
    if pad:
        sp = [0, pad, pad, 0] if last else [0, 0, pad, pad]
        fill = te.min_value(dt.data) if kind == "max" else 0.0
        x_p = topi.nn.pad(x, sp, pad_value=fill, name="pad")
    else:
        x_p = x
    rh, rw = te.reduce_axis((0, kh), "rh"), te.reduce_axis((0, kw), "rw")

    def at(b, ch, i, j):
        return x_p[b, i * s + rh, j * s + rw, ch] if last else x_p[b, ch, i * s + rh, j * s + rw]

    shape = (n, oh, ow, c) if last else (n, c, oh, ow)

    def unpack(idx):
        return (idx[0], idx[3], idx[1], idx[2]) if last else idx

    if kind == "max":
        y = te.compute(shape, lambda *i: te.max(at(*unpack(i)), axis=[rh, rw]), name="pool")
        return Built((x, y), kh * kw)
    acc = te.compute(shape, lambda *i: te.sum(_cast(at(*unpack(i)), dt.acc), axis=[rh, rw]),
                     name="pool_sum")
    y = te.compute(shape, lambda *i: acc[i] * _c(1.0 / (kh * kw), dt.acc), name="pool")
    return Built((x, y), kh * kw)


def _draw_rows(d: Draw, d_hi: int) -> Optional[Params]:
    rank = d.int(1, 3)
    shape = (*d.shape(rank - 1, 1, 64), d.ext(1, d_hi))
    return {"shape": fmt(shape)} if _fits(0, shape) else None


def _build_softmax(p: Mapping[str, Param], dt: Dtypes) -> Built:
    shape = dims(str(p["shape"]))
    lead, n = shape[:-1], shape[-1]
    x = te.placeholder(shape, dt.data, name="X")
    k1, k2 = te.reduce_axis((0, n), "k1"), te.reduce_axis((0, n), "k2")
    mx = te.compute(lead, lambda *i: te.max(x[(*i, k1)], axis=k1), name="row_max")
    e = te.compute(shape, lambda *i: te.exp(x[i] - mx[i[:-1]]), name="exp")
    sm = te.compute(lead, lambda *i: te.sum(e[(*i, k2)], axis=k2), name="row_sum")
    y = te.compute(shape, lambda *i: e[i] / sm[i[:-1]], name="softmax")
    return Built((x, y), n)


def _build_layernorm(p: Mapping[str, Param], dt: Dtypes) -> Built:
    """Layer normalisation over the last axis, two passes (mean, then variance), with gamma and
    beta."""
    shape = dims(str(p["shape"]))
    lead, n = shape[:-1], shape[-1]
    x = te.placeholder(shape, dt.data, name="X")
    gamma = te.placeholder((n,), dt.data, name="gamma")
    beta = te.placeholder((n,), dt.data, name="beta")
    k1, k2 = te.reduce_axis((0, n), "k1"), te.reduce_axis((0, n), "k2")
    inv_n = _c(1.0 / n, dt.data)
    mean = te.compute(lead, lambda *i: te.sum(x[(*i, k1)] * inv_n, axis=k1), name="mean")

    def dev(*i):
        return x[(*i, k2)] - mean[i]

    var = te.compute(lead, lambda *i: te.sum(dev(*i) * dev(*i) * inv_n, axis=k2), name="var")
    eps = _c(1e-5, dt.data)
    y = te.compute(shape, lambda *i: (x[i] - mean[i[:-1]]) * te.rsqrt(var[i[:-1]] + eps)
                   * gamma[i[-1]] + beta[i[-1]], name="layernorm")
    return Built((x, gamma, beta, y), n)


def _draw_log_softmax(d: Draw) -> Optional[Params]:
    p = _draw_rows(d, 1024)
    if p is not None:  # mostly the last axis, as in a model; sometimes a strided one
        rank = len(dims(str(p["shape"])))
        p["axis"] = rank - 1 if d.chance(0.7) else d.int(0, rank - 1)
    return p


def _build_log_softmax(p: Mapping[str, Param], dt: Dtypes) -> Built:
    """TOPI's log-softmax along one axis, ``x - max - log(sum(exp(x - max)))``, as Relax
    legalizes it: its max and exp-sum have one rank less than ``x``, and the exp-sum and the
    output share the buffer name ``compute``."""
    shape = dims(str(p["shape"]))
    axis = int(p.get("axis", len(shape) - 1))
    x = te.placeholder(shape, dt.data, name="X")
    return Built((x, topi.nn.log_softmax(x, axis=axis)), shape[axis])


def _build_rms_norm(p: Mapping[str, Param], dt: Dtypes) -> Built:
    """``x * rsqrt(mean(x^2) + eps) * w`` over the last axis, in the case's dtype throughout
    (TOPI's ``rms_norm`` computes in float32 whatever its dtype: not a float64 case)."""
    shape = dims(str(p["shape"]))
    lead, n = shape[:-1], shape[-1]
    x = te.placeholder(shape, dt.data, name="X")
    w = te.placeholder((n,), dt.data, name="weight")
    k = te.reduce_axis((0, n), "k")
    ss = te.compute(lead, lambda *i: te.sum(_cast(x[(*i, k)], dt.acc) * _cast(x[(*i, k)], dt.acc),
                                            axis=k), name="sum_sq")
    inv_n, eps = _c(1.0 / n, dt.acc), _c(1e-6, dt.acc)
    y = te.compute(shape, lambda *i: _cast(x[i], dt.acc) * te.rsqrt(ss[i[:-1]] * inv_n + eps)
                   * _cast(w[i[-1]], dt.acc), name="rms_norm")
    return Built((x, w, y), n)


def _draw_reduce(d: Draw) -> Optional[Params]:
    if d.chance(0.25):  # the whole of a vector to a scalar, as in Y = sum(X) * 0.5
        shape: Tuple[int, ...] = (d.pick((1024, 7, d.ext(1, 4096))),)
        red = (0,)
    else:
        shape = d.shape(d.int(1, 4), 1, 64)
        red = tuple(i for i in range(len(shape)) if d.chance(0.5)) or (d.int(0, len(shape) - 1),)
    full = len(red) == len(shape)
    if not _fits(0, shape):
        return None
    return {"shape": fmt(shape), "axes": ",".join(map(str, red)),
            "op": d.pick(("sum", "max", "mean")), "keepdims": d.int(0, 1) if not full else 0,
            "post": d.pick(("scale", "scale", "relu")) if full else
            d.pick(("none", "none", "scale", "relu"))}


def _build_reduce(p: Mapping[str, Param], dt: Dtypes) -> Built:
    """sum, max or mean over some axes (all of them: a scalar), then an elementwise step."""
    shape, red = dims(str(p["shape"])), axes(str(p["axes"]))
    op, keep, post = str(p["op"]), bool(p["keepdims"]), str(p["post"])
    acc = dt.data if op == "max" else dt.acc
    x = te.placeholder(shape, dt.data, name="X")
    rs = {a: te.reduce_axis((0, shape[a]), f"r{a}") for a in red}
    kept = [a for a in range(len(shape)) if a not in rs]
    out = tuple(1 if a in rs else shape[a] for a in range(len(shape))) if keep else \
        tuple(shape[a] for a in kept)

    def index(idx):
        it = iter(idx)
        if keep:
            return tuple(rs[a] if a in rs else idx[a] for a in range(len(shape)))
        return tuple(rs[a] if a in rs else next(it) for a in range(len(shape)))

    reducer = te.max if op == "max" else te.sum
    r = te.compute(out, lambda *i: reducer(_cast(x[index(i)], acc), axis=list(rs.values())),
                   name="reduce")
    count = math.prod(shape[a] for a in red)
    if op != "mean" and post == "none":
        return Built((x, r), count)

    def step(*i):
        v = r[i]
        if op == "mean":
            v = v * _c(1.0 / count, acc)
        return _act(v, post)

    y = te.compute(out, step, name="post")
    return Built((x, y), count)


def _draw_variance(d: Draw) -> Optional[Params]:
    shape = d.shape(d.int(1, 4), 1, 64)
    red = tuple(i for i in range(len(shape)) if d.chance(0.5)) or (d.int(0, len(shape) - 1),)
    if not _fits(0, shape):
        return None
    return {"shape": fmt(shape), "axes": ",".join(map(str, red)), "keepdims": d.int(0, 1)}


def _build_variance(p: Mapping[str, Param], dt: Dtypes) -> Built:
    """``sum((X - mean(X)) ** 2)`` over some axes: a reduction feeding another through an
    elementwise stage (the statistics of a norm over arbitrary axes)."""
    shape, red, keep = dims(str(p["shape"])), axes(str(p["axes"])), bool(p["keepdims"])
    x = te.placeholder(shape, dt.data, name="X")
    count = math.prod(shape[a] for a in red)
    r1 = {a: te.reduce_axis((0, shape[a]), f"m{a}") for a in red}
    r2 = {a: te.reduce_axis((0, shape[a]), f"v{a}") for a in red}
    stat = tuple(1 if a in red else shape[a] for a in range(len(shape)))
    mean = te.compute(stat, lambda *i: te.sum(
        x[tuple(r1[a] if a in r1 else i[a] for a in range(len(shape)))] * _c(1.0 / count,
                                                                             dt.data),
        axis=list(r1.values())), name="mean")
    dev = te.compute(shape, lambda *i: x[i] - mean[tuple(0 if a in red else i[a]
                                                         for a in range(len(shape)))],
                     name="dev")
    out = stat if keep else tuple(shape[a] for a in range(len(shape)) if a not in red)

    def var(*i):
        it = iter(i)
        full = tuple(r2[a] if a in r2 else (i[a] if keep else next(it))
                     for a in range(len(shape)))
        return te.sum(dev[full] * dev[full], axis=list(r2.values()))

    return Built((x, te.compute(out, var, name="variance")), count)


def _draw_arg_reduce(d: Draw) -> Optional[Params]:
    shape = d.shape(d.int(1, 4), 1, 64)
    if not _fits(0, shape):
        return None
    return {"shape": fmt(shape), "axis": d.int(0, len(shape) - 1),
            "op": d.pick(("argmax", "argmin")), "keepdims": d.int(0, 1)}


def _build_arg_reduce(p: Mapping[str, Param], dt: Dtypes) -> Built:
    """The int32 index of the largest or smallest element along one axis (a reduction over
    (index, value) pairs; random data has no ties)."""
    x = te.placeholder(dims(str(p["shape"])), dt.data, name="X")
    reduce = topi.argmax if p["op"] == "argmax" else topi.argmin
    return Built((x, reduce(x, axis=int(p["axis"]), keepdims=bool(p["keepdims"]))), 1)


def _draw_pad_slice(d: Draw) -> Optional[Params]:
    shape = d.shape(d.int(1, 4), 1, 64)
    if not _fits(0, shape):
        return None
    before = tuple(d.int(0, 3) for _ in shape)
    after = tuple(d.int(0, 3) for _ in shape)
    strides = tuple(d.pick((1, 1, 2, 3)) for _ in shape)
    return {"shape": fmt(shape), "before": fmt(before), "after": fmt(after),
            "strides": fmt(strides)}


def _build_pad_slice(p: Mapping[str, Param], dt: Dtypes) -> Built:
    """Zero padding then a strided slice of the padded tensor, times 2 (injective stages
    with conditions and strides, as in the prologue of a convolution)."""
    shape, before, after = dims(str(p["shape"])), dims(str(p["before"])), dims(str(p["after"]))
    strides = dims(str(p["strides"]))
    x = te.placeholder(shape, dt.data, name="X")
    padded = topi.nn.pad(x, list(before), list(after), name="pad")
    full = [s + b + a for s, b, a in zip(shape, before, after)]
    out = tuple(-(-f // st) for f, st in zip(full, strides))
    y = te.compute(out, lambda *i: padded[tuple(j * st for j, st in zip(i, strides))]
                   * _c(2.0, dt.data), name="slice")
    return Built((x, y), 1)


# -- elementwise, matmul epilogues, copies -------------------------------------------------------
_ELEMENTWISE = ("add", "mul", "bias_relu", "sigmoid_mul", "tanh_add", "exp_scale", "gelu_add")


def _draw_elementwise(d: Draw) -> Optional[Params]:
    shape = d.shape(d.int(1, 4), 1, 128)
    bshape = tuple(1 if d.chance(0.4) else s for s in shape)
    if not _fits(0, shape):
        return None
    return {"shape": fmt(shape), "bshape": fmt(bshape), "op": d.pick(_ELEMENTWISE)}


def _build_elementwise(p: Mapping[str, Param], dt: Dtypes) -> Built:
    """``f(A, B)`` with ``B`` broadcast along its size-1 axes."""
    shape, bshape, op = dims(str(p["shape"])), dims(str(p["bshape"])), str(p["op"])
    a = te.placeholder(shape, dt.data, name="A")
    b = te.placeholder(bshape, dt.data, name="B")
    t = dt.data

    def body(*i):
        x = a[i]
        y = b[tuple(0 if bs == 1 else ii for ii, bs in zip(i, bshape))]
        return {"add": lambda: x + y, "mul": lambda: x * y,
                "bias_relu": lambda: _act(x + y, "relu"),
                "sigmoid_mul": lambda: x * te.sigmoid(y),
                "tanh_add": lambda: te.tanh(x) + y,
                "exp_scale": lambda: te.exp(x) * _c(0.5, t) + y,
                "gelu_add": lambda: _act(x + y, "gelu")}[op]()

    return Built((a, b, te.compute(shape, body, name="elementwise")), 1)


def _draw_matmul_bias_act(d: Draw) -> Optional[Params]:
    p = _draw_matmul(d)
    if p is not None:
        p["act"] = d.pick(("relu", "gelu", "sigmoid", "none"))
    return p


def _build_matmul_bias_act(p: Mapping[str, Param], dt: Dtypes) -> Built:
    m, n, k, tb = int(p["M"]), int(p["N"]), int(p["K"]), bool(p["trans_b"])
    a = te.placeholder((m, k), dt.data, name="A")
    b = te.placeholder((n, k) if tb else (k, n), dt.data, name="B")
    bias = te.placeholder((n,), dt.acc, name="bias")
    c = _matmul(a, b, dt.acc, tb, "matmul")
    y = te.compute((m, n), lambda i, j: _act(c[i, j] + bias[j], str(p["act"])), name="Y")
    return Built((a, b, bias, y), k)


def _draw_copy_transpose(d: Draw) -> Optional[Params]:
    shape = d.shape(d.int(2, 4), 1, 128)
    perm = list(range(len(shape))) if d.chance(0.2) else [int(i) for i in
                                                          d.rng.permutation(len(shape))]
    if not _fits(0, shape):
        return None
    return {"shape": fmt(shape), "perm": ",".join(map(str, perm))}


def _build_copy_transpose(p: Mapping[str, Param], dt: Dtypes) -> Built:
    """``Y = X.transpose(perm)`` (a plain copy for the identity permutation)."""
    shape, perm = dims(str(p["shape"])), axes(str(p["perm"]))
    x = te.placeholder(shape, dt.data, name="X")

    def body(*yi):
        xi = [0] * len(shape)
        for i, src in enumerate(perm):
            xi[src] = yi[i]
        return x[tuple(xi)]

    y = te.compute(tuple(shape[a] for a in perm), body, name="transpose")
    return Built((x, y), 1)


# -- GEMM chains ---------------------------------------------------------------------------------
def _draw_gemm_chain(d: Draw) -> Optional[Params]:
    bs = d.ext(1, 8) if d.chance(0.5) else 0
    m, k, l, n = (d.ext(1, 256) for _ in range(4))  # noqa: E741
    b = max(bs, 1)
    if not _fits(b * (m * k * l + m * l * n), (b, m, k), (b, k, l), (b, l, n), (b, m, l)):
        return None
    return {"batch": bs, "M": m, "K": k, "L": l, "N": n,
            "middle": d.pick(("none", "relu", "gelu", "scale"))}


def _build_gemm_chain(p: Mapping[str, Param], dt: Dtypes) -> Built:
    """``f(A . B) . D`` (batched when ``batch`` > 0), ``f`` none, relu, gelu or a scale."""
    bs, m, k, l, n = (int(p[x]) for x in ("batch", "M", "K", "L", "N"))  # noqa: E741
    lead = (bs,) if bs else ()
    a = te.placeholder((*lead, m, k), dt.data, name="A")
    b = te.placeholder((*lead, k, l), dt.data, name="B")
    dd = te.placeholder((*lead, l, n), dt.data, name="D")
    c = _matmul(a, b, dt.acc, False, "C")
    if str(p["middle"]) != "none":
        c = te.compute(c.shape, lambda *i: _act(c[i], str(p["middle"])), name="mid")
    return Built((a, b, dd, _matmul(c, dd, dt.acc, False, "E")), k * l)


# -- attention (a Relax model: ``attention`` builds it, ``check_cpu`` compiles and checks it) ---
ATTENTION_MACS = 1 << 26  # the reference is numpy's BLAS matmul, not TVM's unscheduled loops
_HEAD_SIZES = (1, 16, 32, 40, 64, 64, 72, 80, 96, 128)  # models' (64 the commonest), and 1
ATTENTION_MASKS = ("none", "padding", "causal", "causal_padding", "random", "head_bias")


def _draw_kv(d: Draw, h: int) -> Tuple[int, str]:
    """(kv heads, how they meet the query heads): MHA; GQA and MQA as HF's ``repeat_kv``
    (expand_dims, broadcast_to, reshape), or MQA's one head broadcast by the matmul itself."""
    grouped = [g for g in range(2, h) if h % g == 0]
    kinds = ["mha"] + (["gqa"] if grouped else []) + (["mqa"] if h > 1 else [])
    kind = d.pick(kinds)
    if kind == "mha":
        return h, "mha"
    if kind == "gqa":
        return d.pick(grouped), "repeat"
    return 1, d.pick(("repeat", "broadcast"))


def _draw_mask(d: Draw, b: int, sq: int, sk: int) -> Params:
    """An additive mask or bias in a shape HF uses (``attention_mask_shape``): its kind,
    its batch extent where that may be 1, the value at masked positions (``fill``: the dtype's
    minimum, HF's; -1e9 or -10000, older models'), and whether a row is masked everywhere
    (``empty``: only with the minimum, whose sum with any score is the minimum in float32 and
    float64 alike, so such a row is a softmax of equal values on both sides)."""
    kind = d.pick(ATTENTION_MASKS)
    if kind == "none":
        return {"mask": kind}
    p: Params = {"mask": kind}
    if kind in ("causal", "head_bias"):
        p["mask_batch"] = d.pick((1, b))
    if kind == "head_bias":  # relative-position biases: values, no masked positions
        return p
    # a causal mask over more queries than keys masks the first queries everywhere
    p["empty"] = int(kind.startswith("causal") and sq > sk
                     or kind != "causal" and d.chance(0.3))
    p["fill"] = "min" if p["empty"] else d.pick(("min", "min", "-1e9", "-10000"))
    return p


def _draw_attention(d: Draw) -> Optional[Params]:
    b, h = d.int(1, 3), d.ext(1, 16)
    kvh, kv = _draw_kv(d, h)
    hd = d.pick(_HEAD_SIZES) if d.chance(0.7) else d.ext(1, 160)
    sq = d.ext(1, 300)
    sk = sq if d.chance(0.5) else d.ext(1, 300)
    if not _fits(0, (b, h, sq, sk)) or 2 * b * h * sq * sk * hd > ATTENTION_MACS:
        return None
    p: Params = {"B": b, "H": h, "KVH": kvh, "D": hd, "SQ": sq, "SK": sk, "kv": kv,
                 **_draw_mask(d, b, sq, sk)}
    p["scale"] = d.pick(("multiply", "multiply", "divide", "none"))
    if p["scale"] == "multiply":  # HF's head_dim ** -0.5, or a sharper or flatter softmax
        p["const"] = repr(hd ** -0.5 if d.chance(0.6) else d.pick((0.05, 0.5, 2.0, 4.0)))
    elif p["scale"] == "divide":  # older models' / math.sqrt(head_dim)
        p["const"] = repr(math.sqrt(hd) if d.chance(0.7) else d.pick((0.5, 3.0, 8.0)))
    # the operands at rank 4; each matmul between the rank-3 views torch.export imports (the
    # output transposed to [b, sq, h * d] as HF's attention returns it); or heads folded into
    # a rank-3 batch (MHA, and a mask whose batch and heads fold with them)
    mask = attention_mask_shape(p)
    folds = kv == "mha" and (mask is None or mask[0] * mask[1] in (1, b * h))
    p["form"] = d.pick(("rank4", "torch", "folded") if folds else ("rank4", "torch"))
    return p


def attention_mask_shape(p: Mapping[str, Param]) -> Optional[Tuple[int, int, int, int]]:
    """The additive mask's shape at rank 4, as HF makes it: a padding mask ``[b, 1, 1, sk]``;
    a causal one ``[1 or b, 1, sq, sk]``; causal and padding combined, or any pattern,
    ``[b, 1, sq, sk]``; a per-head bias ``[1 or b, h, sq, sk]``. None without a mask."""
    kind = str(p["mask"])
    if kind == "none":
        return None
    b, h, sq, sk = (int(p[x]) for x in ("B", "H", "SQ", "SK"))
    return (int(p.get("mask_batch", b)), h if kind == "head_bias" else 1,
            1 if kind == "padding" else sq, sk)


# -- the registry --------------------------------------------------------------------------------
@dataclass(frozen=True)
class Family:
    """How to draw a family's parameters (None: over budget or invalid, draw again) and build
    its compute. ``half``: CUDA cases may be float16; ``mixed``: float16 inputs accumulate in
    float32 (matmuls) rather than in float16. ``relax``: no PrimFunc (``build`` is None) but a
    Relax model compiled whole by roller's pipeline (``attention``), on a CPU only."""

    draw: Callable[[Draw], Optional[Params]]
    build: Optional[Callable[[Mapping[str, Param], Dtypes], Built]]
    half: bool = False
    mixed: bool = False
    relax: bool = False


FAMILIES: Dict[str, Family] = {
    "matmul": Family(_draw_matmul, _build_matmul, half=True, mixed=True),
    "batch_matmul": Family(_draw_batch_matmul, _build_batch_matmul, half=True, mixed=True),
    "gemv": Family(_draw_gemv, _build_gemv),
    "conv1d": Family(_draw_conv1d, _build_conv),
    "conv2d_nhwc": Family(_draw_conv2d_nhwc, _build_conv),
    "conv2d_nchw": Family(_draw_conv2d_nchw, _build_conv),
    "conv3d": Family(_draw_conv3d, _build_conv),
    "conv_transpose": Family(_draw_conv_transpose, _build_conv_transpose),
    "pool": Family(_draw_pool, _build_pool),
    "softmax": Family(lambda d: _draw_rows(d, 1024), _build_softmax),
    "layernorm": Family(lambda d: _draw_rows(d, 1024), _build_layernorm),
    "log_softmax": Family(_draw_log_softmax, _build_log_softmax),
    "rms_norm": Family(lambda d: _draw_rows(d, 1024), _build_rms_norm),
    "reduce": Family(_draw_reduce, _build_reduce, half=True, mixed=True),
    "elementwise": Family(_draw_elementwise, _build_elementwise, half=True),
    "matmul_bias_act": Family(_draw_matmul_bias_act, _build_matmul_bias_act, half=True,
                              mixed=True),
    "copy_transpose": Family(_draw_copy_transpose, _build_copy_transpose, half=True),
    "gemm_chain": Family(_draw_gemm_chain, _build_gemm_chain),
    "variance": Family(_draw_variance, _build_variance),
    "pad_slice": Family(_draw_pad_slice, _build_pad_slice, half=True),
    "arg_reduce": Family(_draw_arg_reduce, _build_arg_reduce),
    "attention": Family(_draw_attention, None, relax=True),
}


#: low-precision first operands and their accumulators (``--lowp``, on every CPU target: the
#: AMX tiles, AVX-512 / AVX VNNI and AVX512-BF16 dot products, or plain conversions)
LOW_PRECISION = {"bfloat16": "float32", "int8": "int32", "uint8": "int32"}
#: the second operand's types drawn with each first operand's (its own stream): bf16 x bf16,
#: int8 x int8, and uint8 x int8 (VNNI's vpdpbusd) or uint8 x uint8
LOW_PRECISION_B = {"bfloat16": ("bfloat16",), "int8": ("int8",), "uint8": ("int8", "uint8")}
LOWP_FAMILIES = ("matmul", "batch_matmul")


def _draw_dtype(d: Draw, fam: Family, family: str, lowp: bool) -> str:
    if lowp and d.target == "cpu" and family in LOWP_FAMILIES:
        return list(LOW_PRECISION)[d.int(0, len(LOW_PRECISION) - 1)]
    if d.target == "cuda" and fam.half and d.chance(0.4):
        return "float16"
    return "float64" if d.chance(0.25) else "float32"


def _draw_b_dtype(seed: int, index: int, dtype: str) -> str:
    """The second operand's type of a low-precision case, from a stream of its own (so the
    rest of the case is what it was before uint8 x int8 was drawn)."""
    options = LOW_PRECISION_B[dtype]
    return options[int(np.random.default_rng([seed, index, 3]).integers(len(options)))]


def draw_case(seed: int, index: int, family: str, target: str, lowp: bool = False,
              llvm_target: str = "") -> Case:
    """Case ``index`` of ``seed`` in ``family`` for ``target`` ("cpu" or "cuda"); ``lowp``:
    CPU matmuls of bf16 x bf16, int8 x int8, uint8 x int8 or uint8 x uint8 operands
    (accumulating in float32 / int32). ``llvm_target`` (canonical JSON, see ``targets``) is
    the CPU the case is built for; it does not change what is drawn."""
    if llvm_target and target != "cpu":
        raise ValueError(f"an llvm target is for CPU cases, not {target!r}")
    fam = FAMILIES[family]
    d = Draw(np.random.default_rng([seed, index, 1]), target)
    dtype = _draw_dtype(d, fam, family, lowp)
    for _ in range(_DRAW_TRIES):
        params = fam.draw(d)
        if params is not None:
            break
    else:  # the ranges above leave most draws in budget: this is a bug in them
        raise RuntimeError(f"{family}: no parameters within budget in {_DRAW_TRIES} draws")
    if dtype == "float16" and fam.mixed:
        params["acc"] = "float32"
    if dtype in LOW_PRECISION:
        params["acc"] = LOW_PRECISION[dtype]
        b_dtype = _draw_b_dtype(seed, index, dtype)
        if b_dtype != dtype:
            params["b_dtype"] = b_dtype
    return Case(seed, index, family, dtype, target, params, llvm_target=llvm_target)


def family_names(only: Optional[Sequence[str]] = None, target: str = "cpu") -> List[str]:
    """The families to draw from for ``target``, in the registry's order (``only`` filters;
    unknown names, or a Relax family for CUDA, are a ValueError that says so). The Relax
    families are CPU only: a CUDA run's default leaves them out."""
    if not only:
        return [f for f, fam in FAMILIES.items() if target == "cpu" or not fam.relax]
    unknown = sorted(set(only) - set(FAMILIES))
    if unknown:
        raise ValueError(f"unknown families {unknown}; known: {', '.join(FAMILIES)}")
    cpu_only = sorted(f for f in only if FAMILIES[f].relax)
    if cpu_only and target != "cpu":
        raise ValueError(f"{', '.join(cpu_only)}: CPU only (a Relax model roller's CPU "
                         "pipeline compiles)")
    return [f for f in FAMILIES if f in set(only)]


def generate(seed: int, n: int, target_kind: str,
             families: Optional[Sequence[str]] = None, lowp: bool = False,
             llvm_target: str = "") -> List[Case]:
    """``n`` cases for ``target_kind`` ("cpu" or "cuda"), deterministic for ``seed``: the
    families take turns, each block of ``len(families)`` cases in its own shuffled order.
    ``llvm_target``: build the CPU cases for this target (canonical JSON: ``targets.parse``)
    rather than the host; the same cases are drawn for every CPU target."""
    if target_kind not in ("cpu", "cuda"):
        raise ValueError(f"target kind {target_kind!r}: expected cpu or cuda")
    names = family_names(families, target_kind)
    cases = []
    for i in range(n):
        block, pos = divmod(i, len(names))
        order = np.random.default_rng([seed, block, 0]).permutation(len(names))
        cases.append(draw_case(seed, i, names[int(order[pos])], target_kind, lowp,
                               llvm_target))
    return cases


def dtypes_of(case: Case, dtype: Optional[str] = None) -> Dtypes:
    if dtype is not None:
        return Dtypes(dtype, dtype)
    return Dtypes(case.dtype, str(case.params.get("acc", case.dtype)),
                  str(case.params.get("b_dtype", "")))


def build(case: Case, dtype: Optional[str] = None) -> Built:
    """The case's TE compute; ``dtype`` overrides every element type (the reference's)."""
    make = FAMILIES[case.family].build
    if make is None:
        raise ValueError(f"{case.family} is a Relax model (harness.random_cases.attention), "
                         "not a TE compute")
    return make(case.params, dtypes_of(case, dtype))


def prim_func(built: Built) -> tirx.PrimFunc:
    return te.create_prim_func(list(built.tensors))


def make_func(case: Case, dtype: Optional[str] = None) -> tirx.PrimFunc:
    """The case's PrimFunc (``te.create_prim_func``), rebuilt from the case alone."""
    return prim_func(build(case, dtype))
