"""LLM generation: tvm_roller.llm against HF eager generate, same weights, same 2 threads.

Random-weight configs at real models' shapes: ``qwen2-0.5b`` (24 layers, hidden 896, 14 / 2
heads, MLP 4864, vocab 151936, tied embeddings), ``llama-3.2-1b`` (16 layers, hidden 2048, 32 / 8
heads, MLP 8192, vocab 128256, tied), ``tiny`` (for a quick check). For each prompt length:
prefill tok/s and decode tok/s of both (rounds alternating, median), whether the greedy tokens
agree, and decode's bytes per second (weights + the cache read, per token) as a fraction of the
calibrated DRAM bandwidth. Also the cold compile time and the peak resident memory. With
``--llama-cpp``, llama.cpp on the same weights (an f32 GGUF file: ``llamacpp_peer``) in the same
rounds.

    python python/bench_llm.py --config qwen2-0.5b --prompts 128,1024 --new 128 --llama-cpp
"""
from __future__ import annotations

import argparse
import os
import resource
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import tvm_roller.llm as llm  # noqa: E402
from tvm_roller.hardware import host_target  # noqa: E402
from tvm_roller.planner import Context  # noqa: E402
from tvm_roller.tools.bench.measure import write_json  # noqa: E402
from tvm_roller.tools.examples.llm_configs import CONFIGS, build  # noqa: E402

sys.path.insert(0, os.path.dirname(__file__))
from llamacpp_peer import llamacpp_greedy  # noqa: E402

def hf_times(model, ids, new: int):
    """(prefill s, decode s per token, tokens) of HF's greedy generate."""
    with torch.no_grad():
        t0 = time.perf_counter()
        model.generate(ids, max_new_tokens=1, do_sample=False, pad_token_id=0)
        prefill = time.perf_counter() - t0
        t0 = time.perf_counter()
        out = model.generate(ids, max_new_tokens=new, min_new_tokens=new, do_sample=False,
                             pad_token_id=0)
        total = time.perf_counter() - t0
    return prefill, max(total - prefill, 1e-9) / (new - 1), out


def attention_profile(lm, dram: float, contexts) -> list:
    """Per-kernel profile of one decode step at each context (the Relax VM instrument): the
    attention kernels' time against their cache bytes at the calibrated DRAM bandwidth, and
    how much the other kernels' time moves with the context (a copy of the cache would)."""
    import numpy as np
    import tvm

    from tvm_roller.tools.profile_model import profile

    keys, values, marker = lm.buffers()
    dev = tvm.cpu()
    step = tvm.runtime.tensor(np.array([[1]], dtype="int64"), dev)
    out = []
    for ctx in contexts:
        args = (step, keys, values, marker._create_view((ctx,))) + tuple(lm.decode_weights)
        rows = profile(lm.vm, args, lm.report, calls=3, func="decode")
        attn = sum(r.measured_s for r in rows if "kv_attention" in r.name)
        rest = sum(r.measured_s for r in rows if "kv_attention" not in r.name)
        cache_bytes = 2 * lm.cache.layers * lm.cache.kv_heads * lm.cache.head_dim * 4 * ctx
        bound = cache_bytes / dram
        out.append(dict(context=ctx, attention_s=attn, attention_bound_s=bound,
                        other_kernels_s=rest))
        print(f"decode at context {ctx:5d}: attention kernels {attn * 1e3:7.3f} ms "
              f"({attn / bound:.2f}x their cache bytes at DRAM bandwidth), other kernels "
              f"{rest * 1e3:7.2f} ms", flush=True)
    return out


def tvm_default_decode(model, max_seq_len: int, prompt: int, new: int) -> float:
    """TVM's own CPU build of the same module (its default pipeline, dlight's CPU GEMV and
    reduction rules on every function they take; the cache kernels are roller's either way):
    decode seconds per token after a ``prompt``-token prefill, ``new`` tokens."""
    import tvm
    from tvm import relax
    from tvm.s_tir import dlight as dl

    from tvm_roller.integrations.llm.export import export_lm
    from tvm_roller.integrations.llm.lm import CausalLM

    exported = export_lm(model, max_seq_len)
    target = host_target()
    seq = tvm.transform.Sequential([
        relax.transform.LegalizeOps(), relax.transform.AnnotateTIROpPattern(),
        relax.transform.FoldConstant(), relax.transform.FuseOps(), relax.transform.FuseTIR(),
        dl.ApplyDefaultSchedule(dl.cpu.GEMV(), dl.cpu.Reduction())])
    with target:
        mod = seq(exported.mod)
    vm = relax.VirtualMachine(tvm.compile(mod, target=target), tvm.cpu())
    raw = [tvm.runtime.from_dlpack(w.contiguous()) for w in exported.weights]
    lm = CausalLM(vm, list(vm["prefill_transform_params"](raw)), raw, exported.cache,
                  exported.vocab, max_seq_len)
    ids = torch.randint(0, exported.vocab, (1, prompt), generator=torch.Generator().manual_seed(0))
    lm.generate(ids, new)
    return lm.stats.decode_s / lm.stats.decode_tokens


