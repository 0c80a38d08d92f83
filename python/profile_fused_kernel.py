"""Profile the fused GEMM-chain kernel against roller's own single-operator kernels on this CPU.

    python python/profile_fused_kernel.py [--runs 3]

Per chain: GFLOP/s of the fused kernel with the tiles the decision gives its matmuls (roller's
policy on one task's share of each) and with the default tiles it had before (a few rows x two
vectors, no L1 blocking); of roller's kernels for each operator alone, at full size (their
intermediate through memory) and at one batch element (in cache: the single-operator kernel's
own rate); the fused kernel's instruction mix (AVX-512 FMAs against vector loads and
broadcasts, from its assembly); and the fused kernel's rate for other rows per task. Each
figure is the median of ``--runs`` runs, with the range.
"""
from __future__ import annotations

import argparse
import math
import re
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_fusion import _median_time  # noqa: E402

CHAINS = [  # name, batch, m, k, l, n
    ("attention 12x512 (no softmax)", [12], 512, 64, 512, 64),
    ("MLP 1024x512->2048->512", None, 1024, 512, 2048, 512),
]


def _gflops(fn, flops: float, runs: int) -> list:
    return [flops / _median_time(fn) / 1e9 for _ in range(runs)]


def _fmt(rates: list) -> str:
    return f"{np.median(rates):.0f} ({min(rates):.0f}–{max(rates):.0f})"


def _mix(lib) -> str:
    """FMAs, vector loads and broadcasts on zmm registers in the kernel's assembly."""
    asm = lib.mod.inspect_source("asm")
    fma = len(re.findall(r"vfmadd\w*ps\s[^\n]*zmm", asm))
    bcast = len(re.findall(r"vbroadcastss\s[^\n]*zmm|\{1to16\}", asm))
    loads = len(re.findall(r"vmovups\s+-?\w*\(", asm)) + len(re.findall(r"vfmadd\w*ps\s+-?\w*\(", asm))
    return f"{fma} FMAs, {(loads + bcast) / max(1, fma):.2f} loads+broadcasts per FMA"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()

    import tvm

    import tvm_roller
    from tvm_roller.backends.cpu import chain_lower, chain_plan
    from tvm_roller.backends.registry import backend_for
    from tvm_roller.fusion import operators
    from harness.bench.chains import gemm_chain
    from tvm_roller.hardware import normalize_target

    target = normalize_target("llvm")
    rng = np.random.default_rng(0)
    print(f"target {target}, {time.strftime('%Y-%m-%d %H:%M')}")
    for name, batch, m, k, l, n in CHAINS:  # noqa: E741
        func = gemm_chain(batch, m, k, l, n, "none")
        p = tvm_roller.plan(func, target)
        lanes = p.device.simd_lanes("float32")
        chain = p.chain
        flops = 2.0 * math.prod(batch or [1]) * m * l * (k + n)
        bs = tuple(batch or ())
        arrays = [tvm.runtime.tensor(rng.uniform(-1, 1, bs + s).astype("float32"))
                  for s in ((m, k), (k, l), (l, n))]
        out = tvm.runtime.tensor(np.zeros(bs + (m, n), "float32"))
        print(f"\n### {name}: rows per task {p.fusion.rows}, decision "
              f"{'fused' if p.fusion.fuse else 'unfused'}")
        print("| kernel | GFLOP/s, median (range) | instruction mix |")
        print("|---|---|---|")
        for label, tiles in (("fused, the decision's tiles", p.fusion.prediction.tiles),
                             ("fused, default tiles", (None, None))):
            lib = tvm.compile(chain_lower.apply_fused(func, chain, p.fusion.rows, lanes,
                                                      tiles).mod, target=target)
            print(f"| {label} {tiles[0] or ''} | "
                  f"{_fmt(_gflops(lambda: lib(*arrays, out), flops, args.runs))} | {_mix(lib)} |")
        one = [1] * len(chain.batch) if chain.batch else []
        for size, ch in (("full size", chain), ("one batch element" if one else "",
                                                 None)):
            if ch is None and not one:
                continue
            ch = ch or type(chain)(**{**chain.to_dict(), "batch": one})
            for op, build in (("first", operators.first_operator),
                              ("second", operators.second_operator)):
                f = build(ch)
                lib = tvm_roller.build(f, target)
                bufs = [tvm.runtime.tensor(rng.uniform(-1, 1, [int(d) for d in prm.shape])
                                           .astype("float32")) for prm in f.params]
                op_flops = 2.0 * math.prod(ch.batch or [1]) * ch.m * (
                    ch.l * ch.k if op == "first" else ch.n * ch.l)
                print(f"| roller's {op} operator alone, {size} | "
                      f"{_fmt(_gflops(lambda: lib(*bufs), op_flops, args.runs))} | {_mix(lib)} |")
        print("\n| rows per task | fused GFLOP/s, median (range) |")
        print("|---|---|")
        for rows in sorted({d for d in (16, 32, 64, 128, 256) if m % d == 0}):
            t = chain_plan.predict_times(chain, p.fusion.model, p.device, rows,
                                         backend_for(target).chain_rule.plan_alone)
            lib = tvm.compile(chain_lower.apply_fused(func, chain, rows, lanes, t.tiles).mod,
                              target=target)
            print(f"| {rows} | {_fmt(_gflops(lambda: lib(*arrays, out), flops, args.runs))} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
