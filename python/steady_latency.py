"""Steady latency: one model compiled and timed in separate processes, roller beside its peers.

    python python/steady_latency.py --arch resnet50 --batch 8 --runs 5
    python python/steady_latency.py --arch bert --tokens 512 --runs 5 [--no-peers]
    python python/steady_latency.py --arch resnet50 --batch 8 --env TVM_BIND_THREADS=0

Each run is a fresh process (``harness.bench.measure.run_isolated``; the machine's calibration
kept, nothing else cached): the model (``tools.models.hf_archs``) is compiled by roller, timed
alone first (before any other runtime exists in the process), then against PyTorch eager, ONNX
Runtime and OpenVINO in one interleaved run (``harness.bench.contest``). Printed: every
contender's median per run, and its max / min over the runs; a fingerprint of roller's plans
(a run whose plans differ from another's shows). ``--env K=V`` sets a variable in the runs.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import time


def run_one(args) -> dict:
    import warnings

    import numpy as np
    import torch

    import tvm_roller  # noqa: F401  (TVM's thread pool before torch starts its own)
    import tvm
    from tvm import relax

    from harness.bench import contest, interleaved
    from tvm_roller.integrations.pytorch import import_torch
    from tvm_roller.planner import Context
    from tvm_roller.tools.models import hf_archs

    threads = len(os.sched_getaffinity(0))
    torch.set_num_threads(threads)
    model, x = hf_archs.build(args.arch, args.batch, args.tokens)
    with torch.no_grad():
        ref = model(x).numpy().astype(np.float64)
    report: list = []
    t0 = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ctx = Context.make("llvm")
        ex = tvm_roller.relax.compile(import_torch(model, x), ctx, report, cache=False)
    row = {"compile_s": time.perf_counter() - t0, "dram_gbs": ctx.device.dram.bandwidth_gbs,
           "peak_gflops": ctx.device.peak_gflops["float32"]}
    vm = relax.VirtualMachine(ex, tvm.cpu())
    arg = tvm.runtime.tensor(x.numpy())

    def roller():
        return vm["main"](arg)

    row["roller_alone_ms"] = interleaved.time_blocks({"roller": roller})["roller"]["median_s"] * 1e3
    plans = sorted(json.dumps([e["name"], e.get("rtile"), e.get("status")], default=str)
                   for e in report)
    row["plans"] = hashlib.sha1("".join(plans).encode()).hexdigest()[:10]
    if not args.no_peers:
        row.update(contest.against_peers(roller, model, x, ref, threads, inductor=False))
    return row


def _table(rows: list) -> None:
    ok = [r for r in rows if r is not None]
    if not ok:
        print("no run finished")
        return
    series = {"roller alone": [r["roller_alone_ms"] for r in ok]}
    if "roller_ms" in ok[0]:
        series["roller (interleaved)"] = [r["roller_ms"] for r in ok]
        for name in ok[0]["peers"]:
            ms = [r["peers"][name].get("ms") for r in ok]
            if all(m is not None for m in ms):
                series[name] = ms
    for name, ms in series.items():
        runs = "  ".join(f"{m:8.1f}" for m in ms)
        print(f"{name:22s} {runs}   max/min {max(ms) / min(ms):.3f}")
    print("plans:", " ".join(r["plans"] for r in ok),
          "| DRAM GB/s:", " ".join(f"{r['dram_gbs']:.1f}" for r in ok))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--arch", default="resnet50")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--no-peers", action="store_true")
    ap.add_argument("--env", action="append", default=[], help="K=V set in every run")
    ap.add_argument("--json", default=None)
    ap.add_argument("--one", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--out", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    if args.one:
        with open(args.out, "w", encoding="utf-8") as fh:
            json.dump(run_one(args), fh)
        return
    from harness.bench.measure import run_isolated, write_json

    for kv in args.env:
        key, _, value = kv.partition("=")
        os.environ[key] = value
    opts = ["--one", "--arch", args.arch, "--batch", str(args.batch), "--tokens",
            str(args.tokens)] + ["--no-peers"] * args.no_peers
    rows = []
    for i in range(args.runs):
        run = run_isolated(__file__, opts, fresh_cache=False)
        rows.append(run.row)
        print(f"run {i + 1}: {run.status} {json.dumps(run.row)[:300] if run.row else ''}",
              flush=True)
    print(f"{args.arch} batch {args.batch}" + (f", {args.tokens} tokens" if args.tokens else "")
          + (f", env {' '.join(args.env)}" if args.env else ""))
    _table(rows)
    if args.json:
        write_json(args.json, rows)


if __name__ == "__main__":
    main()
