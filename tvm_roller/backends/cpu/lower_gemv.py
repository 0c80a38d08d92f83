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

from tvm_roller.analysis.schedule import add_unit_loops, attempt, extent, realize_of

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
    if red_count == 0 or k_len % lanes or k_len < 2 * lanes or row_count < 2 * cores:
        return False
    interleave = k_len * _streamed_bytes(sch, red) >= INTERLEAVE_PAGES * page_bytes
    add_unit_loops(sch)
    loops = sch.get_loops(red)
    spatial = len(loops) - red_count
    batch = _batch_innermost(sch, red, loops[:spatial])
    if not interleave:
        # short rows: the batch's rows join the weight's in the tasks (one row a task when the
        # batch is symbolic: measured on a Zen 4, a decode step of 8 sequences, Qwen2-0.5B's
        # 4864 x 896 GEMMs 1.44 ms a call this way, 1.88 ms with the batch under a task's rows)
        batch = 0
    loops = sch.get_loops(red)
    weight_rows = spatial - batch  # the loops over the weight's rows, then the batch's
    per_row = 1
    for l in loops[weight_rows:spatial]:
        per_row *= extent(sch, l) or 1
    rows = _rows_per_task(row_count // per_row, extent(sch, loops[weight_rows - 1]) or 1,
                          cores)
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
    # the partial sums' loops: (rows..., batch..., k steps..., chains * lanes) -> (task,
    # batch..., k steps..., rows, chains, lanes) read together (long rows: a task's weight
    # rows come from memory for the batch's first row and from cache for the others; measured
    # as above, the 896 x 4864 GEMM 1.57 -> 1.15 ms a call), (task, rows, k steps..., chains,
    # lanes) one by one
    rloops = sch.get_loops(rf)
    row = sch.fuse(*rloops[:weight_rows]) if weight_rows > 1 else rloops[0]
    task, within = sch.split(row, [None, rows])
    rloops = sch.get_loops(rf)
    seqs, steps = rloops[2:2 + batch], rloops[2 + batch:-1]
    chain, lane = sch.split(rloops[-1], [chains, lanes])
    if interleave:
        sch.reorder(task, *seqs, *steps, within, chain, lane)
    else:
        sch.reorder(task, *seqs, within, *steps, chain, lane)
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


def _batch_innermost(sch: s_tir.Schedule, red, spatial_loops: list) -> int:
    """The spatial loops the streamed weight does not depend on (a batch of rows: a decode
    step's sequences) moved inside the ones it does; how many (0 when either kind is
    missing). A loop bound to anything but one iterator counts as the weight's."""
    blk = sch.get(red)
    used = [v for r in _streamed_read(sch, red).region
            for v in tirx.analysis.undefined_vars(r.min, [])]
    binding = realize_of(sch, red).iter_values
    free, bound = [], []
    for loop in spatial_loops:
        var = sch.get(loop).loop_var
        ivs = [iv for iv, val in zip(blk.iter_vars, binding) if val.same_as(var)]
        if len(ivs) == 1 and not any(ivs[0].var.same_as(u) for u in used):
            free.append(loop)
        else:
            bound.append(loop)
    if not (free and bound):
        return 0
    if spatial_loops != bound + free:
        sch.reorder(*bound, *free)
    return len(free)


def _streamed_read(sch: s_tir.Schedule, red):
    """The region of the largest buffer ``red`` reads (the streamed weight)."""
    def elements(region) -> int:
        n = 1
        for d in region.source.shape:  # (a symbolic extent counts as large)
            n *= int(d) if isinstance(d, tirx.IntImm) else 1 << 30
        return n

    return max(sch.get(red).reads, key=elements)


def _streamed_bytes(sch: s_tir.Schedule, red) -> int:
    """Bytes per element of the largest buffer ``red`` reads (the streamed weight)."""
    return max(1, tvm.DataType(str(_streamed_read(sch, red).source.dtype)).bits // 8)
