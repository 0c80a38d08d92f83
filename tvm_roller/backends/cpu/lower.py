"""Apply a tiled rTile to a PrimFunc with ``tvm.s_tir.Schedule`` for the LLVM (CPU) backend.

Tiled (reuse-heavy) functions get the loop nest

    S0 (fused, parallel: one task per L2 tile) · R0 (reduction chunks) · S1 (L1 tiles)
    · S2 (register tiles) · R1 (the chunk) · S3 (register tile: unrolled, innermost vectorized)

with the accumulator of a task's tile written through a small cache (``cache_write``) and the
elementwise epilogue inlined into its write-back; padding and layout-preserving prologues are
inlined into the main block. Memory-bound functions: ``lower_streaming``.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import List, Optional, Tuple

from tvm import s_tir, tirx
from tvm.s_tir.schedule import LoopRV, SBlockRV

from tvm_roller.analysis import FuncAnalysis
from tvm_roller.analysis.access import build_access
from tvm_roller.analysis.schedule import (attempt, axis_loops, block_names, extent,
                                          inline_within, is_padding, is_reduction, perfect_split)
from tvm_roller.backends.cpu.prepack import panel_operands, prepack
from tvm_roller.backends.cpu.loops import (block_2d, parallel_vectorize_block, transposed_pair,
                                           vectorize_inner)
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
# more than the bounds tests it removes (measured on DEP/C2D, see docs/history.md).
_PAD_MATERIALISE_REUSE = 32


def _elements(sch: s_tir.Schedule, name: str) -> int:
    return math.prod(int(e) for e in sch.get(sch.get_sblock(name)).writes[0].source.shape)


# -- tiled ------------------------------------------------------------------------------------------


@dataclass
class _TiledLoops:
    """The loop nest of a tiled main block (module docstring): S0..S3 per spatial axis, R0/R1
    per reduction axis; the vector axis' register loop apart (``vec``, split into whole vectors
    with ``vec_outer`` over them) and the fused, parallel task loop over S0."""
    s0: List[LoopRV]
    s1: List[LoopRV]
    s2: List[LoopRV]
    s3: List[LoopRV]
    r0: List[LoopRV]
    r1: List[LoopRV]
    vec: Optional[LoopRV]
    vec_outer: List[LoopRV]
    task: LoopRV


def apply_tiled(func: tirx.PrimFunc, fa: FuncAnalysis, t: RTile) -> s_tir.Schedule:
    """Schedule ``func`` as the tiled loop nest of the module docstring for the rTile ``t``."""
    sch = s_tir.Schedule(func)
    padded, leftovers = _place_prologues(sch, fa)
    ext_p, crops, in_pads = pad_main(sch, fa, t)
    leftovers += in_pads  # zero-padded input copies: once, parallel and vectorized
    main = sch.get_sblock(fa.main)
    loops = _tile_main(sch, fa, t, main, ext_p)
    leftovers += _write_back(sch, fa, t, main, loops, crops)
    _pack_operands(sch, func, fa, t, main, loops.task)
    _unroll_register_tile(sch, loops)
    _schedule_leftovers(sch, t, leftovers, in_pads)
    _materialise_padded(sch, padded, loops.task, t.vector_lanes)
    if loops.r0:
        init = sch.decompose_reduction(main, loops.r0[0])
        inner = sch.get_loops(init)[-1]
        if 1 < (extent(sch, inner) or 1) <= t.vector_lanes:
            sch.vectorize(inner)
    return sch


def _place_prologues(sch: s_tir.Schedule, fa: FuncAnalysis) -> Tuple[List[str], List[str]]:
    """Inline the layout-preserving prologues; return the padding blocks materialised per task
    and the blocks left to run on their own."""
    padded: List[str] = []
    leftovers: List[str] = []
    volume = math.prod(a.extent for a in fa.axes)
    for name in reversed(fa.producers):
        if is_padding(sch, name) and len(sch.get_consumers(sch.get_sblock(name))) == 1 and \
                volume >= _PAD_MATERIALISE_REUSE * _elements(sch, name):
            padded.append(name)  # materialised per task below: no bounds test in the hot loop
        elif _layout_preserving(sch, name):
            sch.compute_inline(sch.get_sblock(name))
        else:
            leftovers.append(name)  # e.g. a transpose: materialised, then parallel/vectorized
    return padded, leftovers


def _tile_main(sch: s_tir.Schedule, fa: FuncAnalysis, t: RTile, main: SBlockRV,
               ext_p: List[int]) -> _TiledLoops:
    """Split the main block's loops into the tile levels, order them and fuse the task loop."""
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
    if s3_vec is not None and t.reg[v] > t.vector_lanes and t.reg[v] % t.vector_lanes == 0:
        vo, s3_vec = sch.split(s3_vec, [None, t.vector_lanes])
        vec_outer = [vo]
    inner = s3 + vec_outer + ([s3_vec] if s3_vec is not None else [])
    if t.acc_level == "reg":  # the register tile accumulates over the whole reduction
        sch.reorder(*(s0 + s1 + s2 + r0 + r1 + inner))
    else:  # the task's tile accumulates in cache, K chunks outermost (BLIS order)
        sch.reorder(*(s0 + r0 + s1 + s2 + r1 + inner))
    task = sch.fuse(*s0) if len(s0) > 1 else s0[0]
    if t.num_tasks > 1:
        sch.parallel(task)
    return _TiledLoops(s0, s1, s2, s3, r0, r1, s3_vec, vec_outer, task)


