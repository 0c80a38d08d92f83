"""fp16 GEMM workloads for the CUDA backend (tensor cores).

Each is a ``te`` computation turned into a PrimFunc with ``te.create_prim_func`` and the
``global_symbol`` "main", shaped like cuBLAS's fp16 GEMM (``cublasGemmEx`` with fp16 inputs and
output, fp32 compute): fp16 operands, a main reduction block ``matmul`` that accumulates in
float32, and an epilogue block ``C`` that casts the result to a float16 output.

    fp16_gemm(M, N, K)           A[M, K] @ B[K, N]          -> C[M, N]
    fp16_batch_gemm(B, M, N, K)  A[B, M, K] @ B[B, K, N]     -> C[B, M, N]

``FP16_GEMMS`` names the shapes the tensor-core lowering is checked on; ``create(name)`` builds
one by name ("HGEMM:4096", or "BHGEMM:BxMxNxK" / "HGEMM:MxNxK" for any other shape).
"""
from __future__ import annotations

import re
from typing import TYPE_CHECKING, Dict, Tuple

if TYPE_CHECKING:  # pragma: no cover
    import tvm

FP16_GEMMS: Dict[str, Tuple[int, int, int]] = {
    "HGEMM:4096": (4096, 4096, 4096),
    "HGEMM:1024": (1024, 1024, 1024),
    "HGEMM:128x3072x768": (128, 3072, 768),  # BERT-base FFN up-projection, 128 tokens
}


def fp16_gemm(M: int, N: int, K: int) -> "tvm.tirx.PrimFunc":
    """C[M, N] = float16(sum_k float32(A[M, K]) * float32(B[K, N]))."""
    from tvm import te

    A = te.placeholder((M, K), "float16", name="A")
    B = te.placeholder((K, N), "float16", name="B")
    k = te.reduce_axis((0, K), name="k")
    acc = te.compute(
        (M, N),
        lambda i, j: te.sum(A[i, k].astype("float32") * B[k, j].astype("float32"), axis=k),
        name="matmul")
    C = te.compute((M, N), lambda i, j: acc[i, j].astype("float16"), name="C")
    return te.create_prim_func([A, B, C]).with_attr("global_symbol", "main")


def fp16_batch_gemm(batch: int, M: int, N: int, K: int) -> "tvm.tirx.PrimFunc":
    """C[b, M, N] = float16(sum_k float32(A[b, M, K]) * float32(B[b, K, N]))."""
    from tvm import te

    A = te.placeholder((batch, M, K), "float16", name="A")
    B = te.placeholder((batch, K, N), "float16", name="B")
    k = te.reduce_axis((0, K), name="k")
    acc = te.compute(
        (batch, M, N),
        lambda b, i, j: te.sum(A[b, i, k].astype("float32") * B[b, k, j].astype("float32"),
                               axis=k),
        name="matmul")
    C = te.compute((batch, M, N), lambda b, i, j: acc[b, i, j].astype("float16"), name="C")
    return te.create_prim_func([A, B, C]).with_attr("global_symbol", "main")


def create(name: str) -> "tvm.tirx.PrimFunc":
    """A workload by name: a key of ``FP16_GEMMS``, ``"HGEMM:MxNxK"`` or ``"BHGEMM:BxMxNxK"``."""
    if name in FP16_GEMMS:
        return fp16_gemm(*FP16_GEMMS[name])
    m = re.fullmatch(r"\s*(B?HGEMM):(\d+(?:x\d+)*)\s*", name)
    if m:
        dims = [int(d) for d in m.group(2).split("x")]
        if m.group(1) == "HGEMM" and len(dims) in (1, 3):
            return fp16_gemm(*(dims * 3 if len(dims) == 1 else dims))
        if m.group(1) == "BHGEMM" and len(dims) == 4:
            return fp16_batch_gemm(*dims)
    raise ValueError(f"unknown fp16 GEMM workload {name!r}; known: {', '.join(FP16_GEMMS)}, or "
                     "'HGEMM:MxNxK' / 'BHGEMM:BxMxNxK'")
