"""A convolution whose output width has no divisor a register tile can take, as two parts: a
head whose width does, and the last few positions.

A convolution's register tile holds a few output positions × a few vectors of channels, and its
positions must divide the width (a predicated partial tile keeps the accumulators in memory,
``policy_conv``). A prime width (43, 109) leaves one position per tile: 4 accumulators, the
loads outnumbering the multiply-adds (1×43×43×128→128: 114 GFLOP/s, where 42 wide runs at 249
with 6 positions a tile). Here the reduction is split along the width (``axis_split``): a head
of ``width - width mod d`` positions for a ``d`` of 4 to 8 (the shortest tail), then the tail;
the producers (the padding) run first, as their own part.

Taken: a function of producers and one trailing reduction whose output's second-to-last index
is a spatial axis the input is read through a window along (the axis plus a reduction axis in
one index), longer than 8, with no divisor from 4 to 32.
"""
from __future__ import annotations

from typing import Optional

from tvm import s_tir, tirx
from tvm.ir.expr import TensorLoad

from tvm_roller.analysis import axis_split
from tvm_roller.analysis.parts import Decomposition
from tvm_roller.analysis.visit import post_order_visit

_ROWS = (8, 7, 6, 5, 4)  # output positions a register tile of a few vectors holds
_WIDEST = 32  # a divisor up to this is a register tile already


def decompose(func, vector_lanes: int = 0) -> Optional[Decomposition]:
    """``func`` with its output width split into head and tail (module doc), or None."""
    red = axis_split.find_reduction(func)
    if red is None:
        return None
    axis = _window_axis(red.main.block)
    if axis is None:
        return None
    extent = red.extent(axis)
    if extent <= _ROWS[0] or any(extent % d == 0 for d in range(_ROWS[-1], _WIDEST + 1)):
        return None
    head, rows = max((extent - extent % d, d) for d in _ROWS)
    name = red.main.block.iter_vars[axis].var.name
    reason = (f"{name}: {extent} output positions (no divisor from {_ROWS[-1]} to {_WIDEST} "
              f"for a register tile) = {head} ({rows} a tile) + a {extent - head}-position "
              "tail, planned apart")
    return axis_split.split(red, axis, head, "window tail", reason)


def _window_axis(block: s_tir.SBlock) -> Optional[int]:
    """The block axis of the output's second-to-last index when an input is read through a
    window along it (the axis and a reduction axis in one index)."""
    store = block.body
    if not isinstance(store, tirx.BufferStore) or len(store.indices) < 2:
        return None
    pos = store.indices[-2]
    ivs = list(block.iter_vars)
    axis = next((i for i, iv in enumerate(ivs) if iv.var.same_as(pos)), None)
    if axis is None or ivs[axis].iter_type != tirx.IterVar.DataPar:
        return None
    reduction = [iv.var for iv in ivs if iv.iter_type != tirx.IterVar.DataPar]
    windowed = []

    def visit(node) -> None:
        if isinstance(node, TensorLoad):
            for index in node.indices:
                used = _vars(index)
                if any(v.same_as(pos) for v in used) and \
                        any(v.same_as(r) for v in used for r in reduction):
                    windowed.append(node)
    post_order_visit(store.value, visit)
    return axis if windowed else None


def _vars(expr) -> list:
    return list(tirx.analysis.undefined_vars(expr))
