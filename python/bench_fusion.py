"""GEMM chains (Chimera) on this CPU: what ``tvm_roller.build`` makes of each chain against the
same operators built one by one by roller (one PrimFunc each, run in turn), PyTorch and numpy,
in the same run, with the same threads; and the BERT layer through Relax with fusion on and off.

    python python/bench_fusion.py [--runs 3] [--json out/fusion.json] [--traffic] [--no-bert]

Every kernel is compiled once; then the whole set is timed ``--runs`` times in turn (each time
the median of repeats), so the runs show the spread on this machine. Per chain: the model's
decision and its predicted times (fused, unfused), ``build()`` against the operators in each
run, the fused kernel forced (whatever the decision) with the decision's tiles and with the
default tiles it had before (a few rows x two vectors, no L1 blocking), each with its
run-to-run spread. ``--traffic`` also runs every kernel once under valgrind's cache simulator
(``measure_traffic.py``): MiB into L2 from the shared level and into L1 from L2.
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
sys.path.insert(0, str(Path(__file__).resolve().parent))


def _median_time(fn, min_s: float = 0.3, repeats: int = 5) -> float:
    fn()
    times = []
    start = time.perf_counter()
    while len(times) < repeats or time.perf_counter() - start < min_s:
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return float(np.median(times))


def _ops(batch, m, k, l, n, middle):  # noqa: E741
    """The chain's operators as separate PrimFuncs (what an unfused build runs): the two
    matmuls (``fusion.operators``) and the stage between them on a placeholder, if any."""
    from tvm import te

    from tvm_roller.fusion import operators
    from harness.bench import chains as workloads
    from tvm_roller.fusion.chain import detect_chain

    chain_func = workloads.gemm_chain(batch, m, k, l, n, middle)
    chain = detect_chain(chain_func)
    mid = None
    if middle != "none":
        c = te.placeholder(tuple(batch or ()) + (m, l), name="Cin")
        mid = te.create_prim_func([c, workloads.middle_stage(c, middle)])
    return [operators.first_operator(chain), mid, operators.second_operator(chain)], chain_func


class _Case:
    """One chain, compiled: build(), the operators alone, the fused kernel both ways."""

    def __init__(self, name, funcs, chain_func, data, target):
        import tvm

        import tvm_roller
        from measure_traffic import chain_schedules

        self.name, self.func = name, chain_func
        inputs, self.ref, self.torch_fn, self.numpy_fn, out_shape, mid_shape = data
        self.plan = tvm_roller.plan(chain_func, target)
        self.args = [tvm.runtime.tensor(x) for x in inputs]
        self.out = tvm.runtime.tensor(np.zeros(out_shape, "float32"))
        self.schedules = chain_schedules(chain_func, target)
        self.kernels = {"build": tvm_roller.build(chain_func, target)}
        for kind in ("fused", "fused, default tiles"):
            self.kernels[kind] = tvm.compile(self.schedules[kind].mod, target=target)
        self.errors = {k: self._error(f) for k, f in self.kernels.items()}
        self.libs = [tvm_roller.build(f, target) if f is not None else None for f in funcs]
        self.mid = [tvm.runtime.tensor(np.zeros(mid_shape, "float32")) for _ in range(2)]
        c = self.plan.chain
        self.flops = 2.0 * math.prod(c.batch or [1]) * c.m * c.l * (c.k + c.n)

    def _error(self, f) -> float:
        f(*self.args, self.out)
        return float(np.abs(self.out.numpy() - self.ref).max() / np.abs(self.ref).max())

    def unfused(self):
        a, b, d = self.args
        tc, ts = self.mid
        self.libs[0](a, b, tc)
        if self.libs[1] is not None:
            self.libs[1](tc, ts)
            self.libs[2](ts, d, self.out)
        else:
            self.libs[2](tc, d, self.out)

    def time_all(self) -> dict:
        """One run: each variant's median, alternating so that a slow spell hits all."""
        t = {k: _median_time(lambda f=f: f(*self.args, self.out)) for k, f in self.kernels.items()}
        t["unfused"] = _median_time(self.unfused)
        t["build, again"] = _median_time(lambda: self.kernels["build"](*self.args, self.out))
        t["build"] = min(t["build"], t.pop("build, again"))
        import torch

        with torch.no_grad():
            t["torch"] = _median_time(self.torch_fn)
        t["numpy"] = _median_time(self.numpy_fn) if self.numpy_fn else float("nan")
        return t


