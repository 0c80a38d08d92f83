"""The roofline lower bound of a function on the context's device: what no kernel of it can beat.

``max(FLOPs at the calibrated peak, bytes at the bandwidth of the level the data lives in)``:
the FLOPs are the multiply-adds of the function's reduction blocks (2 per multiply-add; the
elementwise and transcendental work is not counted, so the bound stays a lower bound); the
bytes are one read of every input and one write of every output, from the smallest memory level
that holds them all (a private level's bandwidth summed over the cores). Every report entry
carries it, so a kernel far above its bound shows (``tvm-roller profile-model``).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

from tvm import tirx

from tvm_roller.analysis.selected import touched_param_bytes

from tvm_roller.analysis.func import FuncAnalysis
from tvm_roller.core.errors import UnsupportedError
from tvm_roller.hardware.model import DeviceModel
from tvm_roller.planner.context import Context


@dataclass(frozen=True)
class Bound:
    """A function's lower bound: ``seconds``, what bounds it (``compute`` or the memory level),
    and the counts it came from."""

    seconds: float
    by: str
    flops: float
    bytes: int


def reduction_flops(fa: FuncAnalysis) -> float:
    """2 per multiply-add of every reduction block of the function."""
    return float(sum(2 * math.prod(a.extent for a in b.axes) for b in fa.blocks
                     if b.is_reduction))


def param_bytes(func: tirx.PrimFunc) -> Optional[int]:
    """One read or write of every buffer parameter (of the slice it can touch:
    ``analysis.selected``); None when a shape is symbolic."""
    return touched_param_bytes(func)


def bound(fa: FuncAnalysis, dev: DeviceModel) -> Optional[Bound]:
    """The lower bound of an analysed (static) function on ``dev``."""
    nbytes = param_bytes(fa.func)
    if nbytes is None:
        return None
    return counted_bound(reduction_flops(fa), nbytes, dev, fa.dtype)


def counted_bound(flops: float, nbytes: int, dev: DeviceModel, dtype: str = "float32") -> Bound:
    """The bound of ``flops`` (at the peak for ``dtype``) and ``nbytes`` (from the smallest
    level holding them): for kernels whose work is counted by who builds them."""
    compute_s = flops / (dev.peak_gflops.get(dtype, dev.peak_gflops["float32"]) * 1e9)
    memory = _memory_bound(nbytes, dev)
    if compute_s >= memory.seconds:
        return Bound(compute_s, "compute", flops, nbytes)
    return Bound(memory.seconds, memory.by, flops, nbytes)


def _memory_bound(nbytes: int, dev: DeviceModel) -> Bound:
    """``nbytes`` from the smallest level that holds them, at its bandwidth (over the cores)."""
    level = next((lv for lv in dev.levels
                  if lv.capacity_bytes * (1 if lv.shared else dev.num_units) >= nbytes),
                 dev.levels[-1])
    bandwidth = level.bandwidth_gbs * (1 if level.shared else dev.num_units) * 1e9
    return Bound(nbytes / bandwidth, level.name, 0.0, nbytes)


def bound_of(func: tirx.PrimFunc, ctx: Context) -> Optional[Bound]:
    """The bound of a function roller did not plan (left to TVM's default): from its own
    analysis, or from its bytes alone when roller cannot analyse it; None with symbolic
    shapes."""
    try:
        return bound(ctx.backend.analyze(func), ctx.device)
    except UnsupportedError:
        nbytes = param_bytes(func)
        return None if nbytes is None else _memory_bound(nbytes, ctx.device)
