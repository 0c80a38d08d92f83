"""The PyTorch side of the device check (``gpu_check``'s run half): each workload class as a
PyTorch op (the reference in float64, the peer in float32), the inputs (random, never zero) and
the error measure.

Nothing here may import TVM or the rest of tvm_roller: the GPU machine has neither.
"""
from __future__ import annotations

from typing import Any, Callable, Dict, Optional, Sequence, Tuple

# where run() puts tensors (read at each call, here and in gpu_measure); the tests replay run()
# on "cpu" with stand-ins
DEVICE = "cuda"


# -- PyTorch ops (the reference in float64 and the peer in float32) -----------------------------
# Same semantics as tvm_roller/tools/suite/references.py (checked against each other in
# tests/harness/cuda_check/test_gpu_check.py); written here because the GPU machine has no TVM.
def torch_op(cls: str, p: Dict[str, int],
             xs: Sequence[Any]) -> Tuple[Callable[[], Any], Callable[[Any], Any]]:
    """``(fn, to_tvm)`` for workload class ``cls`` with named parameters ``p`` on tensors ``xs``
    (any device/dtype, TVM layouts): ``fn()`` computes the op only (layout permutations of the
    inputs are done here, once, outside it); ``to_tvm(fn())`` is the result in TVM's layout."""
    import torch
    import torch.nn.functional as F

    def conv_nd(nd: int, x, w, groups: int):
        conv = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}[nd]
        xt = x.permute((0, nd + 1) + tuple(range(1, nd + 1))).contiguous()
        # [k.., CI/g, CO] -> [CO, CI/g, k..]
        wt = w.permute((nd + 1, nd) + tuple(range(nd))).contiguous()
        back = (0,) + tuple(range(2, nd + 2)) + (1,)
        return (lambda: conv(xt, wt, None, p["stride"], p["pad"], p["dil"], groups),
                lambda y: y.permute(back).contiguous())

    if cls == "C1D":
        return conv_nd(1, xs[0], xs[1], p["groups"])
    if cls in ("C2D", "GRP", "DIL"):
        return conv_nd(2, xs[0], xs[1], p["groups"])
    if cls == "C3D":
        return conv_nd(3, xs[0], xs[1], p["groups"])
    if cls == "DEP":
        xt = xs[0].permute(0, 3, 1, 2).contiguous()
        wt = xs[1][0].permute(2, 0, 1).unsqueeze(1).contiguous()  # [1,KH,KW,C] -> [C,1,KH,KW]
        return (lambda: F.conv2d(xt, wt, None, p["stride"], p["pad"], p["dil"], p["c"]),
                lambda y: y.permute(0, 2, 3, 1).contiguous())
    if cls == "T2D":
        xt = xs[0].permute(0, 3, 1, 2).contiguous()
        wt = xs[1].permute(2, 3, 0, 1).contiguous()  # [KH,KW,CI,CO] -> [CI,CO,KH,KW]
        return (lambda: F.conv_transpose2d(xt, wt, None, p["stride"], p["pad"]),
                lambda y: y.permute(0, 2, 3, 1).contiguous())
    if cls == "CAP":
        n, h, w, ci, co, k, cap = (p[q] for q in ("n", "h", "w", "ci", "co", "k", "capsule"))
        # x[n,h,w,i,k,rc] -> [(n,i), (k,rc), h, w]; w[rh,rw,k,j,rc,co] -> [(j,co), (k,rc), rh, rw]
        xt = xs[0].permute(0, 3, 4, 5, 1, 2).reshape(n * cap, cap * ci, h, w).contiguous()
        wt = xs[1].permute(3, 5, 2, 4, 0, 1).reshape(cap * co, cap * ci, k, k).contiguous()

        def cap_back(y):
            oh, ow = y.shape[-2:]
            return y.reshape(n, cap, cap, co, oh, ow).permute(0, 4, 5, 1, 2, 3).contiguous()

        return lambda: F.conv2d(xt, wt, None, p["stride"], p["pad"]), cap_back
    if cls == "CBR":
        xt = xs[0].permute(0, 3, 1, 2).contiguous()
        wt = xs[1].permute(3, 2, 0, 1).contiguous()
        bias = xs[2].reshape(-1)
        offset, scale = xs[3].reshape(-1, 1, 1), xs[4].reshape(-1, 1, 1)  # args: bias, offset, scale
        def cbr():
            conv = F.conv2d(xt, wt, bias, p["stride"], p["pad"], p["dil"])
            return torch.relu_(torch.addcmul(offset, conv, scale))

        return cbr, lambda y: y.permute(0, 2, 3, 1).contiguous()
    if cls == "GMM":
        return (lambda: torch.bmm(xs[0], xs[1])), (lambda z: z)
    if cls == "TBG":  # the transposes are part of the op: strided views inside the call
        return (lambda: torch.matmul(xs[0].permute(0, 2, 1, 3), xs[1].permute(0, 2, 3, 1)),
                lambda z: z.contiguous())
    if cls == "NRM":
        return (lambda: torch.linalg.vector_norm(xs[0], dim=(1, 2))), (lambda d: d)
    if cls == "SFM":
        return (lambda: torch.softmax(xs[0], dim=1)), (lambda b: b)
    if cls == "HGEMM":
        return (lambda: torch.matmul(xs[0], xs[1])), (lambda c: c)
    if cls == "CHAIN":  # E = f(A . B) . D, f as in harness.bench.chains.middle_stage
        a, b, d = xs
        middle = p["middle"]
        if middle == "gelu" and a.dtype == torch.float64:
            # the reference: the chain's own definition, constant and all
            def mid(c):
                return 0.5 * c * (1.0 + torch.tanh(0.7978845608 * (c + 0.044715 * c ** 3)))
        elif middle == "gelu":  # the peer: PyTorch's fused tanh-form GELU (sqrt(2/pi) exactly)
            def mid(c):
                return F.gelu(c, approximate="tanh")
        elif middle == "relu":
            mid = torch.relu
        elif middle == "softmax":
            def mid(c):
                return torch.softmax(c, dim=-1)
        elif middle == "none":
            def mid(c):
                return c
        else:
            raise ValueError(f"unknown chain middle {middle!r}")
        return (lambda: torch.matmul(mid(torch.matmul(a, b)), d)), (lambda e: e)
    raise ValueError(f"no torch op for class {cls!r}")


def rel_error(out: Any, ref: Any) -> float:
    """max |out - ref| / max |ref| (inf for a wrong shape or a non-finite output)."""
    import torch

    if tuple(out.shape) != tuple(ref.shape):
        return float("inf")
    o = out.to(torch.float64)
    if not bool(torch.isfinite(o).all()):
        return float("inf")
    scale = float(ref.abs().max()) if ref.numel() else 0.0
    err = float((o - ref).abs().max()) if ref.numel() else 0.0
    return err / scale if scale > 0 else err


def random_tensor(shape: Sequence[int], dtype: str, gen: Any, device: Optional[str] = None) -> Any:
    """Uniform(-1, 1) without exact zeros (a zero input hides reading padding for data)."""
    import torch

    x = torch.rand(tuple(shape), generator=gen, device=device or DEVICE, dtype=torch.float32) * 2 - 1
    x = x.to(getattr(torch, dtype))
    x[x == 0] = 0.5
    return x
