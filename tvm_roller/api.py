"""Public entry points: schedule, build, explain."""
from __future__ import annotations

import logging
import time
import warnings
from dataclasses import dataclass, field
from typing import List, Optional, Union

import tvm
from tvm import s_tir, tirx

from .analysis import FuncAnalysis, analyze
from .errors import FallbackWarning, UnsupportedError
from .hardware import DeviceModel
from .rtile import RTile

TargetLike = Union[tvm.target.Target, dict, str]
logger = logging.getLogger("tvm_roller")


@dataclass
class Plan:
    """What roller constructed for one function: the analysis, the ranked rTiles, the target."""

    analysis: FuncAnalysis
    target: tvm.target.Target
    device: DeviceModel
    tiles: List[RTile]
    target_notes: List[str] = field(default_factory=list)
    construct_s: float = 0.0
    chain: Optional[object] = None  # a fusion.chain.GemmChain when the function is one
    fusion: Optional[object] = None  # the fusion.movement.ChainPlan deciding fused or not


_BACKENDS = {"llvm": "cpu", "cuda": "cuda"}
# TVM's lowering turns the pipelines roller annotates into cp.async copies only when asked
CUDA_PASS_CONFIG = {"tirx.use_async_copy": True}


def _backend(target: tvm.target.Target) -> str:
    kind = target.kind.name
    if kind not in _BACKENDS:
        raise UnsupportedError(f"target kind {kind!r} has no roller backend "
                               f"(supported: {', '.join(_BACKENDS)})")
    return _BACKENDS[kind]


def pass_context(target: tvm.target.Target) -> tvm.transform.PassContext:
    """The PassContext a roller schedule for ``target`` is compiled under."""
    cfg = CUDA_PASS_CONFIG if _backend(target) == "cuda" else {}
    return tvm.transform.PassContext(opt_level=3, config=cfg)


def resolve_target(target: TargetLike, device: Optional[DeviceModel] = None):
    """Normalise the target (complete an llvm target from the host) and get its device model."""
    from . import hardware

    tgt = hardware.normalize_target(target)
    backend = _backend(tgt)
    notes = hardware.target_completion_notes(target)
    dev = device if device is not None else hardware.from_target(tgt)
    if backend == "cuda":
        note = hardware.gpu.check_target_device(tgt, dev)
        if note:
            notes.append(note)
    elif dev.kind != "cpu":
        raise UnsupportedError(f"device {dev.name!r} is a {dev.kind}, the target is {tgt.kind.name}")
    return tgt, dev, notes


def plan(func, target: TargetLike, topk: int = 1, device: Optional[DeviceModel] = None) -> Plan:
    """Analyse ``func`` and construct its top-k rTiles (no TVM scheduling yet)."""
    from . import policy, policy_gpu

    t0 = time.perf_counter()
    tgt, dev, notes = resolve_target(target, device)
    backend = _backend(tgt)
    fa = analyze(func, backend)
    tiles = (policy_gpu if backend == "cuda" else policy).construct(fa, dev, topk)
    p = Plan(fa, tgt, dev, tiles, notes)
    _plan_fusion(p)
    p.construct_s = time.perf_counter() - t0
    return p


def _may_be_chain(fa: FuncAnalysis) -> bool:
    """A chain has two reduction blocks: other functions skip the detection's own schedule."""
    return sum(b.is_reduction for b in fa.blocks) >= 2


def _plan_fusion(p: Plan) -> None:
    """A chain of two matmuls (Chimera): plan the fused kernel and decide whether it pays."""
    if not _may_be_chain(p.analysis):
        return
    from .fusion.chain import detect_chain
    from .fusion.planner import plan_gemm_chain

    chain = detect_chain(p.analysis.func)
    if chain is None:
        return
    p.chain = chain
    if p.device.kind == "gpu":
        from .fusion.lower_cuda import plan_cuda_chain

        p.fusion = plan_cuda_chain(chain, p.device)
    else:
        p.fusion = plan_gemm_chain(chain, p.device)
    logger.info("tvm_roller: GEMM chain %s -> %s: %s (%s)", chain.first, chain.second,
                "fused" if p.fusion.fuse else "not fused", p.fusion.reason)


def apply(p: Plan, tile: RTile, traceable: bool = False) -> s_tir.Schedule:
    """``tile`` applied to the planned function. A chain roller declines to fuse is built as its
    operators one by one, each with roller's own schedule for it alone; that result is IR, not
    a trace, so ``traceable=True`` (MetaSchedule records) takes a one-function schedule of the
    operators in turn instead."""
    from .lower import cpu, cuda

    func = p.analysis.func
    if p.chain is not None:  # the chain's own kernels: fused, or its operators in turn
        from .fusion import lower_cpu, split
        from .fusion.planner import rows_per_task

        if not p.fusion.fuse and not traceable:
            return split.build_unfused(func, p.chain,
                                       lambda part: _schedule_alone(part, p.target, p.device))
        if not p.fusion.fuse and tile.backend == "cuda":
            raise UnsupportedError("a GEMM chain not fused on the GPU has no one-function "
                                   "schedule trace: schedule its operators as separate functions")
        if tile.backend == "cuda":
            from .fusion.lower_cuda import apply_fused_cuda

            try:
                return apply_fused_cuda(func, p.chain, p.fusion, p.device)
            except UnsupportedError as err:  # e.g. stages a row block cannot pass through
                if traceable:
                    raise
                p.fusion.fuse = False
                p.fusion.reason += f"; the fused kernel refused it ({err}): operators one by one"
                logger.warning("tvm_roller: %s", p.fusion.reason)
                return split.build_unfused(func, p.chain,
                                           lambda part: _schedule_alone(part, p.target, p.device))
        rows = rows_per_task(p.chain, p.fusion, p.device)
        lanes = p.device.simd_lanes(p.chain.dtype)
        how = lower_cpu.apply_fused if p.fusion.fuse else lower_cpu.apply_unfused
        return how(func, p.chain, rows, lanes)
    if tile.backend == "cuda":
        if tile.kind == "tiled":
            return cuda.apply_tiled(func, p.analysis, tile, p.device)
        return cuda.apply_streaming(func, p.analysis, tile, p.device)
    if tile.kind == "tiled":
        return cpu.apply_tiled(func, p.analysis, tile)
    return cpu.apply_streaming(func, p.analysis, tile, p.device.num_units)


