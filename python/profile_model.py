"""Per-kernel time of an example model built by roller (Relax VM instrument), next to PyTorch.

    python python/profile_model.py bert_layer [--torch-profile]

Prints the model's latency (roller and PyTorch eager), then the 14 slowest kernels of roller's
build, averaged over 20 calls (instrumented calls run a little slower than plain ones).
"""
from __future__ import annotations

import argparse
import time

import numpy as np


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", choices=["mlp", "bert_layer", "resnet_cnn"])
    ap.add_argument("--torch-profile", action="store_true", help="also print PyTorch's op table")
    args = ap.parse_args()

    import torch
    import tvm
    from tvm import relax

    import tvm_roller
    from tvm_roller.integrations.pytorch import import_torch
    from harness.examples import models

    model = getattr(models, args.model)()
    x = torch.randn(*models.INPUT_SHAPES[args.model])
    target = tvm_roller.hardware.normalize_target("llvm")
    ex = tvm_roller.relax.compile(import_torch(model, x), target, [], cache=False)
    dev = tvm.cpu()
    vm = relax.VirtualMachine(ex, dev)
    arg = tvm.runtime.tensor(x.numpy())
    roller_s = vm.time_evaluator("main", dev, number=10, repeat=5)(arg).median
    with torch.no_grad():
        for _ in range(5):
            model(x)
        ts = []
        for _ in range(30):
            t0 = time.perf_counter()
            model(x)
            ts.append(time.perf_counter() - t0)
    torch_s = float(np.median(ts))
    print(f"roller {roller_s * 1e3:.2f} ms, PyTorch {torch_s * 1e3:.2f} ms: "
          f"roller speed = {torch_s / roller_s:.2f}x PyTorch")

    from harness.bench.measure import kernel_times, slowest

    times = kernel_times(vm, arg, calls=20)
    for name, t in slowest(times, 14):
        print(f"{name[:60]:<60} {t * 1e3:.3f} ms")
    print(f"sum of all kernels {sum(times.values()) * 1e3:.2f} ms")
    if args.torch_profile:
        with torch.autograd.profiler.profile() as prof, torch.no_grad():
            for _ in range(10):
                model(x)
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=12))


if __name__ == "__main__":
    main()
