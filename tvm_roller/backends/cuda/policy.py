"""ROLLER construction for GPUs: levels global -> shared memory -> registers.

Register tile (one thread's outputs): grown from 1 by the reuse score within a register budget,
the contiguous output axis in steps of 4 (a 16-byte store). Shared-memory tile (one thread
block): the register tile times a thread count per axis, grown by the reuse score
S_i = (Q(T) - Q(T'_i)) / (F(T'_i) - F(T)) over global traffic Q and shared footprint F, for
several block sizes (multiples of the warp); the reduction chunk is at least one 32-byte
transaction of the contiguous input. Fp16 matmuls also get tensor-core tiles (warp tiles in
16x16x16 fragments). Scale-out across SMs and wave quantization are the micro-model's job:
every candidate is predicted and the best k are returned.
"""
from __future__ import annotations

import dataclasses
import itertools
import math
from typing import Dict, List, Optional, Tuple

from tvm_roller.analysis import FuncAnalysis
from tvm_roller.analysis.traffic import (input_bytes, num_tiles, param_bytes, register_loads,
                                          staged_input_bytes)
from tvm_roller.backends.cuda import tensorcore_gemm as tcg
from tvm_roller.backends.cuda.perf_model import (estimated_registers, predict_streaming,
                                                 predict_tiled)
from tvm_roller.core.errors import UnsupportedError
from tvm_roller.core.growth import grow_by_reuse
from tvm_roller.core.rtile import RTile, aligned_steps, padding_waste
from tvm_roller.hardware import DeviceModel
from tvm_roller.hardware.gpu import smem_limit
from tvm_roller.hardware.model import DTYPE_BYTES

Tile = Tuple[int, ...]
_MAX_ACC = 64  # accumulators per thread: 8x8 leaves room for operands at 2 blocks per SM
_REG_BUDGET = 96
_BLOCK_THREADS = (32, 64, 128, 256, 512)
# an axis may be padded up to a tile that does not divide it when at most this much of the
# work is wasted (ROLLER's shape alignment): prime and odd extents still get aligned tiles
PAD_EPS = 0.15


def tile_limit(extent: int) -> int:
    """The largest block tile along a spatial axis of ``extent``: its next power of two. A tile
    past the extent is predicated, and lets a block of tiny or odd extents be whole warps."""
    return 1 << max(0, (extent - 1).bit_length())


