"""Operators outside the suite, drawn with a stated seed, built by roller for a target and timed
against PyTorch in the same interleaved run (each contender in its own blocks): 3x3
convolutions at 14² to 56² with 64 to 512 channels, GEMMs, GEMVs, softmax and layer norm.
Every output is checked against float64 first.

For the AVX2-only target, restrict PyTorch to the same ISA (and check with MKL_VERBOSE /
ONEDNN_VERBOSE that it took it):

    ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2 \\
        python python/bench_heldout_ops.py --seed 42 -n 12 \\
        --target '{"kind": "llvm", "mcpu": "haswell", "num-cores": 2}'

Prints a markdown table (op, shape, roller ms, torch ms, torch / roller) and the geomean.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
from dataclasses import dataclass
from typing import Callable, List

import numpy as np
import torch
import tvm
from tvm import te
from tvm.s_tir.meta_schedule.testing import te_workload

import tvm_roller

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness.bench.interleaved import time_blocks  # noqa: E402

CHANNELS = (64, 96, 128, 192, 256, 384, 512)


@dataclass
class Op:
    """One drawn operator: its TE tensors (inputs..., output), its float64 reference and the
    PyTorch call on the same inputs."""

    name: str
    shape: str
    tensors: tuple
    reference: Callable[[List[np.ndarray]], np.ndarray]
    torch_call: Callable[[List[torch.Tensor]], Callable[[], object]]


def _layer_norm(rows: int, cols: int) -> tuple:
    x = te.placeholder((rows, cols), "float32", name="x")
    g = te.placeholder((cols,), "float32", name="gamma")
    b = te.placeholder((cols,), "float32", name="beta")
    k = te.reduce_axis((0, cols), "k")
    total = te.compute((rows,), lambda i: te.sum(x[i, k], axis=k), name="total")
    k2 = te.reduce_axis((0, cols), "k2")
    sq = te.compute((rows,), lambda i: te.sum((x[i, k2] - total[i] / cols)
                                              * (x[i, k2] - total[i] / cols), axis=k2), name="sq")
    y = te.compute((rows, cols), lambda i, j: (x[i, j] - total[i] / cols)
                   / te.sqrt(sq[i] / cols + 1e-5) * g[j] + b[j], name="y")
    return x, g, b, y


def _ln_ref(a):
    x, g, b = a
    m = x.mean(axis=1, keepdims=True)
    return (x - m) / np.sqrt(x.var(axis=1, keepdims=True) + 1e-5) * g + b


def _conv_ref(a):  # NHWC input, HWIO weight (te_workload's layouts) in float64
    x = torch.from_numpy(a[0]).permute(0, 3, 1, 2)
    w = torch.from_numpy(a[1]).permute(3, 2, 0, 1)
    return torch.nn.functional.conv2d(x, w, padding=1).permute(0, 2, 3, 1).numpy()


def _torch_conv(t):
    """PyTorch's own layout (NCHW, OIHW), converted once before the timing."""
    x, w = t[0].permute(0, 3, 1, 2).contiguous(), t[1].permute(3, 2, 0, 1).contiguous()
    return lambda: torch.nn.functional.conv2d(x, w, padding=1)


