"""ROLLER construction for convolutions (a windowed input and a filter, see analysis.conv).

Every convolution — 1-D and 2-D, strided (patchify), grouped, depthwise, any window — gets a
register tile over output positions x output channels chosen by register-level reuse, and
keeps its accumulators in registers over the whole window (``acc_level="reg"``):

* register tile: among the tiles whose accumulators and loads fit the vector register file,
  first those whose input lines do not overflow one L1 set (a stride-2 window over 512
  channels puts neighbouring outputs' inputs a page apart), then the best micro-kernel
  efficiency (latency-hiding accumulators, loads within the load ports, as the micro-model
  counts, less the work a partial tail tile wastes), exact divisors before predicated tails,
  the most multiply-adds per load (ROLLER's register-level reuse score), the most
  accumulators; equal reuse prefers the axis that walks the input most contiguously (output
  width before height), so a depthwise convolution is vectorized over channels and
  register-blocked over output width.
* the reduction (ry · rx · rc) runs whole inside the register tile, so the accumulators are
  loaded and stored once per output tile (a K-chunked GEMM schedule re-reads them per chunk;
  measured 1.4x slower on ResNet-50's convolutions).
* L1/L2 (ROLLER's choice of the operand that stays): when the whole filter fits in half of
  L2, *input-stationary* (a tile of output positions meets every channel tile while its input
  window sits in L1; tasks are rows of outputs); otherwise *weight-stationary* (a channel
  tile's filter slice sweeps all of a task's output positions; tasks split the channels,
  then the positions until the task's input window takes at most a quarter of L2).
* tasks: split until every core has several, in multiples of the tiles that divide the axes.
"""
from __future__ import annotations

import itertools
import math
from typing import List

from tvm_roller.analysis import FuncAnalysis
from tvm_roller.analysis.traffic import accumulator_registers, register_loads
from tvm_roller.backends.cpu.perf_model import micro_kernel_efficiency, predict_tiled
from tvm_roller.backends.cpu.policy import construct_tiled
from tvm_roller.core.rtile import RTile, ceil_div, padding_waste
from tvm_roller.hardware import DeviceModel

_REG_LIMIT = 32  # largest register-tile size along a non-vector axis (the register file
# bounds it anyway)
_TAIL_WASTE = 0.1
# A register tile that does not divide its axis leaves a predicate (``T.where``) on the update
# of a convolution (pad_einsum does not take windows): LLVM then keeps the accumulators in memory.
# Measured 28 vs 94 GFLOP/s (docs/history.md, "Irregular extents"); DIL:0 (109 outputs a row)
# ran at 40 GFLOP/s with a 5-wide predicated tile.
PREDICATED_RATE = 0.3
# L1 geometry the set-conflict check assumes: 64-byte lines, addresses a page apart share a set,
# 8 ways (every current x86 L1D has at least 8; cpu.py's transposes use the same page rule)
_LINE_BYTES, _SET_ALIAS_BYTES, _L1_WAYS = 64, 4096, 8
_TASKS_PER_CORE = 4  # enough tasks to balance cores (and absorb interference)
_MIN_TASK_FLOPS = 5e5  # a task below this much work costs more to start than it balances
L2_FILL = 0.5
_RIVALS = 3  # generic tiles the convolution's own tile is compared with
_RIVAL_MARGIN = 0.15  # how much faster a generic tile must be predicted to be ranked first


def _divisors(n: int, limit: int) -> List[int]:
    return [d for d in range(1, min(n, limit) + 1) if n % d == 0]


def _vector_sizes(extent: int, lanes: int) -> List[int]:
    if extent < lanes:
        return [extent]
    sizes = [m * lanes for m in (1, 2, 3, 4) if extent % (m * lanes) == 0]
    if sizes:
        return sizes
    # not a multiple of the lanes (24 channels): the largest divisor within 4 vectors, its
    # last vector partly filled, rather than a predicated tail
    return [max(_divisors(extent, 4 * lanes))]


def _position_sizes(extent: int) -> List[int]:
    """Register-tile sizes along an output-position axis: divisors, and sizes whose last tile
    is partial (a predicate on the tail) when that wastes at most ``_TAIL_WASTE`` of the
    axis: a prime length (wav2vec2's 199) is not left with a one-position tile."""
    return [d for d in range(1, min(extent, _REG_LIMIT) + 1)
            if extent % d == 0 or padding_waste(extent, d) <= _TAIL_WASTE]


