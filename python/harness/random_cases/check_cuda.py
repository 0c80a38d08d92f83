"""One case for CUDA without a GPU: roller's schedule lowered, verified, nvcc-compiled, and its
CPU replica compared with the float64 reference.

``plan`` then ``apply`` of the best rTile, then ``cuda_check.check`` (TVM's own lowering,
``verify_gpu_code`` and shared memory, nvcc + ``ptxas -v`` per kernel, the launches). On top of
what ``check`` reports, the launches and ptxas numbers are held against the device's limits
(:func:`launch_limits`): a kernel the driver would refuse to launch, or a block of partial
warps, is *over_limit* with the exact numbers. Spilled registers are recorded, not a failure.

Correctness: ``cuda_check.cpu_replica`` (thread loops serial, GPU buffers global) built for
LLVM and run; a tensor-core schedule has no replica and its result is "not checked".
"""
from __future__ import annotations

import math
from typing import Any, Dict, List, Optional, Tuple

import tvm

from tvm_roller import planner
from tvm_roller.core.errors import UnsupportedError
from harness.cuda_check import CheckReport, check as cuda_checks, cpu_replica
from tvm_roller.hardware import gpu
from tvm_roller.hardware.model import DeviceModel
from harness.random_cases import compare, faults, families
from harness.random_cases.case import (ERROR, NVCC_FAIL, OK, OVER_LIMIT, WRONG, Case,
                                       Result)
from harness.random_cases.outcome import classify
from harness.random_cases.steps import StepHook, Steps

# H100 with sm_90 (the tag's own arch is sm_90a), as the project's CUDA tests build for
TARGET = {"tag": "nvidia/nvidia-h100", "arch": "sm_90"}
REPLICA_TARGET = "llvm"
MATMULS = ("matmul", "batch_matmul", "matmul_bias_act")
GRID_LIMITS = (2 ** 31 - 1, 65535, 65535)
BLOCK_LIMITS = (1024, 1024, 64)
NOT_CHECKED_TC = "not checked (tensor cores)"


