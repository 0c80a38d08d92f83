"""Memory-bound functions on the CPU (row reductions, softmax, norms, elementwise and copies):
parallel over rows and vectorized, reductions through ``rfactor``."""
from __future__ import annotations

from typing import List, Optional

import tvm
from tvm import s_tir, tirx

from tvm_roller.analysis import FuncAnalysis
from tvm_roller.analysis.schedule import (add_unit_loops, attempt, block_names, extent,
                                          inline_within, is_reduction, realize_of)
from tvm_roller.backends.buffer_names import unique_buffer_names
from tvm_roller.backends.cpu.loops import (block_2d, element_steps, is_copy, is_vectorized,
                                           parallel_vectorize_block, transposed_pair,
                                           vectorize_inner)
from tvm_roller.backends.cpu.lower_gemv import dot_product_rows
from tvm_roller.backends.cpu.reduction_split import split_unaligned_reductions
from tvm_roller.core.rtile import RTile
from tvm_roller.hardware.model import CpuTraits, DeviceModel


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
    # (loops after the lane one that are no chain, an init beside an update under them; or a
    # binding TVM's vectorize does not take as affine, as a task loop fused from two batch
    # axes gives: the lanes stay unvectorized, the kernel correct)
    if not after or attempt(sch.reorder, *after, lane[0]):
        attempt(sch.vectorize, lane[0])


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
            inline_within(sch, sch.get_sblock(name))
    for name in block_names(sch):
        parallel_vectorize_block(sch, sch.get_sblock(name), lanes, cores, partition=True)
    return sch


def apply_streaming(func: tirx.PrimFunc, fa: FuncAnalysis, t: RTile, dev: DeviceModel,
                    traceable: bool = False) -> s_tir.Schedule:
    """``traceable``: no rewrite of ``func`` first (the trace must replay on it), so a
    reduction over an unaligned row stays scalar there, and a row over buffers that share a
    name is split rather than partitioned (``loops.partition_hazard``)."""
    lanes, cores = t.vector_lanes, dev.num_units
    sch = s_tir.Schedule(func if traceable else
                         unique_buffer_names(split_unaligned_reductions(func, lanes)))
    if len(_output_blocks(sch)) > 1 and not any(is_reduction(sch, sch.get_sblock(n))
                                                for n in block_names(sch)):
        return _each_output_alone(sch, lanes, cores)
    names = block_names(sch)
    out_name = names[-1]
    # inline injective stages that feed a single consumer, and copies (reshapes, transposes,
    # broadcasts) into every consumer: they are recomputed at no extra cost
    for name in names[:-1]:
        blk = sch.get_sblock(name)
        if is_reduction(sch, blk):
            continue
        if len(sch.get_consumers(blk)) == 1 or is_copy(sch.get(blk)):
            inline_within(sch, blk)
    names = block_names(sch)
    out = sch.get_sblock(out_name)
    if _dot_products(sch, names, lanes, cores, (dev.cpu or CpuTraits()).page_bytes):
        return sch
    out_loops = sch.get_loops(out)
    out_red = is_reduction(sch, out)
    row_loops = out_loops[:-1] if not out_red else out_loops[:len(out_loops) - sum(
        1 for iv in sch.get(out).iter_vars if iv.iter_type == 2)]
    rows = 1
    for l in row_loops:
        rows *= extent(sch, l) or 1
    if rows < 2 * cores and not out_red and out_loops and \
            _reduces_per_element(sch, names[:-1], out_loops):
        # a GEMV with its epilogue (bias, activation): each output element is a row (a dot
        # product), not the output's last axis a vectorized column
        row_loops, rows = out_loops, rows * (extent(sch, out_loops[-1]) or 1)

    if rows >= 2 * cores:
        if not out_red and len(block_names(sch)) == 1:
            pair = transposed_pair(sch, out, lanes)
            if pair is not None:  # a transposing copy: 2-D blocks instead of rows
                block_2d(sch, out, pair, lanes, cores)
                return sch
        # stages whose share of a row is the whole stage (a norm's statistics over the rows
        # themselves) stay at the root: under the row loop they would be recomputed per row
        at_root = _stages_at_root(sch, names[:-1], out_name, len(row_loops))
        # vectorize reductions first (rfactor wants them at the root), then nest every other
        # stage under the output's parallel row loop so a row stays in cache between stages
        for name in names[:-1]:
            blk = sch.get_sblock(name)
            if name not in at_root and is_reduction(sch, blk):
                rfactor_vectorize_reduction(sch, blk, lanes, lanes_last=True)
        if out_red:  # rows of dot products (a GEMV over a row-major matrix): lanes too
            rfactor_vectorize_reduction(sch, out, lanes, lanes_last=True)
        out_loops = sch.get_loops(out)
        row_loops = out_loops[:len(row_loops)]
        row = sch.fuse(*row_loops) if len(row_loops) > 1 else row_loops[0]
        sch.parallel(row)
        for name in reversed(block_names(sch)[:-1]):
            if name not in at_root:
                sch.compute_at(sch.get_sblock(name), row, preserve_unit_loops=True)
        for name in block_names(sch):
            blk = sch.get_sblock(name)
            if name in at_root:
                _schedule_at_root(sch, blk, lanes, cores)
            elif is_reduction(sch, blk):
                vectorize_lanes_under_row(sch, blk, row, lanes)
            else:
                # (loop handles from get_loops are new objects: compare the loops)
                ls = [l for l in sch.get_loops(blk) if not sch.get(l).same_as(sch.get(row))]
                if ls and not is_vectorized(sch, ls[-1]):
                    vectorize_inner(sch, ls[-1], lanes, partition=True)
        return sch

    # few rows: parallelize inside the heavy reduction, the rest is tiny
    for name in names:
        blk = sch.get_sblock(name)
        if is_reduction(sch, blk):
            rfactor_vectorize_reduction(sch, blk, lanes, split_cores=cores)
        else:
            parallel_vectorize_block(sch, blk, lanes, cores, partition=True)
    return sch


