"""float64 references and PyTorch / numpy peers for every suite class.

Each formula was written from the te_workload definition in
``tvm/s_tir/meta_schedule/testing/te_workload.py`` (TVM 0.27) and is checked against TVM's own
unscheduled build of the workload in ``tests/tools/test_suite_refs.py``:

=====  ======================  =====================================================================
class  te_workload function    semantics (TVM layouts; ``p`` = CONFIGS params)
=====  ======================  =====================================================================
C1D    conv1d_nlc              x[N,L,CI] * w[K,CI/g,CO] -> y[N,OL,CO]; stride, pad, dilation, groups
C2D    conv2d_nhwc             x[N,H,W,CI] * w[KH,KW,CI/g,CO] -> y[N,OH,OW,CO]
GRP    conv2d_nhwc (groups=4)  output channel co reads input channels of group co // (CO/g)
DIL    conv2d_nhwc (dil=2)
C3D    conv3d_ndhwc            x[N,D,H,W,CI] * w[KD,KH,KW,CI/g,CO]
DEP    depthwise_conv2d_nhwc   x[N,H,W,C] * w[1,KH,KW,C] (factor 1)
T2D    conv2d_transpose_nhwc   x[N,H,W,CI], w[KH,KW,CI,CO]: y[n, ih*s - p + kh] += x[ih] * w[kh]
CAP    conv2d_capsule_nhwijc   y[n,h,w,i,j,co] = sum x[n,h*s+rh,w*s+rw,i,k,rc] * w[rh,rw,k,j,rc,co]
NRM    norm_bmn                d[b] = sqrt(sum_{i,j} a[b,i,j]^2)
SFM    softmax_mn              softmax over axis 1
CBR    conv2d_nhwc_bn_relu     args (data, kernel, bias, bn_offset, bn_scale): relu((conv+bias)*scale+offset)
TBG    transpose_batch_matmul  q[B,L,H,D], v[B,L,H,D] -> c[B,H,L,L] = q_T @ v_T (sum over D)
GMM    batch_matmul_nkkm       x[B,N,K] @ y[B,K,M] -> z[B,N,M]
=====  ======================  =====================================================================

The convolution references use torch's float64 kernels on pre-permuted (NC...) tensors; the
peers use the same permutations in float32, done outside the timed region.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, List, Optional, Sequence, Tuple

import numpy as np

from tvm_roller.tools.suite import workloads

if TYPE_CHECKING:  # pragma: no cover
    import torch


@dataclass
class Peer:
    """A timed competitor: ``fn()`` computes the op (and only the op); ``to_tvm(fn())`` turns its
    result into the TVM output layout as a numpy array (untimed)."""

    name: str
    fn: Callable[[], Any]
    to_tvm: Callable[[Any], np.ndarray]

    def output(self) -> np.ndarray:
        return self.to_tvm(self.fn())


def _with_defaults(p: Sequence, defaults: Sequence) -> tuple:
    """CONFIGS tuples omit trailing defaulted arguments; fill them in."""
    p = tuple(p)
    return p + tuple(defaults[len(p):])


# Full positional signatures (with te_workload's defaults) of the functions CONFIGS uses.
_CONV1D = (None, None, None, None, None, 1, 0, 1, 1)  # N L CI CO k stride pad dil groups
_CONV2D = (None, None, None, None, None, None, 1, 0, 1, 1)  # N H W CI CO k stride pad dil groups
_CONV3D = (None,) * 7 + (1, 0, 1, 1)  # N D H W CI CO k stride pad dil groups
_DEPTH = (None,) * 5 + (1, 0, 1, 1)  # N H W C k stride pad dil factor
_T2D = (None,) * 6 + (1, 0)  # N H W CI CO k stride pad
_CAP = (None,) * 6 + (1, 0, 4)  # N H W CI CO k stride pad capsule
_CBR = (None,) * 8 + (1,)  # N H W CI CO k strides pad dil


# Names of the positional parameters above (te_workload's argument order), for named_params.
_PARAM_NAMES = {
    "C1D": ("n", "l", "ci", "co", "k", "stride", "pad", "dil", "groups"),
    "C2D": ("n", "h", "w", "ci", "co", "k", "stride", "pad", "dil", "groups"),
    "C3D": ("n", "d", "h", "w", "ci", "co", "k", "stride", "pad", "dil", "groups"),
    "DEP": ("n", "h", "w", "c", "k", "stride", "pad", "dil", "factor"),
    "T2D": ("n", "h", "w", "ci", "co", "k", "stride", "pad"),
    "CAP": ("n", "h", "w", "ci", "co", "k", "stride", "pad", "capsule"),
    "CBR": ("n", "h", "w", "ci", "co", "k", "stride", "pad", "dil"),
    "GMM": ("b", "n", "m", "k"),
    "TBG": ("b", "seq", "heads", "dim"),
    "NRM": ("b", "m", "n"),
    "SFM": ("m", "n"),
}
_PARAM_NAMES["GRP"] = _PARAM_NAMES["DIL"] = _PARAM_NAMES["C2D"]
_DEFAULTS = {"C1D": _CONV1D, "C2D": _CONV2D, "GRP": _CONV2D, "DIL": _CONV2D, "C3D": _CONV3D,
             "DEP": _DEPTH, "T2D": _T2D, "CAP": _CAP, "CBR": _CBR}


def named_params(cls: str, idx: int) -> dict:
    """Workload ``cls:idx``'s CONFIGS parameters by name, trailing defaults filled in (stride,
    pad, dil, groups, ...), as plain ints: what a reference outside TVM (e.g. PyTorch on a GPU
    machine without TVM) needs to reproduce the op."""
    p = workloads.params(cls, idx)
    if cls in _DEFAULTS:
        p = _with_defaults(p, _DEFAULTS[cls])
    return {k: int(v) for k, v in zip(_PARAM_NAMES[cls], p)}


def _t(x: np.ndarray, dtype: "torch.dtype") -> "torch.Tensor":
    import torch

    return torch.from_numpy(np.ascontiguousarray(x)).to(dtype)


def _channels_first(nd: int) -> Tuple[int, ...]:
    return (0, nd + 1) + tuple(range(1, nd + 1))


def _channels_last(nd: int) -> Tuple[int, ...]:
    return (0,) + tuple(range(2, nd + 2)) + (1,)


def _conv_peer(nd: int, x: np.ndarray, w: np.ndarray, stride: int, pad: int, dil: int,
               groups: int, dtype: "torch.dtype", name: str) -> Peer:
    """conv{1,2,3}d in NC... layout; x is channels-last, w is [k..., CI/g, CO]."""
    import torch.nn.functional as F

    conv = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}[nd]
    xt = _t(x, dtype).permute(_channels_first(nd)).contiguous()
    # [k1..knd, CI/g, CO] -> [CO, CI/g, k1..knd]; torch's grouping (co // (CO/g)) matches TVM's.
    wt = _t(w, dtype).permute((nd + 1, nd) + tuple(range(nd))).contiguous()
    back = _channels_last(nd)
    return Peer(name, lambda: conv(xt, wt, None, stride, pad, dil, groups),
                lambda y: y.permute(back).contiguous().numpy())


def _torch_peer(cls: str, idx: int, inputs: List[np.ndarray], dtype: "torch.dtype") -> Peer:
    import torch
    import torch.nn.functional as F

    p = workloads.params(cls, idx)
    name = "torch"
    if cls == "C1D":
        _, _, _, _, _, s, pad, dil, g = _with_defaults(p, _CONV1D)
        return _conv_peer(1, inputs[0], inputs[1], s, pad, dil, g, dtype, name)
    if cls in ("C2D", "GRP", "DIL"):
        _, _, _, _, _, _, s, pad, dil, g = _with_defaults(p, _CONV2D)
        return _conv_peer(2, inputs[0], inputs[1], s, pad, dil, g, dtype, name)
    if cls == "C3D":
        *_, s, pad, dil, g = _with_defaults(p, _CONV3D)
        return _conv_peer(3, inputs[0], inputs[1], s, pad, dil, g, dtype, name)
    if cls == "DEP":
        _, _, _, c, _, s, pad, dil, factor = _with_defaults(p, _DEPTH)
        assert factor == 1, "te_workload only supports factor 1"
        xt = _t(inputs[0], dtype).permute(0, 3, 1, 2).contiguous()
        wt = _t(inputs[1][0], dtype).permute(2, 0, 1).unsqueeze(1).contiguous()  # [C,1,KH,KW]
        return Peer(name, lambda: F.conv2d(xt, wt, None, s, pad, dil, c),
                    lambda y: y.permute(0, 2, 3, 1).contiguous().numpy())
    if cls == "T2D":
        *_, s, pad = _with_defaults(p, _T2D)
        xt = _t(inputs[0], dtype).permute(0, 3, 1, 2).contiguous()
        wt = _t(inputs[1], dtype).permute(2, 3, 0, 1).contiguous()  # [CI,CO,KH,KW]
        return Peer(name, lambda: F.conv_transpose2d(xt, wt, None, s, pad),
                    lambda y: y.permute(0, 2, 3, 1).contiguous().numpy())
    if cls == "CAP":
        n, h, w, ci, co, k, s, pad, cap = _with_defaults(p, _CAP)
        # Capsule conv == grouped-free conv2d with batch (n, i), in-channels (k, rc) and
        # out-channels (j, co): x[n,h,w,i,k,rc] -> [(n,i), (k,rc), h, w].
        xt = (_t(inputs[0], dtype).permute(0, 3, 4, 5, 1, 2)
              .reshape(n * cap, cap * ci, h, w).contiguous())
        # w[rh,rw,k,j,rc,co] -> [(j,co), (k,rc), rh, rw]
        wt = (_t(inputs[1], dtype).permute(3, 5, 2, 4, 0, 1)
              .reshape(cap * co, cap * ci, k, k).contiguous())

        def cap_back(y: "torch.Tensor") -> np.ndarray:
            oh, ow = y.shape[-2:]
            # [(n,i), (j,co), oh, ow] -> [n, oh, ow, i, j, co]
            return y.reshape(n, cap, cap, co, oh, ow).permute(0, 4, 5, 1, 2, 3).contiguous().numpy()

        return Peer(name, lambda: F.conv2d(xt, wt, None, s, pad), cap_back)
    if cls == "CBR":
        *_, s, pad, dil = _with_defaults(p, _CBR)
        xt = _t(inputs[0], dtype).permute(0, 3, 1, 2).contiguous()
        wt = _t(inputs[1], dtype).permute(3, 2, 0, 1).contiguous()
        bias = _t(inputs[2], dtype)
        offset = _t(inputs[3], dtype).reshape(-1, 1, 1)  # arg order: bias, bn_offset, bn_scale
        scale = _t(inputs[4], dtype).reshape(-1, 1, 1)
        return Peer(name,
                    lambda: torch.relu_(torch.addcmul(offset, F.conv2d(xt, wt, bias, s, pad, dil), scale)),
                    lambda y: y.permute(0, 2, 3, 1).contiguous().numpy())
    if cls == "GMM":
        xt, yt = _t(inputs[0], dtype), _t(inputs[1], dtype)
        return Peer(name, lambda: torch.bmm(xt, yt), lambda z: z.numpy())
    if cls == "TBG":
        # The transposes are part of the op, so they stay inside the timed call (as strided views).
        qt, vt = _t(inputs[0], dtype), _t(inputs[1], dtype)
        return Peer(name, lambda: torch.matmul(qt.permute(0, 2, 1, 3), vt.permute(0, 2, 3, 1)),
                    lambda z: z.contiguous().numpy())
    if cls == "NRM":
        at = _t(inputs[0], dtype)
        return Peer(name, lambda: torch.linalg.vector_norm(at, dim=(1, 2)), lambda d: d.numpy())
    if cls == "SFM":
        at = _t(inputs[0], dtype)
        return Peer(name, lambda: torch.softmax(at, dim=1), lambda b: b.numpy())
    raise ValueError(f"no torch peer for class {cls!r}")


def torch_peer(cls: str, idx: int, inputs: List[np.ndarray],
               num_threads: Optional[int] = None) -> Peer:
    """The PyTorch float32 peer. ``num_threads`` (the target's core count) is applied with
    ``torch.set_num_threads``, a process-wide setting: the caller restores it."""
    import torch

    if num_threads:
        torch.set_num_threads(int(num_threads))
    return _torch_peer(cls, idx, inputs, torch.float32)


def numpy_peer(cls: str, idx: int, inputs: List[np.ndarray]) -> Optional[Peer]:
    """numpy float32 peer for the classes numpy has a natural kernel for (GMM, SFM, NRM)."""
    if cls == "GMM":
        x, y = inputs
        out = np.empty((x.shape[0], x.shape[1], y.shape[2]), dtype=x.dtype)
        return Peer("numpy", lambda: np.matmul(x, y, out=out), lambda z: z)
    if cls == "SFM":
        (a,) = inputs

        def softmax() -> np.ndarray:
            e = np.exp(a - a.max(axis=1, keepdims=True))
            e /= e.sum(axis=1, keepdims=True)
            return e

        return Peer("numpy", softmax, lambda b: b)
    if cls == "NRM":
        (a,) = inputs
        flat = a.reshape(a.shape[0], -1)
        return Peer("numpy", lambda: np.linalg.norm(flat, axis=1), lambda d: d)
    return None


def reference(cls: str, idx: int, inputs: List[np.ndarray]) -> np.ndarray:
    """The float64 result of workload ``cls:idx`` on ``inputs`` (TVM output layout)."""
    x64 = [np.asarray(x, dtype=np.float64) for x in inputs]
    if cls == "GMM":
        return np.matmul(x64[0], x64[1])
    if cls == "TBG":
        q, v = x64
        return np.einsum("bihk,bjhk->bhij", q, v, optimize=True)
    if cls == "NRM":
        a = x64[0]
        return np.sqrt(np.einsum("bij,bij->b", a, a))
    if cls == "SFM":
        a = x64[0]
        e = np.exp(a - a.max(axis=1, keepdims=True))
        return e / e.sum(axis=1, keepdims=True)
    if cls == "CBR":
        # Exactly TVM's order of stages: conv -> +bias -> *scale -> +offset -> relu.
        import torch

        _, _, _, _, _, _, s, pad, dil = _with_defaults(workloads.params(cls, idx), _CBR)
        conv = _conv_peer(2, x64[0], x64[1], s, pad, dil, 1, torch.float64, "ref").output()
        bias, offset, scale = x64[2], x64[3], x64[4]
        return np.maximum((conv + bias) * scale + offset, 0.0)
    import torch

    # Convolutions: torch's float64 CPU kernels are exact enough (errors ~1e-15) and fast.
    return _torch_peer(cls, idx, x64, torch.float64).output()


RTOL = 1e-4
_U32 = 2.0 ** -24  # float32 unit roundoff


def tolerance(cls: str, idx: int) -> float:
    """Allowed max relative error (see ``compare``) for workload ``cls:idx``.

    1e-4 everywhere except NRM: a float32 sum of n = M*N positive squares done sequentially
    (TVM's unscheduled loop) drifts systematically, measured ~n*u/170 for n = 4M (1.5e-3), so
    allow n*u/64 there. Indexing bugs give O(1) errors, far above either bound.
    """
    if cls == "NRM":
        b, m, n = workloads.params(cls, idx)
        return max(RTOL, m * n * _U32 / 64)
    return RTOL


def compare(out: np.ndarray, ref: np.ndarray, rtol: float = RTOL) -> Tuple[bool, float]:
    """(ok, max_rel_err): errors are measured relative to the largest reference magnitude, so
    outputs near zero after cancellation (convs, relu) don't give meaningless ratios."""
    out = np.asarray(out, dtype=np.float64)
    if out.shape != ref.shape:
        return False, float("inf")
    if not np.all(np.isfinite(out)):
        return False, float("inf")
    scale = float(np.max(np.abs(ref))) if ref.size else 0.0
    err = float(np.max(np.abs(out - ref))) if ref.size else 0.0
    rel = err / scale if scale > 0 else err
    return rel <= rtol, rel

