"""Chains of two matmuls as TE PrimFuncs, for the benchmarks and tests: attention-like batch
GEMM chains, MLP blocks and convolution chains, and the suites of them BENCHMARKS.md measures."""
from __future__ import annotations

from typing import Optional, Sequence

from tvm_roller.fusion.stages import middle_stage


def gemm_chain(batch: Optional[Sequence[int]], m: int, k: int, l: int, n: int,  # noqa: E741
               middle: str = "none", dtype: str = "float32"):
    """E = f(A . B) . D with A [*batch, m, k], B [*batch, k, l], D [*batch, l, n]; ``middle`` is
    f: nothing, relu, tanh-form GELU or a row softmax (exp as TVM's fast_exp, vectorizable)."""
    from tvm import te

    bs = tuple(batch or ())
    A = te.placeholder(bs + (m, k), dtype, name="A")
    B = te.placeholder(bs + (k, l), dtype, name="B")
    D = te.placeholder(bs + (l, n), dtype, name="D")
    rk = te.reduce_axis((0, k), name="rk")
    C = te.compute(bs + (m, l), lambda *i: te.sum(
        A[i[:-1] + (rk,)] * B[i[:-2] + (rk, i[-1])], axis=rk), name="C")
    S = middle_stage(C, middle)
    rl = te.reduce_axis((0, l), name="rl")
    E = te.compute(bs + (m, n), lambda *i: te.sum(
        S[i[:-1] + (rl,)] * D[i[:-2] + (rl, i[-1])], axis=rl), name="E")
    return te.create_prim_func([A, B, D, E]).with_attr("global_symbol", "main")


def conv_chain(n: int, h: int, w: int, c_in: int, c_mid: int, c_out: int, kernel: int = 3,
               middle: str = "relu", dtype: str = "float32"):
    """NHWC: a kernel x kernel convolution (stride 1, same padding) then a 1x1 convolution,
    ``middle`` (relu or none) between them; weights [kh, kw, ci, co] as in TVM's topi."""
    from tvm import te, topi

    if middle not in ("none", "relu"):
        raise ValueError(f"middle must be 'none' or 'relu' for a conv chain, got {middle!r}")
    data = te.placeholder((n, h, w, c_in), dtype, name="data")
    w1 = te.placeholder((kernel, kernel, c_in, c_mid), dtype, name="w1")
    w2 = te.placeholder((1, 1, c_mid, c_out), dtype, name="w2")
    y = topi.nn.conv2d_nhwc(data, w1, 1, kernel // 2, 1, out_dtype=dtype)
    if middle == "relu":
        y = te.compute(y.shape, lambda *i: te.max(y[i], te.const(0, dtype)), name="S")
    z = topi.nn.conv2d_nhwc(y, w2, 1, 0, 1, out_dtype=dtype)
    return te.create_prim_func([data, w1, w2, z]).with_attr("global_symbol", "main")


# The chains BENCHMARKS.md measures (python/bench_fusion.py, python/measure_traffic.py)
CHAINS = [  # name, batch, m, k, l, n, middle
    ("attention 12x512 (no softmax)", [12], 512, 64, 512, 64, "none"),
    ("attention 12x512 softmax", [12], 512, 64, 512, 64, "softmax"),
    ("attention 12x128 softmax", [12], 128, 64, 128, 64, "softmax"),
    ("MLP 128x768->3072->768 GELU", None, 128, 768, 3072, 768, "gelu"),
    ("MLP 128x768->3072->768 ReLU", None, 128, 768, 3072, 768, "relu"),
    ("MLP 1024x512->2048->512", None, 1024, 512, 2048, 512, "none"),
    ("attention 16x256 (no softmax)", [16], 256, 64, 256, 64, "none"),
    ("chain 64x64 . 64x64 . 64x64", None, 64, 64, 64, 64, "none"),
]
CONV_CHAINS = [  # name, (n, h, w, c_in, c_mid, c_out): 3x3 conv, ReLU, 1x1 conv, NHWC
    ("conv 3x3 -> 1x1, 1x56x56x64 -> 64 -> 64", (1, 56, 56, 64, 64, 64)),
    ("conv 3x3 -> 1x1, 4x56x56x64 -> 64 -> 256", (4, 56, 56, 64, 64, 256)),
    ("conv 3x3 -> 1x1, 1x112x112x32 -> 64 -> 32", (1, 112, 112, 32, 64, 32)),
]
