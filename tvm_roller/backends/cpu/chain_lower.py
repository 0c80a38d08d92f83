"""GEMM chains on the CPU: one fused kernel, or the operators one after another.

Fused (Chimera's row-block order ``m · (l · k) · (n · l)``): the second operator's rows are split
into blocks of ``rows`` (parallel tasks over batch x row blocks); inside a task the first operator
computes its ``rows x l`` slice of the intermediate, the stages in between transform that slice,
and the second operator consumes it, so the intermediate never leaves the core's cache (TVM
allocates it per task, ``rows x l``). Unfused: each operator and stage in turn over all rows, the
intermediate written to memory and read back.

Both use the same register-tiled micro-kernel for the two matmuls (a few rows x two vectors of
the output columns, the reduction outside the tile, unrolled and vectorized), so the comparison
between them is about data movement only.
"""
from __future__ import annotations

from tvm import s_tir

from tvm_roller.analysis.schedule import block_names, extent, is_reduction
from tvm_roller.fusion.chain import GemmChain

_ROW_TILES = (6, 4, 3, 2, 1)


def _largest_divisor(n: int, options) -> int:
    return next((o for o in options if o <= n and n % o == 0), 1)


def degenerate_tiles(chain: GemmChain, rows: int, lanes: int) -> str:
    """Why the fused kernel's register tiles or stage vectors would be degenerate for this
    chain (an irregular extent: a prime number of rows, a row length no multiple of a few
    lanes), or "" when they are not. Such a chain runs faster as its operators, which roller
    pads one by one."""
    rm = _largest_divisor(rows, _ROW_TILES)
    vec = _largest_divisor(chain.l, (lanes, 8, 4, 2))
    why = []
    if rows > 1 and rm < 2:
        why.append(f"{rows} rows per task give one-row register tiles")
    if chain.l >= lanes and vec < 4:
        why.append(f"rows of {chain.l} give {vec}-wide vectors in the stages between")
    return "; ".join(why)


def _micro_kernel(sch: s_tir.Schedule, name: str, lanes: int) -> None:
    """Below the task loop the block has its spatial loops, rows i and output columns j last,
    then its reduction loops: a register tile of rm rows x rj columns accumulates over them."""
    blk = sch.get_sblock(name)
    n_red = sum(int(iv.iter_type) == 2 for iv in sch.get(blk).iter_vars)
    loops = sch.get_loops(blk)
    red = loops[len(loops) - n_red:]
    i, j = loops[len(loops) - n_red - 2:len(loops) - n_red]
    ei, ej = extent(sch, i) or 1, extent(sch, j) or 1
    rm = _largest_divisor(ei, _ROW_TILES)
    rj = _largest_divisor(ej, (2 * lanes, lanes, 8, 4, 2, 1))
    vec = min(rj, lanes)
    io, ii = sch.split(i, [None, rm])
    jo, jv, ji = sch.split(j, [None, rj // vec, vec])
    sch.reorder(io, jo, *red, ii, jv, ji)
    sch.unroll(ii)
    sch.unroll(jv)
    if vec > 1:
        sch.vectorize(ji)
    sch.decompose_reduction(blk, red[0])


def _stage(sch: s_tir.Schedule, name: str, lanes: int) -> None:
    """A stage between the matmuls, inside a row block: elementwise ones vectorized along the
    row; a row reduction (softmax's max and sum) reduces all the block's rows at once, the
    reduction outside and the rows as the vector (a serial chain per row would cost as much as
    the matmuls)."""
    blk = sch.get_sblock(name)
    if is_reduction(sch, blk):
        loops = sch.get_loops(blk)
        kinds = [int(iv.iter_type) for iv in sch.get(blk).iter_vars]
        n_red = sum(k == 2 for k in kinds)
        if n_red == 1 and len(loops) >= 2 and kinds[-1] == 2:
            row, red = loops[-2], loops[-1]
            e = extent(sch, row) or 1
            vec = _largest_divisor(e, (lanes, 8, 4, 2))
            if vec > 1:  # vectorize first: TVM checks it on the block with its init
                ro, ri = sch.split(row, [None, vec])
                sch.reorder(ro, red, ri)
                sch.vectorize(ri)
                sch.decompose_reduction(blk, red)
        return
    inner = sch.get_loops(blk)[-1]
    e = extent(sch, inner) or 1
    vec = _largest_divisor(e, (lanes, 8, 4, 2))
    if vec > 1:
        _, v = sch.split(inner, [None, vec])
        sch.vectorize(v)


def _pad_intermediate_columns(sch: s_tir.Schedule, chain: GemmChain, lanes: int) -> None:
    """An intermediate whose row length l is no multiple of the micro-kernel's two vectors
    (197 tokens, 1500 frames) would get a one-column register tile: the first matmul computes
    a zero-padded ``rows x l_pad`` slice instead (its right operand padded once, outside the
    tasks), and the stages after it read the first l columns of it."""
    unit = 2 * lanes
    if chain.l % unit == 0 or chain.l < unit:
        return
    first = sch.get_sblock(chain.first)
    before = set(block_names(sch))
    sch.pad_einsum(first, [1] * (len(chain.batch) + 1) + [unit, 1])
    for name in block_names(sch):
        if name in before:
            continue
        blk = sch.get_sblock(name)
        if sch.get_producers(blk) and any(sch.get(p).name_hint == chain.first
                                          for p in sch.get_producers(blk)):
            sch.compute_inline(blk)  # the copy back: its readers take the padded slice
        else:  # the padded operand: once, in parallel over its rows
            loops = sch.get_loops(blk)
            sch.parallel(sch.fuse(*loops[:-1]))
            _, v = sch.split(loops[-1], [None, lanes])
            sch.vectorize(v)


def apply_fused(func, chain: GemmChain, rows: int, lanes: int) -> s_tir.Schedule:
    sch = s_tir.Schedule(func)
    _pad_intermediate_columns(sch, chain, lanes)
    second = sch.get_sblock(chain.second)
    loops = sch.get_loops(second)
    nb = len(chain.batch)
    mo, _ = sch.split(loops[nb], [None, rows])
    task = sch.fuse(*loops[:nb], mo) if nb else mo
    sch.parallel(task)
    for name in reversed(chain.producers + [chain.first] + chain.between):
        sch.compute_at(sch.get_sblock(name), task, preserve_unit_loops=True)
    _micro_kernel(sch, chain.first, lanes)
    _micro_kernel(sch, chain.second, lanes)
    for name in chain.producers + chain.between:
        _stage(sch, name, lanes)
    return sch


def apply_unfused(func, chain: GemmChain, rows: int, lanes: int) -> s_tir.Schedule:
    sch = s_tir.Schedule(func)
    nb = len(chain.batch)
    for name in [chain.first, chain.second]:
        loops = sch.get_loops(sch.get_sblock(name))
        mo, _ = sch.split(loops[nb], [None, rows])
        sch.parallel(sch.fuse(*loops[:nb], mo) if nb else mo)
        _micro_kernel(sch, name, lanes)
    for name in chain.producers + chain.between:
        loops = sch.get_loops(sch.get_sblock(name))
        sch.parallel(sch.fuse(*loops[:nb + 1]))
        _stage(sch, name, lanes)
    return sch