def _same_set_lines(fa: FuncAnalysis, reg, positions: List[int]) -> int:
    """The most input lines one reduction step of the register tile reads that map to one L1
    set (addresses a multiple of ``_SET_ALIAS_BYTES`` apart). A stride-2 window over 512
    channels puts neighbouring outputs' inputs 4 KiB apart: a 13-position tile then needs 13
    lines of one 8-way set at once, and they evict each other (measured 12% slower than a
    3-position tile)."""
    worst = 1
    for acc in fa.reads:
        strides = [acc.stride_of_axis(i) * acc.bytes_per_elem for i in positions]
        if not any(strides):
            continue
        sets = {}
        for point in itertools.product(*[range(reg[i]) for i in positions]):
            off = sum(p * st for p, st in zip(point, strides))
            line = off // _LINE_BYTES
            key = (off % _SET_ALIAS_BYTES) // _LINE_BYTES
            sets.setdefault(key, set()).add(line)
        worst = max(worst, max(len(v) for v in sets.values()))
    return worst


def _contiguity(fa: FuncAnalysis, axis: int) -> int:
    """How far one step of ``axis`` moves the windowed input (smaller: more contiguous)."""
    strides = [acc.stride_of_axis(axis) for acc in fa.reads]
    moved = [s for s in strides if s]
    return min(moved) if moved else 0


def register_tile(fa: FuncAnalysis, dev: DeviceModel, lanes: int) -> List[int]:
    v = fa.vector_axis
    nregs = dev.num_vector_registers
    options = []
    for i, a in enumerate(fa.axes):
        if a.kind == "R" or a.extent == 1:
            options.append([1])
        elif i == v:
            options.append(_vector_sizes(a.extent, lanes))
        else:
            options.append(_position_sizes(a.extent))
    # non-vector spatial axes ranked by contiguity: the most contiguous is preferred on ties
    order = sorted((i for i in fa.spatial if i != v),
                   key=lambda i: (_contiguity(fa, i), -i))
    best, best_key = None, None
    for reg in itertools.product(*options):
        n_acc = accumulator_registers(fa, reg, lanes)
        vec_loads = ceil_div(reg[v], lanes)
        if n_acc + vec_loads + 2 > nregs:
            continue
        loads = register_loads(fa, reg, lanes)
        eff = micro_kernel_efficiency(fa, dev, reg, lanes, n_acc, loads)
        simd = min(reg[v], lanes) / lanes
        # the work a partial last tile wastes (a divisor wastes none)
        simd *= math.prod(a.extent / (ceil_div(a.extent, r) * r) for a, r in zip(fa.axes, reg))
        # blocking concentrated on the preferred (contiguous) axes
        spread = tuple(reg[i] for i in order)
        exact = all(a.extent % r == 0 for a, r in zip(fa.axes, reg))  # no predicated tail
        if not exact:  # the tail's predicate sits in every iteration of the micro-kernel
            eff *= PREDICATED_RATE
        alias_ok = _same_set_lines(fa, reg, order) < _L1_WAYS
        key = (alias_ok, round(eff * simd, 2), exact, round(n_acc * min(reg[v], lanes) / loads, 3), n_acc,
               spread)
        if best_key is None or key > best_key:
            best, best_key = list(reg), key
    return best


def _split_tasks(fa: FuncAnalysis, cur: List[int], unit: List[int], order: List[int],
                 cores: int) -> List[int]:
    """Split the task tile ``cur`` along ``order`` (in multiples of ``unit`` that divide the
    axes) until there are enough tasks, keeping each task worth starting."""
    want = _TASKS_PER_CORE * cores
    red = math.prod(a.extent for a in fa.axes if a.kind == "R")

    def tasks(t):
        return math.prod(ceil_div(fa.axes[i].extent, t[i]) for i in fa.spatial)

    cur = list(cur)
    for i in order:
        while tasks(cur) < want:
            smaller = _smaller(fa, i, cur[i], unit[i])
            if not smaller:
                break
            nxt = list(cur)
            nxt[i] = smaller
            work = 2.0 * red * math.prod(nxt[j] for j in fa.spatial)
            if work < _MIN_TASK_FLOPS and tasks(cur) >= cores:
                break
            cur = nxt
    return cur