def launch_limits(rep: CheckReport, dev: DeviceModel) -> List[str]:
    """What the launches and ptxas's numbers break of ``dev``'s limits (a launch the driver
    refuses, a block of partial warps), one line per fact."""
    g = dev.gpu
    static_max, total_max = gpu.smem_limit(dev, dynamic=False), gpu.smem_limit(dev)
    kernels = rep.ptxas.kernels if rep.ptxas is not None else {}
    out: List[str] = []
    for name, k in kernels.items():
        if k.smem_static > static_max:
            out.append(f"{name}: {k.smem_static} B static shared memory > {static_max} B "
                       "(static __shared__ cannot opt in to more)")
    for ln in (rep.bundle.launches if rep.bundle is not None else []):
        threads = math.prod(ln.block)
        if threads > g.max_threads_per_block:
            out.append(f"{ln.name}: {threads} threads per block {ln.block} > "
                       f"{g.max_threads_per_block}")
        if any(b > lim for b, lim in zip(ln.block, BLOCK_LIMITS)):
            out.append(f"{ln.name}: block {ln.block} exceeds per-dimension limits {BLOCK_LIMITS}")
        if any(x > lim for x, lim in zip(ln.grid, GRID_LIMITS)):
            out.append(f"{ln.name}: grid {ln.grid} exceeds {GRID_LIMITS}")
        if threads > g.warp_size and threads % g.warp_size:
            out.append(f"{ln.name}: {threads} threads per block {ln.block} is not a multiple "
                       f"of the warp ({g.warp_size})")
        k = kernels.get(ln.name)
        if k is None:
            continue
        smem = k.smem_static + ln.dyn_smem_bytes
        if smem > total_max:
            out.append(f"{ln.name}: {k.smem_static} B static + {ln.dyn_smem_bytes} B dynamic "
                       f"shared memory > {total_max} B")
        regs = k.registers * -(-threads // g.warp_size) * g.warp_size
        if regs > g.regs_per_block:
            out.append(f"{ln.name}: {k.registers} registers x {threads} threads = {regs} > "
                       f"{g.regs_per_block} per block")
    return out


def _is_nvcc(problem: str) -> bool:
    return problem.startswith("nvcc")


_LAUNCHES = "launches:"  # check() could not read the host's launch sequence


def _facts(case: Case, rep: CheckReport, p: planner.Plan) -> Dict[str, Any]:
    tile = p.tiles[0]
    facts: Dict[str, Any] = {"rule": p.rule.name, "tile_kind": str(tile.kind),
                             "tensor_core": bool(rep.tensor_core)}
    if rep.ptxas is not None:
        facts["kernels"] = {n: {"registers": k.registers, "spill_stores": k.spill_stores,
                                "stack_frame": k.stack_frame, "smem_static": k.smem_static}
                            for n, k in rep.ptxas.kernels.items()}
        facts["spill_bytes"] = sum(k.spill_stores for k in rep.ptxas.kernels.values())
    if rep.bundle is not None:
        facts["launches"] = [{"name": ln.name, "grid": list(ln.grid), "block": list(ln.block),
                              "dyn_smem_bytes": ln.dyn_smem_bytes}
                             for ln in rep.bundle.launches]
    if case.family in MATMULS:
        facts["all_ge16"] = all(int(case.params[x]) >= 16 for x in ("M", "N", "K"))
    return facts


def _replica(case: Case, built: families.Built, mod: tvm.IRModule, arrays
             ) -> Tuple[Optional[Any], str]:
    """The replica's output, or None and why it was not checked."""
    try:
        rmod = cpu_replica(mod)
    except UnsupportedError as err:
        reason = NOT_CHECKED_TC if "tensor-core" in str(err) else f"not checked ({err})"
        return None, reason
    lib = tvm.compile(rmod, target=REPLICA_TARGET)
    return faults.perturb(case, compare.run(lib, arrays, compare.specs(built)[-1])), "checked"


def check(case: Case, on_step: Optional[StepHook] = None) -> Result:
    steps = Steps(on_step)
    facts: Dict[str, Any] = {}
    try:
        with steps.step("func"):
            built = families.build(case)
            func = families.prim_func(built)
            arrays = compare.inputs(case, built)
        with steps.step("plan"):
            p = planner.plan(func, TARGET)
        with steps.step("apply"):
            faults.before_step(case)
            sch = planner.apply(p, p.tiles[0])
        with steps.step("check"):
            with p.ctx.pass_context():
                rep = cuda_checks(sch.mod, p.target, p.device)
        facts = _facts(case, rep, p)
        with steps.step("replica"):
            out, facts["correctness"] = _replica(case, built, sch.mod, arrays)
        ref = None
        if out is not None:
            with steps.step("reference"):
                ref = compare.reference(case, arrays)
    except Exception as err:  # every failure becomes a classified result
        outcome, message = classify(err, steps.stage)
        return Result(case, outcome, message, steps.stage, seconds=steps.elapsed(),
                      facts={**facts, **steps.times})
    facts.update(steps.times)
    nvcc = [x for x in rep.problems if _is_nvcc(x)]
    unreadable = [x for x in rep.problems if x.startswith(_LAUNCHES)]
    limits = [x for x in rep.problems if not _is_nvcc(x) and not x.startswith(_LAUNCHES)]
    limits += launch_limits(rep, p.device)
    err = tol = None
    wrong = ""
    if ref is not None:
        out_dtype = compare.specs(built)[-1][1]
        err, tol = compare.error(out, ref), compare.tolerance(out_dtype, built.reduction)
        if err > tol:
            wrong = "replica " + compare.mismatch(out, ref, tol)
            facts["correctness"] = "wrong"
    if nvcc:
        return Result(case, NVCC_FAIL, "; ".join(nvcc + ([wrong] if wrong else [])), "check",
                      err, tol, steps.elapsed(), facts)
    if limits:
        return Result(case, OVER_LIMIT, "; ".join(limits + ([wrong] if wrong else [])), "check",
                      err, tol, steps.elapsed(), facts)
    if unreadable:  # no launches to check the limits on, nor for a GPU machine to run
        return Result(case, ERROR, "; ".join(unreadable + ([wrong] if wrong else [])),
                      "launches", err, tol, steps.elapsed(), facts)
    if wrong:
        return Result(case, WRONG, wrong, "replica", err, tol, steps.elapsed(), facts)
    return Result(case, OK, "", "compare" if ref is not None else "check", err, tol,
                  steps.elapsed(), facts)
