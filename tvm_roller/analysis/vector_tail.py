"""A product whose vector axis is not a whole number of vectors, as two parts: the whole vectors
and the tail.

The tiled lowering pads a GEMM-like block to whole register tiles (``pad_einsum``): a vector axis
of 3001 columns becomes 3008, and every input read along it is copied, zero-filled, in every call
(B of a 1×3001×1237 GEMV: 30 MB per call, three times the GEMV's own traffic). Here the block is
split along that axis instead (``axis_split``): one part over the columns that fill whole
vectors, one over the last ``extent mod lanes`` columns (narrower than a vector: taken whole, no
padding). Both read the original buffers in place; each is planned by the ordinary rules.

Taken: a function that is one reduction block (no producer: one would become a copy of its own),
every buffer index one block axis or a constant, float operands of the output's dtype (a
low-precision product packs its operands anyway), the output's last axis spatial and longer than
a vector but not a multiple of it, a non-constant input read contiguously along it (a constant one
is padded once, while compiling) and another input not (a product, reused along the axis).
"""
from __future__ import annotations

from typing import List, Optional

from tvm import s_tir, tirx
from tvm.ir.expr import TensorLoad

from tvm_roller.analysis import axis_split
from tvm_roller.analysis.constants import constant_params
from tvm_roller.analysis.parts import Decomposition
from tvm_roller.analysis.visit import post_order_visit

_FLOATS = ("float16", "float32", "float64")


def decompose(func, vector_lanes: int = 0) -> Optional[Decomposition]:
    """``func`` as its whole-vector columns and its tail (see the module doc), or None."""
    red = axis_split.find_reduction(func)
    if red is None or red.producers or vector_lanes <= 1:
        return None
    axis = _vector_axis(red.func, red.main.block)
    if axis is None:
        return None
    extent = red.extent(axis)
    head = extent // vector_lanes * vector_lanes
    if head == 0 or head == extent:
        return None
    reason = (f"{red.main.block.iter_vars[axis].var.name}: {extent} = {head} in whole "
              f"{vector_lanes}-lane vectors + a {extent - head}-column tail, planned apart (no "
              "zero-filled input copies)")
    return axis_split.split(red, axis, head, "vector tail", reason)


def _vector_axis(func: tirx.PrimFunc, block: s_tir.SBlock) -> Optional[int]:
    """The block axis of the output's last index when the block qualifies (module doc)."""
    store = block.body
    if not isinstance(store, tirx.BufferStore) or len(block.writes) != 1:
        return None
    out_dtype = str(store.buffer.dtype)
    loads: List[TensorLoad] = []
    ok = [out_dtype in _FLOATS]

    def visit(node) -> None:
        if isinstance(node, TensorLoad):
            loads.append(node)
            ok[0] &= str(node.source.dtype) == out_dtype and _plain(node.indices, block)
    post_order_visit(store.value, visit)
    if not ok[0] or not _plain(store.indices, block) or not store.indices:
        return None
    last = store.indices[-1]
    axis = next((i for i, iv in enumerate(block.iter_vars) if iv.var.same_as(last)), None)
    if axis is None or block.iter_vars[axis].iter_type != tirx.IterVar.DataPar:
        return None
    var = block.iter_vars[axis].var
    free = constant_params(func)
    inputs = [ld for ld in loads if not ld.source.same_as(store.buffer)]
    along = [ld for ld in inputs if any(i.same_as(var) for i in ld.indices)]
    if not any(ld.indices[-1].same_as(var) for ld in along):
        return None  # no input is read along the axis contiguously: it is not vectorized
    copied = [ld for ld in along if ld.source.name not in free]
    # a product: an input the axis does not index (reused along it: a tiled function, which
    # pads) besides the ones it does (a row-wise reduction streams, and pads nothing)
    return axis if copied and len(along) < len(inputs) else None


def _plain(indices, block: s_tir.SBlock) -> bool:
    """Every index is one block axis or a constant (einsum-like: ``pad_einsum``'s form)."""
    variables = [iv.var for iv in block.iter_vars]
    return all(isinstance(i, tirx.IntImm) or any(i.same_as(v) for v in variables)
               for i in indices)