def _spread(values) -> float:
    """Half the range over the runs, as a share of their median (±)."""
    return (max(values) - min(values)) / 2 / float(np.median(values))


def _bert_vms(seq: int, target):
    """The BERT layer (``examples.models.bert_layer``) at ``seq`` tokens through roller's Relax
    pipeline, fusion on and off: (input, reference, PyTorch call, {on: (vm, chains fused)})."""
    import torch
    import tvm
    from tvm import relax

    import tvm_roller
    from tvm_roller.integrations.pytorch import import_torch
    from harness.examples import models

    model = models.bert_layer()
    x = torch.randn(1, seq, 768)
    mod = import_torch(model, x)
    with torch.no_grad():
        ref = model(x).numpy()
    vms = {}
    for fuse in (True, False):
        decisions = []
        ex = tvm_roller.relax.compile(mod, target, cache=False, chains=decisions,
                                      fuse_chains=fuse)
        vms[fuse] = (relax.VirtualMachine(ex, tvm.cpu()), sum(d["fused"] for d in decisions))
    return tvm.runtime.tensor(x.numpy()), ref, lambda: model(x), vms


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", default=None)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--traffic", action="store_true", help="also simulate the caches (valgrind)")
    ap.add_argument("--no-bert", action="store_true")
    ap.add_argument("--chain", action="append", default=[], metavar="B,M,K,L,N,MIDDLE",
                    help="time this GEMM chain instead of the suite's (B: the batch, 0 for "
                         "none; MIDDLE: none, relu, gelu or softmax); repeatable")
    args = ap.parse_args()

    import torch
    import tvm

    from harness.bench.chains import CHAINS, CONV_CHAINS
    from tvm_roller.hardware import normalize_target

    target = normalize_target("llvm")
    threads = int(target.attrs["num-cores"])
    torch.set_num_threads(threads)
    os.environ.setdefault("OMP_NUM_THREADS", str(threads))
    print(f"target {target}, {threads} threads, {time.strftime('%Y-%m-%d %H:%M')}")
    chains = [_parse_chain(spec) for spec in args.chain] or CHAINS
    cases = [_Case(name, *_ops(batch, m, k, l, n, middle), _gemm_data(batch, m, k, l, n, middle),
                   target) for name, batch, m, k, l, n, middle in chains]
    if not args.chain:
        cases += [_Case(name, *_conv_ops(*shape), _conv_data(*shape), target)
                  for name, shape in CONV_CHAINS]
    bert = None if args.no_bert else _bert_vms(512, target)
    runs = []
    for r in range(args.runs):
        run = {c.name: c.time_all() for c in cases}
        if bert is not None:
            arg, _, torch_fn, vms = bert
            run["BERT"] = {fuse: vm.time_evaluator("main", tvm.cpu(), number=3, repeat=5)(
                arg).median for fuse, (vm, _) in vms.items()}
            with torch.no_grad():
                run["BERT"]["torch"] = _median_time(torch_fn)
        runs.append(run)
        print(f"run {r + 1} done", flush=True)

    rows = []
    for c in cases:
        ts = [run[c.name] for run in runs]
        med = {k: float(np.median([t[k] for t in ts])) for k in ts[0]}
        times = c.plan.fusion.prediction
        rows.append({
            "chain": c.name, "intermediate_mib": c.plan.chain.intermediate_bytes / 2**20,
            "decision": "fused" if c.plan.fusion.fuse else "unfused",
            "rows_per_task": c.plan.fusion.rows,
            "predicted_fused_ms": times.fused_s * 1e3,
            "predicted_unfused_ms": times.unfused_s * 1e3,
            "median_ms": {k: v * 1e3 for k, v in med.items()},
            "build_over_unfused": [t["unfused"] / t["build"] for t in ts],
            "fused_over_unfused": [t["unfused"] / t["fused"] for t in ts],
            "default_tiles_over_unfused": [t["unfused"] / t["fused, default tiles"] for t in ts],
            "fused_spread": _spread([t["fused"] for t in ts]),
            "default_tiles_spread": _spread([t["fused, default tiles"] for t in ts]),
            "build_x_torch": med["torch"] / med["build"],
            "build_x_numpy": med["numpy"] / med["build"],
            "max_rel_err": max(c.errors.values()),
            "fused_peak_fraction": c.flops / (c.plan.device.peak_gflops["float32"] * 1e9) /
            med["fused"],
        })
    if args.traffic:
        from measure_traffic import measure, shapes_of

        kinds = ("fused", "fused, default tiles", "unfused")
        sims = measure([(c.schedules[k].mod, shapes_of(c.func)) for c in cases for k in kinds])
        for i, row in enumerate(rows):
            row["traffic"] = dict(zip(kinds, sims[3 * i:3 * i + 3]))
    _print_tables(rows, runs, bert)
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps({"chains": rows, "bert": [
            {str(k): v for k, v in run["BERT"].items()} for run in runs if "BERT" in run]},
            indent=1))
    return 0


