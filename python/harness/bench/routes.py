"""Every micro-kernel route against the others, per GEMM shape: the best-predicted tile of each
route the device model has (from roller's top-k plan) is built and timed in one interleaved run,
and the route predicted fastest is checked against the one measured fastest."""
from __future__ import annotations

import json
import sys
from typing import Callable, Dict, List, Sequence

import numpy as np
import tvm

import tvm_roller
from tvm_roller.planner import apply
from harness.bench.interleaved import time_blocks

_DTYPES = {"bf16": ("bfloat16", "bfloat16", "float32"), "int8": ("uint8", "int8", "int32")}
_TOPK = 400  # every task tile of every route (a route's best one is kept)


def _route(tile) -> str:
    return tile.tensor_core.split(":", 1)[0]


def _args(shape: Sequence[int], dts: Sequence[str]) -> list:
    b, m, n, k = shape
    rng = np.random.default_rng(0)
    out = []
    for sh, dt in (((b, m, k), dts[0]), ((b, k, n), dts[1]), ((b, m, n), dts[2])):
        x = tvm.runtime.empty(sh, dt, tvm.cpu())
        if dt == "bfloat16":
            x.copyfrom(rng.integers(0x3c00, 0x3f80, sh).astype("uint16"))
        elif dt != dts[2]:
            x.copyfrom(rng.integers(1, 100, sh).astype(dt))
        out.append(x)
    return out


def bench_routes(shapes: List[Sequence[int]], gemm_func: Callable, rounds: int, target) -> list:
    rows = []
    for shape in shapes:
        for label, dts in _DTYPES.items():
            func = gemm_func(*shape, *dts)
            plan = tvm_roller.plan(func, target, topk=_TOPK)
            best: Dict[str, object] = {}
            for tile in plan.tiles:  # best first: a route's first tile is its best
                best.setdefault(_route(tile), tile)
            runs, predicted = {}, {}
            for route, tile in best.items():
                lib = tvm.compile(apply(plan, tile).mod, target=plan.ctx.target)
                args = _args(shape, dts)
                runs[route] = (lambda lib=lib, args=args: lib(*args))
                predicted[route] = tile.predicted_s
            times = time_blocks(runs, rounds=rounds, block_s=0.2, pause_s=0.05)
            flops = 2.0 * float(np.prod(shape))
            row = {"shape": list(shape), "dtype": label,
                   "gops": {r: flops / t["median_s"] / 1e9 for r, t in times.items()},
                   "predicted_gops": {r: flops / p / 1e9 for r, p in predicted.items()},
                   "predicted_fastest": min(predicted, key=predicted.get),
                   "measured_fastest": min(times, key=lambda r: times[r]["median_s"])}
            rows.append(row)
            print(json.dumps(row), file=sys.stderr)
    return rows


def routes_table(rows: list) -> str:
    out = ["| shape (b×M×N×K) | dtype | GOP/s measured per route (predicted) | predicted fastest | "
           "measured fastest |", "|---|---|---|---|---|"]
    for r in rows:
        cells = ", ".join(f"{k} {v:.0f} ({r['predicted_gops'][k]:.0f})"
                          for k, v in sorted(r["gops"].items(), key=lambda kv: -kv[1]))
        ok = "" if r["predicted_fastest"] == r["measured_fastest"] else " ✗"
        out.append(f"| {'×'.join(map(str, r['shape']))} | {r['dtype']} | {cells} | "
                   f"{r['predicted_fastest']} | {r['measured_fastest']}{ok} |")
    return "\n".join(out)
