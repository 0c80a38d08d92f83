"""Benchmark the three example PyTorch models through roller's Relax pipeline.

For each model: compile cold (fresh cache directory) and again (cached), check against PyTorch, and
time roller's build, PyTorch eager and TVM's default build in the same process. Prints a markdown
table (the one in BENCHMARKS.md) and writes the raw results as JSON.

    python python/bench_models.py [--models mlp,bert_layer,resnet_cnn] [--json out/models.json]
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time


def bench_one(name: str, tvm_default: bool) -> dict:
    import tvm_roller  # noqa: F401  (sets the thread pool size before torch / tvm start)
    from tvm_roller.tools.compile_model import compile_model
    from harness.examples import models

    factory = getattr(models, name)
    cold = compile_model(factory(), models.INPUT_SHAPES[name], name=name, cache=True,
                         tvm_default=tvm_default)
    warm = compile_model(factory(), models.INPUT_SHAPES[name], name=name, cache=True,
                         tvm_default=False)
    print(f"{name}: cold {cold.compile_s:.2f} s, cached {warm.compile_s:.2f} s, "
          f"err {cold.max_abs_err:.2e}, roller {cold.roller_ms:.3f} ms, "
          f"torch {cold.torch_ms:.3f} ms", file=sys.stderr)
    return {"model": name, "input": list(models.INPUT_SHAPES[name]),
            "cold": cold.to_dict(), "cached": warm.to_dict()}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="mlp,bert_layer,resnet_cnn")
    ap.add_argument("--json", default=None)
    ap.add_argument("--no-tvm-default", action="store_true")
    ap.add_argument("--one", default=None, help=argparse.SUPPRESS)  # internal: one model, JSON out
    args = ap.parse_args()

    if args.one:
        row = bench_one(args.one, not args.no_tvm_default)
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump(row, fh)
        return 0

    from harness.bench.measure import run_isolated, write_json

    # each model in a fresh process with a fresh cache (see run_isolated)
    rows = []
    for name in args.models.split(","):
        run = run_isolated(__file__, ["--one", name] + ["--no-tvm-default"] * args.no_tvm_default,
                           out_flag="--json")
        if run.row is None:
            raise SystemExit(f"{name}: failed ({run.status})")
        rows.append(run.row)
    import torch

    print(f"\n{time.strftime('%Y-%m-%d')}, {platform.processor() or platform.machine()}, "
          f"{os.cpu_count()} CPUs, torch {torch.__version__} ({torch.get_num_threads()} threads)\n")
    print("| model | input | max abs err vs PyTorch | compile cold (s) | compile cached (s) | "
          "roller (ms) | PyTorch eager (ms) | roller speed vs PyTorch | TVM default (ms) | "
          "roller speed vs TVM default | PrimFuncs roller / fallback |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        c, w = r["cold"], r["cached"]
        # the cached run re-times everything: report the mean of both runs
        roller_ms = (c["roller_ms"] + w["roller_ms"]) / 2
        torch_ms = (c["torch_ms"] + w["torch_ms"]) / 2
        n_r = sum(e["status"] == "roller" for e in c["report"])
        tvm_ms = c["tvm_default_ms"]
        print(f"| {r['model']} | {'x'.join(map(str, r['input']))} | {max(c['max_abs_err'], w['max_abs_err']):.1e} "
              f"| {c['compile_s']:.2f} | {w['compile_s']:.2f} | {roller_ms:.3f} | {torch_ms:.3f} "
              f"| {torch_ms / roller_ms:.2f}x | {'-' if tvm_ms is None else f'{tvm_ms:.1f}'} "
              f"| {'-' if tvm_ms is None else f'{tvm_ms / roller_ms:.0f}x'} "
              f"| {n_r} / {len(c['report']) - n_r} |")
    if args.json:
        write_json(args.json, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