def _write_back(sch: s_tir.Schedule, fa: FuncAnalysis, t: RTile, main: SBlockRV, loops: _TiledLoops,
                crops: List[str]) -> List[str]:
    """The accumulator tile, written back once with the epilogue folded in; return the
    epilogue blocks that could not be folded."""
    reg_acc = t.acc_level == "reg"
    wb = sch.cache_write(main, 0, "local" if reg_acc else "global")
    # unit loops kept: the trace then replays under any re-tiling (MetaSchedule mutations)
    sch.reverse_compute_at(wb, loops.s2[-1] if reg_acc else loops.task, preserve_unit_loops=True)
    for name in crops:
        sch.reverse_compute_inline(sch.get_sblock(name))
    leftovers = fold_epilogue(sch, list(fa.consumers), sch.get(wb).name_hint)
    vectorize_inner(sch, sch.get_loops(wb)[-1], t.vector_lanes)
    return leftovers


def _pack_operands(sch: s_tir.Schedule, func: tirx.PrimFunc, fa: FuncAnalysis, t: RTile,
                   main: SBlockRV, task: LoopRV) -> None:
    """Pack the operands into panels of the register tile's vector width."""
    v = t.vector_axis
    panel = t.reg[v] if v is not None else t.vector_lanes
    # constants: packed into panels while compiling (not in a bucket's kernel: the buckets
    # are branches of one function, each would split off a packing of its own)
    for name in [] if fa.dynamic_axes else panel_operands(fa, v):
        if name not in t.pack:
            prepack(sch, func, main, name, panel)
    for name in t.pack:  # a constant operand is packed while compiling, others per task
        name = _read_name(sch, main, name)
        if fa.dynamic_axes or not prepack(sch, func, main, name, panel):
            _pack_operand(sch, main, name, task, panel, t.vector_lanes)


def _unroll_register_tile(sch: s_tir.Schedule, loops: _TiledLoops) -> None:
    """Unroll the register tile, vectorize its innermost loop, let LLVM unroll under the task."""
    for l in loops.s3 + loops.vec_outer:
        if (extent(sch, l) or 1) > 1:
            sch.unroll(l)
    if loops.vec is not None and (extent(sch, loops.vec) or 1) > 1:
        sch.vectorize(loops.vec)
    sch.annotate(loops.task, "pragma_auto_unroll_max_step", _UNROLL_STEP)
    sch.annotate(loops.task, "pragma_unroll_explicit", 1)


def _schedule_leftovers(sch: s_tir.Schedule, t: RTile, leftovers: List[str],
                        in_pads: List[str]) -> None:
    """The blocks neither inlined nor folded run on their own, parallel and vectorized."""
    lanes = t.vector_lanes
    for name in leftovers:
        blk = sch.get_sblock(name)
        pair = None if is_reduction(sch, blk) else transposed_pair(sch, blk, lanes)
        if pair is not None:  # a transposed operand (NT batch matmul): 2-D blocks, not rows
            block_2d(sch, blk, pair, lanes, t.num_tasks)
        elif name in in_pads:  # whole vectors of the source row without the pad's branch
            parallel_vectorize_block(sch, blk, lanes, t.num_tasks, partition=True,
                                     valid=_source_row(sch, blk))
        else:
            parallel_vectorize_block(sch, blk, lanes, t.num_tasks)


def _materialise_padded(sch: s_tir.Schedule, padded: List[str], task: LoopRV, lanes: int) -> None:
    """The task's padded input window, computed where the task starts (cache-resident)."""
    for name in padded:
        pad = sch.get_sblock(name)
        sch.compute_at(pad, task, preserve_unit_loops=True)
        pad_loops = sch.get_loops(pad)
        inner = pad_loops[-1]
        if len(pad_loops) > 1 and (extent(sch, inner) or 1) >= lanes:
            vectorize_inner(sch, inner, lanes)


