"""Decoder LMs exported once with a dynamic sequence length, compiled once, run at many lengths.

For a Llama-style model and GPT-2 (hidden 768, random weights, ``--layers`` layers): one
``torch.export`` with ``Dim("seq", 1, --max-len)`` and one ``tvm_roller.relax.compile``; then at
each length: the error against PyTorch, and the latency of roller's dynamic build, PyTorch
eager, roller's static build of that length (its own export and compile) and TVM's default
build of the dynamic module. Also the compile time, the bucket kernels and the library size.

    python python/bench_dynamic.py --layers 4 --json out/dynamic.json
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
import warnings

import numpy as np
import torch
import tvm
from tvm import relax

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import tvm_roller  # noqa: E402
import tvm_roller.relax as rr  # noqa: E402
from tvm_roller.hardware import host_target  # noqa: E402
from tvm_roller.integrations.pytorch import import_torch  # noqa: E402
from harness.bench.measure import write_json  # noqa: E402
from tvm_roller.integrations.relax.passes.shape_bounds import bound_shapes_pass  # noqa: E402
from tvm_roller.integrations.relax.passes.workarounds import workarounds_pass  # noqa: E402


def build_model(name: str, layers: int, max_len: int):
    from transformers import GPT2Config, GPT2Model, LlamaConfig, LlamaModel

    from harness.examples.hf_models import _eval
    from tvm_roller.tools.models.hf_export import LastHidden

    torch.manual_seed(0)
    if name == "llama":
        cfg = LlamaConfig(hidden_size=768, intermediate_size=2048, num_attention_heads=12,
                          num_key_value_heads=12, num_hidden_layers=layers, vocab_size=1000,
                          max_position_embeddings=max(2048, max_len))
        model = LlamaModel(cfg)
    else:
        cfg = GPT2Config(n_embd=768, n_head=12, n_layer=layers, vocab_size=1000,
                         n_positions=max(1024, max_len))
        model = GPT2Model(cfg)
    cfg._attn_implementation = "eager"
    cfg.use_cache = False
    return _eval(LastHidden(model, "input_ids"))


def time_vm(ex, x, repeat_ms: int, repeat: int = 5) -> float:
    vm = relax.VirtualMachine(ex, tvm.cpu())
    arg = tvm.runtime.tensor(x.numpy())
    vm["main"](arg)
    return float(vm.time_evaluator("main", tvm.cpu(), number=1, repeat=repeat,
                                   min_repeat_ms=repeat_ms)(arg).median)


def time_torch(model, x, calls: int = 10) -> float:
    with torch.no_grad():
        for _ in range(3):
            model(x)
        times = []
        for _ in range(calls):
            t0 = time.perf_counter()
            model(x)
            times.append(time.perf_counter() - t0)
    return float(np.median(times))


def library_mb(ex) -> float:
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "lib.so")
        ex.export_library(path)
        return os.path.getsize(path) / 2 ** 20


def run(name: str, layers: int, lengths, max_len: int, tgt) -> dict:
    model = build_model(name, layers, max_len)
    ids = torch.randint(0, 1000, (1, 32), generator=torch.Generator().manual_seed(0))
    mod = import_torch(model, ids, {1: torch.export.Dim("seq", min=1, max=max_len)})
    report = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", tvm_roller.FallbackWarning)
        t0 = time.perf_counter()
        ex = rr.compile(mod, tgt, report, cache=False)
        compile_s = time.perf_counter() - t0
        # TVM's default pipeline refuses the module as exported (DispatchSortScan: "non-symbolic
        # shape is not supported for now", the causal mask's shapes): it gets roller's Relax
        # rewrites first (shapes simplified under the bounds, slice axes from the front)
        t0 = time.perf_counter()
        fixed = tvm.transform.Sequential([bound_shapes_pass(), workarounds_pass()])(mod)
        ex_default = tvm.compile(fixed, target=tgt)
        default_compile_s = time.perf_counter() - t0
    row = {"model": name, "layers": layers, "max_len": max_len, "compile_s": compile_s,
           "default_compile_s": default_compile_s, "library_mb": library_mb(ex),
           "functions": len(report), "bucketed": sum(bool(e.get("buckets")) for e in report),
           "kernels": sum(len(e.get("buckets") or []) for e in report),
           "left_to_tvm": [(e["name"], e["fallback"], e["reason"][:160]) for e in report
                           if e["status"] == "fallback"],
           "lengths": []}
    vm = relax.VirtualMachine(ex, tvm.cpu())
    for n in lengths:
        x = torch.randint(0, 1000, (1, n), generator=torch.Generator().manual_seed(n))
        out = vm["main"](tvm.runtime.tensor(x.numpy())).numpy()
        with torch.no_grad():
            ref = model(x).numpy()
        static_mod = import_torch(model, x)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", tvm_roller.FallbackWarning)
            ex_static = rr.compile(static_mod, tgt, cache=False)
        entry = {"len": n, "rel_err": float(np.abs(out - ref).max() / np.abs(ref).max()),
                 "roller_ms": time_vm(ex, x, 200) * 1e3,
                 "torch_ms": time_torch(model, x) * 1e3,
                 "static_ms": time_vm(ex_static, x, 200) * 1e3,
                 # (unscheduled loops: seconds per call at the longer lengths)
                 "default_ms": time_vm(ex_default, x, 1, 3 if n < 128 else 1) * 1e3}
        row["lengths"].append(entry)
        print(f"{name} len {n:4d}: err {entry['rel_err']:.1e}  roller {entry['roller_ms']:8.2f} ms"
              f"  torch {entry['torch_ms']:8.2f}  static {entry['static_ms']:8.2f}"
              f"  TVM default {entry['default_ms']:9.1f}", flush=True)
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default="llama,gpt2")
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--max-len", type=int, default=512)
    ap.add_argument("--lengths", default="1,7,32,128,300,512")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    tgt = tvm_roller.hardware.normalize_target(host_target())
    lengths = [int(v) for v in args.lengths.split(",")]
    rows = [run(m, args.layers, lengths, args.max_len, tgt) for m in args.models.split(",")]
    for r in rows:
        print(f"\n{r['model']} ({r['layers']} layers): compile {r['compile_s']:.1f} s "
              f"(TVM default {r['default_compile_s']:.1f} s), {r['bucketed']} of "
              f"{r['functions']} functions bucketed, {r['kernels']} kernels, library "
              f"{r['library_mb']:.1f} MiB; left to TVM: {r['left_to_tvm']}")
        print("| length | rel. error | roller dynamic (ms) | PyTorch eager (ms) | x eager | "
              "roller static (ms) | x static | TVM default dynamic (ms) | x default |")
        print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
        for e in r["lengths"]:
            print(f"| {e['len']} | {e['rel_err']:.1e} | {e['roller_ms']:.2f} | "
                  f"{e['torch_ms']:.2f} | {e['torch_ms'] / e['roller_ms']:.2f} | "
                  f"{e['static_ms']:.2f} | {e['static_ms'] / e['roller_ms']:.2f} | "
                  f"{e['default_ms']:.1f} | {e['default_ms'] / e['roller_ms']:.0f} |")
    if args.json:
        write_json(args.json, rows)


if __name__ == "__main__":
    main()
