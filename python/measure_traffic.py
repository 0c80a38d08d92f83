"""Measured memory traffic of fused and unfused GEMM-chain kernels, and the model's prediction.

This VM exposes no hardware cache counters (``perf stat`` reports them "not supported"), so the
traffic is measured by running the built kernels under valgrind's cache simulator (callgrind
``--cache-sim=yes``): one core's L1 (32 KiB, 8-way) and L2 (1 MiB, 16-way) with 64 B lines, as on
this machine. A kernel runs once to warm up, then once with instrumentation on; collection is
limited to the kernel's entry point. The traffic is the lines the simulated L2 fetched from
beyond it (read misses + write-allocate misses) x 64 B, i.e. what the shared level (L3/DRAM)
delivered to one core running every task in turn (``TVM_NUM_THREADS=1``).

Valgrind 3.19 does not decode AVX-512, so the kernels are planned and scheduled for this machine
(as ``tvm_roller.build`` does) and compiled for ``-mcpu=znver3`` (AVX2): the same tiles, loop
orders and fusion, LLVM splitting each 16-lane vector in two.

    python python/measure_traffic.py [--json docs/fusion_traffic.json] [--jobs 2]

Needs ``valgrind`` and ``callgrind_control`` on PATH; about a minute per kernel. The same
simulation measures the fused kernels' traffic beside their times in ``bench_fusion.py
--traffic``. "into L1" counts the lines the simulated L1 fetched from L2 (read and write
misses): the traffic a core's L2 must serve, which bounds a micro-kernel on a core with more
FLOPs per cycle than L2 bytes (a full-width AVX-512 core).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Dict, List, Sequence

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

AVX2_TARGET = {"kind": "llvm", "mcpu": "znver3", "num-cores": 2}
L1 = "32768,8,64"
L2 = "1048576,16,64"
LINE = 64


def _run_kernel(so: str, shapes: Sequence[str]) -> None:
    """Inside valgrind: load the kernel, call it once uninstrumented, then once measured."""
    import numpy as np
    import tvm.runtime  # the runtime only: importing all of TVM under valgrind takes minutes

    lib = tvm.runtime.load_module(so)
    rng = np.random.default_rng(0)
    args = [tvm.runtime.tensor(rng.uniform(-1, 1, tuple(int(x) for x in s.split("x")))
                               .astype("float32")) for s in shapes]
    f = lib["main"]
    f(*args)  # page faults, the thread pool and the first-touch misses stay outside
    subprocess.run(["callgrind_control", "-i", "on", str(os.getpid())], check=True,
                   capture_output=True)
    f(*args)


def _simulate(so: str, shapes: Sequence[str], workdir: str) -> Dict[str, int]:
    """Run ``so`` under callgrind's cache simulation; its event totals."""
    out = os.path.join(workdir, Path(so).stem + ".callgrind")
    env = dict(os.environ, TVM_NUM_THREADS="1")
    cmd = ["valgrind", "--tool=callgrind", "--cache-sim=yes", f"--D1={L1}", f"--I1={L1}",
           f"--LL={L2}", "--instr-atstart=no", "--collect-atstart=no",
           "--toggle-collect=__tvm_ffi_main", f"--callgrind-out-file={out}",
           os.path.realpath(sys.executable), os.path.abspath(__file__), "--run-so", so, *shapes]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"valgrind failed on {so}:\n{proc.stderr[-2000:]}")
    events = totals = None
    for line in Path(out).read_text().splitlines():
        if line.startswith("events:"):
            events = line.split()[1:]
        elif line.startswith(("summary:", "totals:")):
            totals = [int(x) for x in line.split()[1:]]
    if not events or not totals:
        raise RuntimeError(f"no totals in {out}")
    return dict(zip(events, totals))


def shapes_of(func) -> List[str]:
    return ["x".join(str(int(d)) for d in p.shape) for p in func.params]


def chain_schedules(func, target) -> Dict[str, object]:
    """The chain's kernels as roller plans them for ``target``'s machine: "fused" (the fused
    kernel with the decision's tiles, built whatever the decision), "fused, default tiles"
    (the fused kernel's tiles before issue 18: a few rows x two vectors, no L1 blocking) and
    "unfused" (roller's declined build: the operators one by one)."""
    import tvm_roller
    from tvm_roller.backends.cpu import chain_lower
    from tvm_roller.fusion import split

    p = tvm_roller.plan(func, target)
    lanes = p.device.simd_lanes("float32")
    return {"fused": chain_lower.apply_fused(func, p.chain, p.fusion.rows, lanes,
                                             p.fusion.prediction.tiles),
            "fused, default tiles": chain_lower.apply_fused(func, p.chain, p.fusion.rows, lanes),
            "unfused": split.build_unfused(func, p.chain,
                                           lambda part: tvm_roller.schedule(part, target))}


