"""GEMM chains (Chimera) on this CPU: roller's fused kernel against the same operators built
unfused by roller (one PrimFunc each, run in turn), numpy and PyTorch, same run, same threads.

    python python/bench_fusion.py [--json out/fusion.json]

Prints a markdown table: each time is the median of repeated runs; "fused / unfused" is the
speed-up of the fused kernel over roller's unfused operators; the predicted traffic columns are the
data-movement model's (outer level, fused vs unfused); "% of peak" is the chain's FLOP rate
against the machine's calibrated float32 peak, and "ceiling" the most any kernel could gain
over the unfused one (peak / unfused rate): a chain whose unfused operators already run near
the peak is compute-bound, and fusing it cannot save more than that.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

def _median_time(fn, min_s: float = 0.5, repeats: int = 5) -> float:
    fn()
    times = []
    start = time.perf_counter()
    while len(times) < repeats or time.perf_counter() - start < min_s:
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return float(np.median(times))


def _ops(batch, m, k, l, n, middle):  # noqa: E741
    """The chain's operators as separate PrimFuncs (what an unfused build runs)."""
    from tvm import te

    from tvm_roller.fusion.workloads import gemm_chain

    bs = tuple(batch or ())
    A = te.placeholder(bs + (m, k), name="A")
    B = te.placeholder(bs + (k, l), name="B")
    rk = te.reduce_axis((0, k), name="rk")
    C = te.compute(bs + (m, l), lambda *i: te.sum(A[i[:-1] + (rk,)] * B[i[:-2] + (rk, i[-1])],
                                                  axis=rk), name="C")
    S = te.placeholder(bs + (m, l), name="S")
    D = te.placeholder(bs + (l, n), name="D")
    rl = te.reduce_axis((0, l), name="rl")
    E = te.compute(bs + (m, n), lambda *i: te.sum(S[i[:-1] + (rl,)] * D[i[:-2] + (rl, i[-1])],
                                                  axis=rl), name="E")
    funcs = [te.create_prim_func([A, B, C]), None, te.create_prim_func([S, D, E])]
    if middle != "none":  # the middle alone: the chain's definition with identity matmuls is
        # not available, so rebuild it on a placeholder
        from tvm_roller.fusion import workloads as fw

        Cin = te.placeholder(bs + (m, l), name="Cin")
        mid = fw.middle_stage(Cin, middle)
        funcs[1] = te.create_prim_func([Cin, mid])
    return funcs, gemm_chain(batch, m, k, l, n, middle)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", default=None)
    args = ap.parse_args()

    import torch
    import tvm

    import tvm_roller
    from tvm_roller.fusion.workloads import CHAINS, CONV_CHAINS
    from tvm_roller.hardware import normalize_target

    target = normalize_target("llvm")
    threads = int(target.attrs["num-cores"])
    torch.set_num_threads(threads)
    os.environ.setdefault("OMP_NUM_THREADS", str(threads))
    print(f"target {target}, {threads} threads, {time.strftime('%Y-%m-%d %H:%M')}")
    rows = []
    cases = [(name, _ops(batch, m, k, l, n, middle), _gemm_data(batch, m, k, l, n, middle))
             for name, batch, m, k, l, n, middle in CHAINS]
    cases += [(name, _conv_ops(*shape), _conv_data(*shape)) for name, shape in CONV_CHAINS]
    for name, (funcs, chain_func), (inputs, ref, torch_chain, numpy_chain, out_shape,
                                    mid_shape) in cases:
        p = tvm_roller.plan(chain_func, target)
        ta, tb, td = (tvm.runtime.tensor(x) for x in inputs)
        out = tvm.runtime.tensor(np.zeros(out_shape, "float32"))

        # fused (forced, whatever the model decided) and what build() does
        from tvm_roller.backends.cpu import chain_lower
        rws = p.fusion.rows  # the row block of a fused task, as build() uses it
        lanes = p.device.simd_lanes("float32")
        fused = tvm.compile(chain_lower.apply_fused(chain_func, p.chain, rws, lanes).mod,
                            target=target)
        t_fused = _median_time(lambda: fused(ta, tb, td, out))
        err = float(np.abs(out.numpy() - ref).max() / np.abs(ref).max())

        built = tvm_roller.build(chain_func, target)  # what the model decided
        t_built = _median_time(lambda: built(ta, tb, td, out))
        libs = [tvm_roller.build(f, target) if f is not None else None for f in funcs]
        tc = tvm.runtime.tensor(np.zeros(mid_shape, "float32"))
        ts = tvm.runtime.tensor(np.zeros(mid_shape, "float32"))

        def unfused():
            libs[0](ta, tb, tc)
            if libs[1] is not None:
                libs[1](tc, ts)
                libs[2](ts, td, out)
            else:
                libs[2](tc, td, out)

        t_unfused = _median_time(unfused)
        with torch.no_grad():
            t_torch = _median_time(torch_chain)
        t_numpy = _median_time(numpy_chain) if numpy_chain else float("nan")
        plan = p.fusion.model  # the movement model's figures
        c = p.chain
        flops = 2.0 * math.prod(c.batch or [1]) * c.m * c.l * (c.k + c.n)
        peak = p.device.peak_gflops["float32"] * 1e9  # calibrated on this machine
        row = {"chain": name, "intermediate_mib": p.chain.intermediate_bytes / 2**20,
               "decision": "fused" if p.fusion.fuse else "unfused", "rows_per_task": rws,
               "fused_ms": t_fused * 1e3, "unfused_roller_ms": t_unfused * 1e3,
               "build_ms": t_built * 1e3,
               "torch_ms": t_torch * 1e3, "numpy_ms": t_numpy * 1e3, "max_rel_err": err,
               "unfused_peak_fraction": flops / peak / t_unfused,
               "fused_peak_fraction": flops / peak / t_fused,
               "predicted_fused_mib": plan.least_total_fused / 2**20,
               "predicted_unfused_mib": plan.least_total_unfused / 2**20}
        rows.append(row)
        print(json.dumps(row))
    print()
    print("| chain | intermediate | model's decision | fused ms | unfused roller ms | "
          "fused / unfused | build() ms | build() / unfused | build() × PyTorch | × numpy | "
          "predicted traffic, fused / unfused | unfused, fused at % of peak | ceiling |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['chain']} | {r['intermediate_mib']:.2f} MiB | {r['decision']} | "
              f"{r['fused_ms']:.3f} | {r['unfused_roller_ms']:.3f} | "
              f"{r['unfused_roller_ms'] / r['fused_ms']:.2f}× | {r['build_ms']:.3f} | "
              f"{r['unfused_roller_ms'] / r['build_ms']:.2f}× | {r['torch_ms'] / r['build_ms']:.2f}× | "
              f"{r['numpy_ms'] / r['build_ms']:.2f}× | {r['predicted_fused_mib']:.1f} / "
              f"{r['predicted_unfused_mib']:.1f} MiB | {100 * r['unfused_peak_fraction']:.0f}%, "
              f"{100 * r['fused_peak_fraction']:.0f}% | {1 / r['unfused_peak_fraction']:.2f}× |")
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


