"""Find a chain of two matmul-like operators in a PrimFunc: ``E = op2(f(op1(A, B)), D)``.

``op1`` computes C[batch.., m, l] = sum_k A[.., m, k] B[.., k, l] and ``op2`` computes
E[batch.., m, n] = sum_l S[.., m, l] D[.., l, n], where S is C after elementwise ops and row-wise
ops over l (softmax, a row norm): every stage between them keeps the rows (batch.., m), so a block
of rows can go through the whole chain while its slice of the intermediate stays in cache.
The loop names ``m, k, l, n`` follow Chimera's GEMM-chain notation. The stages in between may
reshape or mask (what Relax makes of an attention block); the lowering checks that a row block
can pass through them.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import List, Optional

from tvm import s_tir

from tvm_roller.analysis import unwrap_func
from tvm_roller.analysis.access import build_access
from tvm_roller.analysis.schedule import SCHEDULE_ERRORS
from tvm_roller.core.errors import UnsupportedError


@dataclass
class GemmChain:
    """Plain data: the two operators, the stages between them and the loop extents."""

    first: str  # block computing C = A . B
    second: str  # block computing E = S . D
    between: List[str]  # elementwise / row-wise blocks from C to S, in order
    batch: List[int]  # extents of the shared leading (batch) axes
    m: int
    k: int
    l: int  # noqa: E741 (Chimera's name: the first op's output columns, the second's reduction)
    n: int
    dtype: str = "float32"
    elem_bytes: int = 4
    producers: List[str] = field(default_factory=list)  # before the first op (padding)
    # the first op's reduction extents when it has several (a convolution: kh, kw, c_in)
    window: List[int] = field(default_factory=list)
    # a stage between reduces rows (softmax): unfused, it is a pass of its own over the
    # intermediate (a row reduction does not fold into the first matmul's epilogue)
    row_reduction: bool = False

    def to_dict(self) -> dict:
        return asdict(self)

    @property
    def is_conv(self) -> bool:
        """An NHWC convolution chain as ``detect_chain`` reads it: batch (n, h), rows w, the
        first operator's window (kh, kw, c_in)."""
        return bool(self.producers) and len(self.window) == 3 and len(self.batch) == 2

    @property
    def intermediate_bytes(self) -> int:
        size = self.m * self.l * self.elem_bytes
        for b in self.batch:
            size *= b
        return size


def _blocks(sch: s_tir.Schedule):
    return [sch.get(b) for b in sch.get_child_blocks(sch.get_sblock("root"))]


def _matmul_axes(blk) -> Optional[tuple]:
    """(spatial extents, reduction extents, input buffer names) of a block that multiplies two
    inputs: the first input's last dimension is the (last) reduction axis, the second's is the
    output's last axis and it uses every reduction axis — a (batch) matmul in NN layout, or an
    NHWC convolution read as one (rows: the output's w, the reduction: the window and input
    channels); None otherwise."""
    ivs = list(blk.iter_vars)
    red = [i for i, iv in enumerate(ivs) if int(iv.iter_type) == 2]
    spatial = [i for i, iv in enumerate(ivs) if int(iv.iter_type) == 0]
    outs = {w.source.name for w in blk.writes}
    reads = [r for r in blk.reads if r.source.name not in outs]
    if not red or len(reads) != 2 or len(spatial) < 2:
        return None
    var_order = [iv.var for iv in ivs]
    a, b = (build_access(r, var_order, "read") for r in reads)
    m_ax, n_ax = spatial[-2], spatial[-1]
    if a.innermost_axis() != red[-1] or b.innermost_axis() != n_ax:
        return None
    if n_ax in a.axes_used() or m_ax in b.axes_used() or \
            any(r not in b.axes_used() for r in red):
        return None
    ext = [int(iv.dom.extent) for iv in ivs]
    return ([ext[i] for i in spatial], [ext[r] for r in red],
            (reads[0].source.name, reads[1].source.name))


def detect_chain(func) -> Optional[GemmChain]:
    """The GEMM chain in ``func``, or None when it is not one (any other function)."""
    func = unwrap_func(func)
    try:
        blocks = _blocks(s_tir.Schedule(func))
    except SCHEDULE_ERRORS:  # not a block-structured function (no root block)
        return None
    mm = [(i, b, _matmul_axes(b)) for i, b in enumerate(blocks)]
    mm = [(i, b, ax) for i, b, ax in mm if ax is not None]
    if len(mm) != 2 or mm[1][0] != len(blocks) - 1:
        return None
    (i1, first, (s1, window, _)), (_, second, (s2, red2, ins2)) = mm
    k, l2 = math.prod(window), math.prod(red2)
    producers = blocks[:i1]  # e.g. a convolution's padding: elementwise, computed per row block
    if any(any(int(iv.iter_type) != 0 for iv in blk.iter_vars) for blk in producers):
        return None
    *batch1, m, l1 = s1
    *batch2, m2, n = s2
    if batch1 != batch2 or m != m2 or l1 != l2:
        return None
    between = blocks[i1 + 1:-1]
    # the stages in between may reshape, mask or reduce rows (softmax): whether a row block can
    # go through them is settled by the lowering (compute_at), which refuses what it cannot
    if any(len(blk.writes) != 1 for blk in between):
        return None
    prev = between[-1].writes[0].source.name if between else first.writes[0].source.name
    if ins2[0] != prev:
        return None
    dtype = str(first.writes[0].source.dtype)
    if dtype not in ("float32", "float64"):
        raise UnsupportedError(f"GEMM chain in {dtype}: the fused CPU kernel takes float32/float64")
    return GemmChain(first.name_hint, second.name_hint, [b.name_hint for b in between],
                     list(batch1), m, k, l1, n, dtype, 4 if dtype == "float32" else 8,
                     producers=[b.name_hint for b in producers],
                     window=window if len(window) > 1 else [],
                     row_reduction=any(any(int(iv.iter_type) == 2 for iv in b.iter_vars)
                                       for b in between))