def draw(rng: np.random.Generator) -> List[Callable[[], Op]]:
    """The families in turn: conv, GEMM, GEMV, conv, softmax, layer norm."""
    def conv() -> Op:
        hw, ci, co = int(rng.integers(14, 57)), int(rng.choice(CHANNELS)), int(rng.choice(CHANNELS))
        return Op("conv3x3", f"1x{hw}x{hw}x{ci} -> {co}",
                  te_workload.conv2d_nhwc(1, hw, hw, ci, co, 3, 1, 1), _conv_ref, _torch_conv)

    def gemm() -> Op:
        m, n, k = (int(rng.integers(64, 1025)) for _ in range(3))
        return Op("gemm", f"{m}x{n}x{k}", te_workload.matmul(m, n, k),
                  lambda a: a[0] @ a[1], lambda t: (lambda: torch.matmul(t[0], t[1])))

    def gemv() -> Op:
        n, k = int(rng.integers(256, 4097)), int(rng.integers(256, 4097))
        return Op("gemv", f"1x{n}x{k}", te_workload.matmul(1, n, k),
                  lambda a: a[0] @ a[1], lambda t: (lambda: torch.matmul(t[0], t[1])))

    def softmax() -> Op:
        m, n = int(rng.integers(64, 2049)), int(rng.integers(64, 4097))

        def ref(a):
            e = np.exp(a[0] - a[0].max(axis=1, keepdims=True))
            return e / e.sum(axis=1, keepdims=True)
        return Op("softmax", f"{m}x{n}", te_workload.softmax_mn(m, n), ref,
                  lambda t: (lambda: torch.softmax(t[0], dim=1)))

    def layer_norm() -> Op:
        rows, cols = int(rng.integers(64, 1025)), int(rng.integers(256, 4097))
        return Op("layer_norm", f"{rows}x{cols}", _layer_norm(rows, cols), _ln_ref,
                  lambda t: (lambda: torch.nn.functional.layer_norm(t[0], (t[0].shape[1],),
                                                                    t[1], t[2], 1e-5)))
    return [conv, gemm, gemv, conv, softmax, layer_norm]


def run_op(op: Op, target, rounds: int, rng: np.random.Generator) -> dict:
    func = te.create_prim_func(list(op.tensors)).with_attr("global_symbol", "main")
    ins = [rng.standard_normal([int(d) for d in t.shape]).astype("float32")
           for t in op.tensors[:-1]]
    out_shape = [int(d) for d in op.tensors[-1].shape]
    lib = tvm_roller.build(func, target)
    args = [tvm.runtime.tensor(a) for a in ins] + [tvm.runtime.empty(out_shape, "float32")]
    lib(*args)
    ref = op.reference([a.astype(np.float64) for a in ins])
    err = float(np.abs(args[-1].numpy() - ref).max() / max(np.abs(ref).max(), 1e-30))
    torch_run = op.torch_call([torch.from_numpy(a) for a in ins])
    times = time_blocks({"roller": lambda: lib(*args), "torch": torch_run}, rounds=rounds)
    roller_s, torch_s = times["roller"]["median_s"], times["torch"]["median_s"]
    return dict(op=op.name, shape=op.shape, roller_ms=roller_s * 1e3, torch_ms=torch_s * 1e3,
                ratio=torch_s / roller_s, rel_err=err, ok=err < 1e-3)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("-n", type=int, default=12)
    ap.add_argument("--target", default=None, help="roller's target as JSON (default: host)")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    torch.set_num_threads(2)
    rng = np.random.default_rng(args.seed)
    target = json.loads(args.target) if args.target else tvm_roller.hardware.host_target()
    makers = draw(rng)
    rows = []
    print(f"PyTorch CPU capability: {torch.backends.cpu.get_cpu_capability()}; roller target "
          f"{target}; seed {args.seed}\n\n| op | shape | roller ms | torch ms | torch / roller | "
          "rel. error |\n|---|---|---|---|---|---|", flush=True)
    for i in range(args.n):
        row = run_op(makers[i % len(makers)](), target, args.rounds, rng)
        rows.append(row)
        print(f"| {row['op']} | {row['shape']} | {row['roller_ms']:.3f} | {row['torch_ms']:.3f} | "
              f"{row['ratio']:.2f}x | {row['rel_err']:.1e}{'' if row['ok'] else ' WRONG'} |",
              flush=True)
    geo = math.exp(sum(math.log(r["ratio"]) for r in rows) / len(rows))
    print(f"\ngeomean {geo:.2f}x over {len(rows)}; lowest {min(r['ratio'] for r in rows):.2f}x; "
          f"{sum(not r['ok'] for r in rows)} wrong")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(rows, f, indent=1)
    return 0 if all(r["ok"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
