"""bf16 and int8 compute: roller's AMX kernels against roller's float32 and PyTorch (oneDNN), and
whole models in bf16 / int8 against PyTorch (eager, inductor), ONNX Runtime and PyTorch's
int8, with the accuracy against the float32 model. Everything in one process, interleaved
(``harness.bench.interleaved``).

    python python/bench_lowp.py --gemm                 # GEMM / batch-matmul shapes
    python python/bench_lowp.py --gemm --routes        # and every micro-kernel route per shape
    python python/bench_lowp.py --models bert          # BERT-base, 128 tokens

``--llvm-target JSON`` plans and builds roller's kernels for that target (e.g. AMX masked off:
'{"kind": "llvm", "mcpu": "sapphirerapids", "mattr": ["-amx-tile", "-amx-bf16", "-amx-int8"]}').
``--routes``: for each shape and low-precision dtype, the best-predicted tile of every route the
device model has is built and timed: whether the route predicted fastest is the one measured
fastest.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

# (batch, M, N, K): 1024³, the suite's GEMMs (GMM:0-3), BERT-base's linear layers at 128
# tokens, its attention batch matmuls (12 heads)
GEMMS = [(1, 1024, 1024, 1024), (1, 128, 128, 128), (1, 512, 32, 512), (1, 512, 512, 512),
         (1, 128, 3072, 768), (1, 128, 768, 3072), (1, 128, 768, 768), (12, 128, 128, 64),
         (12, 128, 64, 128)]


def _gemm_func(b, m, n, k, a_dt, b_dt, acc):
    from tvm import te

    A = te.placeholder((b, m, k), a_dt, name="A")
    B = te.placeholder((b, k, n), b_dt, name="B")
    r = te.reduce_axis((0, k), name="k")
    C = te.compute((b, m, n), lambda z, i, j: te.sum(
        A[z, i, r].astype(acc) * B[z, r, j].astype(acc), axis=r), name="C")
    return te.create_prim_func([A, B, C])


def bench_gemms(rounds: int, target) -> list:
    import numpy as np
    import torch
    import tvm

    import tvm_roller
    from harness.bench.interleaved import time_blocks

    dev, rows = tvm.cpu(), []
    for b, m, n, k in GEMMS:
        rng = np.random.default_rng(0)
        a32 = torch.from_numpy(rng.uniform(-1, 1, (b, m, k)).astype("float32"))
        b32 = torch.from_numpy(rng.uniform(-1, 1, (b, k, n)).astype("float32"))
        a8 = torch.from_numpy(rng.integers(0, 256, (b, m, k)).astype("uint8"))
        b8 = torch.from_numpy(rng.integers(-128, 128, (b, k, n)).astype("int8"))
        runs = {}
        for label, (x, y, dts) in {
                "roller fp32": (a32, b32, ("float32", "float32", "float32")),
                "roller bf16": (a32.bfloat16(), b32.bfloat16(), ("bfloat16", "bfloat16", "float32")),
                "roller int8": (a8, b8, ("uint8", "int8", "int32"))}.items():
            lib = tvm_roller.build(_gemm_func(b, m, n, k, *dts), target)
            args = [_tvm(x, dts[0]), _tvm(y, dts[1]), tvm.runtime.empty((b, m, n), dts[2], dev)]
            runs[label] = (lambda lib=lib, args=args: lib(*args))
        ab, bb = a32.bfloat16(), b32.bfloat16()
        s8 = (a8.to(torch.int16) - 128).to(torch.int8)  # _int_mm takes int8 × int8
        runs["torch fp32"] = lambda: torch.bmm(a32, b32)
        runs["torch bf16"] = lambda: torch.bmm(ab, bb)
        if b == 1 and m > 16 and k % 8 == 0 and n % 8 == 0:
            runs["torch int8"] = lambda: torch._int_mm(s8[0], b8[0])
        times = time_blocks(runs, rounds=rounds, block_s=0.3, pause_s=0.1)
        flops = 2.0 * b * m * n * k
        row = {"shape": [b, m, n, k], **{name: flops / t["median_s"] / 1e9
                                         for name, t in times.items()}}
        rows.append(row)
        print(json.dumps(row), file=sys.stderr)
    return rows


def _tvm(t, dtype):
    import numpy as np
    import torch
    import tvm

    x = t.contiguous()
    data = x.view(torch.int16).numpy().view(np.uint16) if dtype == "bfloat16" else x.numpy()
    arr = tvm.runtime.empty(tuple(x.shape), dtype, tvm.cpu())
    arr.copyfrom(data)
    return arr


def _gemm_table(rows: list) -> str:
    out = ["| shape (b×M×N×K) | roller fp32 | roller bf16 (× fp32) | roller int8 (× fp32) | "
           "torch fp32 | torch bf16 | torch int8 | bf16 × torch | int8 × torch |",
           "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        f32, b16, i8 = r["roller fp32"], r["roller bf16"], r["roller int8"]
        ti8 = r.get("torch int8")
        out.append(f"| {'×'.join(map(str, r['shape']))} | {f32:.0f} | {b16:.0f} ({b16 / f32:.2f}×) "
                   f"| {i8:.0f} ({i8 / f32:.2f}×) | {r['torch fp32']:.0f} | {r['torch bf16']:.0f} | "
                   f"{'%.0f' % ti8 if ti8 else '—'} | {b16 / r['torch bf16']:.2f}× | "
                   f"{'%.2f×' % (i8 / ti8) if ti8 else '—'} |")
    return "\n".join(out)


# -- models ------------------------------------------------------------------------------------


def bench_model(name: str, rounds: int, samples: int, inductor: bool) -> dict:
    import torch
    import tvm
    from tvm import relax

    import tvm_roller
    from tvm_roller.hardware import host_target
    from tvm_roller.integrations.pytorch import import_torch
    from harness.bench.interleaved import time_blocks
    from harness.examples import hf_models

    torch.set_num_threads(len(os.sched_getaffinity(0)))
    model, x = hf_models.MODELS[name]("full")
    xs = [_sample(name, x, i) for i in range(samples)]
    with torch.no_grad():
        refs = [model(v).double() for v in xs]
    bf = _copy(model).to(torch.bfloat16)
    ctx, row = {}, {"model": name, "input": list(x.shape), "compile_s": {}, "declined": {}}

    def compile_(label, mod, **kw):
        report: list = []
        t0 = time.perf_counter()
        ex = tvm_roller.relax.compile(mod, host_target(), report, **kw)
        row["compile_s"][label] = time.perf_counter() - t0
        row["declined"][label] = [f"{e['name']}: {e['reason']}" for e in report if e["fallback"]]
        vm = relax.VirtualMachine(ex, tvm.cpu())
        return lambda v: _to_torch(vm["main"](_tvm(v, str(v.dtype).replace("torch.", ""))))

    def low(v):  # a bf16 model takes bf16 pixels (token ids stay integers)
        return v.to(torch.bfloat16) if v.is_floating_point() else v

    ctx["roller fp32"] = compile_("roller fp32", import_torch(model, x))
    roller_bf16 = compile_("roller bf16", import_torch(bf, low(x)))
    ctx["roller bf16"] = lambda v: roller_bf16(low(v))
    ctx["roller int8"] = compile_("roller int8", import_torch(model, x), weights="int8")
    ctx["torch bf16 eager"] = lambda v: _no_grad(bf, low(v))
    if inductor:
        compiled = torch.compile(bf)
        ctx["torch bf16 inductor"] = lambda v: _no_grad(compiled, low(v))
    dyn = torch.ao.quantization.quantize_dynamic(_copy(model), {torch.nn.Linear}, torch.qint8)
    ctx["torch int8 dynamic"] = lambda v: _no_grad(dyn, v)
    ort = _ort_int8(model, x)
    if ort is not None:
        ctx["onnxruntime int8 dynamic"] = ort
    row["accuracy"] = {label: _accuracy(f, xs, refs) for label, f in ctx.items()}
    times = time_blocks({label: (lambda f=f: f(x)) for label, f in ctx.items()}, rounds=rounds)
    row["ms"] = {label: t["median_s"] * 1e3 for label, t in times.items()}
    print(json.dumps(row), file=sys.stderr)
    return row


def _sample(name, x, i):
    import torch

    if x.dtype in (torch.int64, torch.int32):
        g = torch.Generator().manual_seed(i)
        return torch.randint(0, int(x.max()) + 1, x.shape, generator=g, dtype=x.dtype)
    return torch.randn(x.shape, generator=torch.Generator().manual_seed(i))


def _copy(model):
    import copy

    return copy.deepcopy(model)


def _no_grad(model, v):
    import torch

    with torch.no_grad():
        return model(v)


def _to_torch(out):
    import numpy as np
    import torch

    out = out if hasattr(out, "numpy") else out[0]
    data = out.numpy()
    if str(out.dtype) == "bfloat16":
        return torch.from_numpy(data.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(data)


def _accuracy(f, xs, refs) -> dict:
    import torch

    cos, top = [], []
    for v, ref in zip(xs, refs):
        y = f(v).double().reshape(ref.shape)
        cos.append(float(torch.nn.functional.cosine_similarity(y.flatten(), ref.flatten(), 0)))
        top.append(float((y.argmax(-1) == ref.argmax(-1)).double().mean()))
    return {"cos_mean": sum(cos) / len(cos), "cos_min": min(cos), "top1": sum(top) / len(top)}


def _ort_int8(model, x):
    """ONNX Runtime on the model's dynamic int8 quantization (``quantize_dynamic``: int8
    weights, activations quantized per tensor at run time), or None when it cannot export."""
    import tempfile

    import onnxruntime as ort
    import torch
    from onnxruntime.quantization import QuantType, quantize_dynamic

    from harness.bench.peers import export_onnx

    d = tempfile.mkdtemp()
    try:
        export_onnx(model, x, os.path.join(d, "m.onnx"))
        quantize_dynamic(os.path.join(d, "m.onnx"), os.path.join(d, "q.onnx"),
                         weight_type=QuantType.QInt8)
    except (RuntimeError, ValueError, torch.onnx.errors.OnnxExporterError) as err:
        print(f"onnxruntime int8: {err}", file=sys.stderr)
        return None
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = len(os.sched_getaffinity(0))
    sess = ort.InferenceSession(os.path.join(d, "q.onnx"), opts, providers=["CPUExecutionProvider"])
    name = sess.get_inputs()[0].name
    return lambda v: torch.from_numpy(sess.run(None, {name: v.numpy()})[0])


def _model_table(rows: list) -> str:
    out = ["| model | contender | ms | × roller | cosine vs fp32 (mean / min) | top-1 agreement |",
           "|---|---|---|---|---|---|"]
    for r in rows:
        for label, ms in r["ms"].items():
            base = r["ms"]["roller bf16" if "bf16" in label else
                            "roller int8" if "int8" in label else "roller fp32"]
            acc = r["accuracy"][label]
            out.append(f"| {r['model']} | {label} | {ms:.2f} | {ms / base:.2f} | "
                       f"{acc['cos_mean']:.5f} / {acc['cos_min']:.5f} | {acc['top1']:.3f} |")
    return "\n".join(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gemm", action="store_true")
    ap.add_argument("--models", default="")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--samples", type=int, default=32, help="inputs for the accuracy")
    ap.add_argument("--no-inductor", action="store_true")
    ap.add_argument("--json", default=None)
    ap.add_argument("--llvm-target", default=None, help="JSON target for roller's kernels")
    ap.add_argument("--routes", action="store_true", help="time every route per shape")
    ap.add_argument("--shapes", default=None, help="indices into GEMMS, e.g. 0,3")
    args = ap.parse_args()
    import tvm_roller  # noqa: F401  (the thread pool before torch starts its own)
    from tvm_roller.hardware import host_target
    target = json.loads(args.llvm_target) if args.llvm_target else host_target()
    if args.shapes:
        GEMMS[:] = [GEMMS[int(i)] for i in args.shapes.split(",")]
    out = {"date": time.strftime("%Y-%m-%d"), "machine": os.uname().nodename,
           "target": args.llvm_target or "host"}
    if args.gemm:
        out["gemm"] = bench_gemms(args.rounds, target)
        print(_gemm_table(out["gemm"]))
    if args.routes:
        from harness.bench.routes import bench_routes, routes_table

        out["routes"] = bench_routes(GEMMS, _gemm_func, args.rounds, target)
        print(routes_table(out["routes"]))
    if args.models:
        out["models"] = [bench_model(m, args.rounds, args.samples, not args.no_inductor)
                         for m in args.models.split(",")]
        print(_model_table(out["models"]))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump(out, fh, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
