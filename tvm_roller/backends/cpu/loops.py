"""Loop helpers the CPU lowerings share: vectorize an inner loop, parallelize and vectorize a
leftover block, and copy a transposing block in 2-D blocks of whole cache lines."""
from __future__ import annotations

import math
from typing import List, Optional

import tvm
from tvm import s_tir, sym, tirx
from tvm.ir.expr import TensorLoad

from tvm_roller.analysis.schedule import extent, is_reduction, plain_splits_active
from tvm_roller.analysis.visit import post_order_visit
from tvm_roller.backends.buffer_names import shared_names

# rows this many bytes apart alias to the same L1 set (a page: the set span of the usual
# 32-48 KiB, 8-12-way L1s)
_SET_ALIAS_BYTES = 4096


def is_vectorized(sch: s_tir.Schedule, loop) -> bool:
    return int(sch.get(loop).kind) == 2  # ForKind.VECTORIZED


def vectorize_inner(sch: s_tir.Schedule, loop, lanes: int, partition: bool = False,
                    valid: Optional[int] = None) -> None:
    """Vectorize ``loop`` in ``lanes``-wide vectors. A loop that is not a whole number of
    vectors gets a predicated last vector, which TVM emits as scalar code for the whole loop;
    ``partition`` (callers with nothing to schedule under the loop afterwards) cuts it instead
    into whole vectors and a short rest (``loop_partition``: new blocks). ``valid``: the first
    ``valid`` iterations take no branch (a padding copy's source row), the rest may: the cut
    falls within them, so the whole vectors carry no condition. Where buffers under the loop
    share a name, the loop is split instead (:func:`partition_hazard`)."""
    ext = extent(sch, loop)
    if ext is None or ext <= 1:
        return
    if ext <= lanes and not plain_splits_active():
        sch.vectorize(loop)
        return
    limit = ext if valid is None else min(valid, ext)
    cut = limit - limit % lanes
    if partition and 0 < cut < ext and not plain_splits_active() and \
            partition_hazard(sch, loop) is None:
        whole, rest = sch.loop_partition(loop, [cut, None])
        _, inner = sch.split(whole, [None, lanes])
        sch.vectorize(inner)
        if ext - cut <= lanes:  # (a longer rest, past a padding copy's source, stays serial:
            sch.vectorize(rest)  # its branch would scalarize it, and TVM cannot split it)
        return
    # (a trace to replay on symbolic extents splits even a short loop: its extent may be a
    # variable there, and a whole loop is vectorized only at a constant extent)
    _, inner = sch.split(loop, [None, lanes])
    sch.vectorize(inner)


def partition_hazard(sch: s_tir.Schedule, loop) -> Optional[str]:
    """Why ``loop_partition`` cannot copy the blocks under ``loop`` faithfully, or None: TVM
    0.27 rewrites the copies' regions matching buffers by name, so distinct buffers of one name
    (TOPI's log-softmax: its exp-sum and its output are both ``compute``) get each other's
    regions, of another rank ("Buffer rank and region dimension mismatch") or silently wrong
    (:mod:`tvm_roller.backends.buffer_names`)."""
    shared = shared_names(sch.get(loop))
    if shared:
        return f"distinct buffers share the names {', '.join(shared)}"
    return None


def parallel_vectorize_block(sch: s_tir.Schedule, block, lanes: int, cores: int,
                             partition: bool = False, valid: Optional[int] = None) -> None:
    """A leftover injective block: fused loops, parallel outer, vectorized inner (``partition``:
    see :func:`vectorize_inner`). A leftover reduction (a mean feeding a variance) gets its row
    loops parallel, its reduction serial."""
    loops = sch.get_loops(block)
    if not loops:
        return
    if is_reduction(sch, block):
        n_red = sum(1 for iv in sch.get(block).iter_vars if iv.iter_type != 0)
        rows = loops[:len(loops) - n_red]  # create_prim_func order: reduction loops innermost
        if rows:
            row = sch.fuse(*rows) if len(rows) > 1 else rows[0]
            if (extent(sch, row) or 1) > 1:
                sch.parallel(row)
        return
    # the innermost loop that iterates (a reshape's trailing unit axes move outside it)
    pos = max((i for i, l in enumerate(loops) if extent(sch, l) != 1), default=len(loops) - 1)
    if pos < len(loops) - 1:
        sch.reorder(*loops[pos + 1:], loops[pos])
        loops = sch.get_loops(block)
    inner = loops[-1]
    ext = extent(sch, inner) or 1
    if len(loops) > 1:
        outer = sch.fuse(*loops[:-1])
        if (extent(sch, outer) or 1) > 1:
            sch.parallel(outer)
        vectorize_inner(sch, inner, lanes, partition, valid)
    elif ext >= 2 * lanes * cores:
        o, i = sch.split(inner, [None, lanes])
        sch.parallel(o)
        sch.vectorize(i)
    else:
        vectorize_inner(sch, inner, lanes, partition, valid)


