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

import itertools
import math
from typing import Dict, List, Optional, Tuple

from tvm_roller.analysis import FuncAnalysis
from tvm_roller.analysis.traffic import param_bytes, input_bytes, num_tiles, register_loads
from tvm_roller.backends.cuda import tensorcore as tc
from tvm_roller.backends.cuda.perf_model import (estimated_registers, predict_streaming,
                                                 predict_tiled)
from tvm_roller.core.errors import UnsupportedError
from tvm_roller.core.growth import grow_by_reuse
from tvm_roller.core.rtile import RTile, aligned_steps
from tvm_roller.hardware import DeviceModel
from tvm_roller.hardware.gpu import smem_limit
from tvm_roller.hardware.model import DTYPE_BYTES

Tile = Tuple[int, ...]
_MAX_ACC = 64  # accumulators per thread: 8x8 leaves room for operands at 2 blocks per SM
_REG_BUDGET = 96
_BLOCK_THREADS = (32, 64, 128, 256, 512)


def gpu_kind(fa: FuncAnalysis) -> str:
    """Tiled when an input is reused across the outputs (some spatial axis it does not use),
    whatever the CPU's vector-axis test said: threads need no contiguous vector axis."""
    if fa.kind != "reduction":
        return fa.kind
    spatial = math.prod(fa.axes[i].extent for i in fa.spatial)
    reused = any(any(i not in acc.axes_used() and fa.axes[i].extent > 1 for i in fa.spatial)
                 for acc in fa.reads)
    return "tiled" if reused and spatial >= 32 else "reduction"


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
                sizes = aligned_steps(a.extent, unit, eps=0.0, multiples=(1, 2, 4, 8))
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
    return input_bytes(fa, l1) * stages * 9 // 8


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
            steps.append([m * reg[i] for m in range(1, a.extent // reg[i] + 1)
                          if a.extent % (m * reg[i]) == 0])
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


def construct_simt(fa: FuncAnalysis, dev: DeviceModel) -> List[RTile]:
    notes: List[str] = []
    warp = dev.gpu.warp_size
    cands: Dict[tuple, RTile] = {}
    for reg in _register_tiles(fa, notes):
        for chunk in _reduction_chunks(fa, dev):
            for max_threads in _BLOCK_THREADS:
                for stages in (2, 1):
                    # static shared memory only: more needs the dynamic opt-in
                    l1 = _block_tile(fa, dev, reg, chunk, max_threads,
                                     smem_limit(dev, dynamic=False), stages)
                    threads = _threads(fa, reg, l1)
                    if threads < warp and num_tiles(fa, l1, fa.spatial) > 1:
                        continue  # a partial warp while other blocks exist: grow first
                    t = RTile(**_base(fa, "tiled"), reg=list(reg), l1=list(l1), l2=list(l1),
                              vector_lanes=1, threads=threads, stages=stages,
                              smem_bytes=_smem(fa, l1, stages), notes=list(notes))
                    predict_tiled(fa, dev, t)
                    cands.setdefault(t.key() + (threads, stages), t)
    if not cands:
        raise UnsupportedError("no CUDA tile fits the device's limits")
    return list(cands.values())


# -- tensor cores ------------------------------------------------------------------------------
def construct_tensorcore(fa: FuncAnalysis, dev: DeviceModel) -> List[RTile]:
    """fp16 matmul-like kernels: block tiles of 16x16x16 fragments, warp tiles of 32-64."""
    if not all(str(a.dtype) == "float16" for a in fa.reads) or len(fa.spatial) < 2:
        return []
    if len(fa.reduction) != 1:
        return []
    m, n, k = fa.spatial[-2], fa.spatial[-1], fa.reduction[0]
    out = []
    cap = smem_limit(dev)
    for bm, bn, bk, wm, wn, stages in itertools.product(
            (256, 128, 64, 32), (256, 128, 64, 32), (64, 32), (64, 32), (64, 32), (4, 3, 2)):
        warps = (bm // wm) * (bn // wn)
        if wm > bm or wn > bn or not 2 <= warps <= 8:
            continue
        l1, reg = [1] * len(fa.axes), [1] * len(fa.axes)
        l1[m], l1[n], l1[k] = bm, bn, bk
        reg[m], reg[n], reg[k] = wm, wn, 16
        t = RTile(**_base(fa, "tiled"), reg=reg, l1=l1, l2=list(l1), vector_lanes=8,
                  threads=warps * dev.gpu.warp_size, stages=stages, tensor_core=tc.WMMA)
        try:
            tc.validate_tile(fa, t, dev)
        except UnsupportedError:
            continue  # not a valid tensor-core tile for this shape: not a candidate
        t.smem_bytes = tc.smem_bytes(fa, t)
        if t.smem_bytes > cap:
            continue
        t.notes.append(f"tensor cores: block {bm}x{bn}x{bk}, warp {wm}x{wn} in 16x16x16 "
                       f"fragments, {stages}-stage pipeline")
        predict_tiled(fa, dev, t)
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
    if rows * 2 >= dev.num_units or red < 64 * threads or fa.producers:
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