def fold_epilogue(sch: s_tir.Schedule, names: List[str], write_back: str) -> List[str]:
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
            inline_within(sch, blk)
    left: List[str] = []
    for name in names:
        if name not in block_names(sch):
            continue  # inlined forward above
        if left or not same_space(name) or \
                not attempt(sch.reverse_compute_inline, sch.get_sblock(name)):
            left.append(name)
    return left


def _source_row(sch: s_tir.Schedule, block) -> Optional[int]:
    """The innermost extent of the one buffer a padding copy reads (None: several, or not
    constant)."""
    reads = {r.source.id_: r.source for r in sch.get(block).reads}
    if len(reads) != 1:
        return None
    last = list(reads.values())[0].shape[-1]
    return int(last.value) if isinstance(last, tirx.IntImm) else None


def _write_shape(sch: s_tir.Schedule, name: str) -> List[int]:
    return [int(e) for e in sch.get(sch.get_sblock(name)).writes[0].source.shape]


def pad_main(sch: s_tir.Schedule, fa: FuncAnalysis, t: RTile):
    """Pad the main block's spatial axes up to multiples of the register tile, and a reduction
    axis up to a multiple of its L1 chunk (``pad_einsum``, zero-filled inputs) when the tile
    does not divide them, so that no split needs a predicate (a dynamic axis:
    to a multiple of its task tile, or of its reduction chunk). Returns the
    (padded) extents, the output-cropping blocks to inline into the write-back, in order, and
    the input pad blocks. A block ``pad_einsum`` refuses keeps its extents (predicated
    splits)."""
    exts = [a.extent for a in fa.axes]
    factors = [r if a.kind == "S" and a.extent % r else 1 for a, r in zip(fa.axes, t.reg)]
    factors = [c if a.kind == "R" and a.extent % c else f
               for a, c, f in zip(fa.axes, t.l1, factors)]
    for i in fa.dynamic_axes:
        # replayed on a symbolic extent: padded to the outermost split's step, which then
        # divides it and no split needs a predicate in the micro-kernel
        factors[i] = t.l2[i] if fa.axes[i].kind == "S" else t.l1[i]
    if all(f == 1 for f in factors):
        return exts, [], []
    crops = _own_output(sch, fa)
    before = set(block_names(sch))
    main = sch.get_sblock(fa.main)
    if not attempt(sch.pad_einsum, main, factors):
        return exts, crops, []
    main = sch.get_sblock(fa.main)
    new = set(block_names(sch)) - before
    crops = [sch.get(b).name_hint for b in sch.get_consumers(main)
             if sch.get(b).name_hint in new][:1] + crops
    in_pads = [sch.get(b).name_hint for b in sch.get_producers(main)
               if sch.get(b).name_hint in new]
    return [-(-e // f) * f for e, f in zip(exts, factors)], crops, in_pads


def _own_output(sch: s_tir.Schedule, fa: FuncAnalysis) -> List[str]:
    """A main block that writes part of its output (a part of a decomposed function,
    ``analysis.vector_tail``) writes a buffer of its own region first: ``pad_einsum`` pads
    and crops whole buffers. Returns the copy into the output (inlined into the write-back
    later), or nothing when the block writes its whole output."""
    main = sch.get_sblock(fa.main)
    region = sch.get(main).writes[0]
    shape = [int(d) for d in region.source.shape]
    covered = [int(r.extent) if isinstance(r.extent, tirx.IntImm) else -1
               for r in region.region]
    if covered == shape:
        return []
    return [sch.get(sch.cache_write(main, 0, "global")).name_hint]


def _read_name(sch: s_tir.Schedule, main, name: str) -> str:
    """The buffer ``main`` reads for operand ``name``: its zero-padded copy once ``pad_einsum``
    padded a reduction axis (``<name>_pad``)."""
    reads = [str(r.source.name) for r in sch.get(main).reads]
    return name if name in reads or f"{name}_pad" not in reads else f"{name}_pad"


def _pack_operand(sch: s_tir.Schedule, main, name: str, at_loop, panel: int, lanes: int) -> None:
    """Copy a task's slice of a reused operand into a contiguous panel layout:
    (last // panel, other dims..., last % panel), so the micro-kernel streams it linearly."""
    reads = [r.source.name for r in sch.get(main).reads]
    cb = sch.cache_read(main, reads.index(name), "global")
    sch.compute_at(cb, at_loop, preserve_unit_loops=True)
    sch.transform_layout(cb, ("write", 0),
                         lambda *idx: (idx[-1] // panel, *idx[:-1], idx[-1] % panel))
    vectorize_inner(sch, sch.get_loops(cb)[-1], lanes)


# -- memory-bound kinds ----------------------------------------------------------------------------


