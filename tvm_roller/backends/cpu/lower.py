"""Apply an rTile to a PrimFunc with ``tvm.s_tir.Schedule`` for the LLVM (CPU) backend.

Tiled (reuse-heavy) functions get the loop nest

    S0 (fused, parallel: one task per L2 tile) · R0 (reduction chunks) · S1 (L1 tiles)
    · S2 (register tiles) · R1 (the chunk) · S3 (register tile: unrolled, innermost vectorized)

with the accumulator of a task's tile written through a small cache (``cache_write``) and the
elementwise epilogue inlined into its write-back; padding and layout-preserving prologues are
inlined into the main block. Memory-bound functions (row reductions, softmax, norms,
elementwise) are parallelized over rows and vectorized, reductions through ``rfactor``.
"""
from __future__ import annotations

import math
from typing import List, Optional

import tvm
from tvm import s_tir, sym, tirx
from tvm.ir.expr import TensorLoad

from tvm_roller.analysis import FuncAnalysis
from tvm_roller.analysis.access import build_access
from tvm_roller.analysis.schedule import (add_unit_loops, attempt, axis_loops, block_names, extent,
                                          is_padding, is_reduction, perfect_split,
                                          plain_splits_active, realize_of)
from tvm_roller.analysis.visit import post_order_visit
from tvm_roller.core.rtile import RTile

_UNROLL_STEP = 64


# -- helpers ---------------------------------------------------------------------------------------


def _layout_preserving(sch: s_tir.Schedule, name: str) -> bool:
    """A prologue whose innermost write index moves with its innermost read index (padding,
    broadcast, elementwise): inlining it keeps the consumer's vector loads contiguous."""
    blk = sch.get(sch.get_sblock(name))
    vs = [iv.var for iv in blk.iter_vars]
    w = build_access(blk.writes[0], vs, "write")
    wi = w.innermost_axis()
    for r in blk.reads:
        acc = build_access(r, vs, "read")
        ri = acc.innermost_axis()
        if wi is not None and wi in acc.axes_used() and ri != wi:
            return False
    return True


# A padded input is copied per task when each of its elements feeds at least this many
# multiply-adds (a convolution over many channels); below that (depthwise: k*k) the copy costs
# more than the bounds tests it removes (measured on DEP/C2D, see BENCHMARKS.md).
_PAD_MATERIALISE_REUSE = 32


def _elements(sch: s_tir.Schedule, name: str) -> int:
    return math.prod(int(e) for e in sch.get(sch.get_sblock(name)).writes[0].source.shape)


def _is_vectorized(sch: s_tir.Schedule, loop) -> bool:
    return int(sch.get(loop).kind) == 2  # ForKind.VECTORIZED


def _vectorize_inner(sch: s_tir.Schedule, loop, lanes: int) -> None:
    ext = extent(sch, loop)
    if ext is None or ext <= 1:
        return
    if ext <= lanes and not plain_splits_active():
        sch.vectorize(loop)
        return
    # (a trace to replay on symbolic extents splits even a short loop: its extent may be a
    # variable there, and a whole loop is vectorized only at a constant extent)
    _, inner = sch.split(loop, [None, lanes])
    sch.vectorize(inner)


def _parallel_vectorize_block(sch: s_tir.Schedule, block, lanes: int, cores: int) -> None:
    """A leftover injective block: fused loops, parallel outer, vectorized inner. A leftover
    reduction (a mean feeding a variance) gets its row loops parallel, its reduction serial."""
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
    inner = loops[-1]
    ext = extent(sch, inner) or 1
    if len(loops) > 1:
        outer = sch.fuse(*loops[:-1])
        if (extent(sch, outer) or 1) > 1:
            sch.parallel(outer)
        _vectorize_inner(sch, inner, lanes)
    elif ext >= 2 * lanes * cores:
        o, i = sch.split(inner, [None, lanes])
        sch.parallel(o)
        sch.vectorize(i)
    else:
        _vectorize_inner(sch, inner, lanes)


# -- tiled ------------------------------------------------------------------------------------------


