"""Apply an rTile to a PrimFunc with ``tvm.s_tir.Schedule`` for the CUDA backend.

Tiled (reuse-heavy) functions, on CUDA cores (fp16 GEMMs go to ``cuda_tensorcore``):

    blockIdx.x (fused block tiles) · threadIdx.x (fused thread tiles, the output's contiguous
    axis innermost so neighbouring threads write neighbouring outputs) · reduction chunks (the
    innermost one software-pipelined, cp.async on sm_80+) · chunk · register tile (unrolled)

Every input's chunk is fetched into shared memory cooperatively by the whole block, with 16-byte
vector accesses where every address is provably aligned, rows padded (``storage_align``) when a
row spans all 32 banks; padding and other prologues are inlined into that fetch (an input whose
window changes size from step to step is read from global memory instead); the accumulators
live in registers and the elementwise epilogue is folded into their write-back.

Memory-bound functions: rows (the spatial axes every block shares) map to thread blocks and a
row's reduction to the block's threads, which TVM lowers to warp shuffles plus one shared-memory
exchange; elementwise functions map one element (or one 16-byte vector) to a thread.
"""
from __future__ import annotations

import logging

import math
from typing import List, Optional

from tvm import s_tir, sym, tirx
from tvm.ir.expr import TensorLoad

from tvm_roller.analysis import FuncAnalysis
from tvm_roller.analysis.schedule import (add_unit_loops, attempt, axis_loops, block_names, extent,
                                          is_reduction, perfect_split, realize_of, require)
from tvm_roller.analysis.visit import post_order_visit
from tvm_roller.backends.cuda.tensorcore import apply_tensorcore
from tvm_roller.core.errors import UnsupportedError
from tvm_roller.core.rtile import RTile
from tvm_roller.hardware import DeviceModel
from tvm_roller.hardware.model import DTYPE_BYTES

_VECTOR_BYTES = 16  # widest CUDA vector access (float4 / half8); wider is invalid CUDA
_UNROLL_STEP = 256


logger = logging.getLogger("tvm_roller")

