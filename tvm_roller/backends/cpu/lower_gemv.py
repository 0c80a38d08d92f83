"""Rows of dot products on the CPU: ``y[r] = sum_k f(x[k], w[r, k])`` over a row-major ``w``
(a GEMV over a weight as torch holds it, a decode step's every projection), alone or under an
elementwise epilogue.

Each task takes ``ROWS`` consecutive rows: their partial sums are ``ROWS x lanes`` registers
(an rfactor over a lane split of ``k``, placed under the task so its buffer is a small stack
array LLVM keeps in registers), updated row by row within each step along ``k``: several
independent multiply-add chains and several streams of ``w`` in flight, which a single row's
dependent chain does not give (measured here: one row 19.4 GB/s, four 22.7 GB/s on a GEMV
cycling through 418 MB of weights, against the calibrated 21.9)."""
from __future__ import annotations

from tvm import s_tir

from tvm_roller.analysis.schedule import add_unit_loops, attempt, extent

ROWS = 4  # rows per task (measured above: 4 beats 1, 2 and 8)


def _rows_per_task(rows: int, innermost: int, cores: int) -> int:
    """Rows a task takes: they must divide the innermost output axis, so a task's rows are one
    box of the output (consecutive rows across an outer axis are not: the lane sums placed
    after them would cover the whole box, other tasks' rows included)."""
    for r in (ROWS, 2, 1):
        if innermost % r == 0 and rows // r >= 2 * cores:
            return r
    return 1


def dot_product_rows(sch: s_tir.Schedule, red, out, row_count: int, lanes: int,
                     cores: int) -> bool:
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
    add_unit_loops(sch)
    loops = sch.get_loops(red)
    spatial = len(loops) - red_count
    reduce = loops[spatial:]
    if red_count > 1 and (extent(sch, reduce[-1]) or 0) % lanes == 0:
        # the innermost reduction loop alone is split: an index over the outer ones (a group's
        # scale, a packed weight's half) stays one value per vector, where over a fused loop
        # it would be (o * lanes + l) // g, which vectorizes as a gather
        _, ki = sch.split(reduce[-1], [None, lanes])
    else:
        k = sch.fuse(*reduce) if red_count > 1 else reduce[-1]
        _, ki = sch.split(k, [None, lanes])
    red_name, out_name = sch.get(red).name_hint, sch.get(out).name_hint
    rf = sch.rfactor(ki, len(sch.get(red).writes[0].source.shape))
    # the partial sums' loops: (rows..., k steps..., lanes) -> (task, k steps..., rows, lanes)
    rloops = sch.get_loops(rf)
    row = sch.fuse(*rloops[:spatial]) if spatial > 1 else rloops[0]
    task, within = sch.split(row, [None, rows])
    rloops = sch.get_loops(rf)
    steps, lane = rloops[2:-1], rloops[-1]
    sch.reorder(task, *steps, within, lane)
    sch.parallel(task)
    # the lanes' sum and the epilogue per task, after its partial sums (first: TVM vectorizes
    # a loop only once its block's consumers sit in the same task; and before the zeroing is
    # split off, while the block is still a whole reduction)
    sch.reverse_compute_at(sch.get_sblock(red_name), task, preserve_unit_loops=True)
    if out_name != red_name:
        sch.reverse_compute_at(sch.get_sblock(out_name), task, preserve_unit_loops=True)
    sch.unroll(within)
    sch.vectorize(lane)
    init = sch.decompose_reduction(rf, steps[0])
    attempt(sch.vectorize, sch.get_loops(init)[-1])
    return True