def _parse_chain(spec: str):
    """``B,M,K,L,N,MIDDLE`` as a CHAINS entry."""
    *dims, middle = spec.split(",")
    b, m, k, l, n = (int(d) for d in dims)  # noqa: E741
    batch = [b] if b else None
    return (spec, batch, m, k, l, n, middle)


def _ratios(values) -> str:
    return " / ".join(f"{v:.2f}" for v in values)


def _print_tables(rows, runs, bert) -> None:
    print()
    print("| chain | intermediate | decision | predicted fused / unfused ms | build() ms | "
          "unfused ms | build() / unfused, runs | fused forced / unfused, runs | fused spread | "
          "default tiles / unfused, runs | default tiles spread | build() × PyTorch | "
          "build() × numpy | fused: % of peak | max rel. error |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        m = r["median_ms"]
        print(f"| {r['chain']} | {r['intermediate_mib']:.2f} MiB | {r['decision']} | "
              f"{r['predicted_fused_ms']:.3f} / {r['predicted_unfused_ms']:.3f} | "
              f"{m['build']:.3f} | {m['unfused']:.3f} | {_ratios(r['build_over_unfused'])} | "
              f"{_ratios(r['fused_over_unfused'])} | ±{100 * r['fused_spread']:.0f}% | "
              f"{_ratios(r['default_tiles_over_unfused'])} | "
              f"±{100 * r['default_tiles_spread']:.0f}% | {r['build_x_torch']:.2f}× | "
              f"{r['build_x_numpy']:.2f}× | {100 * r['fused_peak_fraction']:.0f}% | "
              f"{r['max_rel_err']:.1e} |")
    if any("traffic" in r for r in rows):
        print()
        print("| chain | into L2 from the shared level: fused, default tiles, unfused | "
              "into L1 from L2: fused, default tiles, unfused |")
        print("|---|---|---|")
        for r in rows:
            t = r["traffic"]
            kinds = ("fused", "fused, default tiles", "unfused")
            print(f"| {r['chain']} | " + ", ".join(f"{t[k]['l2_mib']:.1f}" for k in kinds) +
                  " MiB | " + ", ".join(f"{t[k]['l1_mib']:.0f}" for k in kinds) + " MiB |")
    if bert is not None:
        arg, ref, _, vms = bert
        errs = {fuse: float(np.abs(vm["main"](arg).numpy() - ref).max())
                for fuse, (vm, _) in vms.items()}
        print()
        print("| BERT layer, 512 tokens | fusion on ms | fusion off ms | on / off | PyTorch ms | "
              "on × PyTorch | max abs error on, off |")
        print("|---|---|---|---|---|---|---|")
        for i, run in enumerate(runs):
            b = run["BERT"]
            print(f"| run {i + 1} ({vms[True][1]} of 2 chains fused) | {b[True] * 1e3:.2f} | "
                  f"{b[False] * 1e3:.2f} | {b[False] / b[True]:.2f}× | {b['torch'] * 1e3:.2f} | "
                  f"{b['torch'] / b[True]:.2f}× | {errs[True]:.1e}, {errs[False]:.1e} |")


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

    from harness.bench.chains import conv_chain

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
