"""Micro-performance model for the CUDA backend: an rTile's latency from occupancy, waves,
compute, shared-memory, L2 and DRAM traffic.

All constants come from the GPU device model (preset: datasheet figures; no live GPU needed).
Each term is a time in seconds; the prediction is the largest term plus launch overhead, and
the rTile records which term bounds it, as on the CPU.
"""
from __future__ import annotations

import math
from typing import Dict, Sequence

from tvm_roller.analysis import FuncAnalysis
from tvm_roller.analysis.traffic import input_bytes, num_tiles, output_bytes, register_loads
from tvm_roller.core.estimate import finish
from tvm_roller.core.rtile import RTile, ceil_div
from tvm_roller.hardware import DeviceModel
from tvm_roller.hardware.model import DTYPE_BYTES

LAUNCH_S = 3e-6  # kernel launch and tail
# thread-FMAs in flight per SM that saturate its 4 x 32 FP32 lanes (about 4-cycle latency,
# with slack for operand-collector and shared-memory stalls)
_FMAS_IN_FLIGHT = 1024
_MEM_LATENCY_S = 6e-7  # a global load's round trip (L2 hit ~ 0.3 us, DRAM ~ 0.6 us)
_REG_OVERHEAD = 24  # addresses, loop counters, the fetch's staging registers


def estimated_registers(fa: FuncAnalysis, reg: Sequence[int], tensor_core: bool = False) -> int:
    """Registers a thread needs for a register tile ``reg`` (a warp's tile with tensor cores)."""
    acc = math.prod(reg[i] for i in fa.spatial)
    if tensor_core:  # a warp's fragments spread over its 32 lanes (fp32 accumulators)
        acc = acc // 32 + 2 * (reg[fa.spatial[-1]] + reg[fa.spatial[-2]]) // 32 * 4
    return min(255, acc + register_loads(fa, reg, 1) + _REG_OVERHEAD)


def blocks_per_sm(dev: DeviceModel, threads: int, regs: int, smem: int) -> int:
    g = dev.gpu
    by_threads = g.max_threads_per_sm // max(1, threads)
    # registers are allocated per warp in units of 256
    regs_warp = ceil_div(regs * g.warp_size, 256) * 256
    by_regs = g.regs_per_sm // max(1, regs_warp * ceil_div(threads, g.warp_size))
    by_smem = g.smem_per_sm // smem if smem > 0 else 1 << 30
    return max(0, min(g.max_blocks_per_sm, by_threads, by_regs, by_smem))


def predict_tiled(fa: FuncAnalysis, dev: DeviceModel, t: RTile) -> RTile:
    """Fill ``predicted_s``, ``bound`` and ``terms`` of a CUDA tiled rTile."""
    S = fa.spatial
    sms = dev.num_units
    in_elem = max((a.bytes_per_elem for a in fa.reads), default=DTYPE_BYTES.get(fa.dtype, 4))
    nb = num_tiles(fa, t.l1, S)
    regs = estimated_registers(fa, t.reg, bool(t.tensor_core))
    bps = blocks_per_sm(dev, t.threads, regs, t.smem_bytes)
    terms: Dict[str, float] = {}
    if bps == 0:  # does not fit an SM at all
        t.terms, t.bound, t.predicted_s = {"occupancy": float("inf")}, "occupancy", float("inf")
        return t
    waves = ceil_div(nb, sms * bps)
    per_sm = min(bps, ceil_div(nb, sms))  # blocks an SM runs at once
    red_total = math.prod(fa.axes[i].extent for i in fa.reduction)
    chunks = num_tiles(fa, t.l1, fa.reduction)
    padded = math.prod(t.l1[i] for i in S) * red_total
    flops_block = 2.0 * padded
    if t.tensor_core:
        peak_sm = dev.peak_gflops["float16_tc"] * 1e9 / sms
        warps = per_sm * t.threads // dev.gpu.warp_size
        eff = min(1.0, warps / 8)  # 4 sub-cores, two warps each keep the tensor pipes busy
    else:
        peak_sm = dev.peak_gflops.get(fa.dtype, dev.peak_gflops["float32"]) * 1e9 / sms
        acc = math.prod(t.reg[i] for i in S)
        eff = min(1.0, per_sm * t.threads * acc / _FMAS_IN_FLIGHT)
    terms["compute"] = waves * per_sm * flops_block / (peak_sm * max(eff, 1e-3))
    # shared memory: every thread reads its register tile's operands each reduction step
    smem_bw = dev.levels[0].bandwidth_gbs * 1e9
    if t.tensor_core:  # fragments: each warp loads its A and B panels once per k step
        smem_block = input_bytes(fa, t.reg) * (t.threads // dev.gpu.warp_size) * chunks * \
            (t.l1[fa.reduction[-1]] // max(1, t.reg[fa.reduction[-1]]))
    else:
        smem_block = t.threads * register_loads(fa, t.reg, 1) * red_total * in_elem
    terms["SMEM"] = waves * per_sm * smem_block / smem_bw
    glob_block = chunks * input_bytes(fa, t.l1) + output_bytes(fa, t.l1)
    terms["L2"] = nb * glob_block / (dev.levels[1].bandwidth_gbs * 1e9)
    unique = sum(acc.footprint(tuple(a.extent for a in fa.axes)) * acc.bytes_per_elem
                 for acc in fa.reads + fa.writes)
    dram_bytes = unique if nb * glob_block <= 4 * unique or unique <= dev.levels[1].capacity_bytes \
        else nb * glob_block
    terms["DRAM"] = dram_bytes / (dev.dram.bandwidth_gbs * 1e9)
    # each k step waits on its loads unless other blocks or pipeline stages cover them
    terms["latency"] = waves * chunks * _MEM_LATENCY_S / max(1, per_sm * t.stages)
    return _finish(t, terms, nb)


def predict_streaming(fa: FuncAnalysis, dev: DeviceModel, t: RTile, bytes_moved: int,
                      kernels: int = 1) -> RTile:
    """Memory-bound kernels: DRAM (or L2) traffic over the SMs the grid keeps busy."""
    busy = min(1.0, t.num_tasks / dev.num_units) if t.num_tasks else 1.0
    src = dev.levels[1] if bytes_moved <= dev.levels[1].capacity_bytes // 2 else dev.dram
    terms = {src.name: bytes_moved / (src.bandwidth_gbs * 1e9 * max(busy, 1e-3)),
             "launches": (kernels - 1) * LAUNCH_S}
    return _finish(t, terms, t.num_tasks)


def _finish(t: RTile, terms: Dict[str, float], blocks: int) -> RTile:
    return finish(t, terms, (LAUNCH_S,), blocks)
