"""Real HuggingFace architectures (random weights, real sizes) through roller's Relax pipeline,
against PyTorch eager, ``torch.compile`` (inductor), ONNX Runtime and OpenVINO (f32) in the
same process.

For each model, in a fresh process with a fresh roller cache: export, compile cold, compile
again (warm: the module cache), check against PyTorch, list the slowest kernels (Relax VM
instrument, before any other runtime is loaded), then time roller and every peer in one
interleaved run, each in its own short blocks (``harness.bench.contest``: the peers' exporters
and settings are named there; a peer that cannot convert a model is reported as failing). Batch
1, all cores. Counts the PrimFuncs roller scheduled / declined / failed on. Prints a markdown
table; ``--json`` keeps the raw rows.

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


def _kernel_profile(vm, arg, calls: int = 5, top: int = 8) -> list:
    """(kernel, ms per call, share) of the slowest PrimFuncs."""
    from harness.bench.measure import kernel_times, slowest

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
    from harness.bench import contest
    from harness.examples import hf_models

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
        ref = model(x).numpy().astype(np.float64)
    rel = float(np.abs(out.astype(np.float64) - ref).max() / np.abs(ref).max())
    row = {"model": name, "size": size, "input": list(x.shape), "import_s": import_s,
           "cold_s": cold_s, "warm_s": warm_s, "rel_err": rel,
           "roller_funcs": sum(e["status"] == "roller" for e in report),
           "declined": [f"{e['name']}: {e['reason']}" for e in report
                        if e["fallback"] == "decline"],
           "errors": [f"{e['name']}: {e['reason']}" for e in report if e["fallback"] == "error"],
           "kernels": _kernel_profile(vm, arg)}
    row.update(contest.against_peers(lambda: vm["main"](arg), model, x, ref,
                                     len(os.sched_getaffinity(0)), inductor))
    print(f"{name}: cold {cold_s:.1f} s, warm {warm_s:.2f} s, rel err {rel:.1e}, roller "
          f"{row['roller_ms']:.2f} ms, peers " + ", ".join(
              f"{k} {p['ms']:.2f} ms" if "ms" in p else f"{k} fails"
              for k, p in row["peers"].items()), file=sys.stderr)
    return row


_PEERS = ("eager", "inductor", "onnxruntime", "openvino")


def _table(rows: list) -> str:
    import math

    from harness.bench.contest import best_peer

    lines = ["| model | input | max rel. err | compile cold / warm (s) | roller (ms) | eager (ms) "
             "| inductor (ms) | ONNX RT (ms) | OpenVINO (ms) | best peer | x best | x eager "
             "| roller / declined / error funcs |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    geo = {"best": [], "eager": []}
    for r in rows:
        cells = []
        for name in _PEERS:
            p = r["peers"].get(name)
            cells.append("-" if p is None else (f"{p['ms']:.2f}" if "ms" in p else "fails"))
        best = best_peer(r["peers"])
        eager = r["peers"]["eager"].get("ms")
        x_best = best[1] / r["roller_ms"] if best else None
        x_eager = eager / r["roller_ms"] if eager else None
        for key, v in (("best", x_best), ("eager", x_eager)):
            if v:
                geo[key].append(v)
        lines.append(
            f"| {r['model']} | {'x'.join(map(str, r['input']))} | {r['rel_err']:.1e} "
            f"| {r['cold_s']:.1f} / {r['warm_s']:.2f} | {r['roller_ms']:.2f} | "
            + " | ".join(cells) + f" | {best[0] if best else '-'} "
            f"| {'-' if x_best is None else f'{x_best:.2f}'} "
            f"| {'-' if x_eager is None else f'{x_eager:.2f}'} "
            f"| {r['roller_funcs']} / {len(r['declined'])} / {len(r['errors'])} |")
    for key, vs in geo.items():
        if vs:
            g = math.exp(sum(math.log(v) for v in vs) / len(vs))
            lines.append(f"\ngeomean x {key}: {g:.2f} ({len(vs)} models, min {min(vs):.2f})")
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

    from harness.bench.measure import run_isolated

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
