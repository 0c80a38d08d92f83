"""The stage between a chain's two matmuls as TE: what the fusion model rebuilds a chain from
(``fusion.operators``) and what the benchmark chains put there (``harness.bench.chains``)."""
from __future__ import annotations

MIDDLE = ("none", "relu", "gelu", "softmax")


def middle_stage(C, middle: str):
    """f(C) for the stage between the matmuls: relu, tanh-form GELU, a softmax over the last
    axis (TVM's vectorizable fast_exp) or C itself."""
    from tvm import te, topi

    if middle not in MIDDLE:
        raise ValueError(f"middle must be one of {MIDDLE}, got {middle!r}")
    if middle == "relu":
        return te.compute(C.shape, lambda *i: te.max(C[i], te.const(0, C.dtype)), name="S")
    if middle == "gelu":
        def gelu(*i):
            x = C[i]
            return 0.5 * x * (1.0 + te.tanh(0.7978845608 * (x + 0.044715 * x * x * x)))
        return te.compute(C.shape, gelu, name="S")
    if middle == "softmax":
        row = len(C.shape) - 1
        r1 = te.reduce_axis((0, C.shape[-1]), name="r1")
        mx = te.compute(C.shape[:-1], lambda *i: te.max(C[i + (r1,)], axis=r1), name="row_max")
        shifted = te.compute(C.shape, lambda *i: C[i] - mx[i[:row]], name="row_shift")
        ex = topi.fast_exp(shifted)
        r2 = te.reduce_axis((0, C.shape[-1]), name="r2")
        sm = te.compute(C.shape[:-1], lambda *i: te.sum(ex[i + (r2,)], axis=r2), name="row_sum")
        return te.compute(C.shape, lambda *i: ex[i] / sm[i[:row]], name="S")
    return C
