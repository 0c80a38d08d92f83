"""Irregular-M GEMMs (ViT 197, 49, 77, 127, Whisper 1500; 128 as the regular control):
roller vs PyTorch's torch.mm, same process, 2 threads.

    python python/bench_irregular_gemm.py [--quick] [--shapes M,K,N ...] [--bias]

Prints a markdown table: shape, roller GFLOP/s, torch GFLOP/s, ratio (roller / torch).
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

SHAPES = [(m, k, n) for m in (197, 49, 77, 127, 128)
          for (k, n) in ((768, 768), (768, 3072), (3072, 768))]
SHAPES += [(1500, 384, 384), (1500, 384, 1536), (1500, 1536, 384)]


def gemm_func(m: int, k: int, n: int, bias: bool = False):
    from tvm import te, topi

    A = te.placeholder((m, k), name="A")
    B = te.placeholder((k, n), name="B")
    C = topi.nn.matmul(A, B)
    args = [A, B]
    if bias:
        bvec = te.placeholder((n,), name="bias")
        C = te.compute((m, n), lambda i, j: C[i, j] + bvec[j], name="T_add")
        args.append(bvec)
    return te.create_prim_func(args + [C])


def roller_timer(m, k, n, bias, min_ms):
    """Build and check roller's kernel; a function that times it (median, seconds)."""
    import tvm
    import tvm_roller

    func = gemm_func(m, k, n, bias)
    tgt = tvm_roller.hardware.normalize_target("llvm")
    ex = tvm_roller.build(func, tgt)
    dev = tvm.cpu()
    rng = np.random.default_rng(0)
    a = rng.standard_normal((m, k)).astype("float32")
    b = rng.standard_normal((k, n)).astype("float32")
    args = [tvm.runtime.tensor(a, dev), tvm.runtime.tensor(b, dev)]
    ref = a.astype("float64") @ b.astype("float64")
    if bias:
        bv = rng.standard_normal(n).astype("float32")
        args.append(tvm.runtime.tensor(bv, dev))
        ref = ref + bv
    out = tvm.runtime.tensor(np.zeros((m, n), "float32"), dev)
    ex(*args, out)
    err = np.abs(out.numpy() - ref).max() / max(1.0, np.abs(ref).max())
    if err > 1e-4:
        raise AssertionError(f"roller result wrong for {(m, k, n)}: rel err {err:.2e}")
    f = ex.mod.time_evaluator("main", dev, number=1, repeat=15, min_repeat_ms=min_ms)
    return lambda: f(*args, out).median


def torch_timer(m, k, n, bias, min_ms):
    import torch

    a = torch.randn(m, k)
    b = torch.randn(k, n)
    bv = torch.randn(n)
    f = (lambda: torch.addmm(bv, a, b)) if bias else (lambda: torch.mm(a, b))
    for _ in range(5):
        f()

    def run():
        meds = []
        for _ in range(15):
            reps, t0 = 0, time.perf_counter()
            while True:
                f()
                reps += 1
                dt = time.perf_counter() - t0
                if dt * 1e3 >= min_ms:
                    break
            meds.append(dt / reps)
        return float(np.median(meds))
    return run


def _idle_fraction(dt: float = 0.5) -> float:
    def snap():
        with open("/proc/stat") as f:
            v = [int(x) for x in f.readline().split()[1:]]
        return v[3] + v[4], sum(v)
    i0, t0 = snap()
    time.sleep(dt)
    i1, t1 = snap()
    return (i1 - i0) / max(1, t1 - t0)


def wait_quiet(max_wait_s: float = 120.0, idle: float = 0.9) -> None:
    """The cores are shared: wait (up to ``max_wait_s``) until other processes leave them idle."""
    end = time.time() + max_wait_s
    while time.time() < end and _idle_fraction() < idle:
        pass


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="shorter timing (min_repeat_ms 20)")
    ap.add_argument("--bias", action="store_true", help="add a bias epilogue (torch.addmm)")
    ap.add_argument("--wait-quiet", action="store_true",
                    help="before each timing round, wait until the (shared) cores are idle")
    ap.add_argument("--rounds", type=int, default=3, help="alternating timing rounds")
    ap.add_argument("--shapes", nargs="*", help="M,K,N triples (default: the ViT/Whisper set)")
    args = ap.parse_args(argv)
    import torch

    torch.set_num_threads(2)
    os.environ.setdefault("TVM_NUM_THREADS", "2")
    shapes = [tuple(int(x) for x in s.split(",")) for s in args.shapes] if args.shapes else SHAPES
    min_ms = 20 if args.quick else 60
    print("| shape (M,K,N) | roller GFLOP/s | torch GFLOP/s | ratio |")
    print("|---|---:|---:|---:|")
    ratios = []
    for (m, k, n) in shapes:
        flop = 2.0 * m * k * n
        # alternate the two a few rounds (the cores are shared): best median of each
        rt, tt_ = roller_timer(m, k, n, args.bias, min_ms), torch_timer(m, k, n, args.bias, min_ms)
        tr = tt = float("inf")
        for _ in range(args.rounds):
            if args.wait_quiet:
                wait_quiet()
            tr = min(tr, rt())
            if args.wait_quiet:
                wait_quiet()
            tt = min(tt, tt_())
        ratios.append(tt / tr)
        print(f"| {m}x{k}x{n} | {flop / tr / 1e9:.1f} | {flop / tt / 1e9:.1f} | "
              f"{tt / tr:.2f} |", flush=True)
    print(f"\nmin ratio {min(ratios):.2f}, geomean {float(np.exp(np.mean(np.log(ratios)))):.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