def _dot_products(sch: s_tir.Schedule, names: List[str], lanes: int, cores: int,
                  page_bytes: int) -> bool:
    """A reduction alone, or under one elementwise epilogue over the same elements, with many
    output elements: rows of dot products (``lower_gemv``); whether it was scheduled so."""
    if not 1 <= len(names) <= 2 or not is_reduction(sch, sch.get_sblock(names[0])):
        return False
    out = sch.get_sblock(names[-1])
    if len(names) == 2 and (is_reduction(sch, out)
                            or not _reduces_per_element(sch, names[:1], sch.get_loops(out))):
        return False
    elements = 1
    for iv in sch.get(out).iter_vars:
        if iv.iter_type == 0:
            elements *= _iv_extent(iv) or 0
    trial = sch.copy()
    if not dot_product_rows(trial, trial.get_sblock(names[0]), trial.get_sblock(names[-1]),
                            elements, lanes, cores, page_bytes):
        return False
    return dot_product_rows(sch, sch.get_sblock(names[0]), out, elements, lanes, cores,
                            page_bytes)


def _reduces_per_element(sch: s_tir.Schedule, stages: List[str], out_loops) -> bool:
    """A reduction among ``stages`` whose spatial extent is the output's element count: one
    reduction per output element (a matrix-vector product under an elementwise epilogue)."""
    elements = 1
    for l in out_loops:
        elements *= extent(sch, l) or 1
    for name in stages:
        blk = sch.get_sblock(name)
        if is_reduction(sch, blk):
            spatial = 1
            for iv in sch.get(blk).iter_vars:
                if iv.iter_type == 0:
                    spatial *= _iv_extent(iv) or 0
            if spatial == elements:
                return True
    return False


#: a stage whose iterations grow by more than this under the row loop is recomputed per row
_REDUNDANT = 1.5


def _iterations(sch: s_tir.Schedule, block) -> int:
    """How often a block's body runs where it stands: the product of its loops' extents."""
    n = 1
    for loop in sch.get_loops(block):
        n *= extent(sch, loop) or 1
    return n


