"""A chain's operators as stand-alone PrimFuncs, built from its shape alone.

The fusion decision predicts both sides with the single-operator machinery: the operators one by
one at full size (each planned as roller plans it alone), and one fused task's share of each
matmul (a row block), whose tiles the fused kernel then takes. A Relax graph's chain has only its
shape, so the functions are rebuilt here with TE rather than cut out of a PrimFunc.
"""
from __future__ import annotations

from typing import List, Optional

from tvm import te, tirx

from tvm_roller.fusion.chain import GemmChain
from tvm_roller.fusion.stages import middle_stage


def _func(*tensors) -> tirx.PrimFunc:
    return te.create_prim_func(list(tensors)).with_attr("global_symbol", "main")


def _matmul(batch: List[int], m: int, k: int, n: int, dtype: str):
    """E[batch.., m, n] = sum_k A[batch.., m, k] B[batch.., k, n] (NN layout)."""
    bs = tuple(batch)
    a = te.placeholder(bs + (m, k), dtype, name="A")
    b = te.placeholder(bs + (k, n), dtype, name="B")
    r = te.reduce_axis((0, k), name="r")
    out = te.compute(bs + (m, n), lambda *i: te.sum(a[i[:-1] + (r,)] * b[i[:-2] + (r, i[-1])],
                                                   axis=r), name="E")
    return a, b, out


def _conv(batch: List[int], w: int, chain: GemmChain, valid: bool):
    """The first operator of a convolution chain: ``kh x kw`` over ``c_in`` channels into
    ``chain.l``. ``valid``: one fused task's input window (no padding, the rows around the
    task's output row included), else the whole map with same padding."""
    from tvm import topi

    kh, kw, c_in = chain.window
    n, h = batch
    dtype = chain.dtype
    if valid:
        data = te.placeholder((n, h + kh - 1, w + kw - 1, c_in), dtype, name="data")
        pad = 0
    else:
        data = te.placeholder((n, h, w, c_in), dtype, name="data")
        pad = (kh // 2, kw // 2)
    weight = te.placeholder((kh, kw, c_in, chain.l), dtype, name="weight")
    return data, weight, topi.nn.conv2d_nhwc(data, weight, 1, pad, 1, out_dtype=dtype)


def first_operator(chain: GemmChain, rows: Optional[int] = None) -> tirx.PrimFunc:
    """The first matmul (or convolution) alone: the whole of it, or one fused task's
    ``rows`` rows of one batch element."""
    batch = list(chain.batch) if rows is None else [1] * len(chain.batch)
    m = chain.m if rows is None else rows
    if chain.is_conv:
        return _func(*_conv(batch, m, chain, valid=rows is not None))
    return _func(*_matmul(batch, m, chain.k, chain.l, chain.dtype))


def second_operator(chain: GemmChain, rows: Optional[int] = None) -> tirx.PrimFunc:
    """The second matmul alone (its left operand the intermediate), whole or one task's."""
    batch = list(chain.batch) if rows is None else [1] * len(chain.batch)
    m = chain.m if rows is None else rows
    return _func(*_matmul(batch, m, chain.l, chain.n, chain.dtype))


def row_stage(chain: GemmChain, rows: Optional[int] = None) -> Optional[tirx.PrimFunc]:
    """The stage between the matmuls that reduces rows (a softmax) as a function of its own,
    or None when the stages between fold into the first operator's epilogue."""
    if not chain.row_reduction:
        return None
    batch = tuple(chain.batch) if rows is None else (1,) * len(chain.batch)
    m = chain.m if rows is None else rows
    c = te.placeholder(batch + (m, chain.l), chain.dtype, name="C")
    return _func(c, middle_stage(c, "softmax"))
