"""The BERT-base layer on this CPU at 128 and 512 tokens: roller with the matmul-chain fusion on
(the default) and off, against PyTorch eager, same run, same threads.

    python python/bench_bert_fusion.py
"""
from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> int:
    import torch
    import tvm
    from tvm import relax

    import tvm_roller
    from tvm_roller.integrations.pytorch import import_torch
    from harness.examples import models

    tgt = tvm_roller.hardware.normalize_target("llvm")
    torch.set_num_threads(int(tgt.attrs["num-cores"]))
    print(f"target {tgt}, {time.strftime('%Y-%m-%d %H:%M')}")
    print("| tokens | chains fused | roller, fusion on (ms) | roller, fusion off (ms) | on / off | "
          "PyTorch (ms) | × PyTorch | max abs error |")
    print("|---|---|---|---|---|---|---|---|")
    for seq in (128, 512):
        model = models.bert_layer()
        x = torch.randn(1, seq, 768)
        mod = import_torch(model, x)
        with torch.no_grad():
            ref = model(x).numpy()
            model(x)
            t0 = time.perf_counter()
            for _ in range(5):
                model(x)
            t_torch = (time.perf_counter() - t0) / 5
        res = {}
        for fuse in (True, False):
            decisions = []
            ex = tvm_roller.relax.compile(mod, tgt, cache=False, chains=decisions,
                                          fuse_chains=fuse)
            vm = relax.VirtualMachine(ex, tvm.cpu())
            arg = tvm.runtime.tensor(x.numpy())
            out = vm["main"](arg).numpy()
            t = vm.time_evaluator("main", tvm.cpu(), number=3, repeat=5)(arg).median
            res[fuse] = (t, float(np.abs(out - ref).max()), sum(d["fused"] for d in decisions))
        (t_on, err, n), (t_off, _, _) = res[True], res[False]
        print(f"| {seq} | {n} of 2 | {t_on * 1e3:.2f} | {t_off * 1e3:.2f} | {t_off / t_on:.2f}× | "
              f"{t_torch * 1e3:.2f} | {t_torch / t_on:.2f}× | {err:.1e} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
