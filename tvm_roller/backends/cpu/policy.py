"""The CPU's ROLLER construction: grow an rTile level by level by data-reuse score, scale out.

Scale-up: from an aligned unit tile, repeatedly enlarge the axis whose next aligned size has the
best reuse score S_i = (Q(T) - Q(T'_i)) / (F(T'_i) - F(T)) (Q: traffic into the level, F: the
tile's footprint in it) while the tile still fits the level. Registers first, then L1, then L2.
Scale-out: shrink per-core tiles (lowest reuse first) until every core has work, keeping the
number of tasks a good multiple of the core count (wave quantization). Candidates along the way
are ranked by the micro-model; the whole construction is deterministic.
"""
from __future__ import annotations

import dataclasses
import itertools
import math
from typing import List, Optional, Sequence, Tuple

from tvm_roller.analysis import FuncAnalysis
from tvm_roller.analysis.traffic import (accumulator_registers, input_bytes, num_tiles,
                                         output_bytes, param_bytes, register_loads)
from tvm_roller.backends.cpu.pack_policy import with_panel_packing
from tvm_roller.backends.cpu.perf_model import predict_streaming, predict_tiled
from tvm_roller.analysis.constants import constant_operand
from tvm_roller.core.growth import grow_by_reuse
from tvm_roller.core.rtile import (RTile, aligned_steps, ceil_div, padding_waste,
                                   worst_padding_waste)
from tvm_roller.hardware import DeviceModel
from tvm_roller.hardware.model import DTYPE_BYTES

Tile = Tuple[int, ...]
L1_FILL = 0.5  # of L1 a tile may use: the rest holds the accumulator stream and stray lines
L2_FILL = 0.5
# ROLLER's alignment epsilon: a register tile that does not divide its axis is allowed when
# padding the axis up to a multiple of it wastes at most this fraction of the axis. The lowering
# pads the main block (``pad_einsum``: zero-filled input copies, the padded output rows dropped in
# the write-back), so the hot loop keeps no predicate (a predicated tail inside the unrolled
# micro-kernel measured 28 GFLOP/s for a 6x64 tile vs 94 exact). Only for einsum-like main blocks
# (every index one axis: matmuls, batch matmuls); others (convolutions) keep exact divisors.
# Cache (L1/L2/task) tiles divide the padded extent. See docs/history.md "Irregular extents".
PAD_EPS = 0.10
REG_PAD_EPS = PAD_EPS
# The same for a reduction axis with no L1-sized chunk that divides it (K = 1,214 = 2 x 607:
# the only chunk was the whole K, whose A rows outgrow L1, 76 GFLOP/s; padded to 1,216 for
# 32-long chunks, zero-filled: 153). A smaller epsilon: every padded step is a whole K-step.
RED_PAD_EPS = 0.02
_TIE = 0.02  # predictions this close to the best are ranked as equal (the model's precision)


def einsum_like(fa: FuncAnalysis) -> bool:
    """Every buffer index of the main block is one block axis or a constant (matmul, batch
    matmul): the block can be padded with ``pad_einsum``."""
    for acc in fa.reads + fa.writes:
        for d in acc.dims:
            if d.coeffs is None or d.extent != 1 or sum(1 for c in d.coeffs if c) > 1 or \
                    any(c not in (0, 1) for c in d.coeffs):
                return False
    return True


def padded_extents(fa: FuncAnalysis, reg: Sequence[int]) -> List[int]:
    """Each axis rounded up to a multiple of the register tile (reduction axes unchanged)."""
    return [padded_extents_of(a.extent, r) if a.kind == "S" else a.extent
            for a, r in zip(fa.axes, reg)]


def padded_extents_of(extent: int, reg: int) -> int:
    """A spatial axis of ``extent`` rounded up to a multiple of its register tile ``reg``."""
    return ceil_div(extent, reg) * reg


