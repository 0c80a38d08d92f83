"""Micro-performance model: an rTile's latency from its traffic per level, compute and parallelism.

Every term is a time in seconds computed from the device model's (calibrated or preset) constants;
the prediction is the largest term of the busiest core, and the rTile records which term bounds it.
The compute term's rate per register tile comes from the calibration's micro-kernel table
(``CpuTraits.tile_gflops``) when the device has one.
"""
from __future__ import annotations

import math
from typing import Dict, Optional

from tvm_roller.analysis import FuncAnalysis
from tvm_roller.analysis.traffic import (accumulator_registers, num_tiles, output_bytes,
                                         register_bytes, register_loads)
from tvm_roller.core.estimate import finish
from tvm_roller.core.rtile import RTile, ceil_div
from tvm_roller.hardware import DeviceModel

TASK_OVERHEAD_S = 2e-7  # per parallel task (loop bookkeeping, cache warm-up)
LAUNCH_OVERHEAD_S = 3e-6  # entering a parallel region
_TASK_WORKSPACE_S = 7e-7  # allocating and freeing a task's accumulator workspace (DEP:2, 32 tasks)
_STACK_BYTES = 1024  # TVM keeps smaller local buffers on the stack
# measured rates within this of the best are the best (repeat-to-repeat noise of the table)
_RATE_NOISE = 0.03
_SHARED_FILL = 0.5  # of the shared cache a function's data may use and still be re-read there
_FILL = 0.5  # of a private cache one operand's slice may take and still be reused there


def _slice(acc, tile) -> int:
    """Bytes of one operand a tile touches."""
    return acc.footprint(tuple(tile)) * acc.bytes_per_elem


def _reloads(acc, nested, capacity: float) -> float:
    """Bytes of ``acc`` read into a level of ``capacity``: (count, tile) pairs from the largest
    tile down; the first whose slice fits is what the level holds (the last one regardless)."""
    for count, tile in nested:
        if _slice(acc, tile) <= capacity:
            return count * _slice(acc, tile)
    count, tile = nested[-1]
    return count * _slice(acc, tile)


def _issue_cycles(dev: DeviceModel, n_acc: int, loads: int) -> float:
    """Cycles per reduction step of a register tile when FMAs and loads issue in parallel."""
    return max(n_acc / dev.cpu.fma_per_cycle, loads / dev.cpu.loads_per_cycle)


def _measured_rate(table: Dict[str, float], rows: int, vectors: int) -> Optional[float]:
    """One core's measured GFLOP/s for a ``rows`` x ``vectors`` register tile, linear in rows
    between the measured tiles of the same width (clamped at the ends), None when the table
    has no tile of that width."""
    vectors = min(vectors, max(int(k.split("x")[1]) for k in table))
    col = sorted((int(k.split("x")[0]), g) for k, g in table.items()
                 if int(k.split("x")[1]) == vectors)
    if not col:
        return None
    if rows <= col[0][0]:
        return col[0][1] * rows / col[0][0]  # fewer rows than measured: latency-bound, linear
    for (r0, g0), (r1, g1) in zip(col, col[1:]):
        if r0 <= rows <= r1:
            return g0 + (g1 - g0) * (rows - r0) / (r1 - r0)
    return col[-1][1]


