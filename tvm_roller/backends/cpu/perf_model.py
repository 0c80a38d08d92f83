"""Micro-performance model: an rTile's latency from its traffic per level, compute and parallelism.

Every term is a time in seconds computed from the device model's (calibrated or preset) constants;
the prediction is the largest term of the busiest core, and the rTile records which term bounds it.
"""
from __future__ import annotations

import math
from typing import Dict

from tvm_roller.analysis import FuncAnalysis
from tvm_roller.analysis.traffic import (accumulator_registers, input_bytes, num_tiles,
                                         output_bytes, register_loads)
from tvm_roller.core.estimate import finish
from tvm_roller.core.rtile import RTile, ceil_div
from tvm_roller.hardware import DeviceModel
from tvm_roller.hardware.model import DTYPE_BYTES

_TASK_OVERHEAD_S = 2e-7  # per parallel task (loop bookkeeping, cache warm-up)
_LAUNCH_OVERHEAD_S = 3e-6  # entering a parallel region


def predict_tiled(fa: FuncAnalysis, dev: DeviceModel, t: RTile) -> RTile:
    """Fill ``t.predicted_s``, ``t.bound`` and ``t.terms`` for a tiled (reuse-heavy) rTile."""
    lanes = t.vector_lanes
    cores = dev.num_units
    elem = DTYPE_BYTES.get(fa.dtype, 4)
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
    chains = dev.cpu.fma_chains  # independent FMAs in flight to hide latency
    fma_per_cycle = dev.cpu.fma_per_cycle
    load_per_cycle = dev.cpu.loads_per_cycle
    eff_latency = min(1.0, n_acc / chains)
    eff_load = min(1.0, (n_acc / fma_per_cycle) / max(loads / load_per_cycle, 1e-9))
    v = fa.vector_axis
    eff_simd = 1.0
    if v is not None:
        eff_simd = min(reg[v], lanes) / lanes if reg[v] < lanes else 1.0
    else:
        eff_simd = 1.0 / lanes
    eff = max(1e-3, eff_latency * eff_load * eff_simd)
    peak_core = dev.peak_per_unit(fa.dtype) * 1e9
    compute = 2.0 * padded / (peak_core * eff) / busy * (waves * busy / tasks if tasks else 1.0)

    # traffic per level, per core (private caches) or in total (shared levels)
    steps_reg = num_tiles(fa, reg, S) * math.prod(a.extent for a in fa.axes if a.kind == "R")
    bytes_l1 = steps_reg * loads * lanes * elem if v is not None else steps_reg * loads * elem
    n1 = num_tiles(fa, l1)
    bytes_l2 = n1 * (input_bytes(fa, l1) + 2 * output_bytes(fa, l1))
    n2 = num_tiles(fa, l2)
    bytes_l3 = n2 * (input_bytes(fa, l2) + 2 * output_bytes(fa, l2))
    unique = sum(acc.footprint(tuple(a.extent for a in fa.axes)) * acc.bytes_per_elem
                 for acc in fa.reads + fa.writes)
    L1, L2 = dev.levels[0], dev.levels[1]
    shared = [lv for lv in dev.levels[2:]]
    outer = shared[0] if shared and unique <= shared[0].capacity_bytes else dev.dram
    per_core = waves / tasks if tasks else 1.0  # fraction of the work the busiest core does
    terms: Dict[str, float] = {
        "compute": compute,
        "L1": bytes_l1 * per_core / (L1.bandwidth_gbs * 1e9),
        "L2": bytes_l2 * per_core / (L2.bandwidth_gbs * 1e9),
        outer.name: bytes_l3 / (outer.bandwidth_gbs * 1e9 * (1 if outer.shared else busy)),
        "DRAM-once": unique / (dev.dram.bandwidth_gbs * 1e9),
    }
    return finish(t, terms, (_LAUNCH_OVERHEAD_S, _TASK_OVERHEAD_S * waves), tasks)


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
    return finish(t, terms, (_LAUNCH_OVERHEAD_S,))