def _schedule_alone(func, target: tvm.target.Target, device: DeviceModel) -> s_tir.Schedule:
    p = plan(func, target, 1, device)
    return apply(p, p.tiles[0])


def schedule(func, target: TargetLike, topk: int = 1, device: Optional[DeviceModel] = None):
    """A ``tvm.s_tir.Schedule`` built from roller's best rTile; a list of the top-k if topk > 1."""
    p = plan(func, target, topk, device)
    schs = [apply(p, t) for t in p.tiles]
    return schs[0] if topk == 1 else schs


def build(func, target: TargetLike, fallback: bool = False, device: Optional[DeviceModel] = None):
    """Schedule with roller and compile; what ``tvm.compile`` returns.

    With ``fallback=True`` a function roller cannot handle is built with TVM's default
    (unscheduled) lowering, and a :class:`FallbackWarning` gives the reason.
    """
    from . import hardware

    try:
        p = plan(func, target, 1, device)
        sch = apply(p, p.tiles[0])
        with pass_context(p.target):
            return tvm.compile(sch.mod, target=p.target)
    except UnsupportedError as err:
        # TVM's default build can't help with a non-function input or an invalid target either
        if not fallback or not isinstance(func, (tvm.IRModule, tirx.PrimFunc)):
            raise
        tgt = hardware.normalize_target(target)  # raises UnsupportedError for an invalid target
        warnings.warn(f"roller declined ({err}); building with TVM's default schedule",
                      FallbackWarning, stacklevel=2)
        mod = func if isinstance(func, tvm.IRModule) else tvm.IRModule({"main": func})
        if tgt.kind.name == "cuda":  # unscheduled kernels do not build for a GPU: dlight's rules
            mod = default_gpu_schedule(mod, tgt)
        return tvm.compile(mod, target=tgt)


def default_gpu_schedule(mod: tvm.IRModule, target: tvm.target.Target) -> tvm.IRModule:
    """TVM's own dlight default rules for a GPU target (what roller's CUDA results are compared
    with, and the fallback for what roller declines)."""
    from .relax import _fallback_passes

    with target:
        return tvm.transform.Sequential(_fallback_passes(target))(mod)


def explain(func, target: TargetLike, device: Optional[DeviceModel] = None, topk: int = 3) -> str:
    """Human-readable account of the construction: rTiles per level, alignment, prediction."""
    p = plan(func, target, topk, device)
    fa, best = p.analysis, p.tiles[0]
    lines = [f"target: {p.target}"]
    lines += [f"  note: {n}" for n in p.target_notes]
    d = p.device
    if d.kind == "gpu":
        x = d.extra
        lines.append(f"device: {d.name} ({d.source}), {d.num_units} SMs, compute capability "
                     f"{int(x['cc_major'])}.{int(x['cc_minor'])}, {int(x['smem_per_block_optin'])} B "
                     f"shared memory per block (opt-in), {d.dram.bandwidth_gbs:g} GB/s DRAM")
    else:
        lines.append(f"device: {d.name} ({d.source}), {d.num_units} units, "
                     f"{d.simd_bytes * 8}-bit SIMD, {d.num_vector_registers} vector regs")
    lines.append(f"main block: {fa.main} ({fa.kind}), dtype {fa.dtype}, "
                 f"{fa.flops / 1e6:.2f} MFLOP")
    lines.append("axes: " + ", ".join(f"{a.name}={a.extent}{a.kind}" for a in fa.axes))
    if fa.vector_axis is not None:
        lines.append(f"vector axis: {fa.axes[fa.vector_axis].name}")
    lines.append(f"construction: {p.construct_s * 1e3:.1f} ms, {len(p.tiles)} candidate(s)")
    for rank, t in enumerate(p.tiles):
        lines.append(f"#{rank + 1}: predicted {t.predicted_s * 1e6:.1f} us, bound by {t.bound}, "
                     f"{t.num_tasks} parallel tasks")
        if t.kind == "tiled" and t.backend == "cuda":
            reg = "warp tile (tensor cores)" if t.tensor_core else "register tile (per thread)"
            lines.append(f"    {reg:26s} {t.reg}")
            lines.append(f"    {'shared-memory (block) tile':26s} {t.l1}")
            lines.append(f"    {t.threads} threads per block, {t.stages}-stage pipeline, "
                         f"{t.smem_bytes} B shared memory")
        elif t.kind == "tiled":
            lines.append(f"    register tile {t.reg}")
            lines.append(f"    L1 tile       {t.l1}")
            lines.append(f"    L2/task tile  {t.l2}")
        lines.append("    terms (s): " + ", ".join(f"{k}={v:.3g}" for k, v in t.terms.items()))
    lines += [f"alignment: {n}" for n in best.notes]
    if p.chain is not None:
        from .fusion.planner import describe

        lines += describe(p.chain, p.fusion)
    return "\n".join(lines)
