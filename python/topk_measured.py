"""Top-k measured (``relax.compile(measure_topk=4)``) against the default top-1 on whole models
of ``tvm_roller.tools.models.hf_archs``: compile time and latency, both builds in one process
timed in alternating rounds, each compile with a fresh schedule cache.

    python python/topk_measured.py deit[,bert,...]
"""
from __future__ import annotations

import os
import sys
import tempfile
import time

import numpy as np


def compare(arch: str, ks=(0, 4), rounds: int = 4) -> None:
    import tvm
    from tvm import relax

    import tvm_roller
    from tvm_roller.integrations.pytorch import import_torch
    from tvm_roller.tools.models import hf_archs

    model, x = hf_archs.build(arch)
    mod = import_torch(model, x)
    arg = tvm.runtime.tensor(x.numpy())
    built = {}
    for k in ks:
        os.environ["TVM_ROLLER_CACHE"] = tempfile.mkdtemp()  # plans made afresh
        t0 = time.perf_counter()
        ex = tvm_roller.relax.compile(mod, "llvm", [], cache=False, measure_topk=k)
        built[k] = (time.perf_counter() - t0, relax.VirtualMachine(ex, tvm.cpu()))
    times = {k: [] for k in built}
    for r in range(rounds):
        for k in (list(built) if r % 2 == 0 else list(built)[::-1]):
            timer = built[k][1].time_evaluator("main", tvm.cpu(), number=3, repeat=3)
            times[k].append(timer(arg).median)
    for k, (compile_s, _) in built.items():
        print(f"{arch} measure_topk={k}: compile {compile_s:.1f} s, latency "
              f"{np.median(times[k]) * 1e3:.2f} ms")


if __name__ == "__main__":
    for name in sys.argv[1].split(","):
        compare(name)
