"""How long roller takes to construct a CUDA schedule (analysis + policy + micro-model, no TVM
scheduling or compilation) for the 52 suite workloads and the fp16 GEMMs, for sm_90 and sm_80.

    python python/cuda_construction_time.py
"""
from __future__ import annotations

import statistics
import sys
import time
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> int:
    import tvm

    import tvm_roller
    from tvm_roller.tools.suite import gpu_workloads
    from tvm_roller.tools.suite import workloads as W

    warnings.simplefilter("ignore")
    funcs = [W.create(c, i) for c, i in W.list_workloads()] + \
        [gpu_workloads.create(n) for n in gpu_workloads.FP16_GEMMS]
    targets = {"sm_90": tvm.target.Target({"tag": "nvidia/nvidia-h100", "arch": "sm_90"}),
               "sm_80": tvm.target.Target("nvidia/nvidia-a100")}
    print(f"{time.strftime('%Y-%m-%d %H:%M')}, {len(funcs)} workloads")
    for arch, tgt in targets.items():
        times = []
        for f in funcs:
            t0 = time.perf_counter()
            tvm_roller.plan(f, tgt)
            times.append(time.perf_counter() - t0)
        print(f"{arch}: median {statistics.median(times) * 1e3:.0f} ms, "
              f"max {max(times) * 1e3:.0f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