def element_steps(blk: tirx.Block) -> Optional[List[List[int]]]:
    """For each tensor the block reads: how many elements its address moves per unit step of
    each block axis (evaluated at the origin; 0 = broadcast along that axis). None if any
    index does not evaluate to a constant (e.g. a data-dependent one)."""
    loads = []
    post_order_visit(blk.body, lambda n: loads.append(n) if isinstance(n, TensorLoad) else None)
    ivs = [iv.var for iv in blk.iter_vars]
    dtypes = {iv.var.name: str(iv.dom.extent.ty.dtype) for iv in blk.iter_vars}

    def address(load, point) -> Optional[int]:
        ana = sym.Analyzer()
        for v, x in zip(ivs, point):
            ana.bind(v, tirx.const(x, dtypes[v.name]))
        flat, stride = 0, 1
        for idx, ext in reversed(list(zip(load.indices, load.source.shape))):
            val = ana.simplify(idx)
            if not isinstance(val, tvm.tirx.IntImm):
                return None
            flat += int(val) * stride
            stride *= int(ext)
        return flat

    steps = []
    for load in loads:
        origin = [0] * len(ivs)
        base = address(load, origin)
        if base is None:
            return None
        row = []
        for k in range(len(ivs)):
            moved = address(load, origin[:k] + [1] + origin[k + 1:])
            if moved is None:
                return None
            row.append(moved - base)
        steps.append(row)
    return steps


def transposed_pair(sch: s_tir.Schedule, blk_rv, lanes: int) -> Optional[tuple]:
    """(k, last) when some input is read with a stride along the output's innermost axis but
    contiguously along axis k: a transpose, whose row-by-row copy touches a new cache line per
    element. Only for a block whose loops are its axes, one to one."""
    blk = sch.get(blk_rv)
    loops = sch.get_loops(blk_rv)
    exts = [int(iv.dom.extent) for iv in blk.iter_vars]
    if len(loops) != len(exts) or len(exts) < 2 or exts[-1] < lanes:
        return None
    steps = element_steps(blk)
    if not steps:
        return None
    last = len(exts) - 1
    for row in steps:
        if abs(row[last]) > 1:
            for k in range(last - 1, -1, -1):
                if abs(row[k]) == 1 and exts[k] >= lanes:
                    # (k, last, input stride along last, output stride along k)
                    return k, last, abs(row[last]), math.prod(exts[k + 1:])
    return None


def block_2d(sch: s_tir.Schedule, blk_rv, pair: tuple, lanes: int, cores: int) -> None:
    """lanes x lanes blocks over axes (k, last): each block reads whole cache lines of the
    transposed input and writes whole lines of the output; blocks run in parallel."""
    k, last, in_stride, out_stride = pair
    loops = sch.get_loops(blk_rv)
    ko, ki = sch.split(loops[k], [None, lanes])
    lo, li = sch.split(loops[last], [None, lanes])
    outer = [l for i, l in enumerate(loops) if i not in (k, last)]
    # The lines of the side that is gathered/scattered element by element must stay in L1 for
    # the whole block. Rows a multiple of a page apart land in the same cache set and
    # evict each other, so let that side stream whole vectors instead.
    elem = tvm.DataType(str(sch.get(blk_rv).writes[0].source.dtype)).bits // 8
    swap = (in_stride * elem) % _SET_ALIAS_BYTES == 0 and (out_stride * elem) % _SET_ALIAS_BYTES != 0
    inner = [li, ki] if swap else [ki, li]
    sch.reorder(*outer, ko, lo, *inner)
    task = sch.fuse(*outer, ko, lo) if outer else sch.fuse(ko, lo)
    if cores > 1:
        sch.parallel(task)
    sch.unroll(inner[0])
    sch.vectorize(inner[1])


def is_copy(blk: tirx.Block) -> bool:
    """A block that only moves data: its value is one load (a reshape, a transpose, a
    broadcast), no arithmetic."""
    store = blk.body
    return isinstance(store, tirx.BufferStore) and isinstance(store.value, TensorLoad) and \
        blk.init is None
