"""Rows of dot products on the CPU: ``y[r] = sum_k f(x[k], w[r, k])`` over a row-major ``w``
(a GEMV over a weight as torch holds it, a decode step's every projection), alone or under an
elementwise epilogue.

Each task takes a few consecutive rows; their partial sums are ``lanes``-wide registers (an
rfactor over a lane split of ``k``, placed under the task so its buffer is a small stack array
LLVM keeps in registers). Two orders, by the length of a row against the page the hardware
prefetchers follow a stream within (``CpuTraits.page_bytes``):

* long rows (at least ``INTERLEAVE_PAGES`` pages): the task's ``ROWS`` rows are read together,
  row by row within each step along ``k``: one load of ``x`` serves every row, and several
  streams of ``w`` are in flight (measured here: one row 19.4 GB/s, four 22.7 GB/s on a GEMV
  cycling through 418 MB of weights, against the calibrated 21.9);
* short rows: the task's rows one after the other, each through ``CHAINS`` independent
  partial sums: the weight is one sequential stream. Several rows read together restart the
  prefetchers at every task's rows, each a few pages on (measured on a Zen 4, 2 cores, GEMVs
  of 18 MB cycled through 420 MB: rows of 3.5 KiB 26-27 -> 32-34 GB/s, 6 KiB 27 -> 31, 8 KiB
  30 -> 34, 12 KiB level; at 19 KiB reading four together is ahead, 35 vs 32).
"""
from __future__ import annotations

import tvm
from tvm import s_tir, tirx

from tvm_roller.analysis.schedule import add_unit_loops, attempt, extent

ROWS = 4  # rows per task (measured above: 4 beats 1, 2 and 8)
INTERLEAVE_PAGES = 4  # rows this many pages long are read together (measured above)
CHAINS = 2  # independent partial sums of a row read alone (1 and 2 level from DRAM, 4 behind)


def _rows_per_task(rows: int, innermost: int, cores: int) -> int:
    """Rows a task takes: they must divide the innermost output axis, so a task's rows are one
    box of the output (consecutive rows across an outer axis are not: the lane sums placed
    after them would cover the whole box, other tasks' rows included)."""
    for r in (ROWS, 2, 1):
        if innermost % r == 0 and rows // r >= 2 * cores:
            return r
    return 1


def dot_product_rows(sch: s_tir.Schedule, red, out, row_count: int, lanes: int, cores: int,
                     page_bytes: int) -> bool:
    """Schedule ``red`` (the reduction, spatial loops first, then its reduction loops) and
    ``out`` (``red`` itself, or the elementwise epilogue over the same elements) as rows of dot
    products; ``row_count`` is the number of output elements. False (the schedule untouched)
    when the reduction is not whole vectors or the rows are too few to share."""
    loops = sch.get_loops(red)
    red_count = sum(1 for iv in sch.get(red).iter_vars if iv.iter_type == 2)
    k_len = 1
    for l in loops[len(loops) - red_count:]:
        k_len *= extent(sch, l) or 0
    spatial_extents = [int(iv.dom.extent) for iv in sch.get(red).iter_vars
                       if iv.iter_type == 0]
    rows = _rows_per_task(row_count, spatial_extents[-1] if spatial_extents else 1, cores)
    if red_count == 0 or k_len % lanes or k_len < 2 * lanes or row_count < 2 * cores:
        return False
    interleave = k_len * _streamed_bytes(sch, red) >= INTERLEAVE_PAGES * page_bytes
    add_unit_loops(sch)
    loops = sch.get_loops(red)
    spatial = len(loops) - red_count
    reduce = loops[spatial:]
    if red_count > 1 and (extent(sch, reduce[-1]) or 0) % lanes == 0:
        # the innermost reduction loop alone is split: an index over the outer ones (a group's
        # scale, a packed weight's half) stays one value per vector, where over a fused loop
        # it would be (o * lanes + l) // g, which vectorizes as a gather
        k = reduce[-1]
    else:
        k = sch.fuse(*reduce) if red_count > 1 else reduce[-1]
    chains = 1 if interleave or (extent(sch, k) or 0) % (CHAINS * lanes) else CHAINS
    _, ki = sch.split(k, [None, chains * lanes])
    red_name, out_name = sch.get(red).name_hint, sch.get(out).name_hint
    rf = sch.rfactor(ki, len(sch.get(red).writes[0].source.shape))
    # the partial sums' loops: (rows..., k steps..., chains * lanes) -> (task, k steps..., rows,
    # chains, lanes) read together, (task, rows, k steps..., chains, lanes) one by one
    rloops = sch.get_loops(rf)
    row = sch.fuse(*rloops[:spatial]) if spatial > 1 else rloops[0]
    task, within = sch.split(row, [None, rows])
    rloops = sch.get_loops(rf)
    steps = rloops[2:-1]
    chain, lane = sch.split(rloops[-1], [chains, lanes])
    if interleave:
        sch.reorder(task, *steps, within, chain, lane)
    else:
        sch.reorder(task, within, *steps, chain, lane)
    sch.parallel(task)
    # the lanes' sum and the epilogue per task, after its partial sums (first: TVM vectorizes
    # a loop only once its block's consumers sit in the same task; and before the zeroing is
    # split off, while the block is still a whole reduction)
    sch.reverse_compute_at(sch.get_sblock(red_name), task, preserve_unit_loops=True)
    if out_name != red_name:
        sch.reverse_compute_at(sch.get_sblock(out_name), task, preserve_unit_loops=True)
    if interleave:
        sch.unroll(within)
    sch.unroll(chain)
    sch.vectorize(lane)
    init = sch.decompose_reduction(rf, steps[0] if interleave else within)
    attempt(sch.vectorize, sch.get_loops(init)[-1])
    return True


def _streamed_bytes(sch: s_tir.Schedule, red) -> int:
    """Bytes per element of the largest buffer ``red`` reads (the streamed weight)."""
    def elements(buf) -> int:
        n = 1
        for d in buf.shape:  # (a symbolic extent counts as large)
            n *= int(d) if isinstance(d, tirx.IntImm) else 1 << 30
        return n

    biggest = max((r.source for r in sch.get(red).reads), key=elements)
    return max(1, tvm.DataType(str(biggest.dtype)).bits // 8)