def _divisor_step(padded: int, unit: int, at_most: int) -> int:
    """The largest multiple of ``unit`` that is <= ``at_most`` and divides ``padded``."""
    for m in range(max(1, at_most // unit), 0, -1):
        if padded % (m * unit) == 0:
            return m * unit
    return unit


def _register_level(fa: FuncAnalysis, dev: DeviceModel, lanes: int, notes: List[str],
                    eps: float = 0.0) -> List[Tile]:
    v = fa.vector_axis
    nregs = dev.num_vector_registers
    steps: List[List[int]] = []
    start = []
    for i, a in enumerate(fa.axes):
        if a.kind == "R" or a.extent == 1:
            steps.append([1]); start.append(1)
        elif i == v:
            if a.extent >= lanes:
                # eps 0 (the exact candidates): only whole vectors dividing the axis rounded
                # to the lanes, so no padding beyond the last partial vector
                sizes = aligned_steps(ceil_div(a.extent, lanes) * lanes, lanes, limit=4 * lanes,
                                      eps=1.0 if eps > 0 else 0.0, multiples=(1, 2, 3, 4))
                notes.append(f"vector axis {a.name}: register tile a multiple of {lanes} "
                             f"{fa.dtype} lanes (one vector register)")
            else:
                sizes = [a.extent]
                notes.append(f"vector axis {a.name} ({a.extent}) shorter than {lanes} lanes: "
                             "taken whole, partly filled vectors")
            steps.append(sizes); start.append(sizes[0])
        else:  # sizes that tile the axis evenly (or nearly), so no predicate in the kernel
            steps.append(aligned_steps(a.extent, 1, limit=16, eps=eps,
                                       multiples=tuple(range(1, 17))))
            start.append(steps[-1][0])
    start = tuple(start)
    total_steps = 1
    for a in fa.axes:
        if a.kind == "R":
            total_steps *= a.extent

    def q(t: Tile) -> float:  # loads from L1 over the whole computation
        return num_tiles(fa, t, fa.spatial) * total_steps * register_loads(fa, t, lanes)

    def f(t: Tile) -> float:  # registers held
        return accumulator_registers(fa, t, lanes) + register_loads(fa, t, lanes)

    def fits(t: Tile) -> bool:
        vec_loads = ceil_div(t[v], lanes) if v is not None else 0
        return accumulator_registers(fa, t, lanes) + vec_loads + 2 <= nregs

    path = grow_by_reuse(start, steps, q, f, fits)
    return path[-3:]


def _register_candidates(fa: FuncAnalysis, dev: DeviceModel, lanes: int, notes: List[str],
                         eps: float) -> List[Tuple[Tile, float]]:
    """(register tile, reduction-chunk epsilon) pairs: the ``eps``-padded growth's tiles and,
    when ``eps`` > 0, the exact growth's largest (dividing its axes; chunks dividing K when
    the rows it holds over a whole K fit L1). Only the largest: the smaller exact tiles (one
    row, one vector) are where the model's compute term is least accurate (485×528×913: a 1×48
    tile predicted 2.9 ms, measured 4.6)."""
    red_eps = RED_PAD_EPS if eps > 0 else 0.0
    out = [(reg, red_eps) for reg in _register_level(fa, dev, lanes, notes, eps)]
    if eps > 0:
        cap = dev.levels[0].capacity_bytes * L1_FILL
        out += [(reg, 0.0 if _held_rows_fit(fa, reg, cap) else red_eps)
                for reg in _register_level(fa, dev, lanes, [], 0.0)[-1:]]
    return list(dict.fromkeys(out))


def _held_rows_fit(fa: FuncAnalysis, reg: Tile, cap_bytes: float) -> bool:
    """Whether the operands a register tile reuses across the vector axis (A's rows, held in L1
    while B streams) fit ``cap_bytes`` over the whole reduction: only then is a chunk of all of
    K (a prime K's only exact one) as fast as padded chunks (96×1214×64: A's six rows over all
    of K outgrew L1, 76 GFLOP/s; padded to 32-long chunks, 153)."""
    tile = tuple(a.extent if a.kind == "R" else r for a, r in zip(fa.axes, reg))
    held = sum(acc.footprint(tile) * acc.bytes_per_elem for acc in fa.reads
               if fa.vector_axis not in acc.axes_used())
    return held <= cap_bytes


def _cache_level(fa: FuncAnalysis, base: Tile, cap_bytes: float, grow_reduction: bool,
                 lanes: int, line_elems: int, fixed_red: Optional[Tile] = None,
                 padded: Optional[Sequence[int]] = None, red_eps: float = 0.0) -> List[Tile]:
    """Grow spatial multiples of ``base`` (and, at L1, reduction chunks) within ``cap_bytes``;
    spatial sizes divide the (register-padded) extent, reduction chunks divide the reduction
    axis or pad it by at most ``red_eps``."""
    steps: List[List[int]] = []
    start = list(base)
    inner_red = _innermost_reduction(fa)
    padded = padded or [a.extent for a in fa.axes]
    for i, a in enumerate(fa.axes):
        if a.kind == "S":
            b = base[i]
            sizes = [m * b for m in range(1, ceil_div(padded[i], b) + 1)
                     if padding_waste(padded[i], m * b) == 0]
            steps.append(sorted(set(sizes) | {b}))
        elif grow_reduction:
            unit = line_elems if i == inner_red and a.extent >= line_elems else 1
            steps.append(aligned_steps(a.extent, unit, eps=red_eps,
                                       multiples=tuple(range(1, 257))))
            start[i] = steps[-1][0]
        else:
            steps.append([fixed_red[i]]); start[i] = fixed_red[i]
    start = tuple(start)

    def q(t: Tile) -> float:
        red_chunks = num_tiles(fa, t, fa.reduction)
        return num_tiles(fa, t) * input_bytes(fa, t) + \
            2 * num_tiles(fa, t, fa.spatial) * red_chunks * output_bytes(fa, t)

    def f(t: Tile) -> float:
        return input_bytes(fa, t) + output_bytes(fa, t)

    def fits(t: Tile) -> bool:
        return f(t) <= cap_bytes

    path = grow_by_reuse(start, steps, q, f, fits)
    return path[-2:] if len(path) > 1 else path


def _innermost_reduction(fa: FuncAnalysis) -> Optional[int]:
    for acc in fa.reads:
        ax = acc.innermost_axis()
        if ax is not None and fa.axes[ax].kind == "R":
            return ax
    red = fa.reduction
    return red[-1] if red else None


def _scale_out(fa: FuncAnalysis, l1: Tile, l2: Tile, cores: int,
               padded: Optional[Sequence[int]] = None) -> Tile:
    """Shrink the per-core tile until all cores have work with little wave-quantization loss
    (to sizes that divide the padded extent: no partial task tile)."""
    padded = padded or [a.extent for a in fa.axes]
    def eff(t: Tile) -> float:
        n = num_tiles(fa, t, fa.spatial)
        return n / (ceil_div(n, cores) * cores)

    cur = list(l2)
    # want enough tasks for balance: at least 2 per core when the problem is big enough
    while True:
        n = num_tiles(fa, cur, fa.spatial)
        if n >= cores and eff(tuple(cur)) >= 0.9:
            break
        best = None
        for i in fa.spatial:
            floor = l1[i] if cur[i] > l1[i] else None
            if floor is None:
                continue
            nxt = list(cur)
            nxt[i] = _divisor_step(padded[i], l1[i], max(floor, cur[i] // 2))
            if nxt[i] == cur[i]:
                continue
            # lowest reuse loss first: the axis whose shrink adds the least traffic
            cost = num_tiles(fa, nxt) * input_bytes(fa, nxt)
            key = (eff(tuple(nxt)), -cost, -i)
            if best is None or key > best[0]:
                best = (key, nxt)
        if best is None:
            break
        cur = best[1]
    return tuple(cur)


def _split_l1_for_parallelism(fa: FuncAnalysis, reg: Tile, l1: Tile, cores: int,
                              padded: Optional[Sequence[int]] = None) -> Tile:
    """Small problems: shrink the L1 tile too so that each core gets a tile."""
    padded = padded or [a.extent for a in fa.axes]
    cur = list(l1)
    while num_tiles(fa, cur, fa.spatial) < cores:
        cands = [i for i in fa.spatial if cur[i] > reg[i]]
        if not cands:
            break
        i = max(cands, key=lambda j: (cur[j] // reg[j], -j))
        cur[i] = _divisor_step(padded[i], reg[i], max(reg[i], cur[i] // 2))
    return tuple(cur)


def _dynamic_variants(fa: FuncAnalysis, l1: Tile, l2: Tile) -> List[Tuple[Tile, Tile]]:
    """(l1, l2) with each dynamic axis's padding step (task tile of a spatial axis: multiples
    of the L1 tile; chunk of a reduction: its divisors) taken smaller than the static
    policy's, so the model can weigh padding against reuse (``planner.buckets`` splits a
    bucket that still pads too much)."""
    options = []
    for i in fa.dynamic_axes:
        if fa.axes[i].kind == "S":
            # (multiples of the L1 tile only: the model counts too little for the operand a
            # task of a few rows re-streams, from DRAM once a model's weights outgrow the L3:
            # GPT-2's MLP ran 1.5x slower in the model with 4-row tasks)
            options.append([(l1[i], m * l1[i]) for m in range(1, l2[i] // l1[i] + 1)])
        else:
            options.append([(d, d) for d in range(1, l1[i] + 1) if l1[i] % d == 0])
    out = []
    for choice in itertools.product(*options):
        a, b = list(l1), list(l2)
        for i, (c1, c2) in zip(fa.dynamic_axes, choice):
            a[i], b[i] = c1, c2
        out.append((tuple(a), tuple(b)))
    return out


def _bucket_waste(fa: FuncAnalysis, l1: Tile, l2: Tile) -> float:
    """The largest fraction of extra work the kernel's run-time padding of the dynamic axes
    costs anywhere in the bucket (from its smallest extents to the planned ones)."""
    work = 1.0
    for i, low in zip(fa.dynamic_axes, fa.dynamic_low):
        step = l2[i] if fa.axes[i].kind == "S" else l1[i]
        work *= 1.0 + worst_padding_waste(low, fa.axes[i].extent, step)
    return work - 1.0


def _chunk_notes(fa: FuncAnalysis, l1: Tile) -> List[str]:
    return [f"axis {a.name}: {a.extent} padded to {ceil_div(a.extent, c) * c} for "
            f"{c}-long L1 chunks (waste {padding_waste(a.extent, c):.1%} <= eps "
            f"{RED_PAD_EPS:.0%}): pad_einsum, zero-filled inputs"
            for a, c in zip(fa.axes, l1) if a.kind == "R" and a.extent % c]


def _padding_notes(fa: FuncAnalysis, padded: Sequence[int], eps: float) -> List[str]:
    out = []
    for a, p in zip(fa.axes, padded):
        if p != a.extent:
            w = padding_waste(a.extent, p)
            why = f"<= eps {eps:.0%}" if w <= eps else "whole vectors"
            out.append(f"axis {a.name}: {a.extent} padded to {p} (waste {w:.1%} {why}): "
                       "pad_einsum, zero-filled inputs, no predicate in the micro-kernel")
    return out


def _count_pad_copies(fa: FuncAnalysis, dev: DeviceModel, t: RTile) -> None:
    """Add to ``t``'s prediction the zero-filled input copies its padding makes in every call
    (``pad_einsum``): each padded input read and its padded copy written, at DRAM bandwidth.
    A constant input (a weight) is copied while compiling: free. (An odd K padded for L1
    chunks measured 2.0 ms against 1.6 ms with K unpadded on a 485×528×913 GEMM.)"""
    ext = [a.extent for a in fa.axes]
    padded = [p if a.kind == "S" else padded_extents_of(a.extent, c)  # (chunk-padded K)
              for a, p, c in zip(fa.axes, padded_extents(fa, t.reg), t.l1)]
    copied = 0.0
    for acc in fa.reads:
        used = acc.axes_used()
        if all(padded[i] == ext[i] for i in used) or constant_operand(fa.func, acc.buffer):
            continue
        elems = math.prod(ext[i] for i in used)
        copied += elems * DTYPE_BYTES.get(acc.dtype, 4) * (1.0 + math.prod(
            padded[i] / ext[i] for i in used))
    if copied:
        seconds = copied / (dev.levels[-1].bandwidth_gbs * 1e9)
        t.predicted_s += seconds
        t.notes.append(f"padding copies its inputs in every call: {copied / 1e6:.2f} MB, "
                       f"{seconds * 1e6:.0f} us counted")


def construct_tiled(fa: FuncAnalysis, dev: DeviceModel, topk: int = 1,
                    pad_eps: Optional[float] = None) -> List[RTile]:
    """``pad_eps``: the padding epsilon (default ``PAD_EPS``); 0 keeps exact divisors."""
    lanes = dev.simd_lanes(fa.dtype)
    elem = DTYPE_BYTES.get(fa.dtype, 4)
    line_elems = max(1, dev.levels[0].line_bytes // elem)
    notes: List[str] = []
    eps = PAD_EPS if pad_eps is None else pad_eps
    can_pad = einsum_like(fa)
    if eps > 0 and not can_pad:
        eps = 0.0
        notes.append("padding eps 0: the main block is not einsum-like (tiles divide the axes)")
    cands = {}
    # the padded candidates (ROLLER's epsilon) and the exact ones: padding copies a
    # non-constant input in every call (``_count_pad_copies``), so the model picks between them
    for reg, red_eps in _register_candidates(fa, dev, lanes, notes, eps):
        padded = padded_extents(fa, reg) if can_pad else [a.extent for a in fa.axes]
        l1s = _cache_level(fa, reg, dev.levels[0].capacity_bytes * L1_FILL, True, lanes,
                           line_elems, padded=padded, red_eps=red_eps)
        for l1 in l1s:
            l1 = _split_l1_for_parallelism(fa, reg, l1, dev.num_units, padded)
            l2s = _cache_level(fa, l1, dev.levels[1].capacity_bytes * L2_FILL, False, lanes,
                               line_elems, fixed_red=l1, padded=padded)
            for l2 in l2s:
                l2 = _scale_out(fa, l1, l2, dev.num_units, padded)
                t = RTile(kind="tiled", axes=[a.name for a in fa.axes],
                          extents=[a.extent for a in fa.axes],
                          axis_kinds="".join(a.kind for a in fa.axes),
                          reg=list(reg), l1=list(l1), l2=list(l2),
                          vector_axis=fa.vector_axis, vector_lanes=lanes,
                          notes=list(notes) + _padding_notes(fa, padded, eps)
                          + _chunk_notes(fa, l1))
                predict_tiled(fa, dev, t)
                if can_pad:
                    _count_pad_copies(fa, dev, t)
                cands.setdefault(t.key(), t)
    # ties: less padding first (the pad copies cost more than the model counts), then more
    # accumulators (fewer accumulator loads/stores than the model counts), then less traffic
    def padding(t: RTile) -> int:
        return math.prod(padded_extents(fa, t.reg)) if can_pad else 0

    # Predictions within the model's precision of the best are a tie, broken by less padding,
    # more accumulators, then less traffic in all (the bound hides the other terms: among
    # compute-bound GEMM tiles a 16-long K chunk measured 1.3x slower than a 32-long one)
    best = min(t.predicted_s for t in cands.values())

    def rank(t: RTile) -> tuple:
        if t.predicted_s > (1.0 + _TIE) * best:
            return (1, float(f"{t.predicted_s:.3g}"), t.key())
        return (0, padding(t), -accumulator_registers(fa, t.reg, lanes),
                sum(t.terms.values()), t.key())

    ranked = [with_panel_packing(fa, t) for t in sorted(cands.values(), key=rank)[:max(1, topk)]]
    if not fa.dynamic_axes:
        return ranked
    # a bucket of a function with symbolic extents (``planner.buckets``): each of the best
    # tiles with its dynamic axes' padding step chosen for the bucket, predicted at the
    # bucket's worst-padded size (the planned one scaled by the extra work); the register and
    # L1 tiles, and so the reuse, stay the static policy's
    fitted = [min((_bucket_variant(fa, dev, t, v1, v2) for v1, v2 in
                   _dynamic_variants(fa, tuple(t.l1), tuple(t.l2))),
                  key=lambda v: v.predicted_s) for t in ranked]
    return sorted((with_panel_packing(fa, t) for t in fitted), key=lambda v: v.predicted_s)


def _bucket_variant(fa: FuncAnalysis, dev: DeviceModel, t: RTile, l1: Tile, l2: Tile) -> RTile:
    v = dataclasses.replace(t, l1=list(l1), l2=list(l2), notes=list(t.notes), terms={})
    predict_tiled(fa, dev, v)
    v.bucket_waste = _bucket_waste(fa, l1, l2)
    v.predicted_s *= 1.0 + v.bucket_waste
    v.notes.append(f"bucket padding: the dynamic axes padded at run time waste at most "
                   f"{v.bucket_waste:.0%} in the bucket (counted in the prediction)")
    return v


def construct_streaming(fa: FuncAnalysis, dev: DeviceModel, topk: int = 1) -> List[RTile]:
    """Reductions and elementwise functions: one row-parallel, vectorized schedule."""
    lanes = dev.simd_lanes(fa.dtype)
    rows = 1
    for a in fa.axes:
        if a.kind == "S":
            rows *= a.extent
    bytes_moved = param_bytes(fa)
    volume = 1
    for a in fa.axes:
        volume *= a.extent
    t = RTile(kind=fa.kind, axes=[a.name for a in fa.axes], extents=[a.extent for a in fa.axes],
              axis_kinds="".join(a.kind for a in fa.axes), reg=[1] * len(fa.axes),
              l1=[a.extent for a in fa.axes], l2=[a.extent for a in fa.axes],
              vector_axis=fa.vector_axis, vector_lanes=lanes,
              num_tasks=min(rows, dev.num_units) if rows > 1 else dev.num_units)
    t.notes.append(f"{fa.kind}: rows parallel over {dev.num_units} cores, "
                   f"{lanes}-lane vectors (reductions via rfactor)")
    predict_streaming(fa, dev, t, bytes_moved, float(volume) * len(fa.blocks))
    return [t]