def _smaller(fa: FuncAnalysis, i: int, cur: int, unit: int) -> int:
    """The next smaller multiple of ``unit`` below ``cur`` that divides axis ``i`` (0: none)."""
    n_units = ceil_div(fa.axes[i].extent, unit)
    return next((m * unit for m in range(cur // unit - 1, 0, -1) if n_units % m == 0), 0)


def _bytes(fa: FuncAnalysis, tile: List[int], which: str) -> int:
    """Bytes of the windowed input ("input") or of the filter ("filter") a tile touches."""
    win = {acc.buffer for acc in fa.reads if any(
        d.coeffs and any(c and fa.axes[i].kind == "S" for i, c in enumerate(d.coeffs)) and
        any(c and fa.axes[i].kind == "R" for i, c in enumerate(d.coeffs)) for d in acc.dims)}
    return sum(acc.footprint(tuple(tile)) * acc.bytes_per_elem for acc in fa.reads
               if (acc.buffer in win) == (which == "input"))


def vector_width(extent: int, lanes: int) -> int:
    """The vector width for a vector axis of ``extent``: the full SIMD width, or a half or a
    quarter of it when that divides the axis and the full one does not (24 channels: three
    8-lane vectors; a 16-lane tile would end in a predicated partial vector, measured 20x
    slower on MobileNetV2's 96->24 projection)."""
    if extent < lanes or extent % lanes == 0:
        return lanes
    return next((w for w in (lanes // 2, lanes // 4) if w >= 4 and extent % w == 0), lanes)


def construct_conv(fa: FuncAnalysis, dev: DeviceModel, topk: int = 1) -> List[RTile]:
    v = fa.vector_axis
    lanes = vector_width(fa.axes[v].extent, dev.simd_lanes(fa.dtype))
    reg = register_tile(fa, dev, lanes)
    red = math.prod(a.extent for a in fa.axes if a.kind == "R")
    if reg is None:
        return construct_tiled(fa, dev, topk)
    # tasks are whole register tiles: an axis the register tile does not divide is covered by
    # its multiple (the lowering splits the task tile into register tiles exactly)
    full = [ceil_div(a.extent, r) * r if a.kind == "S" else a.extent
            for a, r in zip(fa.axes, reg)]
    cap = dev.levels[1].capacity_bytes * L2_FILL
    positions = [i for i in fa.spatial if i != v]
    if _bytes(fa, full, "filter") + _bytes(fa, [reg[i] if i in positions else e
                                               for i, e in enumerate(full)], "input") <= cap:
        # input-stationary: a tile of output positions meets every channel tile while its
        # input window sits in L1; the whole filter stays in L2; tasks are rows of outputs
        stationary = "input"
        l1 = [e if a.kind == "R" or i == v else reg[i] for i, (a, e) in
              enumerate(zip(fa.axes, full))]
        l2 = _split_tasks(fa, full, l1, positions + [v], dev.num_units)
    else:
        # weight-stationary: one channel tile's filter slice is swept over all the task's
        # output positions (read once from memory, then from L2); tasks split the channels
        stationary = "filter"
        l1 = [reg[i] if i == v else e for i, e in enumerate(full)]
        l2 = _split_tasks(fa, full, reg, [v] + positions, dev.num_units)
        # the task's input window must stay in L2 beside the slice (a quarter of L2 for it):
        # fewer positions per task
        while _bytes(fa, l2, "input") > cap / 2:
            i = next((i for i in positions if _smaller(fa, i, l2[i], reg[i])), None)
            if i is None:
                break
            l2[i] = _smaller(fa, i, l2[i], reg[i])
        l1 = [l2[i] if i in positions else e for i, e in enumerate(l1)]
    notes = [f"convolution (sliding window, {len(fa.reads)} inputs): accumulators in registers "
             f"over the whole window ({red} steps)",
             f"register tile {dict((a.name, reg[i]) for i, a in enumerate(fa.axes) if reg[i] > 1)}"
             f": {accumulator_registers(fa, reg, lanes)} accumulators, "
             f"{register_loads(fa, reg, lanes)} loads per step",
             f"{stationary}-stationary: the " + ("filter stays in L2, tiles of output positions "
             "sweep every channel tile" if stationary == "input" else "filter slice of a channel "
             "tile is swept over all the task's output positions")]
    if fa.axes[v].extent < lanes:
        notes.append(f"vector axis {fa.axes[v].name} ({fa.axes[v].extent}) shorter than {lanes} "
                     "lanes: taken whole, partly filled vectors")
    t = RTile(kind="tiled", axes=[a.name for a in fa.axes], extents=[a.extent for a in fa.axes],
              axis_kinds="".join(a.kind for a in fa.axes), reg=list(reg), l1=l1, l2=l2,
              vector_axis=v, vector_lanes=lanes, acc_level="reg", notes=notes)
    predict_tiled(fa, dev, t)
    # the generic GEMM-style tiles compete: the micro-model picks, the convolution's own tile
    # first unless another is predicted clearly faster (a spilling window, a filter that
    # streams from memory)
    rest = [r for r in construct_tiled(fa, dev, max(topk, _RIVALS)) if r.key() != t.key()]
    if rest and rest[0].predicted_s < (1.0 - _RIVAL_MARGIN) * t.predicted_s:
        t.notes.append(f"a generic tile is predicted {t.predicted_s / rest[0].predicted_s:.2f}x "
                       "faster: ranked first")
        return (rest[:1] + [t] + rest[1:])[:topk]
    return ([t] + rest)[:topk]