def micro_kernel_efficiency(fa: FuncAnalysis, dev: DeviceModel, reg, lanes: int, n_acc: int,
                            loads: int) -> float:
    """Share of one core's peak the register micro-kernel reaches (before partial vectors).

    Calibrated (``CpuTraits.tile_gflops``): the measured rate of a GEMM micro-kernel of the same
    rows x vectors over the best measured tile, scaled down when this tile issues more loads per
    step than that GEMM kernel (a broadcast per row and one load per vector). Otherwise: enough
    independent accumulators to hide the FMA latency (``fma_chains``) and loads that keep up."""
    traits = dev.cpu
    v = fa.vector_axis
    table = traits.tile_gflops
    if table and v is not None:
        vectors = ceil_div(reg[v], lanes)
        rows = max(1, n_acc // vectors)
        rate = _measured_rate(table, rows, vectors)
        if rate is not None:
            gemm = _issue_cycles(dev, n_acc, rows + vectors)
            peak = (1.0 - _RATE_NOISE) * max(table.values())
            return min(1.0, rate / peak) * min(1.0, gemm / _issue_cycles(dev, n_acc, loads))
    eff_latency = min(1.0, n_acc / traits.fma_chains)
    eff_load = min(1.0, (n_acc / traits.fma_per_cycle) / max(loads / traits.loads_per_cycle, 1e-9))
    return eff_latency * eff_load


def predict_tiled(fa: FuncAnalysis, dev: DeviceModel, t: RTile) -> RTile:
    """Fill ``t.predicted_s``, ``t.bound`` and ``t.terms`` for a tiled (reuse-heavy) rTile."""
    lanes = t.vector_lanes
    cores = dev.num_units
    reg, l1, l2 = list(t.reg), list(t.l1), list(t.l2)
    S = fa.spatial
    tasks = num_tiles(fa, l2, S)
    waves = ceil_div(tasks, cores)
    busy = min(tasks, cores)

    # compute: FMAs of the padded iteration space at the micro-kernel's efficiency
    padded = math.prod(ceil_div(a.extent, reg[i]) * reg[i] if a.kind == "S" else a.extent
                   for i, a in enumerate(fa.axes))
    n_acc = accumulator_registers(fa, reg, lanes)
    loads = register_loads(fa, reg, lanes)
    v = fa.vector_axis
    eff_simd = 1.0
    if v is not None:
        eff_simd = min(reg[v], lanes) / lanes if reg[v] < lanes else 1.0
    else:
        eff_simd = 1.0 / lanes
    eff = max(1e-3, micro_kernel_efficiency(fa, dev, reg, lanes, n_acc, loads) * eff_simd)
    peak_core = dev.peak_per_unit(fa.dtype) * 1e9
    compute = 2.0 * padded / (peak_core * eff) / busy * (waves * busy / tasks if tasks else 1.0)

    # traffic per level, per core (private caches) or in total (shared levels)
    tiles_reg = num_tiles(fa, reg, S)
    red_steps = math.prod(a.extent for a in fa.axes if a.kind == "R")
    steps_reg = tiles_reg * red_steps
    bytes_l1 = steps_reg * register_bytes(fa, reg, lanes)
    # the accumulators are loaded and stored once per reduction chunk of the L1 tile when the
    # task's tile accumulates in cache (once in all when they stay in registers)
    chunks = 1 if t.acc_level == "reg" else num_tiles(fa, l1, fa.reduction)
    bytes_l1 += tiles_reg * chunks * 2 * output_bytes(fa, reg)
    L1, L2 = dev.levels[0], dev.levels[1]
    # Each operand is re-read from the level below once per tile of the largest tile whose
    # slice of it fits the level (half of it: ROLLER's fill): into L2 from the task tile down,
    # into L1 from the L1 tile down, then the register tile over its reduction chunk, or the
    # register tile every step (a convolution's whole window kept in registers over a filter
    # slice that fits nowhere).
    chunk = [r if a.kind == "S" else c for a, r, c in zip(fa.axes, reg, l1)]
    bytes_l2 = bytes_l3 = 0
    # an output tile is read and written back, once per register tile
    for accesses, per_step, ways in ((fa.reads, red_steps, 1), (fa.writes, 1, 2)):
        for acc in accesses:
            nested = [(num_tiles(fa, l2), l2), (num_tiles(fa, l1), l1),
                      (num_tiles(fa, chunk), chunk), (tiles_reg * per_step, reg)]
            bytes_l2 += ways * _reloads(acc, nested[1:], _FILL * L1.capacity_bytes)
            bytes_l3 += ways * _reloads(acc, nested, _FILL * L2.capacity_bytes)
    unique = sum(acc.footprint(tuple(a.extent for a in fa.axes)) * acc.bytes_per_elem
                 for acc in fa.reads + fa.writes)
    shared = [lv for lv in dev.levels[2:]]
    # the data is re-read from the shared cache only if it stays there: a working set near its
    # capacity is evicted by everything else (the other cores' tiles, the stack, the OS)
    outer = shared[0] if shared and unique <= _SHARED_FILL * shared[0].capacity_bytes \
        else dev.dram
    per_core = waves / tasks if tasks else 1.0  # fraction of the work the busiest core does
    terms: Dict[str, float] = {
        "compute": compute,
        "L1": bytes_l1 * per_core / (L1.bandwidth_gbs * 1e9),
        "L2": bytes_l2 * per_core / (L2.bandwidth_gbs * 1e9),
        outer.name: bytes_l3 / (outer.bandwidth_gbs * 1e9 * (1 if outer.shared else busy)),
        # every byte once, from where the data lives between calls (a timed loop or the
        # previous op leaves a function that fits the shared cache there; the name is the
        # cold case's, kept for stored datasets)
        "DRAM-once": unique / (outer.bandwidth_gbs * 1e9),
    }
    # a task's accumulator tile in cache is a workspace TVM allocates per task (on the heap
    # above 1 KiB: TVMBackendAllocWorkspace)
    per_task = TASK_OVERHEAD_S
    if t.acc_level != "reg" and output_bytes(fa, l2) > _STACK_BYTES:
        per_task += _TASK_WORKSPACE_S
    return finish(t, terms, (LAUNCH_OVERHEAD_S, per_task * waves), tasks)


def predict_streaming(fa: FuncAnalysis, dev: DeviceModel, t: RTile, bytes_moved: int,
                      flops: float) -> RTile:
    """Memory-bound kinds (reductions, elementwise): traffic over the level that holds the data."""
    cores = min(dev.num_units, max(1, t.num_tasks))
    src = next((lv for lv in dev.levels[1:] if bytes_moved <= lv.capacity_bytes *
                (1 if lv.shared else cores)), dev.dram)
    bw = src.bandwidth_gbs * 1e9 * (1 if src.shared else cores)
    eff_simd = 1.0 if t.vector_lanes > 1 else 1.0 / max(1, dev.simd_lanes(fa.dtype))
    terms = {
        src.name: bytes_moved / bw,
        "compute": flops / (dev.peak_per_unit(fa.dtype) * 1e9 * cores * eff_simd),
    }
    return finish(t, terms, (LAUNCH_OVERHEAD_S,))
