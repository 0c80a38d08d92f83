"""GEMM chains on the CPU: one fused kernel, or the operators one after another.

Fused (Chimera's row-block order ``m · (l · k) · (n · l)``): the second operator's rows are split
into blocks of ``rows`` (parallel tasks over batch x row blocks); inside a task the first operator
computes its ``rows x l`` slice of the intermediate, the stages in between transform that slice,
and the second operator consumes it, so the intermediate never leaves the core's cache (TVM
allocates it per task, ``rows x l``). Unfused: each operator and stage in turn over all rows, the
intermediate written to memory and read back.

Inside a fused task each matmul is tiled as roller tiles a single operator (``OpTiles``: the
tiles the CPU policy chooses for the task's share of that matmul, ``chain_plan``): L1 tiles of
rows x columns, register tiles in them, the reduction in L1 chunks; so the fused kernel runs at
the operators' own rate per FLOP. The unfused schedule here (one traceable schedule of the whole
function, for MetaSchedule records) and a fused kernel given no tiles take ``default_tiles``: a
few rows x two vectors, the reduction whole. The row reductions between the matmuls (softmax)
are vectorized along the row through ``rfactor``.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple

from tvm import s_tir

from tvm_roller.analysis.schedule import block_names, extent, is_reduction
from tvm_roller.backends.cpu.lower_streaming import (rfactor_vectorize_reduction,
                                                     vectorize_lanes_under_row)
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
    # the stages between run at the row's vector width, the operators alone at full vectors
    # (a row split into whole vectors and a short rest): Whisper's 6x1500 attention, 4-wide,
    # measured 0.82x its operators; 12x1214, 2-wide, 0.34x
    if chain.l >= lanes and vec < lanes:
        why.append(f"rows of {chain.l} give {vec}-wide vectors in the stages between")
    return "; ".join(why)


@dataclass(frozen=True)
class OpTiles:
    """One matmul's tiles inside a fused task (plain data), as roller's single-operator policy
    chooses them for the task's share of that matmul: a register tile of ``reg_rows`` rows x
    ``reg_cols`` columns, an L1 tile of ``l1_rows`` x ``l1_cols`` with a chunk of each
    reduction loop (``chunks``, in the block's order), and whether the register tile
    accumulates over the whole reduction (``in_registers``) or the task's slice accumulates in
    cache, one reduction chunk after another (BLIS order)."""

    reg_rows: int
    reg_cols: int
    l1_rows: int
    l1_cols: int
    chunks: Tuple[int, ...]
    in_registers: bool = True

    def fits(self, rows: int, cols: int, reductions: Sequence[int], lanes: int) -> bool:
        """Every split divides what it splits: no predicate in the micro-kernel."""
        return (len(self.chunks) == len(reductions) and rows % self.l1_rows == 0 and
                self.l1_rows % self.reg_rows == 0 and cols % self.l1_cols == 0 and
                self.l1_cols % self.reg_cols == 0 and
                (self.reg_cols % lanes == 0 or self.reg_cols < lanes) and
                all(e % c == 0 for e, c in zip(reductions, self.chunks)))


def default_tiles(rows: int, cols: int, reductions: Sequence[int], lanes: int) -> OpTiles:
    """A few rows x two vectors, the whole task's slice as the L1 tile, the reduction whole:
    the tile when no policy tile fits the task."""
    rm = _largest_divisor(rows, _ROW_TILES)
    rj = _largest_divisor(cols, (2 * lanes, lanes, 8, 4, 2, 1))
    return OpTiles(rm, rj, rows, cols, tuple(reductions), True)


def padded_columns(cols: int, lanes: int) -> int:
    """The intermediate's row length as the fused kernel computes it: a multiple of the
    micro-kernel's two vectors (``_pad_intermediate_columns``), unless shorter than them."""
    unit = 2 * lanes
    return cols if cols % unit == 0 or cols < unit else -(-cols // unit) * unit


def _micro_kernel(sch: s_tir.Schedule, name: str, lanes: int,
                  tiles: Optional[OpTiles] = None) -> None:
    """Below the task loop the block has its spatial loops, rows i and output columns j last,
    then its reduction loops. The loops are tiled as ``apply_tiled`` tiles a single operator:
    L1 tiles of rows x columns, register tiles inside them (unrolled, the columns vectorized),
    each reduction loop split in its L1 chunk; the chunks outside the L1 tiles when the slice
    accumulates in cache, inside the register tile's loops when it accumulates in registers."""
    blk = sch.get_sblock(name)
    n_red = sum(int(iv.iter_type) == 2 for iv in sch.get(blk).iter_vars)
    loops = sch.get_loops(blk)
    red = loops[len(loops) - n_red:]
    i, j = loops[len(loops) - n_red - 2:len(loops) - n_red]
    ei, ej = extent(sch, i) or 1, extent(sch, j) or 1
    red_ext = [extent(sch, r) or 1 for r in red]
    if tiles is None or not tiles.fits(ei, ej, red_ext, lanes):
        tiles = default_tiles(ei, ej, red_ext, lanes)
    rm, rj = tiles.reg_rows, tiles.reg_cols
    vec = min(rj, lanes)
    i1, i2, ii = sch.split(i, [None, tiles.l1_rows // rm, rm])
    j1, j2, jv, ji = sch.split(j, [None, tiles.l1_cols // rj, rj // vec, vec])
    r0, r1 = [], []
    for r, c in zip(red, tiles.chunks):
        a, b = sch.split(r, [None, c])
        r0.append(a)
        r1.append(b)
    if tiles.in_registers:
        sch.reorder(i1, j1, i2, j2, *r0, *r1, ii, jv, ji)
    else:
        sch.reorder(*r0, i1, j1, i2, j2, *r1, ii, jv, ji)
    sch.unroll(ii)
    sch.unroll(jv)
    if vec > 1:
        sch.vectorize(ji)
    sch.decompose_reduction(blk, r0[0])


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
    if padded_columns(chain.l, lanes) == chain.l:
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


def _rfactor_row_reductions(sch: s_tir.Schedule, chain: GemmChain, lanes: int) -> List[str]:
    """The row reductions between the matmuls (softmax's max and sum) vectorized along the
    row: each row's partial results per vector lane first (``rfactor``, at the root, before
    the stages move into the task), then the lanes reduced. Returns the stages between the
    matmuls with the partial-result blocks, in order."""
    between: List[str] = []
    for name in chain.between:
        blk = sch.get_sblock(name)
        consumers = [sch.get(c).name_hint for c in sch.get_consumers(blk)]
        if not is_reduction(sch, blk) and len(consumers) == 1 and consumers[0] in chain.between:
            # an elementwise stage feeding only another stage (softmax's shift into its exp):
            # recomputed there, so the task keeps one slice-sized buffer less in its cache
            sch.compute_inline(blk)
            continue
        n_red = sum(int(iv.iter_type) == 2 for iv in sch.get(blk).iter_vars)
        if is_reduction(sch, blk) and n_red == 1 and \
                (extent(sch, sch.get_loops(blk)[-1]) or 1) % lanes == 0:
            before = set(block_names(sch))
            rfactor_vectorize_reduction(sch, blk, lanes, lanes_last=True)
            between += [n for n in block_names(sch) if n not in before]
        between.append(name)
    return between


def apply_fused(func, chain: GemmChain, rows: int, lanes: int,
                tiles: Tuple[Optional[OpTiles], Optional[OpTiles]] = (None, None)
                ) -> s_tir.Schedule:
    """The fused kernel: tasks of ``rows`` rows; ``tiles``: the first and second matmul's
    tiles inside a task (None: ``default_tiles``)."""
    sch = s_tir.Schedule(func)
    _pad_intermediate_columns(sch, chain, lanes)
    between = _rfactor_row_reductions(sch, chain, lanes)
    second = sch.get_sblock(chain.second)
    loops = sch.get_loops(second)
    nb = len(chain.batch)
    mo, _ = sch.split(loops[nb], [None, rows])
    task = sch.fuse(*loops[:nb], mo) if nb else mo
    sch.parallel(task)
    for name in reversed(chain.producers + [chain.first] + between):
        sch.compute_at(sch.get_sblock(name), task, preserve_unit_loops=True)
    _micro_kernel(sch, chain.first, lanes, tiles[0])
    _micro_kernel(sch, chain.second, lanes, tiles[1])
    for name in chain.producers + between:
        if name in chain.producers or name in chain.between:
            _stage(sch, name, lanes)
        else:  # a row's partial results per lane: the lanes as the vector
            vectorize_lanes_under_row(sch, sch.get_sblock(name), task, lanes)
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