def _gemm_data(batch, m, k, l, n, middle):  # noqa: E741
    """(inputs, float64 reference, PyTorch peer, output shape, intermediate shape)."""
    import torch

    bs = tuple(batch or ())
    rng = np.random.default_rng(0)
    a, b, d = (rng.uniform(-1, 1, bs + s).astype("float32") for s in ((m, k), (k, l), (l, n)))
    ta, tb, td = (torch.from_numpy(x) for x in (a, b, d))

    def torch_chain():
        c = torch.matmul(ta, tb)
        if middle == "relu":
            c = torch.relu(c)
        elif middle == "gelu":
            c = torch.nn.functional.gelu(c, approximate="tanh")
        elif middle == "softmax":
            c = torch.softmax(c, -1)
        return torch.matmul(c, td)

    return ((a, b, d), _ref(a, b, d, middle), torch_chain,
            lambda: _ref(a, b, d, middle, np.float32), bs + (m, n), bs + (m, l))


def _conv_ops(n, h, w, ci, cm, co):
    from tvm import te, topi

    from tvm_roller.fusion.workloads import conv_chain

    x = te.placeholder((n, h, w, ci), name="x")
    w1 = te.placeholder((3, 3, ci, cm), name="w1")
    y = topi.nn.conv2d_nhwc(x, w1, 1, 1, 1, out_dtype="float32")
    y = te.compute(y.shape, lambda *i: te.max(y[i], 0.0), name="S")
    yin = te.placeholder((n, h, w, cm), name="yin")
    w2 = te.placeholder((1, 1, cm, co), name="w2")
    z = topi.nn.conv2d_nhwc(yin, w2, 1, 0, 1, out_dtype="float32")
    return ([te.create_prim_func([x, w1, y]), None, te.create_prim_func([yin, w2, z])],
            conv_chain(n, h, w, ci, cm, co))


def _conv_data(n, h, w, ci, cm, co):
    import torch

    rng = np.random.default_rng(0)
    x = rng.uniform(-1, 1, (n, h, w, ci)).astype("float32")
    w1 = rng.uniform(-1, 1, (3, 3, ci, cm)).astype("float32")
    w2 = rng.uniform(-1, 1, (1, 1, cm, co)).astype("float32")

    def conv(x, w1, w2, dtype):
        t = torch.from_numpy(x.astype(dtype)).permute(0, 3, 1, 2)
        k1 = torch.from_numpy(w1.astype(dtype)).permute(3, 2, 0, 1)
        k2 = torch.from_numpy(w2.astype(dtype)).permute(3, 2, 0, 1)
        y = torch.relu(torch.nn.functional.conv2d(t, k1, padding=1))
        return torch.nn.functional.conv2d(y, k2)

    ref = conv(x, w1, w2, np.float64).permute(0, 2, 3, 1).numpy()
    tx = torch.from_numpy(x).permute(0, 3, 1, 2).contiguous()
    k1 = torch.from_numpy(w1).permute(3, 2, 0, 1).contiguous()
    k2 = torch.from_numpy(w2).permute(3, 2, 0, 1).contiguous()

    def torch_chain():  # NCHW (PyTorch's native layout), transposes outside the timed region
        return torch.nn.functional.conv2d(torch.relu(torch.nn.functional.conv2d(tx, k1, padding=1)),
                                          k2)

    # numpy has no convolution: no numpy peer
    return (x, w1, w2), ref, torch_chain, None, (n, h, w, co), (n, h, w, cm)


def _ref(a, b, d, middle, dtype=np.float64):
    c = np.matmul(a.astype(dtype), b.astype(dtype))
    if middle == "relu":
        c = np.maximum(c, 0)
    elif middle == "gelu":
        c = 0.5 * c * (1 + np.tanh(0.7978845608 * (c + 0.044715 * c ** 3)))
    elif middle == "softmax":
        c = np.exp(c - c.max(-1, keepdims=True))
        c /= c.sum(-1, keepdims=True)
    return np.matmul(c, d.astype(dtype))


if __name__ == "__main__":
    sys.exit(main())