def measure(kernels: Sequence[tuple], jobs: int = 2) -> List[Dict[str, float]]:
    """``kernels``: (scheduled module, parameter shapes) pairs; each is compiled for AVX2 and
    run under the cache simulator. Per kernel: MiB into the simulated L2 from beyond it
    ("l2_mib") and into L1 from L2 ("l1_mib"), and the instructions ("instructions")."""
    import tvm

    from tvm_roller.hardware import normalize_target

    avx2 = normalize_target(AVX2_TARGET)
    workdir = tempfile.mkdtemp(prefix="roller_traffic_")
    paths = []
    for i, (mod, _) in enumerate(kernels):
        path = os.path.join(workdir, f"kernel{i}.so")
        tvm.compile(mod, target=avx2).export_library(path)
        paths.append(path)
    with ThreadPoolExecutor(jobs) as pool:
        sims = list(pool.map(lambda job: _simulate(job[0], job[1][1], workdir),
                             zip(paths, kernels)))
    shutil.rmtree(workdir)
    return [{"l2_mib": (ev.get("DLmr", 0) + ev.get("DLmw", 0)) * LINE / 2**20,
             "l1_mib": (ev.get("D1mr", 0) + ev.get("D1mw", 0)) * LINE / 2**20,
             "instructions": ev.get("Ir", 0)} for ev in sims]


def have_valgrind() -> bool:
    return all(shutil.which(tool) is not None for tool in ("valgrind", "callgrind_control"))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", default=None)
    ap.add_argument("--jobs", type=int, default=2)
    args = ap.parse_args()
    if not have_valgrind():
        print("valgrind not found: this script needs valgrind and callgrind_control",
              file=sys.stderr)
        return 2
    import tvm_roller
    from harness.bench.chains import CHAINS, CONV_CHAINS, conv_chain, gemm_chain
    from tvm_roller.hardware import normalize_target

    # planned and scheduled for this machine (its device model), compiled for AVX2
    target = normalize_target("llvm")
    funcs = [(name, gemm_chain(batch, m, k, l, n, middle))
             for name, batch, m, k, l, n, middle in CHAINS]
    funcs += [(name, conv_chain(*shape)) for name, shape in CONV_CHAINS]
    kinds = ("fused", "fused, default tiles", "unfused")
    kernels, meta = [], []
    for name, func in funcs:
        p = tvm_roller.plan(func, target)
        schedules = chain_schedules(func, target)
        kernels += [(schedules[k].mod, shapes_of(func)) for k in kinds]
        meta.append((name, p.fusion.fuse, p.fusion.model.least_total_fused / 2**20,
                     p.fusion.model.least_total_unfused / 2**20))
    sims = measure(kernels, args.jobs)
    results = []
    for i, (name, fuse, pf, pu) in enumerate(meta):
        f, d, u = sims[3 * i:3 * i + 3]
        row = {"chain": name, "decision": "fused" if fuse else "unfused",
               "predicted_fused_mib": pf, "predicted_unfused_mib": pu,
               "measured_fused_mib": f["l2_mib"], "measured_unfused_mib": u["l2_mib"],
               "l1_fused_mib": f["l1_mib"], "l1_default_tiles_mib": d["l1_mib"],
               "l1_unfused_mib": u["l1_mib"],
               "fused_instructions": f["instructions"], "unfused_instructions": u["instructions"]}
        results.append(row)
        print(json.dumps(row), flush=True)
    print()
    print("| chain | model's decision | predicted fused / unfused | predicted reduction | "
          "measured fused / unfused | measured reduction | into L1: fused, default tiles, "
          "unfused |")
    print("|---|---|---|---|---|---|---|")
    for r in results:
        pred = r["predicted_unfused_mib"] / r["predicted_fused_mib"]
        meas = r["measured_unfused_mib"] / r["measured_fused_mib"]
        print(f"| {r['chain']} | {r['decision']} | {r['predicted_fused_mib']:.1f} / "
              f"{r['predicted_unfused_mib']:.1f} MiB | {pred:.2f}× | "
              f"{r['measured_fused_mib']:.1f} / {r['measured_unfused_mib']:.1f} MiB | "
              f"{meas:.2f}× | {r['l1_fused_mib']:.0f}, {r['l1_default_tiles_mib']:.0f}, "
              f"{r['l1_unfused_mib']:.0f} MiB |")
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "--run-so":
        _run_kernel(sys.argv[2], sys.argv[3:])
        sys.exit(0)
    sys.exit(main())
