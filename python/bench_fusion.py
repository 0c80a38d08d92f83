"""GEMM chains (Chimera) on this CPU: roller's fused kernel against the same operators built
unfused by roller (one PrimFunc each, run in turn), numpy and PyTorch, same run, same threads.

    python python/bench_fusion.py [--json out/fusion.json]

Prints a markdown table: each time is the median of repeated runs; "fused / unfused" is the
speed-up of the fused kernel over roller's unfused operators; the predicted traffic columns are the
data-movement model's (outer level, fused vs unfused).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

CHAINS = [  # name, batch, m, k, l, n, middle
    ("attention 12x512 (no softmax)", [12], 512, 64, 512, 64, "none"),
    ("attention 12x512 softmax", [12], 512, 64, 512, 64, "softmax"),
    ("attention 12x128 softmax", [12], 128, 64, 128, 64, "softmax"),
    ("MLP 128x768->3072->768 GELU", None, 128, 768, 3072, 768, "gelu"),
    ("MLP 128x768->3072->768 ReLU", None, 128, 768, 3072, 768, "relu"),
]


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
    from tvm_roller.hardware import normalize_target

    target = normalize_target("llvm")
    threads = int(target.attrs["num-cores"])
    torch.set_num_threads(threads)
    os.environ.setdefault("OMP_NUM_THREADS", str(threads))
    print(f"target {target}, {threads} threads, {time.strftime('%Y-%m-%d %H:%M')}")
    rows = []
    for name, batch, m, k, l, n, middle in CHAINS:  # noqa: E741
        funcs, chain_func = _ops(batch, m, k, l, n, middle)
        p = tvm_roller.plan(chain_func, target)
        bs = tuple(batch or ())
        rng = np.random.default_rng(0)
        a = rng.uniform(-1, 1, bs + (m, k)).astype("float32")
        b = rng.uniform(-1, 1, bs + (k, l)).astype("float32")
        d = rng.uniform(-1, 1, bs + (l, n)).astype("float32")
        ta, tb, td = (tvm.runtime.tensor(x) for x in (a, b, d))
        out = tvm.runtime.tensor(np.zeros(bs + (m, n), "float32"))

        # fused (forced, whatever the model decided) and what build() does
        from tvm_roller.fusion import lower_cpu
        from tvm_roller.fusion.planner import rows_per_task

        rws = rows_per_task(p.chain, p.fusion, p.device)
        lanes = p.device.simd_lanes("float32")
        fused = tvm.compile(lower_cpu.apply_fused(chain_func, p.chain, rws, lanes).mod,
                            target=target)
        t_fused = _median_time(lambda: fused(ta, tb, td, out))
        err = float(np.abs(out.numpy() - _ref(a, b, d, middle)).max())

        built = tvm_roller.build(chain_func, target)  # what the model decided
        t_built = _median_time(lambda: built(ta, tb, td, out))
        libs = [tvm_roller.build(f, target) if f is not None else None for f in funcs]
        tc = tvm.runtime.tensor(np.zeros(bs + (m, l), "float32"))
        ts = tvm.runtime.tensor(np.zeros(bs + (m, l), "float32"))

        def unfused():
            libs[0](ta, tb, tc)
            if libs[1] is not None:
                libs[1](tc, ts)
                libs[2](ts, td, out)
            else:
                libs[2](tc, td, out)

        t_unfused = _median_time(unfused)
        tta, ttb, ttd = (torch.from_numpy(x) for x in (a, b, d))

        def torch_chain():
            c = torch.matmul(tta, ttb)
            if middle == "relu":
                c = torch.relu(c)
            elif middle == "gelu":
                c = torch.nn.functional.gelu(c, approximate="tanh")
            elif middle == "softmax":
                c = torch.softmax(c, -1)
            return torch.matmul(c, ttd)

        with torch.no_grad():
            t_torch = _median_time(torch_chain)
        t_numpy = _median_time(lambda: _ref(a, b, d, middle, np.float32))
        plan = p.fusion
        row = {"chain": name, "intermediate_mib": p.chain.intermediate_bytes / 2**20,
               "decision": "fused" if plan.fuse else "unfused", "rows_per_task": rws,
               "fused_ms": t_fused * 1e3, "unfused_roller_ms": t_unfused * 1e3,
               "build_ms": t_built * 1e3,
               "torch_ms": t_torch * 1e3, "numpy_ms": t_numpy * 1e3, "max_abs_err": err,
               "predicted_fused_mib": plan.least_total_fused / 2**20,
               "predicted_unfused_mib": plan.least_total_unfused / 2**20}
        rows.append(row)
        print(json.dumps(row))
    print()
    print("| chain | intermediate | model's decision | fused ms | unfused roller ms | "
          "fused / unfused | build() ms | build() / unfused | build() × PyTorch | × numpy | "
          "predicted traffic, fused / unfused |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['chain']} | {r['intermediate_mib']:.2f} MiB | {r['decision']} | "
              f"{r['fused_ms']:.3f} | {r['unfused_roller_ms']:.3f} | "
              f"{r['unfused_roller_ms'] / r['fused_ms']:.2f}× | {r['build_ms']:.3f} | "
              f"{r['unfused_roller_ms'] / r['build_ms']:.2f}× | {r['torch_ms'] / r['build_ms']:.2f}× | "
              f"{r['numpy_ms'] / r['build_ms']:.2f}× | {r['predicted_fused_mib']:.1f} / "
              f"{r['predicted_unfused_mib']:.1f} MiB |")
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


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