def _stages_at_root(sch: s_tir.Schedule, stages: List[str], out_name: str,
                    n_row_loops: int) -> set:
    """The stages that cannot go under the output's row loop without being recomputed per row
    (their region for one row is (nearly) the whole stage: statistics over the rows), or
    cannot go there at all: tried on copies of the schedule, consumers first as the lowering
    nests them."""
    trial = sch.copy()
    loops = trial.get_loops(trial.get_sblock(out_name))[:n_row_loops]
    row = trial.fuse(*loops) if len(loops) > 1 else loops[0]
    at_root = set()
    for name in reversed(stages):
        before = _iterations(trial, trial.get_sblock(name))
        attempt_sch = trial.copy()
        try:
            attempt_sch.compute_at(attempt_sch.get_sblock(name), row, preserve_unit_loops=True)
        except (RuntimeError, ValueError):  # tvm ScheduleError: no place under the row
            at_root.add(name)
            continue
        if _iterations(attempt_sch, attempt_sch.get_sblock(name)) > _REDUNDANT * before:
            at_root.add(name)
        else:
            trial = attempt_sch
    return at_root


def _schedule_at_root(sch: s_tir.Schedule, block, lanes: int, cores: int) -> None:
    """A stage left at the root: a reduction over rows reads its spatial axis contiguously
    (vectorized, the reduction loop outside it, parallel over spatial chunks), else its rows
    are reduced in whole vectors (``_reduce_rows``); anything else is parallelized and
    vectorized on its own."""
    if is_reduction(sch, block) and (_reduce_columns(sch, block, lanes, cores)
                                     or _reduce_rows(sch, block, lanes, cores)):
        return
    parallel_vectorize_block(sch, block, lanes, cores, partition=True)


def _reduce_rows(sch: s_tir.Schedule, block, lanes: int, cores: int) -> bool:
    """A reduction's rows in whole vectors (a group norm's statistics): fewer rows than cores
    (one group) each split over the cores, else the rows over the cores (a batch of 8), each
    through ``lanes``-wide partial sums. Tried on a copy first: False, the schedule untouched,
    when the rows are not whole vectors."""
    rows = 1
    for iv in sch.get(block).iter_vars:
        if iv.iter_type == 0:
            rows *= _iv_extent(iv) or cores
    trial = sch.copy()
    name = sch.get(block).name_hint
    if rows < cores:
        apply, kwargs = rfactor_vectorize_reduction, {"split_cores": cores}
    else:
        apply, kwargs = _parallel_vector_rows, {"cores": cores}
    if not attempt(apply, trial, trial.get_sblock(name), lanes, **kwargs):
        return False
    apply(sch, block, lanes, **kwargs)
    return True


def _parallel_vector_rows(sch: s_tir.Schedule, block, lanes: int, cores: int) -> None:
    name = sch.get(block).name_hint
    spatial = sum(1 for iv in sch.get(block).iter_vars if iv.iter_type == 0)
    rfactor_vectorize_reduction(sch, block, lanes, lanes_last=True)
    rf = sch.get_sblock(f"{name}_rf")  # (raises when the rows were not whole vectors)
    rows = sch.get_loops(rf)[:spatial]
    row = sch.fuse(*rows) if len(rows) > 1 else rows[0]
    if (extent(sch, row) or 0) < cores:
        raise ValueError("fewer rows than cores")
    sch.parallel(row)


def _reduce_columns(sch: s_tir.Schedule, block, lanes: int, cores: int) -> bool:
    """Loops ``spatial chunks (parallel) . reduction . lanes (vectorized)`` for a reduction
    whose inputs are contiguous along a spatial axis (not along the reduction): each step adds
    whole vectors of consecutive columns. False when no spatial axis of at least ``lanes``
    columns reads contiguously."""
    b = sch.get(block)
    steps = element_steps(b)
    loops = sch.get_loops(block)
    if steps is None or len(loops) != len(b.iter_vars):
        return False
    spatial = [i for i, iv in enumerate(b.iter_vars) if iv.iter_type == 0]
    red = [i for i, iv in enumerate(b.iter_vars) if iv.iter_type == 2]
    lane = next((i for i in reversed(spatial) if (extent(sch, loops[i]) or 0) >= lanes
                 and all(row[i] in (0, 1) for row in steps) and any(row[i] for row in steps)),
                None)
    if lane is None or not red or (extent(sch, loops[lane]) or 0) % lanes:
        return False
    lo, li = sch.split(loops[lane], [None, lanes])
    outer = [loops[i] for i in spatial if i != lane] + [lo]
    sch.reorder(*outer, *[loops[i] for i in red], li)
    task = sch.fuse(*outer) if len(outer) > 1 else outer[0]
    if (extent(sch, task) or 1) >= cores > 1:
        sch.parallel(task)
    sch.vectorize(li)
    sch.decompose_reduction(block, loops[red[0]])
    return True