def apply_tiled(func: tirx.PrimFunc, fa: FuncAnalysis, t: RTile) -> s_tir.Schedule:
    sch = s_tir.Schedule(func)
    lanes = t.vector_lanes
    leftovers = []
    padded = []
    volume = math.prod(a.extent for a in fa.axes)
    for name in reversed(fa.producers):
        if is_padding(sch, name) and len(sch.get_consumers(sch.get_sblock(name))) == 1 and \
                volume >= _PAD_MATERIALISE_REUSE * _elements(sch, name):
            padded.append(name)  # materialised per task below: no bounds test in the hot loop
        elif _layout_preserving(sch, name):
            sch.compute_inline(sch.get_sblock(name))
        else:
            leftovers.append(name)  # e.g. a transpose: materialised, then parallel/vectorized

    ext_p, out_pad, in_pads = _pad_main(sch, fa, t)
    leftovers += in_pads  # zero-padded input copies: once, parallel and vectorized
    main = sch.get_sblock(fa.main)
    loops = axis_loops(sch, main)
    S, R = fa.spatial, fa.reduction
    s0, s1, s2, s3, r0, r1 = [], [], [], [], [], []
    # tile sizes enter the trace as sample_perfect_tile decisions, so MetaSchedule's mutators
    # can evolve a roller schedule (warm start) like one of its own samples
    for i in S:
        a, b, c, d = perfect_split(sch, loops[i], ext_p[i],
                                    [t.l2[i] // t.l1[i], t.l1[i] // t.reg[i], t.reg[i]])
        s0.append(a); s1.append(b); s2.append(c); s3.append(d)
    for i in R:
        a, b = perfect_split(sch, loops[i], ext_p[i], [t.l1[i]])
        r0.append(a); r1.append(b)
    v = t.vector_axis
    s3_vec = None
    if v is not None:
        s3_vec = s3[S.index(v)]
        s3 = [l for l in s3 if not l.same_as(s3_vec)]
    vec_outer = []
    if s3_vec is not None and t.reg[v] > lanes and t.reg[v] % lanes == 0:
        vo, s3_vec = sch.split(s3_vec, [None, lanes])
        vec_outer = [vo]
    reg_acc = t.acc_level == "reg"
    if reg_acc:  # the register tile accumulates over the whole reduction
        order = s0 + s1 + s2 + r0 + r1 + s3 + vec_outer + ([s3_vec] if s3_vec is not None else [])
    else:  # the task's tile accumulates in cache, K chunks outermost (BLIS order)
        order = s0 + r0 + s1 + s2 + r1 + s3 + vec_outer + ([s3_vec] if s3_vec is not None else [])
    sch.reorder(*order)
    task = sch.fuse(*s0) if len(s0) > 1 else s0[0]
    if t.num_tasks > 1:
        sch.parallel(task)

    # accumulator tile, written back once with the epilogue folded in
    wb = sch.cache_write(main, 0, "local" if reg_acc else "global")
    # unit loops kept: the trace then replays under any re-tiling (MetaSchedule mutations)
    sch.reverse_compute_at(wb, s2[-1] if reg_acc else task, preserve_unit_loops=True)
    if out_pad:
        sch.reverse_compute_inline(sch.get_sblock(out_pad))
    leftovers += _fold_epilogue(sch, list(fa.consumers), sch.get(wb).name_hint)
    wb_loops = sch.get_loops(wb)
    _vectorize_inner(sch, wb_loops[-1], lanes)

    for name in t.pack:
        _pack_operand(sch, main, name, task, t.reg[v] if v is not None else lanes, lanes)

    for l in s3 + vec_outer:
        if (extent(sch, l) or 1) > 1:
            sch.unroll(l)
    if s3_vec is not None and (extent(sch, s3_vec) or 1) > 1:
        sch.vectorize(s3_vec)
    sch.annotate(task, "pragma_auto_unroll_max_step", _UNROLL_STEP)
    sch.annotate(task, "pragma_unroll_explicit", 1)

    for name in leftovers:
        blk = sch.get_sblock(name)
        pair = None if is_reduction(sch, blk) else _transposed_pair(sch, blk, lanes)
        if pair is not None:  # a transposed operand (NT batch matmul): 2-D blocks, not rows
            _block_2d(sch, blk, pair, lanes, t.num_tasks)
        else:
            _parallel_vectorize_block(sch, blk, lanes, t.num_tasks)
    for name in padded:
        # the task's padded input window, computed where the task starts (cache-resident)
        pad = sch.get_sblock(name)
        sch.compute_at(pad, task, preserve_unit_loops=True)
        pad_loops = sch.get_loops(pad)
        inner = pad_loops[-1]
        if len(pad_loops) > 1 and (extent(sch, inner) or 1) >= lanes:
            _vectorize_inner(sch, inner, lanes)

    if r0:
        init = sch.decompose_reduction(main, r0[0])
        inner = sch.get_loops(init)[-1]
        if 1 < (extent(sch, inner) or 1) <= lanes:
            sch.vectorize(inner)
    return sch


def _fold_epilogue(sch: s_tir.Schedule, names: List[str], write_back: str) -> List[str]:
    """Fold the elementwise epilogue into the accumulator's write-back; return the blocks that
    cannot be, left to stream on their own: one over a bigger iteration space than the main
    block's output (squeeze-and-excitation's broadcast multiply) and what comes after it."""
    main_shape = _write_shape(sch, write_back)

    def same_space(name: str) -> bool:
        return _write_shape(sch, name) == main_shape

    # the stages are inlined forward into the last one first: an epilogue that is a DAG
    # (SiLU: x * sigmoid(x) reads two of its stages) cannot be folded stage by stage
    for name in reversed(names[:-1]):
        blk = sch.get_sblock(name)
        readers = [sch.get(c).name_hint for c in sch.get_consumers(blk)]
        if same_space(name) and readers and all(same_space(r) for r in readers):
            attempt(sch.compute_inline, blk)
    left: List[str] = []
    for name in names:
        if name not in block_names(sch):
            continue  # inlined forward above
        if left or not same_space(name) or \
                not attempt(sch.reverse_compute_inline, sch.get_sblock(name)):
            left.append(name)
    return left


def _write_shape(sch: s_tir.Schedule, name: str) -> List[int]:
    return [int(e) for e in sch.get(sch.get_sblock(name)).writes[0].source.shape]


def _pad_main(sch: s_tir.Schedule, fa: FuncAnalysis, t: RTile):
    """Pad the main block's spatial axes up to multiples of the register tile (``pad_einsum``)
    when the tile does not divide them, so that no split needs a predicate (a dynamic axis:
    to a multiple of its task tile, or of its reduction chunk). Returns the
    (padded) extents, the output-cropping block's name (or None) and the input pad blocks.
    A block ``pad_einsum`` refuses keeps its extents (predicated splits)."""
    exts = [a.extent for a in fa.axes]
    factors = [r if a.kind == "S" and a.extent % r else 1 for a, r in zip(fa.axes, t.reg)]
    for i in fa.dynamic_axes:
        # replayed on a symbolic extent: padded to the outermost split's step, which then
        # divides it and no split needs a predicate in the micro-kernel
        factors[i] = t.l2[i] if fa.axes[i].kind == "S" else t.l1[i]
    if all(f == 1 for f in factors):
        return exts, None, []
    before = set(block_names(sch))
    main = sch.get_sblock(fa.main)
    if not attempt(sch.pad_einsum, main, factors):
        return exts, None, []
    main = sch.get_sblock(fa.main)
    new = set(block_names(sch)) - before
    out_pad = next((sch.get(b).name_hint for b in sch.get_consumers(main)
                    if sch.get(b).name_hint in new), None)
    in_pads = [sch.get(b).name_hint for b in sch.get_producers(main)
               if sch.get(b).name_hint in new]
    return [-(-e // f) * f for e, f in zip(exts, factors)], out_pad, in_pads


def _pack_operand(sch: s_tir.Schedule, main, name: str, at_loop, panel: int, lanes: int) -> None:
    """Copy a task's slice of a reused operand into a contiguous panel layout:
    (last // panel, other dims..., last % panel), so the micro-kernel streams it linearly."""
    reads = [r.source.name for r in sch.get(main).reads]
    cb = sch.cache_read(main, reads.index(name), "global")
    sch.compute_at(cb, at_loop, preserve_unit_loops=True)
    sch.transform_layout(cb, ("write", 0),
                         lambda *idx: (idx[-1] // panel, *idx[:-1], idx[-1] % panel))
    _vectorize_inner(sch, sch.get_loops(cb)[-1], lanes)


# -- memory-bound kinds ----------------------------------------------------------------------------
def rfactor_vectorize_reduction(sch: s_tir.Schedule, block, lanes: int, split_cores: int = 0,
                                 lanes_last: bool = False):
    """Vectorize a reduction over its innermost reduction loop through rfactor; optionally
    first split it ``split_cores`` ways into independent parallel partial sums. ``lanes_last``:
    the partial sums' lane axis innermost in their buffer (rows of partial sums, one row per
    output element, contiguous when the lanes are vectorized under a row loop)."""
    blk = sch.get(block)
    red_vars = [i for i, iv in enumerate(blk.iter_vars) if iv.iter_type == 2]
    loops = sch.get_loops(block)
    # reduction loops are the innermost ones in create_prim_func order
    red_loops = loops[len(loops) - len(red_vars):] if red_vars else []
    if not red_loops:
        return
    add_unit_loops(sch)  # rfactor beside a loopless block fails in TVM 0.27
    k = sch.fuse(*red_loops) if len(red_loops) > 1 else red_loops[0]
    ext = extent(sch, k) or 1
    if split_cores > 1 and ext >= split_cores * lanes * 4 and ext % (split_cores * lanes) == 0:
        kp, kr = sch.split(k, [split_cores, None])
        rf = sch.rfactor(kp, 0)  # rf[.., kp] = sum over kr: independent per core
        rloops = sch.get_loops(rf)
        # rf loops: (..., kp, kr) -> parallel kp, vectorize kr through a second rfactor
        sch.parallel(rloops[-2])
        kr = rloops[-1]
        if (extent(sch, kr) or 1) % lanes == 0:
            ko, ki = sch.split(kr, [None, lanes])
            rf2 = sch.rfactor(ki, 0)
            _vectorize_rf(sch, rf2, lanes)
        return
    if ext >= lanes and ext % lanes == 0:
        ko, ki = sch.split(k, [None, lanes])
        rf = sch.rfactor(ki, len(sch.get(block).writes[0].source.shape) if lanes_last else 0)
        _vectorize_rf(sch, rf, lanes)


def vectorize_lanes_under_row(sch: s_tir.Schedule, blk, row, lanes: int) -> None:
    """An rfactor'ed partial reduction moved under the row loop (``compute_at`` regenerates its
    loops without their annotations): its lane loop, the one loop under the row bound to a
    spatial axis of ``lanes`` elements, innermost and vectorized."""
    loops = sch.get_loops(blk)
    loops = loops[next((i + 1 for i, l in enumerate(loops) if l.same_as(row)), 0):]
    lvars = [sch.get(l).loop_var for l in loops]
    b = sch.get(blk)
    lane = [l for iv, val in zip(b.iter_vars, realize_of(sch, blk).iter_values)
            if iv.iter_type == 0 and _iv_extent(iv) == lanes
            for l, lv in zip(loops, lvars) if lv.same_as(val)]
    if len(lane) != 1:
        return
    pos = next(i for i, l in enumerate(loops) if l.same_as(lane[0]))
    after = loops[pos + 1:]
    if after:
        sch.reorder(*after, lane[0])
    sch.vectorize(lane[0])


def _iv_extent(iv) -> Optional[int]:
    e = iv.dom.extent
    return int(e.value) if isinstance(e, tvm.tirx.IntImm) else None


def _vectorize_rf(sch: s_tir.Schedule, rf, lanes: int) -> None:
    """rf block loops are (..., ki, ko): move the lane loop innermost and vectorize it."""
    loops = sch.get_loops(rf)
    lane = None  # the innermost loop of extent ``lanes``: the rfactor'ed lane axis
    for l in loops:
        if extent(sch, l) == lanes:
            lane = l
    if lane is None:
        return
    sch.reorder(*[l for l in loops if not l.same_as(lane)][-1:], lane)
    sch.vectorize(lane)


# rows this many bytes apart alias to the same L1 set (a page: the set span of the usual
# 32-48 KiB, 8-12-way L1s)
_SET_ALIAS_BYTES = 4096


def _element_steps(blk: tirx.Block) -> Optional[List[List[int]]]:
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


def _transposed_pair(sch: s_tir.Schedule, blk_rv, lanes: int) -> Optional[tuple]:
    """(k, last) when some input is read with a stride along the output's innermost axis but
    contiguously along axis k: a transpose, whose row-by-row copy touches a new cache line per
    element. Only for a block whose loops are its axes, one to one."""
    blk = sch.get(blk_rv)
    loops = sch.get_loops(blk_rv)
    exts = [int(iv.dom.extent) for iv in blk.iter_vars]
    if len(loops) != len(exts) or len(exts) < 2 or exts[-1] < lanes:
        return None
    steps = _element_steps(blk)
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


def _block_2d(sch: s_tir.Schedule, blk_rv, pair: tuple, lanes: int, cores: int) -> None:
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


def _output_blocks(sch: s_tir.Schedule) -> List[str]:
    params = {p.id_ for p in sch.mod["main"].params}
    return [n for n in block_names(sch)
            if any(w.source.id_ in params for w in sch.get(sch.get_sblock(n)).writes)]


def _each_output_alone(sch: s_tir.Schedule, lanes: int, cores: int) -> s_tir.Schedule:
    """An elementwise function with several outputs (a split into q, k, v): no output block can
    move under another's loops, so the intermediates are inlined into every reader (copies and
    reshapes cost nothing to recompute) and each output is streamed on its own."""
    outputs = set(_output_blocks(sch))
    for name in block_names(sch):
        if name not in outputs:
            attempt(sch.compute_inline, sch.get_sblock(name))
    for name in block_names(sch):
        _parallel_vectorize_block(sch, sch.get_sblock(name), lanes, cores)
    return sch


def apply_streaming(func: tirx.PrimFunc, fa: FuncAnalysis, t: RTile, cores: int) -> s_tir.Schedule:
    sch = s_tir.Schedule(func)
    lanes = t.vector_lanes
    if len(_output_blocks(sch)) > 1 and not any(is_reduction(sch, sch.get_sblock(n))
                                                for n in block_names(sch)):
        return _each_output_alone(sch, lanes, cores)
    names = block_names(sch)
    out_name = names[-1]
    # inline injective stages that feed a single consumer (they are recomputed at no extra cost)
    for name in names[:-1]:
        blk = sch.get_sblock(name)
        if is_reduction(sch, blk):
            continue
        if len(sch.get_consumers(blk)) == 1:
            sch.compute_inline(blk)
    names = block_names(sch)
    out = sch.get_sblock(out_name)
    out_loops = sch.get_loops(out)
    out_red = is_reduction(sch, out)
    row_loops = out_loops[:-1] if not out_red else out_loops[:len(out_loops) - sum(
        1 for iv in sch.get(out).iter_vars if iv.iter_type == 2)]
    rows = 1
    for l in row_loops:
        rows *= extent(sch, l) or 1

    if rows >= 2 * cores:
        if not out_red and len(block_names(sch)) == 1:
            pair = _transposed_pair(sch, out, lanes)
            if pair is not None:  # a transposing copy: 2-D blocks instead of rows
                _block_2d(sch, out, pair, lanes, cores)
                return sch
        # vectorize reductions first (rfactor wants them at the root), then nest every stage
        # under the output's parallel row loop so a row stays in cache between stages
        for name in names[:-1]:
            blk = sch.get_sblock(name)
            if is_reduction(sch, blk):
                rfactor_vectorize_reduction(sch, blk, lanes, lanes_last=True)
        out_loops = sch.get_loops(out)
        row_loops = out_loops[:len(row_loops)]
        row = sch.fuse(*row_loops) if len(row_loops) > 1 else row_loops[0]
        sch.parallel(row)
        for name in reversed(block_names(sch)[:-1]):
            sch.compute_at(sch.get_sblock(name), row, preserve_unit_loops=True)
        for name in block_names(sch):
            blk = sch.get_sblock(name)
            if is_reduction(sch, blk):
                vectorize_lanes_under_row(sch, blk, row, lanes)
                continue
            ls = [l for l in sch.get_loops(blk) if not l.same_as(row)]
            if ls and not _is_vectorized(sch, ls[-1]):
                _vectorize_inner(sch, ls[-1], lanes)
        return sch

    # few rows: parallelize inside the heavy reduction, the rest is tiny
    for name in names:
        blk = sch.get_sblock(name)
        if is_reduction(sch, blk):
            rfactor_vectorize_reduction(sch, blk, lanes, split_cores=cores)
        else:
            _parallel_vectorize_block(sch, blk, lanes, cores)
    return sch