def gguf_file(model) -> str:
    """The model's weights as an f32 GGUF file (a temporary directory: ~4 bytes a weight)."""
    import tempfile

    from llamacpp_peer import write_gguf

    path = os.path.join(tempfile.mkdtemp(prefix="roller-gguf-"), "model-f32.gguf")
    write_gguf(model, path, "f32")
    return path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="qwen2-0.5b", choices=sorted(CONFIGS))
    ap.add_argument("--prompts", default="128,1024")
    ap.add_argument("--new", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", default=None)
    ap.add_argument("--llama-cpp", action="store_true",
                    help="also time llama.cpp (llama-cpp-python) on the same weights in f32")
    ap.add_argument("--tvm-default", action="store_true",
                    help="also time TVM's own CPU build's decode (dlight CPU rules; prompt 16, "
                         "8 new tokens: its unscheduled prefill GEMMs are slow)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    prompts = [int(p) for p in args.prompts.split(",")]
    model, cfg = build(args.config)
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    t0 = time.perf_counter()
    lm = llm.compile(model, max_seq_len=max(prompts) + args.new, cache=False)
    compile_s = time.perf_counter() - t0
    dram = Context.make(host_target()).device.dram.bandwidth_gbs * 1e9
    cache_per_pos = 2 * lm.cache.layers * lm.cache.kv_heads * lm.cache.head_dim * 4
    print(f"{args.config}: {weight_bytes / 1e9:.2f} GB of weights, compile {compile_s:.1f} s, "
          f"{len(lm.report)} functions ({sum(e['status'] == 'roller' for e in lm.report)} "
          f"roller's), DRAM {dram / 1e9:.1f} GB/s calibrated")
    gguf = gguf_file(model) if args.llama_cpp else None
    rows = []
    for n in prompts:
        ids = torch.randint(0, cfg.vocab_size, (1, n), generator=torch.Generator().manual_seed(n))
        ours, theirs, cpp = [], [], []
        for _ in range(args.rounds):
            out = lm.generate(ids, args.new)
            ours.append((lm.stats.prefill_s, lm.stats.decode_s / lm.stats.decode_tokens))
            hf_pre, hf_dec, ref = hf_times(model, ids, args.new)
            theirs.append((hf_pre, hf_dec))
            if gguf:
                cpp.append(llamacpp_greedy(gguf, ids[0].tolist(), args.new, args.threads))
        pre = statistics.median(o[0] for o in ours)
        dec = statistics.median(o[1] for o in ours)
        hpre = statistics.median(t[0] for t in theirs)
        hdec = statistics.median(t[1] for t in theirs)
        same = int((out == ref).all())
        ctx_mid = n + args.new // 2
        bw = (weight_bytes + cache_per_pos * ctx_mid) / dec
        row = dict(prompt=n, new=args.new, prefill_tok_s=n / pre, hf_prefill_tok_s=n / hpre,
                   decode_tok_s=1 / dec, hf_decode_tok_s=1 / hdec, decode_gbs=bw / 1e9,
                   decode_bw_fraction=bw / dram, tokens_match=bool(same))
        if cpp:
            cpre = statistics.median(c[0] for c in cpp)
            cdec = statistics.median(c[1] for c in cpp)
            row.update(llamacpp_prefill_tok_s=n / cpre, llamacpp_decode_tok_s=1 / cdec,
                       llamacpp_tokens_match=cpp[-1][2] == ref[0].tolist())
            print(f"prompt {n:5d}: llama.cpp f32 prefill {n / cpre:8.1f} tok/s (roller "
                  f"{cpre / pre:.2f}x)  decode {1 / cdec:6.2f} tok/s (roller {cdec / dec:.2f}x)"
                  f"  tokens {'= HF' if row['llamacpp_tokens_match'] else 'differ from HF'}",
                  flush=True)
        rows.append(row)
        print(f"prompt {n:5d}: prefill {n / pre:8.1f} tok/s (HF {n / hpre:8.1f}, "
              f"{hpre / pre:.2f}x)  decode {1 / dec:6.2f} tok/s (HF {1 / hdec:6.2f}, "
              f"{hdec / dec:.2f}x)  {bw / 1e9:5.1f} GB/s = {bw / dram:.0%} of DRAM  "
              f"tokens {'match' if same else 'differ'}", flush=True)
    attention = attention_profile(lm, dram, [c for c in (128, 512, 1024) if c < lm.max_seq_len])
    tvm_default = None
    if args.tvm_default:
        t0 = time.perf_counter()
        tvm_default = tvm_default_decode(model, 32, 16, 8)
        print(f"TVM's own CPU build (dlight GEMV / reduction rules): decode {1 / tvm_default:.2f}"
              f" tok/s at context ~20, {(weight_bytes / tvm_default) / dram:.1%} of DRAM "
              f"(built and run in {time.perf_counter() - t0:.0f} s)", flush=True)
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    print(f"peak resident memory {rss / 1e9:.2f} GB (HF's model and roller's weights both held)")
    if args.json:
        write_json(args.json, dict(config=args.config, compile_s=compile_s, rows=rows,
                                   weight_bytes=weight_bytes, peak_rss=rss, attention=attention,
                                   tvm_default_decode_s=tvm_default))


if __name__ == "__main__":
    main()
