"""Builders of the common chains for the data-movement model: two batch GEMMs (attention-like),
an MLP block, and a KxK convolution followed by a 1x1 convolution."""
from __future__ import annotations

from typing import Optional, Sequence

from tvm_roller.fusion.chain_spec import DTYPE_OF_BYTES, Chain, Loop, Op, TensorUse


def gemm_chain(batch: int, m: int, k: int, l: int, n: int, elem_bytes: int = 4, *,
               batched_weights: bool = True, names: Sequence[str] = "ABCDE") -> Chain:
    """``C[b,m,l] = sum_k A[b,m,k] B[b,k,l]; E[b,m,n] = sum_l C[b,m,l] D[b,l,n]`` (attention-like
    batch GEMM chain). ``batched_weights=False``: B and D are not indexed by ``b``."""
    A, B, C, D, E = names
    w = ("b",) if batched_weights else ()
    dtype = DTYPE_OF_BYTES.get(elem_bytes, "")
    return Chain(
        loops=[Loop("b", batch), Loop("m", m), Loop("k", k), Loop("l", l), Loop("n", n)],
        tensors=[TensorUse(A, ("b", "m", "k"), elem_bytes, "input", dtype),
                 TensorUse(B, w + ("k", "l"), elem_bytes, "input", dtype),
                 TensorUse(C, ("b", "m", "l"), elem_bytes, "intermediate", dtype),
                 TensorUse(D, w + ("l", "n"), elem_bytes, "input", dtype),
                 TensorUse(E, ("b", "m", "n"), elem_bytes, "output", dtype)],
        ops=[Op("gemm1", ("b", "m", "l", "k"), ("k",), (A, B, C)),
             Op("gemm2", ("b", "m", "n", "l"), ("l",), (C, D, E))],
        name=f"gemm_chain b{batch} {m}x{k}x{l}x{n}",
    )


def mlp_chain(tokens: int, d_model: int, d_hidden: int, d_out: Optional[int] = None,
              elem_bytes: int = 4) -> Chain:
    """``H = X.W1`` (tokens x d_hidden), ``Y = H.W2`` (tokens x d_out): an MLP block without its
    activation (elementwise ops act on the intermediate in place and are not ops here)."""
    ch = gemm_chain(1, tokens, d_model, d_hidden, d_model if d_out is None else d_out,
                    elem_bytes, batched_weights=False, names=("X", "W1", "H", "W2", "Y"))
    ch.name = f"mlp {tokens}x{d_model} -> {d_hidden} -> {d_model if d_out is None else d_out}"
    return ch


def conv_chain(n: int, h: int, w: int, c_in: int, c_mid: int, c_out: int, kh: int = 3,
               kw: int = 3, elem_bytes: int = 4) -> Chain:
    """A KxK convolution (stride 1, 'same' padding) followed by a 1x1 convolution, NHWC:
    ``Y[n,h,w,cm] = sum_{r,s,ci} X[n,h+r,w+s,ci] W1[r,s,ci,cm]``,
    ``Z[n,h,w,co] = sum_cm Y[n,h,w,cm] W2[cm,co]``.

    Approximation: ``X`` is indexed by the output loops ``h, w`` (the K-1 halo is ignored);
    ``r, s`` are untiled."""
    dtype = DTYPE_OF_BYTES.get(elem_bytes, "")
    return Chain(
        loops=[Loop("n", n), Loop("h", h), Loop("w", w), Loop("ci", c_in), Loop("cm", c_mid),
               Loop("co", c_out), Loop("r", kh, untiled=True), Loop("s", kw, untiled=True)],
        tensors=[TensorUse("X", ("n", "h", "w", "ci"), elem_bytes, "input", dtype),
                 TensorUse("W1", ("r", "s", "ci", "cm"), elem_bytes, "input", dtype),
                 TensorUse("Y", ("n", "h", "w", "cm"), elem_bytes, "intermediate", dtype),
                 TensorUse("W2", ("cm", "co"), elem_bytes, "input", dtype),
                 TensorUse("Z", ("n", "h", "w", "co"), elem_bytes, "output", dtype)],
        ops=[Op("conv1", ("n", "h", "w", "cm", "ci", "r", "s"), ("ci", "r", "s"),
                ("X", "W1", "Y")),
             Op("conv2", ("n", "h", "w", "co", "cm"), ("cm",), ("Y", "W2", "Z"))],
        name=f"conv{kh}x{kw}+1x1 n{n} {h}x{w} {c_in}->{c_mid}->{c_out}",
    )
