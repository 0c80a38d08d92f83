"""GEMM chains on CUDA: one fused kernel per chain (Chimera's row-block order on a GPU).

``E[b.., m, n] = sum_l f(C)[b.., m, l] D[b.., l, n]`` with ``C = A . B``. One thread block per
(batch, block of ``rows`` rows of m); inside it::

    blockIdx.x: batch x m / rows
      for l-pass (serial):                        first matmul: rows x l-chunk of C
        threads (ty, tx): register tile ir x jr
          for k-step: A[rows, k-step], B[k-step, l-chunk] -> shared (all threads, cooperative)
            accumulate ir x jr in registers
          write the tile to the rows x l slice in shared memory, leading elementwise stages
          (relu, gelu) folded into that write
      row reductions over the slice (softmax max and sum): rows over the warps (threadIdx.y),
        l over a warp's lanes (threadIdx.x), which TVM lowers to warp shuffles
      for n-pass (serial):                        second matmul: rows x n-chunk of E
        threads: register tile ir2 x jr2
          for l-step: D[l-step, n-chunk] -> shared; the last stage (softmax's normalised
            exp) computed from the slice for these l-step columns -> shared
            accumulate in registers
          write E (global)

Only one rows x l slice lives in shared memory (C, or f(C) when f is elementwise): a softmax's
output is made per l-step of the second matmul from C and the row statistics, like an operand
tile, so the slice needs no second copy. Fusing is possible while that slice plus the operand
tiles fits the opt-in shared memory per block.

Whether it pays (Chimera): the operators one by one write the intermediate and read it back
(2 x batch x m x l x elem bytes; a row-reduction stage between them, a softmax, is one more pass
over it), while the fused kernel re-reads B and D once per row block. ``movement``'s
data-movement model gives both volumes into shared memory; the row block is the largest that
fits and still gives every SM a thread block.

Every thread-bound loop is split as ``[.., warps, warp_size]`` onto (threadIdx.y, threadIdx.x)
(the device model's ``gpu.warp_size``, 32 on NVIDIA GPUs), so all
stages share one block shape and the row reductions get whole warps along l. Odd and prime
extents leave predicates (``T.where``) rather than padding; reduction steps divide their
reduction (or take all of it).
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import List, Optional, Tuple

from tvm import s_tir

from tvm_roller.analysis import unwrap_func
from tvm_roller.analysis.schedule import attempt, block_names, extent, is_reduction, require
from tvm_roller.backends.cuda.lower import aligned_lanes, vector_lanes
from tvm_roller.core.errors import UnsupportedError
from tvm_roller.fusion import movement
from tvm_roller.fusion.chain import GemmChain
from tvm_roller.fusion.movement import FUSE_THRESHOLD
from tvm_roller.hardware import DeviceModel, gpu

SMEM_SCOPE = "shared.dyn"  # past the 48 KB static limit; TVM raises the kernel's limit at launch
# the row statistics stay in static shared memory: TVM merges every shared.dyn buffer into one
# allocation before lowering cross-thread reductions, which then refuses two results in it
STATS_SCOPE = "shared"
MAX_THREADS = 256
MAX_ROWS = 64  # larger row blocks leave too few thread blocks for any chain worth fusing
REG_TILE = 4  # register tile edge per thread (4 x 4 accumulators in the first matmul)
K_STEP = 16  # reduction step of the first matmul (A and B tiles per step)
L_STEP = 32  # reduction step of the second matmul (D and S tiles per step)
OPERAND_TILE = 4096  # elements of B's or D's tile per step (16 KiB in float32)
MIN_ROUND_TRIP_SHARE = 0.10  # the intermediate's round trip must matter to the unfused traffic
_UNROLL_STEP = 256


@dataclass(frozen=True)
class CudaChainPlan:
    """Plain data: the decision and the fused kernel's layout (memory figures in bytes).

    ``thread_tile``/``thread_tile2``: per-thread register tile (rows, columns) of the first
    (rows x l) and the second (rows x n) matmul; ``l_chunk``/``n_chunk``: the columns a block's
    threads cover in one pass of each; ``k_step``/``l_step``: their reduction steps.
    ``traffic_*``: volume into shared memory (Chimera's data movement): ``traffic_fused`` for
    this kernel, ``traffic_unfused`` for the operators one by one plus the passes of the stages
    between them; ``intermediate_round_trip`` = 2 x batch x m x l x elem."""

    fuse: bool
    fits: bool  # the fused kernel can be built for the device (shared memory, dtype)
    reason: str
    rows: int
    threads: int
    thread_tile: Tuple[int, int]
    thread_tile2: Tuple[int, int]
    k_step: int
    l_chunk: int
    l_step: int
    n_chunk: int
    row_reduction: bool  # a stage reduces rows (softmax): S computed per l-step
    smem_bytes: int
    smem_limit_bytes: int
    blocks: int
    traffic_fused: int
    traffic_unfused: int
    intermediate_round_trip: int

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class _MatmulLayout:
    """One matmul's rows x cols output tile of a thread block over its threads."""

    ir: int  # register rows per thread
    it: int  # thread rows
    jr: int  # register columns per thread
    jt: int  # thread columns
    step: int  # reduction step (its operand tiles in shared memory per step)

    @property
    def cols(self) -> int:  # columns covered in one pass
        return self.jt * self.jr


def _layout(rows: int, cols: int, red: int, threads: int, step: int,
            tile: Tuple[int, int] = (REG_TILE, REG_TILE)) -> _MatmulLayout:
    """Register tiles of up to ``tile`` outputs per thread; the threads cover every row and as
    many columns as they can (the rest in serial passes)."""
    ir = max(1, min(tile[0], rows))
    it = -(-rows // ir)
    jt = max(1, threads // it)
    jr = max(1, min(tile[1], -(-cols // jt)))
    # wide passes take shorter steps: an operand tile of at most OPERAND_TILE elements
    step = max(1, min(step, OPERAND_TILE // (jt * jr)))
    # a step that divides the reduction: an imperfect one puts the reduction loop into the
    # block predicate, and TVM then no longer sees a reduction block (decompose_reduction)
    div = max(d for d in range(1, min(step, red) + 1) if red % d == 0)
    if 4 * div < step and red <= 4 * step:  # e.g. a prime: one step over all of it
        div = red
    return _MatmulLayout(ir, it, jr, jt, div)


def _threads(rows: int, chain: GemmChain, warp: int) -> int:
    """Whole warps, about 16 outputs of the wider matmul per thread, at most MAX_THREADS."""
    want = -(-rows * max(chain.l, chain.n) // (REG_TILE * REG_TILE))
    t = warp
    while t < min(want, MAX_THREADS):
        t *= 2
    return t


def _layouts(chain: GemmChain, rows: int, warp: int) -> Tuple[int, _MatmulLayout, _MatmulLayout]:
    t = _threads(rows, chain, warp)
    l1 = _layout(rows, chain.l, chain.k, t, K_STEP)
    # attention's n is small (a head): narrower tiles keep every thread on an output
    l2 = _layout(rows, chain.n, chain.l, t, L_STEP, (REG_TILE, 2 if chain.n <= 64 else REG_TILE))
    return t, l1, l2


def _smem_bytes(chain: GemmChain, rows: int, row_reduction: bool, l1: _MatmulLayout,
                l2: _MatmulLayout) -> int:
    e = chain.elem_bytes
    total = rows * chain.l  # the slice
    total += rows * l1.step + l1.step * min(l1.cols, chain.l)  # A and B tiles
    total += l2.step * min(l2.cols, chain.n)  # D tile
    if row_reduction:
        total += rows * l2.step + 2 * rows  # S tile, row max and row sum
    return total * e


def _fmt(b: float) -> str:
    for unit, s in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if b >= s:
            return f"{b / s:.3g} {unit}"
    return f"{b:.0f} B"


@dataclass(frozen=True)
class _RowBlock:
    """A candidate row block: its threads, both matmuls' layouts, shared memory and blocks."""

    rows: int
    threads: int
    l1: _MatmulLayout  # the first matmul (rows x l)
    l2: _MatmulLayout  # the second matmul (rows x n)
    smem: int  # bytes of shared memory per block
    blocks: int  # thread blocks: batch x m / rows


def plan_cuda_chain(chain: GemmChain, dev: DeviceModel,
                    rows: Optional[int] = None) -> CudaChainPlan:
    """Whether to fuse ``chain`` into one CUDA kernel on the GPU ``dev``, and its layout.

    The row block is the largest divisor of m (at most MAX_ROWS) whose slice and tiles fit the
    opt-in shared memory per block and that still gives every SM a thread block (else the one
    with the most blocks); ``rows`` forces it (a divisor of m)."""
    _check_request(chain, dev, rows)
    limit = gpu.smem_limit(dev)
    sms = max(1, dev.num_units)
    round_trip = 2 * math.prod(chain.batch) * chain.m * chain.l * chain.elem_bytes
    traffic_unfused, own_pass = _unfused_traffic(chain, dev, round_trip)
    fused_desc = _movement_chain(chain, whole_rows=True)
    cands = _row_blocks(chain, rows, dev.gpu.warp_size)
    fitting = [c for c in cands if c.smem <= limit]
    chosen = _choose_row_block(cands, fitting, sms, rows)
    fits, why = _buildable(chain, dev, limit, sms, cands, fitting, chosen)
    tf = _fused_traffic(chain, fused_desc, chosen)
    saved = round_trip * (2 if chain.row_reduction else 1)
    share = saved / traffic_unfused if traffic_unfused else 0.0
    why.append(f"traffic into shared memory: fused {_fmt(tf)} (B and D read again by each of "
               f"the {chosen.blocks} row blocks) vs unfused {_fmt(traffic_unfused)}, of which the "
               f"intermediate's round trip is {_fmt(round_trip)}"
               + (f" {own_pass}" if own_pass else "") + f" ({share:.0%})")
    fuse = (fits and chosen.blocks >= sms and tf < FUSE_THRESHOLD * traffic_unfused
            and share >= MIN_ROUND_TRIP_SHARE)
    if fitting and not fuse and fitting[0].rows != chosen.rows:
        why.extend(_largest_block_note(chain, fused_desc, fitting[0], traffic_unfused))
    if fuse:
        why.append(f"fuse: {1 - tf / traffic_unfused:.0%} less traffic")
    else:
        why.append("do not fuse" if fits else "cannot fuse")
    l1, l2 = chosen.l1, chosen.l2
    return CudaChainPlan(fuse, fits, "; ".join(why), chosen.rows, chosen.threads,
                         (l1.ir, l1.jr), (l2.ir, l2.jr), l1.step, l1.cols, l2.step, l2.cols,
                         chain.row_reduction, chosen.smem, limit, chosen.blocks, tf,
                         traffic_unfused, round_trip)


def _check_request(chain: GemmChain, dev: DeviceModel, rows: Optional[int]) -> None:
    """A GPU device model, and a forced row block that divides m."""
    if dev.kind != "gpu":
        raise UnsupportedError(f"plan_cuda_chain needs a GPU device model, got {dev.name} "
                               f"({dev.kind})")
    if rows is not None and (rows < 1 or chain.m % rows):
        raise UnsupportedError(f"row block {rows} does not divide m = {chain.m}")


def _movement_chain(chain: GemmChain, whole_rows: bool) -> movement.Chain:
    """``movement``'s description of the chain; ``whole_rows``: l untiled (the fused kernel
    keeps whole rows of the intermediate)."""
    desc = movement.gemm_chain(math.prod(chain.batch), chain.m, chain.k, chain.l, chain.n,
                               chain.elem_bytes)
    for loop in desc.loops:
        loop.untiled = loop.untiled or (whole_rows and loop.name == "l")
    return desc


def _unfused_traffic(chain: GemmChain, dev: DeviceModel, round_trip: int
                     ) -> Tuple[int, Optional[str]]:
    """Traffic into shared memory of the operators one by one, each with its best tiles and
    parallelism (l tiled freely), plus the passes that a kernel boundary costs; and a note on a
    row reduction's own pass, if any."""
    alone = movement.plan_chain(_movement_chain(chain, whole_rows=False), dev,
                                include_compute=False)
    traffic = int(alone.total_unfused)
    own_pass = None
    if any(i["fits_tile_level"] for i in alone.intermediates):
        # the model lets an intermediate that fits the tile level stay there between the ops
        # (true of a CPU cache); shared memory does not outlive a kernel: charge the round trip
        traffic += round_trip
    if chain.row_reduction:
        # a row reduction cannot fold into a matmul's epilogue: its own pass reads C, writes S
        traffic += round_trip
        own_pass = f"plus {_fmt(round_trip)} for the softmax's own pass"
    return traffic, own_pass


def _fused_traffic(chain: GemmChain, fused_desc: movement.Chain, block: _RowBlock) -> int:
    """Traffic into shared memory of the fused kernel with row block ``block``."""
    l1, l2 = block.l1, block.l2
    dm = movement.data_movement(fused_desc, ["b", "m", "l", "k", "n"],
                                {"b": 1, "m": block.rows, "l": chain.l, "k": l1.step,
                                 "n": min(l2.cols, chain.n)})
    # the model sees one pass over the slice; the kernel re-reads A's rows per l-pass
    passes = -(-chain.l // l1.cols)
    return int(sum(dm.values())
               + (passes - 1) * math.prod(chain.batch) * chain.m * chain.k * chain.elem_bytes)


def _row_blocks(chain: GemmChain, rows: Optional[int], warp: int) -> List[_RowBlock]:
    """Every row block that divides m (at most MAX_ROWS, and ``rows`` if given), largest first."""
    batch = math.prod(chain.batch)
    cands = []
    for r in sorted({d for d in range(1, min(chain.m, MAX_ROWS) + 1) if chain.m % d == 0}
                    | ({rows} if rows else set()), reverse=True):
        t, l1, l2 = _layouts(chain, r, warp)
        cands.append(_RowBlock(r, t, l1, l2, _smem_bytes(chain, r, chain.row_reduction, l1, l2),
                               batch * (chain.m // r)))
    return cands


def _choose_row_block(cands: List[_RowBlock], fitting: List[_RowBlock], sms: int,
                      rows: Optional[int]) -> _RowBlock:
    """``rows`` if forced; else the largest row block that fits and fills the SMs."""
    busy = [c for c in fitting if c.blocks >= sms]
    if rows is not None:
        return next(c for c in cands if c.rows == rows)
    if busy:  # the largest row block (least re-reading of B and D) that fills the SMs
        return busy[0]
    # the most thread blocks
    return fitting[-1] if fitting else cands[-1]


def _buildable(chain: GemmChain, dev: DeviceModel, limit: int, sms: int,
               cands: List[_RowBlock], fitting: List[_RowBlock], chosen: _RowBlock
               ) -> Tuple[bool, List[str]]:
    """Whether the fused kernel can be built with ``chosen`` (shared memory, dtype, no stages
    before the first matmul), and the reasons, the thread blocks' count last."""
    why: List[str] = []
    if not fitting:
        why.append(f"the intermediate's slice (rows x {chain.l} x {chain.elem_bytes} B) and the "
                   f"operand tiles do not fit shared memory even for one row: "
                   f"{_fmt(cands[-1].smem)} > {_fmt(limit)} opt-in per block on {dev.name} "
                   f"(l = {chain.l} too long)")
    else:
        why.append(f"shared memory: the intermediate's slice (rows x {chain.l} x "
                   f"{chain.elem_bytes} B) and the operand tiles fit {_fmt(limit)} opt-in per "
                   f"block for at most {fitting[0].rows} of the {chain.m} rows; {chosen.rows} "
                   f"rows take {_fmt(chosen.smem)}")
    fits = chosen.smem <= limit and chain.dtype == "float32"
    if chain.dtype != "float32":
        why.append(f"dtype {chain.dtype}: the fused CUDA kernel takes float32 only")
    if chain.producers:  # a convolution's padding: the kernel's row blocks have no halo
        fits = False
        why.append(f"stages before the first matmul ({', '.join(chain.producers)}): the fused "
                   "CUDA kernel takes plain (batch) matmuls only")
    why.append(f"{chosen.blocks} thread blocks of {chosen.rows} rows on {sms} SMs"
               + ("" if chosen.blocks >= sms else " (too few to fill the SMs)"))
    return fits, why


def _largest_block_note(chain: GemmChain, fused_desc: movement.Chain, big: _RowBlock,
                        traffic_unfused: int) -> List[str]:
    """Why not a larger row block: even the largest that fits moves too much."""
    tb = _fused_traffic(chain, fused_desc, big)
    if tb >= FUSE_THRESHOLD * traffic_unfused:
        return [f"even the largest row block that fits ({big.rows} rows) moves {_fmt(tb)}: "
                f"l = {chain.l} is too long for shared memory to hold a row block that "
                "reads B and D few enough times"]
    return []


# -- the schedule --------------------------------------------------------------------------------
def _bind_threads(sch: s_tir.Schedule, loop, warps: int, warp: int):
    """``loop`` over the block's threads (threadIdx.y: warps, threadIdx.x: lanes) and serially
    beyond them; returns the threadIdx.x loop. Never a unit outer loop: it would have the warp
    loop's stride, which makes the bindings non-affine to TVM (decompose_reduction refuses)."""
    n = extent(sch, loop) or 1
    if warps == 1:
        tx = loop if n == warp else sch.split(loop, [None, warp])[-1]
        sch.bind(tx, "threadIdx.x")
        return tx
    parts = sch.split(loop, [None, warps, warp] if n > warps * warp else [warps, warp])
    sch.bind(parts[-2], "threadIdx.y")
    sch.bind(parts[-1], "threadIdx.x")
    return parts[-1]


def _spread(sch: s_tir.Schedule, block, warps: int, warp: int, vectorize: bool) -> None:
    """All threads produce a tile of ``block`` (its loops below the compute_at point), with
    16-byte vectors where every access is provably aligned and each thread gets whole ones."""
    inner = sch.get_loops(block)[-len(sch.get(block).iter_vars):]
    total = math.prod(extent(sch, lp) or 1 for lp in inner)
    vec = 1
    if vectorize:  # along the tile's rows, which must hold whole vectors (checked there)
        dtype = str(sch.get(block).writes[0].source.dtype)
        vec = aligned_lanes(sch, block, inner[-1], vector_lanes(dtype))
    fused = sch.fuse(*inner) if len(inner) > 1 else inner[0]
    if vec > 1 and total % (vec * warps * warp) == 0:
        outer, v = sch.split(fused, [None, vec])
        _bind_threads(sch, outer, warps, warp)
        sch.vectorize(v)
    else:
        _bind_threads(sch, fused, warps, warp)


def _operands(sch: s_tir.Schedule, block) -> List[str]:
    blk = sch.get(block)
    outs = {w.source.name for w in blk.writes}
    return [r.source.name for r in blk.reads if r.source.name not in outs]


def _read_index(sch: s_tir.Schedule, block, name: str) -> int:
    blk = sch.get(block)
    for i, r in enumerate(blk.reads):
        if r.source.name == name:
            return i
    raise UnsupportedError(f"block {blk.name_hint} does not read {name}")


def _matmul(sch: s_tir.Schedule, name: str, lay: _MatmulLayout, warps: int, warp: int,
            fetch: List[str]):
    """A matmul under the block loop: (rows, cols, reduction) -> column passes x threads x
    reduction steps x register tile; the operands in ``fetch`` staged in shared memory per
    step. Returns (the accumulators' write-back block, the reduction-step loop)."""
    blk = sch.get_sblock(name)
    i, j, k = sch.get_loops(blk)[-3:]
    it, ir = sch.split(i, [None, lay.ir])
    jo, jt, jr = sch.split(j, [None, lay.jt, lay.jr])
    ko, ki = sch.split(k, [None, lay.step])
    sch.reorder(jo, it, jt, ko, ki, ir, jr)
    tx = _bind_threads(sch, sch.fuse(it, jt), warps, warp)
    # unrolled by hand, not by an unroll pragma over the whole kernel: that would also
    # unroll the row-reduction loops, and TVM cannot lower copies of one cross-thread reduction
    if lay.step * lay.ir * lay.jr <= _UNROLL_STEP:
        sch.unroll(ki)
    sch.unroll(ir)
    sch.unroll(jr)
    wb = sch.cache_write(blk, 0, "local")
    sch.reverse_compute_at(wb, tx, preserve_unit_loops=True)
    for buf in fetch:
        s = sch.cache_read(blk, _read_index(sch, blk, buf), SMEM_SCOPE)
        sch.compute_at(s, ko, preserve_unit_loops=True)
        _spread(sch, s, warps, warp, vectorize=True)
    return wb, ko


def _row_reduction(sch: s_tir.Schedule, block, warps: int, warp: int) -> None:
    """Rows over the warps, the reduced axis over a warp's lanes (TVM: warp shuffles)."""
    i, r = sch.get_loops(block)[-2:]
    ro, tx = sch.split(r, [None, warp])
    if warps > 1:
        _, ty = sch.split(i, [None, warps])
        sch.reorder(ty, ro, tx)
        sch.bind(ty, "threadIdx.y")
    sch.bind(tx, "threadIdx.x")


def _check(sch: s_tir.Schedule, chain: GemmChain, cplan: CudaChainPlan,
           dev: DeviceModel) -> None:
    if chain.dtype != "float32":
        raise UnsupportedError(f"fused CUDA GEMM chain: dtype {chain.dtype} (float32 only)")
    if chain.producers:
        raise UnsupportedError("fused CUDA GEMM chain: stages before the first matmul "
                               f"({', '.join(chain.producers)}, e.g. a convolution's padding) "
                               "are not supported")
    for name in (chain.first, chain.second):
        ivs = sch.get(sch.get_sblock(name)).iter_vars
        if [int(iv.iter_type) for iv in ivs] != [0] * (len(chain.batch) + 2) + [2]:
            raise UnsupportedError(f"fused CUDA GEMM chain: {name} is not a (batch) matmul with "
                                   "one reduction axis (convolution chains are not supported)")
    if not cplan.fits:
        raise UnsupportedError(f"GEMM chain cannot be fused on {dev.name}: {cplan.reason}")
    if chain.m % cplan.rows:
        raise UnsupportedError(f"row block {cplan.rows} does not divide m = {chain.m}")
    if cplan.smem_bytes > gpu.smem_limit(dev) or \
            cplan.threads > dev.gpu.max_threads_per_block or cplan.threads % dev.gpu.warp_size:
        raise UnsupportedError(f"the plan's {cplan.smem_bytes} B of shared memory and "
                               f"{cplan.threads} threads do not suit a block on {dev.name}")


def apply_fused_cuda(func, chain: GemmChain, cplan: CudaChainPlan,
                     dev: DeviceModel) -> s_tir.Schedule:
    """The fused CUDA kernel of ``chain`` laid out as ``cplan`` says (the module docstring).

    Raises UnsupportedError when the chain cannot be fused on ``dev`` (the plan says why: the
    slice does not fit shared memory, a dtype other than float32) or is not one this kernel
    takes (prologues, convolution chains, stages that do not keep the rows)."""
    sch = s_tir.Schedule(unwrap_func(func))
    _check(sch, chain, cplan, dev)
    warp = dev.gpu.warp_size
    warps = cplan.threads // warp
    l1 = _layout(cplan.rows, chain.l, chain.k, cplan.threads, cplan.k_step, cplan.thread_tile)
    l2 = _layout(cplan.rows, chain.n, chain.l, cplan.threads, cplan.l_step, cplan.thread_tile2)

    # one thread block per (batch.., row block); every other block computed inside it
    second = sch.get_sblock(chain.second)
    loops = sch.get_loops(second)
    nb = len(chain.batch)
    mo, _ = sch.split(loops[nb], [None, cplan.rows])
    bx = sch.fuse(*loops[:nb], mo) if nb else mo
    sch.bind(bx, "blockIdx.x")
    for name in reversed([chain.first] + chain.between):
        require(f"fused CUDA chain: placing {name} in the row block", sch.compute_at,
                sch.get_sblock(name), bx, preserve_unit_loops=True)

    a_name, b_name = _operands(sch, sch.get_sblock(chain.first))
    d_name = _operands(sch, second)[1]  # the detector matched (intermediate, weight)
    wb1, ko1 = _matmul(sch, chain.first, l1, warps, warp, [a_name, b_name])
    # leading elementwise stages fold into the write-back of the first matmul's registers
    stages = list(chain.between)
    while stages and not is_reduction(sch, sch.get_sblock(stages[0])) and \
            attempt(sch.reverse_compute_inline, sch.get_sblock(stages[0])):
        stages.pop(0)
    sch.set_scope(wb1, 0, SMEM_SCOPE)  # the rows x l slice
    last = stages.pop() if stages else None
    # elementwise stages between the row reductions (softmax's shift and exp) are recomputed
    # where they are read instead of being stored as slices of their own
    for name in stages:
        if not is_reduction(sch, sch.get_sblock(name)):
            attempt(sch.compute_inline, sch.get_sblock(name))
    for name in [n for n in stages if n in block_names(sch)]:
        blk = sch.get_sblock(name)
        kinds = [int(iv.iter_type) for iv in sch.get(blk).iter_vars]
        if kinds != [0] * (nb + 1) + [2]:
            raise UnsupportedError(f"fused CUDA chain: stage {name} is not a reduction along "
                                   "the rows of the intermediate (or an elementwise stage "
                                   "that can be recomputed where it is read)")
        sch.set_scope(blk, 0, STATS_SCOPE)
        _row_reduction(sch, blk, warps, warp)

    _, ko2 = _matmul(sch, chain.second, l2, warps, warp, [d_name])
    if last is not None:
        # the last stage (softmax's normalised exp) is made per l-step, like an operand tile
        blk = sch.get_sblock(last)
        if is_reduction(sch, blk):
            raise UnsupportedError(f"fused CUDA chain: the last stage {last} reduces rows; the "
                                   "second matmul needs an elementwise one")
        # shared before compute_at: only then is the tile's region taken over all threads
        # (else each thread would make just the part it reads itself)
        sch.set_scope(blk, 0, SMEM_SCOPE)
        require(f"fused CUDA chain: computing {last} per step of the second matmul",
                sch.compute_at, blk, ko2, preserve_unit_loops=True)
        _spread(sch, blk, warps, warp, vectorize=False)
    # last: loops above the update blocks cannot be annotated after decompose_reduction
    sch.decompose_reduction(sch.get_sblock(chain.first), ko1)
    sch.decompose_reduction(sch.get_sblock(chain.second), ko2)
    return sch


__all__ = ["CudaChainPlan", "plan_cuda_chain", "apply_fused_cuda"]
