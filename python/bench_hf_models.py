"""Real HuggingFace architectures (random weights, real sizes) through roller's Relax pipeline,
against PyTorch eager and ``torch.compile`` (inductor) in the same process.

For each model, in a fresh process with a fresh roller cache: export, compile cold, compile
again (warm: the module cache), check against PyTorch, time roller, eager and inductor
(batch 1, all cores), count the PrimFuncs roller scheduled / declined / failed on, and list the
slowest kernels (Relax VM instrument). Prints a markdown table; ``--json`` keeps the raw rows.

    python python/bench_hf_models.py [--models bert,gpt2,vit,resnet,mobilenet_v2,whisper_encoder]
                                     [--size full|small] [--no-inductor] [--json out.json]
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time

DEFAULT_MODELS = "bert,gpt2,vit,resnet,mobilenet_v2,whisper_encoder"


def _median_time(fn, min_s: float = 1.0, min_runs: int = 5) -> float:
    import numpy as np

    for _ in range(2):
        fn()
    times = []
    start = time.perf_counter()
    while time.perf_counter() - start < min_s or len(times) < min_runs:
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return float(np.median(times))


def _kernel_profile(vm, arg, calls: int = 5, top: int = 8) -> list:
    """(kernel, ms per call, share) of the slowest PrimFuncs."""
    from tvm_roller.tools.bench.measure import kernel_times, slowest

    times = kernel_times(vm, arg, calls)
    total = sum(times.values()) or 1.0
    return [(name, t * 1e3, t / total) for name, t in slowest(times, top)]


def bench_one(name: str, size: str, inductor: bool, keep_layouts: bool = False) -> dict:
    import tvm_roller  # noqa: F401  (sets TVM's thread pool before torch starts its own)
    import numpy as np
    import torch
    import tvm
    from tvm import relax

    from tvm_roller.integrations.pytorch import import_torch
    from tvm_roller.tools.examples import hf_models

    torch.set_num_threads(len(os.sched_getaffinity(0)))
    model, x = hf_models.MODELS[name](size)
    target = tvm_roller.hardware.normalize_target("llvm")
    t0 = time.perf_counter()
    mod = import_torch(model, x)
    import_s = time.perf_counter() - t0

    report: list = []
    layouts = {} if keep_layouts else None  # {}: the model's own (NCHW) convolution layouts
    t0 = time.perf_counter()
    ex = tvm_roller.relax.compile(mod, target, report, conv_layouts=layouts)
    cold_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    tvm_roller.relax.compile(mod, target, [], conv_layouts=layouts)
    warm_s = time.perf_counter() - t0

    dev = tvm.cpu()
    vm = relax.VirtualMachine(ex, dev)
    arg = tvm.runtime.tensor(x.numpy())
    out = vm["main"](arg)
    out = out.numpy() if hasattr(out, "numpy") else out[0].numpy()
    with torch.no_grad():
        ref = model(x).numpy()
    rel = float(np.abs(out.astype(np.float64) - ref).max() / np.abs(ref).max())
    roller_s = float(vm.time_evaluator("main", dev, number=1, repeat=10,
                                       min_repeat_ms=300)(arg).median)
    with torch.no_grad():
        eager_s = _median_time(lambda: model(x))
    row = {"model": name, "size": size, "input": list(x.shape), "import_s": import_s,
           "cold_s": cold_s, "warm_s": warm_s, "rel_err": rel, "roller_ms": roller_s * 1e3,
           "eager_ms": eager_s * 1e3,
           "roller_funcs": sum(e["status"] == "roller" for e in report),
           "declined": [f"{e['name']}: {e['reason']}" for e in report
                        if e["fallback"] == "decline"],
           "errors": [f"{e['name']}: {e['reason']}" for e in report if e["fallback"] == "error"],
           "kernels": _kernel_profile(vm, arg)}
    if inductor:
        t0 = time.perf_counter()
        compiled = torch.compile(model)
        with torch.no_grad():
            compiled(x)
            row["inductor_compile_s"] = time.perf_counter() - t0
            row["inductor_ms"] = _median_time(lambda: compiled(x)) * 1e3
    print(f"{name}: cold {cold_s:.1f} s, warm {warm_s:.2f} s, rel err {rel:.1e}, roller "
          f"{row['roller_ms']:.2f} ms, eager {row['eager_ms']:.2f} ms"
          + (f", inductor {row['inductor_ms']:.2f} ms" if inductor else ""), file=sys.stderr)
    return row


def _ratio(peer_ms, roller_ms) -> str:
    return "-" if peer_ms is None else f"{peer_ms / roller_ms:.2f}x"


def _table(rows: list) -> str:
    import math

    lines = ["| model | input | max rel. err | compile cold / warm (s) | roller (ms) | eager (ms) "
             "| inductor (ms) | x eager | x inductor | roller / declined / error funcs |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    ratios = []
    for r in rows:
        ind = r.get("inductor_ms")
        ratios.append(r["eager_ms"] / r["roller_ms"])
        lines.append(
            f"| {r['model']} | {'x'.join(map(str, r['input']))} | {r['rel_err']:.1e} "
            f"| {r['cold_s']:.1f} / {r['warm_s']:.2f} | {r['roller_ms']:.2f} "
            f"| {r['eager_ms']:.2f} | {f'{ind:.2f}' if ind else '-'} "
            f"| {r['eager_ms'] / r['roller_ms']:.2f}x "
            f"| {_ratio(ind, r['roller_ms'])} "
            f"| {r['roller_funcs']} / {len(r['declined'])} / {len(r['errors'])} |")
    if ratios:
        geo = math.exp(sum(math.log(v) for v in ratios) / len(ratios))
        lines.append(f"\ngeomean speed vs PyTorch eager: {geo:.2f}x")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=DEFAULT_MODELS)
    ap.add_argument("--size", default="full", choices=["full", "small"])
    ap.add_argument("--no-inductor", action="store_true")
    ap.add_argument("--keep-layouts", action="store_true",
                    help="keep PyTorch's NCHW/NCW convolutions (no conversion to NHWC/NWC)")
    ap.add_argument("--json", default=None)
    ap.add_argument("--one", default=None, help=argparse.SUPPRESS)  # internal: one model
    ap.add_argument("--out", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()

    if args.one:
        row = bench_one(args.one, args.size, not args.no_inductor, args.keep_layouts)
        with open(args.out, "w", encoding="utf-8") as fh:
            json.dump(row, fh)
        return 0

    from tvm_roller.tools.bench.measure import run_isolated

    rows = []
    for name in args.models.split(","):
        # a fresh process and cache per model (see run_isolated)
        opts = ["--one", name, "--size", args.size] + ["--no-inductor"] * args.no_inductor \
            + ["--keep-layouts"] * args.keep_layouts
        run = run_isolated(__file__, opts)
        if run.row is None:
            print(f"{name}: failed ({run.status})", file=sys.stderr)
            continue
        rows.append(run.row)
    print(f"{time.strftime('%Y-%m-%d')}, {platform.node()}, {os.cpu_count()} CPUs, "
          f"size {args.size}" + (", model's conv layouts" if args.keep_layouts else "") + "\n")
    print(_table(rows))
    for r in rows:
        print(f"\n{r['model']}: slowest kernels (ms per call, share):")
        for kname, ms, share in r["kernels"]:
            print(f"  {kname:<60} {ms:8.3f} {share:6.1%}")
        for what in ("declined", "errors"):
            for line in r[what]:
                print(f"  {what}: {line[:160]}")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump(rows, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