def _spatial_steps(extent: int, reg: int) -> List[int]:
    """Block-tile sizes along a spatial axis: multiples of the register tile that divide the
    extent, and power-of-two multiples of it that pad the extent by at most PAD_EPS or cover
    it in one tile (the smallest cover and the next power of two)."""
    out = []
    for m in range(1, tile_limit(extent) // reg + 1):
        t = m * reg
        if extent % t == 0:
            out.append(t)
        elif m & (m - 1) == 0 and (padding_waste(extent, t) <= PAD_EPS or t >= extent):
            out.append(t)
        elif t >= extent > t - reg:
            out.append(t)
    return out


def gpu_kind(fa: FuncAnalysis) -> str:
    """Tiled when an input is reused across the outputs (some spatial axis it does not use),
    whatever the CPU's vector-axis test said: threads need no contiguous vector axis. A
    reduction feeding another (a mean, then a variance) streams: a block tile's write-back
    folds elementwise epilogues only."""
    if _feeds_reduction(fa):
        return "reduction"
    if fa.kind != "reduction":
        return fa.kind
    spatial = math.prod(fa.axes[i].extent for i in fa.spatial)
    reused = any(any(i not in acc.axes_used() and fa.axes[i].extent > 1 for i in fa.spatial)
                 for acc in fa.reads)
    return "tiled" if reused and spatial >= 32 and not _row_per_block(fa) else "reduction"


def _feeds_reduction(fa: FuncAnalysis) -> bool:
    """A later stage of the function is a reduction too (a mean, then a variance)."""
    later = set(fa.consumers)
    return any(b.is_reduction and b.name in later for b in fa.blocks)


def _row_per_block(fa: FuncAnalysis) -> bool:
    """GEMV-like: the largest input is read once (no spatial axis reuses it) along its
    contiguous reduction axis, so a block per output row reads it coalesced and its threads
    split the reduction, instead of a few block tiles streaming it through shared memory."""
    full = tuple(a.extent for a in fa.axes)
    big = max(fa.reads, key=lambda acc: acc.footprint(full) * acc.bytes_per_elem, default=None)
    if big is None:
        return False
    inner = big.innermost_axis()
    used = big.axes_used()
    return (inner is not None and fa.axes[inner].kind == "R"
            and all(i in used or fa.axes[i].extent == 1 for i in fa.spatial))


def _base(fa: FuncAnalysis, kind: str) -> Dict:
    return dict(kind=kind, axes=[a.name for a in fa.axes], extents=[a.extent for a in fa.axes],
                axis_kinds="".join(a.kind for a in fa.axes), vector_axis=fa.vector_axis,
                backend="cuda")


def _out_axis(fa: FuncAnalysis) -> Optional[int]:
    if fa.vector_axis is not None:
        return fa.vector_axis
    return fa.spatial[-1] if fa.spatial else None


# -- registers ---------------------------------------------------------------------------------
def _register_tiles(fa: FuncAnalysis, notes: List[str]) -> List[Tile]:
    v = _out_axis(fa)
    steps, start = [], []
    for i, a in enumerate(fa.axes):
        if a.kind == "R" or a.extent == 1:
            steps.append([1])
        elif i == v and a.extent % 4 == 0:
            steps.append([s for s in (1, 2, 4, 8) if a.extent % s == 0])
        else:
            steps.append(aligned_steps(a.extent, 1, limit=8, eps=0.0,
                                       multiples=tuple(range(1, 9))))
        start.append(steps[-1][0])
    red = math.prod(a.extent for a in fa.axes if a.kind == "R")

    def q(t: Tile) -> float:  # shared-memory loads over the whole computation
        return num_tiles(fa, t, fa.spatial) * red * register_loads(fa, t, 1)

    def f(t: Tile) -> float:
        return math.prod(t[i] for i in fa.spatial) + register_loads(fa, t, 1)

    def fits(t: Tile) -> bool:
        return math.prod(t[i] for i in fa.spatial) <= _MAX_ACC and f(t) <= _REG_BUDGET

    path = grow_by_reuse(tuple(start), steps, q, f, fits)
    if v is not None:
        notes.append(f"register tile: {fa.axes[v].name} in steps of 4 (16-byte stores); at most "
                     f"{_MAX_ACC} accumulators per thread")
    # every tile on the way: small problems need more threads than big tiles allow, and the
    # micro-model weighs register reuse against parallelism
    return list(dict.fromkeys(reversed(path)))


# -- shared memory -----------------------------------------------------------------------------
def _reduction_chunks(fa: FuncAnalysis, dev: DeviceModel) -> List[Tile]:
    """Reduction chunk per k step: the contiguous reduction axis in whole 32-byte transactions
    (8 fp32 / 16 fp16) where its extent allows, the others one at a time."""
    inner = _contiguous_reduction(fa)
    elem = max((a.bytes_per_elem for a in fa.reads), default=4)
    unit = max(1, dev.gpu.transaction_bytes // elem)
    out = []
    for mult in (1, 2):  # longer chunks unroll into more registers than they save syncs
        t = []
        for i, a in enumerate(fa.axes):
            if a.kind == "S":
                t.append(0)
            elif i == inner:
                sizes = aligned_steps(a.extent, unit, eps=PAD_EPS, multiples=(1, 2, 4, 8))
                t.append(sizes[min(len(sizes) - 1, mult - 1)] if a.extent >= unit else a.extent)
            else:
                t.append(1)
        out.append(tuple(t))
    return list(dict.fromkeys(out))


def _contiguous_reduction(fa: FuncAnalysis) -> Optional[int]:
    for acc in fa.reads:
        ax = acc.innermost_axis()
        if ax is not None and fa.axes[ax].kind == "R":
            return ax
    return fa.reduction[-1] if fa.reduction else None


def _threads(fa: FuncAnalysis, reg: Tile, l1: Tile) -> int:
    return math.prod(l1[i] // reg[i] for i in fa.spatial)


def _smem(fa: FuncAnalysis, l1: Tile, stages: int) -> int:
    # rows spanning all 32 banks get one 16-byte vector of padding: at most 1/8 more
    return staged_input_bytes(fa, l1) * stages * 9 // 8


def _block_tile(fa: FuncAnalysis, dev: DeviceModel, reg: Tile, chunk: Tile, max_threads: int,
                smem_cap: int, stages: int) -> Tile:
    v = _out_axis(fa)
    # the block's row of the output spans whole 32-byte transactions where the axis allows
    elem = DTYPE_BYTES.get(fa.dtype, 4)
    row = max(1, dev.gpu.transaction_bytes // elem)
    # registers: index arithmetic of convolutions costs more than the estimate's allowance;
    # 1.5x keeps __launch_bounds__ from forcing spills (measured with ptxas on C3D)
    regs = estimated_registers(fa, reg)
    max_threads = min(max_threads, dev.gpu.regs_per_block * 2 // (3 * regs))
    steps, start = [], []
    for i, a in enumerate(fa.axes):
        if a.kind == "S":
            steps.append(_spatial_steps(a.extent, reg[i]))
            first = steps[-1][0]
            if i == v:
                first = next((x for x in steps[-1] if x >= row), steps[-1][-1])
            start.append(first)
        else:
            steps.append([chunk[i]])
            start.append(chunk[i])

    def q(t: Tile) -> float:  # global -> shared traffic
        return num_tiles(fa, t) * input_bytes(fa, t)

    def f(t: Tile) -> float:
        return input_bytes(fa, t)

    def fits(t: Tile) -> bool:
        return _threads(fa, reg, t) <= max_threads and _smem(fa, t, stages) <= smem_cap

    tile = list(grow_by_reuse(tuple(start), steps, q, f, fits)[-1])
    # no more reuse to gain, yet a block must be whole warps: widen along the contiguous
    # output axis first (coalesced), then the others, while the limits allow
    warp = dev.gpu.warp_size
    order = [i for i in [v] if i is not None] + [i for i in reversed(fa.spatial) if i != v]
    while _threads(fa, reg, tuple(tile)) % warp:
        for i in order:
            bigger = [x for x in steps[i] if x > tile[i]]
            if bigger and fits(tuple(tile[:i] + [bigger[0]] + tile[i + 1:])):
                tile[i] = bigger[0]
                break
        else:
            break
    return tuple(tile)


def _padding_notes(fa: FuncAnalysis, l1: Tile) -> List[str]:
    pads = [f"{a.name} {a.extent} -> {-(-a.extent // l1[i]) * l1[i]}"
            for i, a in enumerate(fa.axes) if a.extent % l1[i]]
    return [f"block tile pads {', '.join(pads)} (predicated tails)"] if pads else []


def construct_simt(fa: FuncAnalysis, dev: DeviceModel) -> List[RTile]:
    notes: List[str] = []
    warp = dev.gpu.warp_size
    cands: Dict[tuple, RTile] = {}
    # the SIMT lowering declares static __shared__ tiles: at most the static limit (48 KB)
    static_cap = smem_limit(dev, dynamic=False)
    for reg in _register_tiles(fa, notes):
        for chunk in _reduction_chunks(fa, dev):
            for max_threads in _BLOCK_THREADS:
                for stages in (2, 1):
                    l1 = _block_tile(fa, dev, reg, chunk, max_threads, static_cap, stages)
                    threads = _threads(fa, reg, l1)
                    smem = _smem(fa, l1, stages)
                    # blocks are whole warps (a tiny output may be one block of fewer
                    # threads) and fit the device
                    partial = threads % warp and not (
                        threads < warp and num_tiles(fa, l1, fa.spatial) == 1)
                    if partial or threads > max_threads or smem > static_cap:
                        continue
                    t = RTile(**_base(fa, "tiled"), reg=list(reg), l1=list(l1), l2=list(l1),
                              vector_lanes=1, threads=threads, stages=stages,
                              smem_bytes=smem, notes=list(notes) + _padding_notes(fa, l1))
                    predict_tiled(fa, dev, t)  # one with no occupancy: the planner declines
                    cands.setdefault(t.key() + (threads, stages), t)
    if not cands:
        raise UnsupportedError(f"no CUDA block tile of whole warps fits {dev.name}'s limits "
                               f"(at most {static_cap} B static shared memory per block)")
    return list(cands.values())


# -- tensor cores ------------------------------------------------------------------------------
def construct_tensorcore(fa: FuncAnalysis, dev: DeviceModel) -> List[RTile]:
    """fp16 matmul-like kernels: block tiles of 16x16x16 fragments, warp tiles of 16-64.

    An M, N or K that the block tile (K chunk) does not divide is padded up to it (ROLLER's
    alignment to the execution unit; ``tcg.padding_notes`` explains it), and such a
    candidate is predicted with its padded extents, so the micro-model prices the waste when it
    ranks it against the others and the SIMT tiles. Tiles stay within the extents (the padding
    is then less than half the work); 16-wide block and warp tiles, one-warp blocks and a K
    taken whole as one chunk (padded to 16s) only for small axes (below 128; 16-31 need them):
    shapes whose axes are all larger get the candidates they had."""
    if not all(str(a.dtype) == "float16" for a in fa.reads) or len(fa.spatial) < 2:
        return []
    if len(fa.reduction) != 1:
        return []
    try:
        g = tcg.gemm_structure(fa)
    except UnsupportedError:
        return []
    m, n, k = g.m, g.n, g.k
    ext = {i: fa.axes[i].extent for i in (m, n, k)}

    def sizes(axis: int, options: Tuple[int, ...]) -> List[int]:
        return [s for s in options if s <= ext[axis] and (s > 16 or ext[axis] < 128)]

    padded_fa: Dict[Tuple[int, int, int], FuncAnalysis] = {}

    def padded(l1: List[int]) -> FuncAnalysis:  # l1: the K chunk as scheduled
        key = tuple(math.ceil(ext[i] / l1[i]) * l1[i] for i in (m, n, k))
        if key not in padded_fa:
            axes = list(fa.axes)
            for i, e in zip((m, n, k), key):
                axes[i] = dataclasses.replace(axes[i], extent=e)
            padded_fa[key] = fa if list(key) == [ext[i] for i in (m, n, k)] else \
                dataclasses.replace(fa, axes=axes)
        return padded_fa[key]

    # a short K can also be one chunk (padded to 16s when it is not a multiple of 16)
    chunks = sizes(k, (64, 32, 16))
    chunks += [ext[k]] if ext[k] < 128 and ext[k] not in chunks else []
    out = []
    cap = smem_limit(dev)
    for bm, bn, bk, wm, wn, stages in itertools.product(
            sizes(m, (256, 128, 64, 32, 16)), sizes(n, (256, 128, 64, 32, 16)), chunks,
            sizes(m, (64, 32, 16)), sizes(n, (64, 32, 16)), (4, 3, 2)):
        warps = (bm // wm) * (bn // wn)
        if wm > bm or wn > bn or bm % wm or bn % wn or warps > 8:
            continue
        if warps < 2 and (bm > 32 or bn > 32 or min(ext[m], ext[n]) >= 128):
            continue  # one warp only for small blocks of a small M or N
        l1, reg = [1] * len(fa.axes), [1] * len(fa.axes)
        l1[m], l1[n], l1[k] = bm, bn, bk
        reg[m], reg[n], reg[k] = wm, wn, 16
        t = RTile(**_base(fa, "tiled"), reg=reg, l1=l1, l2=list(l1), vector_lanes=8,
                  threads=warps * dev.gpu.warp_size, stages=stages, tensor_core=tcg.WMMA)
        try:
            tcg.validate_tile(fa, t, dev, gemm=g)
        except UnsupportedError:
            continue  # not a valid tensor-core tile for this shape: not a candidate
        t.notes.extend(tcg.padding_notes(fa, t, g))
        t.smem_bytes = tcg.smem_bytes(fa, t, g)
        if t.smem_bytes > cap:
            continue
        sched = list(l1)
        sched[k] = tcg.pad_unit(g, t, k)
        whole = " (all of K, padded)" if sched[k] != bk else ""
        t.notes.insert(0, f"tensor cores: block {bm}x{bn}x{sched[k]}{whole}, warp {wm}x{wn} in "
                          f"16x16x16 fragments, {stages}-stage pipeline")
        # predicted with the padded extents and the chunk as scheduled: the waste is priced
        p = predict_tiled(padded(sched), dev, dataclasses.replace(t, l1=sched, l2=list(sched)))
        t.predicted_s, t.bound, t.terms, t.num_tasks = p.predicted_s, p.bound, p.terms, \
            p.num_tasks
        out.append(t)
    return out


# -- memory-bound ------------------------------------------------------------------------------
def construct_streaming(fa: FuncAnalysis, dev: DeviceModel) -> List[RTile]:
    rows = math.prod(fa.axes[i].extent for i in fa.spatial)
    red = math.prod(fa.axes[i].extent for i in fa.reduction)
    warp = dev.gpu.warp_size
    t = RTile(**_base(fa, fa.kind), reg=[1] * len(fa.axes), l1=[a.extent for a in fa.axes],
              l2=[a.extent for a in fa.axes], vector_lanes=1)
    bytes_moved = param_bytes(fa)
    if fa.kind == "elementwise":
        t.threads = 256
        t.num_tasks = max(1, rows // (256 * 4))
        t.notes.append("elementwise: one 16-byte vector per thread, 256 threads per block")
    elif red < warp:
        t.threads, t.acc_level = 256, "thread"
        t.num_tasks = max(1, rows // 256)
        t.notes.append(f"short reduction ({red}): one output per thread")
    else:
        t.threads = min(512, max(warp, 1 << max(0, (red // 8 - 1).bit_length())))
        t.num_tasks = rows
        parts = _split_parts(fa, dev, rows, red, t.threads)
        if parts > 1:
            t.acc_level = "split"
            t.l2[fa.reduction[0]] = parts
            t.num_tasks = rows * parts
            t.notes.append(f"{rows} row(s) cannot fill {dev.num_units} SMs: each row's reduction "
                           f"split over {parts} blocks (rfactor), partial results reduced by a "
                           "second kernel")
            return [predict_streaming(fa, dev, t, bytes_moved, kernels=2 + len(fa.consumers))]
        t.notes.append(f"row reduction over {red}: one row per block of {t.threads} threads, "
                       "warp shuffles then shared memory")
    return [predict_streaming(fa, dev, t, bytes_moved, kernels=1)]


def _split_parts(fa: FuncAnalysis, dev: DeviceModel, rows: int, red: int, threads: int) -> int:
    """Blocks per row when rows alone leave most SMs idle and each row is long; only for a
    single reduction followed by elementwise stages (a norm), whose rows need no exchange."""
    if rows * 2 >= dev.num_units or red < 64 * threads or fa.producers or _feeds_reduction(fa):
        return 1
    parts = 1
    while rows * parts < 2 * dev.num_units and parts < 1024 and red % (parts * 2 * threads) == 0:
        parts *= 2
    return parts


def construct_tiled(fa: FuncAnalysis, dev: DeviceModel, topk: int = 1) -> List[RTile]:
    """Tensor-core and SIMT block tiles, ranked by the micro-model."""
    cands = construct_tensorcore(fa, dev) + construct_simt(fa, dev)
    ranked = sorted(cands, key=lambda t: (float(f"{t.predicted_s:.3g}"), -t.threads, t.key()))
    return ranked[:max(1, topk)]