def vector_lanes(dtype: str) -> int:
    return max(1, _VECTOR_BYTES // DTYPE_BYTES.get(dtype, 4))


def aligned_lanes(sch: s_tir.Schedule, block, loop, lanes: int) -> int:
    """The widest vector (<= ``lanes``) every access of ``block`` can use along ``loop``: each
    access must step by one element along it, from an address that is a multiple of the vector
    for every value of the other loops (a misaligned float4 faults on the GPU), and no access may
    sit under a condition (padding). 1 when none can."""
    blk = sch.get(block)
    if any(str(r.source.dtype) == "bool" for r in list(blk.reads) + list(blk.writes)):
        return 1  # CUDA has no vector of bool
    var = sch.get(loop).loop_var
    # two analyzers that substitute the block's iterators by their loop bindings, the second
    # with ``loop`` at 0 as well (where a vector would start)
    full, at_zero = sym.Analyzer(), sym.Analyzer()
    at_zero.bind(var, tirx.const(0, var.ty.dtype))
    for iv, value in zip(blk.iter_vars, realize_of(sch, block).iter_values):
        full.bind(iv.var, value)
        at_zero.bind(iv.var, value)
    accesses, conditional = [], []

    def visit(node):
        if isinstance(node, (TensorLoad, tirx.BufferStore)):
            accesses.append(node)
        name = str(getattr(getattr(node, "op", None), "name", ""))
        if isinstance(node, tirx.Select) or name.endswith("if_then_else"):
            conditional.append(node)

    post_order_visit(blk.body, visit)
    if conditional or not accesses:
        return 1
    ext = extent(sch, loop) or 1
    starts = []
    for node in accesses:
        buf = node.buffer if isinstance(node, tirx.BufferStore) else node.source
        if not node.indices:
            continue  # a 0-d tensor (a gather's scalar index): one value for every lane
        idx = full.simplify(node.indices[-1])
        start = at_zero.simplify(node.indices[-1])
        step = full.simplify(idx - start)
        if _is_zero(step):
            if any(not _is_zero(full.simplify(i - at_zero.simplify(i)))
                   for i in node.indices[:-1]):
                return 1  # an outer dimension moves along the loop: a strided gather
            if DTYPE_BYTES.get(str(buf.dtype), 4) == 2:
                # TVM 0.27 builds a broadcast half8 as make_uint4 of 8 halves (invalid
                # CUDA); half4 / bfloat4 broadcasts are fine
                lanes = min(lanes, 4)
            continue  # does not move along the loop: one value broadcast to every lane
        last = buf.shape[-1]
        if not (_is_zero(full.simplify(step - var)) and isinstance(last, tirx.IntImm)):
            return 1  # strided or gathered along the loop
        starts.append((int(last), full.modular_set(start)))
    while lanes > 1:
        if ext % lanes == 0 and all(last % lanes == 0 and m.coeff % lanes == 0 and
                                    m.base % lanes == 0 for last, m in starts):
            return lanes
        lanes //= 2
    return 1


def _is_zero(e) -> bool:
    return isinstance(e, tirx.IntImm) and int(e) == 0


def _cooperative_fetch(sch: s_tir.Schedule, block, threads: int, dtype: str) -> None:
    """All threads of the block copy a tile: fused loops split over threadIdx.x, the innermost
    split a 16-byte vector when the tile's rows allow it."""
    # compute_at (unit loops preserved) made one loop per dimension of the tile
    inner = sch.get_loops(block)[-len(sch.get(block).iter_vars):]
    if not inner:
        return
    total = math.prod(extent(sch, l) or 1 for l in inner)
    vec = aligned_lanes(sch, block, inner[-1], vector_lanes(dtype))
    fused = sch.fuse(*inner) if len(inner) > 1 else inner[0]
    if vec > 1 and total >= vec * threads:
        _, tx, v = sch.split(fused, [None, threads, vec])
        sch.vectorize(v)
    else:
        _, tx = sch.split(fused, [None, threads])
    sch.bind(tx, "threadIdx.x")


def _pad_rows(sch: s_tir.Schedule, block, dtype: str, dev: DeviceModel) -> Optional[str]:
    """Shift each row of a shared tile by one 16-byte vector when rows are a multiple of the 32
    banks: column accesses by different threads then fall in different banks."""
    loops = sch.get_loops(block)
    nd = len(sch.get(block).iter_vars)
    if nd < 2:
        return None
    row = extent(sch, loops[-1]) or 1
    elem = DTYPE_BYTES.get(dtype, 4)
    bank_row = dev.gpu.smem_banks * dev.gpu.bank_bytes // elem
    if row % bank_row:
        return None
    pad = vector_lanes(dtype)
    sch.storage_align(block, 0, axis=nd - 2, factor=bank_row, offset=pad)
    return f"{sch.get(block).name_hint}: rows of {row} padded by {pad} (bank conflicts)"


# -- tiled -----------------------------------------------------------------------------------
class _VariableWindow(Exception):
    """An input's window per reduction step has a loop-dependent extent."""


def apply_tiled(func, fa: FuncAnalysis, t: RTile, dev: DeviceModel,
                global_inputs: frozenset = frozenset()) -> s_tir.Schedule:
    if t.tensor_core:
        return apply_tensorcore(func, fa, t)
    try:
        return _apply_tiled(func, fa, t, dev, global_inputs)
    except _VariableWindow as err:
        # e.g. a transposed convolution's stride-parity window: TVM cannot allocate a shared
        # tile whose size changes from step to step, so that input is read from global memory
        name = str(err)
        logger.info("tvm_roller: %s: window size varies with the reduction step, read from "
                    "global memory (no shared-memory tile)", name)
        return apply_tiled(func, fa, t, dev, global_inputs | {name})


def _apply_tiled(func, fa: FuncAnalysis, t: RTile, dev: DeviceModel,
                 global_inputs: frozenset) -> s_tir.Schedule:
    sch = s_tir.Schedule(func)
    main = sch.get_sblock(fa.main)
    loops = axis_loops(sch, main)
    S, R = fa.spatial, fa.reduction
    v = t.vector_axis if t.vector_axis is not None else (S[-1] if S else None)
    grid, thr, reg, ko, ki = [], [], [], [], []
    vec_thr, vec_reg = [], []
    for i in S:
        # a thread's outputs are contiguous along each axis: the accumulators' write-back then
        # covers exactly them (an interleaved layout would make its region the hull over other
        # threads' outputs, which the CPU replica caught)
        r = t.reg[i]
        g, th, rr = perfect_split(sch, loops[i], fa.axes[i].extent, [t.l1[i] // r, r])
        grid.append(g)
        (vec_thr if i == v else thr).append(th)
        (vec_reg if i == v else reg).append(rr)
    for i in R:
        o, inner = perfect_split(sch, loops[i], fa.axes[i].extent, [t.l1[i]])
        ko.append(o); ki.append(inner)
    # the contiguous output axis varies fastest across threads and innermost in registers
    thr, reg = thr + vec_thr, reg + vec_reg
    sch.reorder(*grid, *thr, *ko, *ki, *reg)
    bx = sch.fuse(*grid) if len(grid) > 1 else grid[0]
    tx = sch.fuse(*thr) if len(thr) > 1 else thr[0]
    sch.bind(bx, "blockIdx.x")
    sch.bind(tx, "threadIdx.x")
    # the fetch sits under the innermost chunk loop; fusing the chunk loops instead would make
    # the fetched window's extent depend on the loop (stride-parity prologues of transposed
    # convolutions), which TVM cannot allocate
    k = ko[-1] if ko else None

    # accumulators in registers, the epilogue folded into their write-back
    wb = sch.cache_write(main, 0, "local")
    sch.reverse_compute_at(wb, tx, preserve_unit_loops=True)
    for name in fa.consumers:
        require(f"CUDA lowering: inlining epilogue {name}", sch.reverse_compute_inline, sch.get_sblock(name))
    wb_loops = sch.get_loops(wb)
    lanes = aligned_lanes(sch, wb, wb_loops[-1],
                          vector_lanes(str(sch.get(wb).writes[0].source.dtype)))
    if lanes > 1:
        if (extent(sch, wb_loops[-1]) or 1) > lanes:
            _, vi = sch.split(wb_loops[-1], [None, lanes])
        else:
            vi = wb_loops[-1]
        sch.vectorize(vi)

    # each input's chunk staged in shared memory; prologues (padding) inlined into the fetch
    threads = t.threads
    if k is not None:
        blk = sch.get(main)
        outs = {w.source.name for w in blk.writes}
        read_idx = [i for i, r in enumerate(blk.reads) if r.source.name not in outs]
        fetches = []
        for i in read_idx:
            name = blk.reads[i].source.name
            if name in global_inputs:
                continue
            s = sch.cache_read(main, i, "shared")
            sch.compute_at(s, k, preserve_unit_loops=True)
            if any(extent(sch, l) is None for l in
                   sch.get_loops(s)[-len(sch.get(s).iter_vars):]):
                raise _VariableWindow(name)
            fetches.append(s)
        for name in reversed(fa.producers):
            require(f"CUDA lowering: inlining prologue {name}", sch.compute_inline, sch.get_sblock(name))
        for s in fetches:
            dtype = str(sch.get(s).writes[0].source.dtype)
            note = _pad_rows(sch, s, dtype, dev)
            if note:
                logger.info("tvm_roller: %s", note)
            _cooperative_fetch(sch, s, threads, dtype)
        if t.stages >= 2 and (extent(sch, k) or 1) >= 2:
            n = len(fetches)
            sch.annotate(k, "software_pipeline_stage", [0] * n + [t.stages - 1])
            sch.annotate(k, "software_pipeline_order", list(range(n + 1)))
            if _async_copy(dev):
                sch.annotate(k, "software_pipeline_async_stages", [0])
        sch.decompose_reduction(main, ko[0])
    else:
        for name in reversed(fa.producers):
            require(f"CUDA lowering: inlining prologue {name}", sch.compute_inline, sch.get_sblock(name))
    sch.annotate(bx, "pragma_auto_unroll_max_step", _UNROLL_STEP)
    sch.annotate(bx, "pragma_unroll_explicit", 1)
    # TVM's inlining can leave a read of a buffer it removed (an epilogue that reshapes between
    # elementwise stages with several readers): refuse here, not as a crash in the build
    if not s_tir.analysis.verify_well_formed(sch.mod, assert_mode=False):
        raise UnsupportedError("CUDA lowering: the epilogue's inlining left ill-formed IR "
                               f"(stages {', '.join(fa.consumers)})")
    return sch


def _async_copy(dev: DeviceModel) -> bool:
    return dev.gpu.cc_major >= 8  # cp.async exists from sm_80


# -- memory-bound ----------------------------------------------------------------------------
def _bind_flat(sch: s_tir.Schedule, block, threads: int, dtype: str, warp: int) -> None:
    """One element (or one 16-byte vector) per thread over the block's fused loops."""
    loops = sch.get_loops(block)
    _bind_flat_loops(sch, loops, threads,
                     aligned_lanes(sch, block, loops[-1], vector_lanes(dtype)), warp=warp)


def apply_streaming(func, fa: FuncAnalysis, t: RTile, dev: DeviceModel) -> s_tir.Schedule:
    sch = s_tir.Schedule(func)
    warp = dev.gpu.warp_size
    threads = max(warp, t.threads or 256)
    names = block_names(sch)
    # elementwise stages inline into their consumers where they can (one kernel, no round trip)
    for name in names[:-1]:
        blk = sch.get_sblock(name)
        if is_reduction(sch, blk):
            continue
        attempt(sch.compute_inline, blk)  # refused: a stage of its own (e.g. two consumers)
    names = block_names(sch)
    # a scalar output: a unit loop around every stage stands for its one row
    add_unit_loops(sch, every=all(fa.axes[i].extent == 1 for i in fa.spatial))
    if t.kind == "elementwise":
        for name in names:
            blk = sch.get_sblock(name)
            _bind_flat(sch, blk, threads, str(sch.get(blk).writes[0].source.dtype), warp)
        return sch
    if t.acc_level == "split":
        return _split_reduction(sch, fa, t, threads, warp)
    # the rows: the reduction's spatial extents other than 1 (a kept dimension of the
    # statistics of a norm is a unit axis the stages after it may not have)
    row_exts = [fa.axes[i].extent for i in fa.spatial if fa.axes[i].extent != 1]
    last = sch.get_sblock(names[-1])
    loops = sch.get_loops(last)
    row = _row_loops(sch, last, row_exts)
    if row is None or any(_row_loops(sch, sch.get_sblock(n), row_exts) is None for n in names):
        raise UnsupportedError("CUDA lowering: the stages do not share the reduction's rows")
    rest = loops[len(row):]
    if t.acc_level == "thread":
        # short reductions (pooling windows): one output per thread, earlier stages of the same
        # row computed by that thread into registers
        _bind_flat_loops(sch, row, threads, warp=warp)
        anchor, scope = sch.get_loops(last)[1], "local"
    else:
        # one row per thread block: the stages' inner loops spread over the block's threads
        # (TVM lowers a reduction bound to threads to warp shuffles), intermediates in shared
        bx = sch.fuse(*row) if len(row) > 1 else row[0]
        sch.bind(bx, "blockIdx.x")
        _spread(sch, rest, threads)
        anchor, scope = bx, "shared"
    for name in reversed(names[:-1]):
        blk = sch.get_sblock(name)
        require(f"CUDA lowering: placing {name} in its row", sch.compute_at, blk, anchor, preserve_unit_loops=True)
        for i in range(len(sch.get(blk).writes)):  # an argmax writes its index and value
            sch.set_scope(blk, i, scope)
        if scope == "shared":
            _spread(sch, sch.get_loops(blk)[1:], threads)
    return sch


def _split_reduction(sch: s_tir.Schedule, fa: FuncAnalysis, t: RTile,
                     threads: int, warp: int) -> s_tir.Schedule:
    """Few rows, long reductions (a norm over a whole tensor): each row's reduction is split
    over ``t.l2`` thread blocks (``rfactor``) writing partial results, a second kernel
    reduces those; the epilogue stages run as kernels of their own."""
    parts = t.l2[fa.reduction[0]]
    main = sch.get_sblock(fa.main)
    loops = sch.get_loops(main)
    # create_prim_func order: the row loops (or a scalar output's unit loop), then the reduction
    n_red = sum(1 for iv in sch.get(main).iter_vars if iv.iter_type != 0)
    spatial, red = loops[:len(loops) - n_red], loops[len(loops) - n_red:]
    r = sch.fuse(*red) if len(red) > 1 else red[0]
    p, _, tx = sch.split(r, [parts, None, threads])
    rf = require("CUDA lowering: splitting the reduction over blocks", sch.rfactor, p,
                 len(fa.spatial))
    rf_loops = sch.get_loops(rf)
    bx = sch.fuse(*rf_loops[:len(spatial) + 1])
    sch.bind(bx, "blockIdx.x")
    sch.bind(sch.get_loops(rf)[-1], "threadIdx.x")
    fin = sch.get_loops(main)
    bx2 = sch.fuse(*fin[:len(spatial)]) if len(spatial) > 1 else fin[0]
    sch.bind(bx2, "blockIdx.x")
    sch.bind(fin[-1], "threadIdx.x")
    left = set(block_names(sch))  # the consumers not inlined into a later stage
    for name in fa.consumers:
        if name not in left:
            continue
        blk = sch.get_sblock(name)
        if is_reduction(sch, blk):
            raise UnsupportedError(f"CUDA lowering: a split reduction followed by another "
                                   f"reduction ({name})")
        _bind_flat(sch, blk, threads, str(sch.get(blk).writes[0].source.dtype), warp)
    return sch


def _row_loops(sch: s_tir.Schedule, block, row_exts: List[int]) -> Optional[list]:
    """The leading loops of ``block`` that walk the rows: their extents other than 1 are
    ``row_exts`` in order (unit loops among them included). None when they are not (the stage
    does not share the rows); rows of a scalar output: its leading unit loops."""
    loops = sch.get_loops(block)
    out, want = [], list(row_exts)
    for l in loops:
        e = extent(sch, l)
        if not want:
            if e == 1 and not row_exts:
                out.append(l)
                continue
            break
        if e == 1:
            out.append(l)
        elif e == want[0]:
            out.append(l)
            want.pop(0)
        else:
            return None
    return out if not want and out else None


def _spread(sch: s_tir.Schedule, loops: list, threads: int) -> None:
    """A row's remaining loops (spatial or reduction) over threadIdx.x."""
    if not loops:
        return
    fused = sch.fuse(*loops) if len(loops) > 1 else loops[0]
    _, tx = sch.split(fused, [None, threads])
    sch.bind(tx, "threadIdx.x")


def _bind_flat_loops(sch: s_tir.Schedule, loops: list, threads: int, vec: int = 1, *,
                     warp: int) -> None:
    """``loops`` fused and spread over blocks x threads (whole warps, no more threads than
    work), the innermost ``vec`` elements a vector per thread."""
    total = math.prod(extent(sch, l) or 1 for l in loops)
    fused = sch.fuse(*loops) if len(loops) > 1 else loops[0]
    threads = min(threads, max(warp, -(-total // vec // warp) * warp))
    if vec > 1:
        bx, tx, vi = sch.split(fused, [None, threads, vec])
        sch.vectorize(vi)
    else:
        bx, tx = sch.split(fused, [None, threads])
    sch.bind(bx, "blockIdx.x")
    sch.bind(tx, "threadIdx.x")
