"""Measure this machine with small TVM-built micro-kernels and cache the result.

* peak fp32: an accumulator tile of MR x (2 * lanes) floats updated by FMAs over a long reduction
  whose operands (a few KiB) stay in L1; the tile lives in vector registers (checked in the asm);
  one tile per core, parallel over all cores (a few attempts: see ``_PEAK_ATTEMPTS``).
* the micro-kernel table (``CpuTraits.tile_gflops``): the same kernel for every rows x vectors
  register tile the policy can construct, on one core alone; the micro-model predicts a tile's
  compute rate from it (ROLLER's per-device compute-rate tables).
* bandwidth per level: each core sums its own slice of a buffer repeatedly, with 8 vector
  accumulators (a 2-D reduction whose inner spatial axis is vectorised), so the loop is bound by
  loads, not by add latency. Working sets: 1/2 of L1, 1/2 of L2, 1/2 of the per-core share of L3,
  and 8x the whole last-level cache for DRAM (measured on a 2-vCPU Zen 4 with a 32 MiB L3:
  4x read 36-57 GB/s from run to run, part of it still cached; 8x read 36 steadily).

The kernels run in a child Python process started with ``TVM_NUM_THREADS=<num-cores>``: TVM's
thread pool is sized once per process and by default assumes 2-way SMT on x86 (half the logical
CPUs), so on a 2-vCPU machine an in-process run would use one thread and under-report shared
bandwidth and peak. The child also isolates the caller from a crash in a generated kernel.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import warnings
from dataclasses import replace
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from tvm.target import Target

from tvm_roller.core.errors import UnsupportedError
from tvm_roller.core.ffi import plain
from tvm_roller.core.types import TargetLike
from tvm_roller.hardware import calibration_store as _cache
from tvm_roller.hardware.cpu import arch_of, detect_isa, from_target, host_cpu, \
    host_physical_cores, host_triple, is_host_target, target_mattr
from tvm_roller.hardware.target import normalize_target
from tvm_roller.hardware.model import DeviceModel, MemoryLevel

_MARK = "TVM_ROLLER_CALIBRATION_RESULT "
CALIBRATE_ENV = "TVM_ROLLER_CALIBRATE"  # "0": never calibrate on first use (estimates instead)
_PEAK_ATTEMPTS = 4
_PARALLEL_SCALING = 0.85  # of cores x one core's rate: a parallel peak below it is retried
# ISA features a calibration target may use only if the host has them (else: SIGILL).
_ISA_FEATURE = re.compile(r"^(avx|amx|fma|f16c|sse|sve|sme|neon|fullfp16|dotprod|i8mm|bf16)")


# ---------------------------------------------------------------------------------------------
# child side: build and time the kernels
# ---------------------------------------------------------------------------------------------
def _time(ex: Any, dev: Any, args: List[Any], quick: bool) -> float:
    """Best (min) seconds per call: a throughput ceiling. Many repeats of ~2 ms, shorter than a
    scheduler slice, so that some land where no other process shares the cores (longer repeats
    measured a third of L1's bandwidth on a machine where another process was busy)."""
    f = ex.mod.time_evaluator("main", dev, number=1, repeat=25 if quick else 50, min_repeat_ms=2)
    return float(min(f(*args).results))


def _fma_kernel(tgt: Any, cores: int, mr: int, nr: int, lanes: int, quick: bool,
                reps_flops: float = 4e7) -> Dict[str, Any]:
    """GFLOP/s of an ``mr`` x ``nr`` accumulator tile updated by FMAs over a long reduction, the
    shape of roller's register micro-kernel (A broadcast per row, ``nr / lanes`` vector loads of
    B per reduction step, the tile in registers). A and B (a few KiB) stay in L1. ``cores`` > 1:
    one tile per core, parallel; 1: the calling thread alone (no parallel region)."""
    import numpy as np
    import tvm
    from tvm import te
    from tvm.s_tir import Schedule

    k_len = 64  # A (k*mr) + B (k*nr) floats: <= 24 KiB for the largest tile, stays in L1
    rep = max(1, int(reps_flops // (2 * mr * nr * k_len)))
    A = te.placeholder((cores, k_len, mr), "float32", name="A")
    B = te.placeholder((cores, k_len, nr), "float32", name="B")
    r = te.reduce_axis((0, rep), "r")
    k = te.reduce_axis((0, k_len), "k")
    C = te.compute((cores, mr, nr), lambda p, i, j: te.sum(A[p, k, i] * B[p, k, j], axis=[r, k]),
                   name="C")
    sch = Schedule(tvm.IRModule({"main": te.create_prim_func([A, B, C])}))
    blk = sch.get_sblock("C")
    p, i, j, rr, kk = sch.get_loops(blk)
    k0, k1 = sch.split(kk, [None, 4])
    sch.reorder(p, rr, k0, k1, i, j)
    acc = sch.cache_write(blk, 0, "local")  # the register tile
    sch.reverse_compute_at(acc, p)
    if cores > 1:
        sch.parallel(p)
    sch.unroll(k1)
    sch.unroll(i)
    if nr > lanes:
        j0, j1 = sch.split(j, [None, lanes])
        sch.unroll(j0)
        sch.vectorize(j1)
    else:
        sch.vectorize(j)
    sch.vectorize(sch.get_loops(acc)[-1])
    init = sch.decompose_reduction(blk, rr)  # last: annotations above need the undecomposed block
    sch.vectorize(sch.get_loops(init)[-1])
    ex = tvm.compile(sch.mod, tgt)
    dev = tvm.cpu(0)
    rng = np.random.default_rng(0)
    args = [tvm.runtime.tensor((rng.random((cores, k_len, mr)) * 1e-3).astype("float32"), dev),
            tvm.runtime.tensor((rng.random((cores, k_len, nr)) * 1e-3).astype("float32"), dev),
            tvm.runtime.empty((cores, mr, nr), "float32", dev)]
    sec = _time(ex, dev, args, quick)
    asm = ex.mod.inspect_source("asm")
    fma_lines = [l for l in asm.splitlines() if re.search(r"\bvfmadd\d*ps\b|\bfmla\b|\bvfmaddps\b", l)]
    return {
        "gflops": 2.0 * cores * mr * nr * k_len * rep / sec / 1e9,
        "tile": [mr, nr],
        "fma_lines": len(fma_lines),
        "zmm_fma_lines": sum("zmm" in l for l in fma_lines),
        "ymm_fma_lines": sum("ymm" in l for l in fma_lines),
    }


def _peak_kernel(tgt: Any, cores: int, lanes: int, regs: int, quick: bool) -> Dict[str, Any]:
    """Peak: the largest tile that leaves registers for the operands, one per core."""
    mr = max(1, min(8, (regs - 4) // 2))  # rows: 2*mr accumulators + 2 B vectors + broadcasts
    return _fma_kernel(tgt, cores, mr, 2 * lanes, lanes, quick)


def tile_table_shapes(regs: int, quick: bool) -> List[Tuple[int, int]]:
    """(rows, vectors) register tiles the micro-kernel table measures: those the policy can
    construct (accumulators + one register per vector load + 2 <= the register file)."""
    rows = (1, 2, 4, 6, 8, 12) if quick else (1, 2, 3, 4, 5, 6, 8, 10, 12, 14, 16)
    return [(mr, nv) for nv in (1, 2, 3, 4) for mr in rows if mr * nv + nv + 2 <= regs]


def _tile_table(tgt: Any, lanes: int, regs: int, quick: bool) -> Dict[str, float]:
    """One core's GFLOP/s per register tile "<rows>x<vectors>" (the calling thread alone, so a
    process on the other cores does not slow it down)."""
    out = {}
    for mr, nv in tile_table_shapes(regs, quick):
        res = _fma_kernel(tgt, 1, mr, nv * lanes, lanes, quick, reps_flops=2e6)
        out[f"{mr}x{nv}"] = round(res["gflops"], 3)
    return out


def _read_kernel(tgt: Any, cores: int, lanes: int, ws_bytes: int, quick: bool) -> float:
    """GB/s (all cores together) of repeatedly summing a per-core buffer of ~ws_bytes."""
    import numpy as np
    import tvm
    from tvm import te
    from tvm.s_tir import Schedule

    width = 8 * lanes  # 8 independent vector accumulators hide the add latency
    m_len = max(1, ws_bytes // 4 // width)
    per_call = 8 << 20  # bytes per core per call: amortise the launch, within a ~2 ms repeat
    rep = max(1, per_call // (m_len * width * 4))
    X = te.placeholder((cores, m_len * width), "float32", name="X")
    r = te.reduce_axis((0, rep), "r")
    m = te.reduce_axis((0, m_len), "m")
    S = te.compute((cores, width), lambda p, j: te.sum(X[p, m * width + j], axis=[r, m]), name="S")
    sch = Schedule(tvm.IRModule({"main": te.create_prim_func([X, S])}))
    blk = sch.get_sblock("S")
    p, j, rr, mm = sch.get_loops(blk)
    sch.reorder(p, rr, mm, j)
    acc = sch.cache_write(blk, 0, "local")
    sch.reverse_compute_at(acc, p)
    j0, j1 = sch.split(j, [None, lanes])
    sch.parallel(p)
    sch.unroll(j0)
    sch.vectorize(j1)
    sch.vectorize(sch.get_loops(acc)[-1])
    init = sch.decompose_reduction(blk, rr)
    sch.vectorize(sch.get_loops(init)[-1])
    ex = tvm.compile(sch.mod, tgt)
    dev = tvm.cpu(0)
    # ones, not uninitialised memory: denormals/NaNs can slow some FP units down
    x = tvm.runtime.tensor(np.ones((cores, m_len * width), "float32"), dev)
    s = tvm.runtime.empty((cores, width), "float32", dev)
    sec = _time(ex, dev, [x, s], quick)
    got = float(s.numpy()[0, 0])
    if abs(got - m_len * rep) > 1e-3 * m_len * rep:
        raise RuntimeError(f"bandwidth kernel computed {got}, expected {m_len * rep}")
    return cores * m_len * width * 4 * rep / sec / 1e9


def _child_main() -> None:
    """Entry point of the measuring process: spec JSON on stdin, result line on stdout."""
    spec = json.loads(sys.stdin.read())
    import tvm
    import tvm_ffi

    t0 = time.time()
    tgt = tvm.target.Target(spec["target"])
    cores, lanes, quick = spec["cores"], spec["lanes"], spec["quick"]
    out: Dict[str, Any] = {"threads": int(tvm_ffi.get_global_func("runtime.NumThreads")())}
    out["tile_gflops"] = _tile_table(tgt, lanes, spec["regs"], quick)
    # Some VMs run both vCPUs of a 2-core guest on one physical core for a while (the parallel
    # peak then reads as one core's): a few attempts, the best kept, while it is below what the
    # cores give one at a time.
    single = max(out["tile_gflops"].values(), default=0.0)
    out["peak_attempts"] = []
    for _ in range(_PEAK_ATTEMPTS):
        peak = _peak_kernel(tgt, cores, lanes, spec["regs"], quick)
        out["peak_attempts"].append(round(peak["gflops"], 3))
        if "peak" not in out or peak["gflops"] > out["peak"]["gflops"]:
            out["peak"] = peak
        if peak["gflops"] >= _PARALLEL_SCALING * cores * single:
            break
    out["bandwidth"] = {lv["name"]: _read_kernel(tgt, cores, lanes, lv["ws_bytes"], quick)
                        for lv in spec["levels"]}
    out["seconds"] = time.time() - t0
    print(_MARK + json.dumps(out), flush=True)


# ---------------------------------------------------------------------------------------------
# parent side
# ---------------------------------------------------------------------------------------------
def _check_runs_here(spec: Dict[str, Any]) -> None:
    triple = str(spec.get("mtriple") or host_triple())
    if arch_of(triple) != arch_of(host_triple()):
        raise UnsupportedError(f"cannot calibrate a {triple} target on a {host_triple()} host")
    _, feats = detect_isa(Target(spec))
    _, host_feats = detect_isa(Target({"kind": "llvm", "mcpu": host_cpu()}))
    if feats and host_feats:
        missing = sorted(f for f in feats - host_feats if _ISA_FEATURE.match(f))
        if missing:
            raise UnsupportedError(
                f"cannot calibrate mcpu={spec.get('mcpu')} on this {host_cpu()} host: it lacks "
                f"{', '.join(missing)} (the kernels would die with an illegal instruction)")


def _working_sets(levels: List[MemoryLevel], cores: int) -> List[Dict[str, Any]]:
    plan = []
    caches = levels[:-1]
    for lv in caches:
        per_core = lv.capacity_bytes // cores if lv.shared else lv.capacity_bytes
        plan.append({"name": lv.name, "ws_bytes": max(4096, per_core // 2)})
    llc_total = max([lv.capacity_bytes * (1 if lv.shared else cores) for lv in caches] or [8 << 20])
    plan.append({"name": levels[-1].name, "ws_bytes": max(32 << 20, 8 * llc_total) // cores})
    return plan


def _busy_cpu_seconds() -> Optional[float]:
    """Non-idle CPU seconds of the whole machine since boot (Linux /proc/stat), None elsewhere."""
    try:
        with open("/proc/stat", encoding="ascii") as fh:
            fields = fh.readline().split()
    except OSError:
        return None
    if not fields or fields[0] != "cpu" or len(fields) < 8:
        return None
    user, nice, system, _idle, _iowait, irq, softirq = (int(x) for x in fields[1:8])
    return (user + nice + system + irq + softirq) / os.sysconf("SC_CLK_TCK")


def _children_cpu_seconds() -> float:
    import resource  # Unix only; only reached where /proc/stat exists

    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def _run_child(spec: Dict[str, Any], timeout_s: float) -> Dict[str, Any]:
    env = dict(os.environ)
    env["TVM_NUM_THREADS"] = str(spec["cores"])
    env[CALIBRATE_ENV] = "0"  # the child measures; it never calibrates on its own
    # make this package importable in the child even when it is not installed
    root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    code = "from tvm_roller.hardware.calibrate import _child_main; _child_main()"
    proc = subprocess.run([sys.executable, "-c", code], input=json.dumps(spec), env=env,
                          capture_output=True, text=True, timeout=timeout_s)
    lines = [l for l in proc.stdout.splitlines() if l.startswith(_MARK)]
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"calibration process failed (exit {proc.returncode}):\n"
                           f"{(proc.stderr or proc.stdout)[-3000:]}")
    return json.loads(lines[-1][len(_MARK):])


def calibrate(target: Optional[TargetLike] = None, quick: bool = False,
              save: bool = True) -> DeviceModel:
    """Measure peak fp32 GFLOP/s and per-level read bandwidth on this machine for ``target``
    (default: the host CPU with all its physical cores), cache the result (unless ``save`` is
    False) and return the DeviceModel (source ``calibrated:<file>``)."""
    return measure(normalize_target(target if target is not None else {"kind": "llvm"}), quick,
                   save)


def measure(tgt: Target, quick: bool = False, save: bool = True) -> DeviceModel:
    """:func:`calibrate` for a normalised target."""
    if tgt.kind.name != "llvm":
        raise UnsupportedError(f"calibrate() measures CPUs (llvm targets), not {tgt.kind.name!r}")
    spec = plain(tgt.export())
    _check_runs_here(spec)
    # this machine's capacities and clock even for a non-host mcpu (e.g. x86-64-v3 on a znver4)
    est = from_target(tgt, use_cache=False, host_caches=True)
    cores = est.num_units
    if cores > host_physical_cores():
        warnings.warn(f"calibrating {cores} cores on a host with {host_physical_cores()}: threads "
                      "will share cores and the numbers describe that oversubscription", stacklevel=2)
    lanes = est.simd_lanes("float32")
    child_spec = {"target": spec, "cores": cores, "lanes": lanes, "quick": quick,
                  "regs": est.num_vector_registers, "levels": _working_sets(est.levels, cores)}
    busy0, kids0 = _busy_cpu_seconds(), _children_cpu_seconds()
    t0 = time.time()
    res = _run_child(child_spec, timeout_s=300)
    wall = time.time() - t0
    busy1, kids1 = _busy_cpu_seconds(), _children_cpu_seconds()
    foreign = -1.0  # unknown (no /proc/stat)
    if busy0 is not None and busy1 is not None:
        # CPU time spent by everything but the calibration process, as a share of all CPUs
        ncpu = os.cpu_count() or 1
        foreign = max(0.0, (busy1 - busy0) - (kids1 - kids0)) / (wall * ncpu)
        if foreign > 0.1:
            warnings.warn(f"other processes used {100 * foreign:.0f}% of the CPUs during the "
                          "calibration: the numbers are probably low; calibrate again on a quiet "
                          "machine", stacklevel=2)

    if res["threads"] != cores:
        warnings.warn(f"TVM ran the calibration with {res['threads']} threads for {cores} cores; "
                      "shared-level bandwidth and peak may be off", stacklevel=2)
    peak = res["peak"]
    best_core = max(res["tile_gflops"].values(), default=0.0)
    if peak["gflops"] < _PARALLEL_SCALING * cores * best_core:
        warnings.warn(f"the parallel peak ({peak['gflops']:.0f} GFLOP/s over {cores} cores; "
                      f"attempts {res['peak_attempts']}) is below {cores} x one core's "
                      f"{best_core:.0f}: the cores were shared (another process, or vCPUs on one "
                      "physical core); calibrate again on a quiet machine", stacklevel=2)
    vec_reg = {"avx512": "zmm_fma_lines", "avx2": "ymm_fma_lines"}.get(est.isa)
    # SSE has no FMA instruction (mulps + addps), so only FMA ISAs are checked
    if est.isa != "sse" and (peak["fma_lines"] == 0 or (vec_reg and peak[vec_reg] == 0)):
        warnings.warn(f"the peak kernel did not compile to {est.isa} vector FMAs; "
                      "the measured peak is a lower bound", stacklevel=2)

    levels = []
    for lv in est.levels:
        total = res["bandwidth"][lv.name]
        # MemoryLevel convention: per core for private levels, whole chip for shared ones
        bw = total if lv.shared else total / cores
        levels.append(MemoryLevel(lv.name, lv.capacity_bytes, lv.line_bytes, round(bw, 3), lv.shared))
    fp32 = peak["gflops"]
    scale = fp32 / est.peak_gflops["float32"]
    # only fp32 is measured; other dtypes keep their estimated ratio to fp32
    peak_gflops = {dt: round(v * scale, 3) for dt, v in est.peak_gflops.items()}
    peak_gflops["float32"] = round(fp32, 3)

    traits = replace(
        est.cpu,
        estimated_peak_float32=est.peak_gflops["float32"],
        calibration_seconds=round(wall, 2),
        calibration_threads=int(res["threads"]),
        calibration_quick=bool(quick),
        calibration_foreign_cpu_share=round(foreign, 3),
        peak_tile_rows=int(peak["tile"][0]),
        peak_tile_cols=int(peak["tile"][1]),
        tile_gflops=dict(res["tile_gflops"]),
    )
    mcpu = str(spec.get("mcpu"))
    key = _cache.calibration_key(host_cpu(), mcpu, cores, target_mattr(spec))
    model = DeviceModel(
        name=f"{mcpu} x{cores} (host, calibrated)", kind="cpu", num_units=cores,
        simd_bytes=est.simd_bytes, num_vector_registers=est.num_vector_registers, levels=levels,
        peak_gflops=peak_gflops, frequency_ghz=est.frequency_ghz, isa=est.isa,
        source=f"calibrated:{_cache.calibration_path(key)}", cpu=traits)
    if save:
        model.source = f"calibrated:{_cache.save_calibration(key, model)}"
    return model


def auto_calibration_enabled() -> bool:
    return os.environ.get(CALIBRATE_ENV, "1").strip().lower() not in ("0", "false", "no", "off")


def device_model(target: Target) -> DeviceModel:
    """The device model roller plans ``target`` with: its calibration, measured here on first
    use for a host target (``calibrate(quick=True)``: a few seconds, cached for every later
    process; ``TVM_ROLLER_CALIBRATE=0`` turns it off), else the estimate. A calibration that
    fails is reported and the estimate used: planning never fails for want of measurements."""
    model = from_target(target)
    if model.source.startswith("calibrated:") or not auto_calibration_enabled() or \
            not is_host_target(target):
        return model
    try:
        return measure(target, quick=True, save=True)
    except (RuntimeError, OSError, UnsupportedError, subprocess.TimeoutExpired) as err:
        warnings.warn(f"calibration on first use failed ({type(err).__name__}: {err}); planning "
                      f"with estimated numbers. Set {CALIBRATE_ENV}=0 to skip it, or run "
                      "`tvm-roller calibrate`.", stacklevel=2)
        return model
