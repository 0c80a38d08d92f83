"""LLM generation: tvm_roller.llm against HF eager generate, same weights, same 2 threads.

Random-weight configs at real models' shapes: ``qwen2-0.5b`` (24 layers, hidden 896, 14 / 2
heads, MLP 4864, vocab 151936, tied embeddings), ``llama-3.2-1b`` (16 layers, hidden 2048, 32 / 8
heads, MLP 8192, vocab 128256, tied), ``tiny`` (for a quick check). For each prompt length:
prefill tok/s and decode tok/s of both (rounds alternating, median), whether the greedy tokens
agree, and decode's bytes per second (weights + the cache read, per token) as a fraction of the
calibrated DRAM bandwidth. Also the cold compile time and the peak resident memory. With
``--llama-cpp``, llama.cpp on the same weights (an f32 GGUF file: ``llamacpp_peer``) in the same
rounds. ``--weights fp32,int8,int4``: roller's quantized weights too (decode's bandwidth counted
at the bytes decode reads: the packed weights), each beside llama.cpp's same format (q8_0, q4_0)
with ``--llama-cpp``; ``--hf-bf16`` and ``--torchao`` add HF eager in bf16 and with torchao's
int8 weight-only linear layers.

    python python/bench_llm.py --config qwen2-0.5b --prompts 128,1024 --new 128 --llama-cpp
    python python/bench_llm.py --weights fp32,int8,int4 --llama-cpp --hf-bf16 --torchao
"""
from __future__ import annotations

import argparse
import json
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
from harness.bench.measure import write_json  # noqa: E402
from tvm_roller.tools.models.llm_configs import CONFIGS, build  # noqa: E402

sys.path.insert(0, os.path.dirname(__file__))
from llamacpp_peer import llamacpp_greedy  # noqa: E402
from tvm_roller.backends.cpu.quant_format import get_format  # noqa: E402

def routed_bytes(t, cfg) -> float:
    """The bytes a decode step reads of weight ``t``: a mixture-of-experts layer's stacked
    expert weights (leading axis = the experts) only for the experts routed to."""
    experts = getattr(cfg, "num_local_experts", None) or getattr(cfg, "num_experts", None)
    nbytes = t.numel() * t.element_size()
    # stacked: float32 [E, n, k]; packed words [E, n/16, k/32, chunks, 16] int32 and scales
    # [E, n/16, k/32, 16] float32 (a plain matrix's are one axis fewer)
    stacked = t.dim() == 3 or (t.dim() == 4 and t.dtype == torch.float32) or t.dim() == 5
    if experts and stacked and t.shape[0] == experts:
        return nbytes * cfg.num_experts_per_tok / experts
    return nbytes


def unread_embedding_bytes(model, report: list, fmt: str) -> float:
    """What a decode step does not read of an input embedding table the LM head does not share:
    all of it but the token's row (in the format it is held in: the report says whether it
    was quantized)."""
    table = model.get_input_embeddings().weight
    if model.get_output_embeddings() is not None and \
            model.get_output_embeddings().weight is table:
        return 0.0
    name = next(n for n, p in model.named_parameters() if p is table)
    # (the report names a weight by its path in the exported wrapper: a suffix of it)
    quantized = any(e["kind"] == "quant-weight" and e["name"].endswith(name)
                    and e["status"] == "roller" for e in report)
    per_weight = get_format(fmt).bytes_per_weight() if quantized else 4.0
    rows, cols = table.shape
    return (rows - 1) * cols * per_weight


def decode_read_bytes(lm, model, cfg, fmt: str) -> float:
    """What a decode step reads of the weights: as decode takes them (packed, where quantized;
    a tied table passed under two names counted once; routed experts only)."""
    unique = {torch.from_dlpack(w).data_ptr(): torch.from_dlpack(w) for w in lm.decode_weights}
    return sum(routed_bytes(t, cfg) for t in unique.values()) \
        - unread_embedding_bytes(model, lm.report, fmt)


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

    from tvm_roller.tools.profile_model import profile

    out = []
    for ctx in contexts:
        args = lm.sequence_args("decode", np.array([[1]], dtype="int64"), ctx)
        rows = profile(lm.vm, args, lm.report, calls=3, func="decode")
        attn = sum(r.measured_s for r in rows if "kv_attention" in r.name)
        rest = sum(r.measured_s for r in rows if "kv_attention" not in r.name)
        cache_bytes = lm.cache.position_bytes * ctx
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
                  exported.vocab, max_seq_len, tvm.cpu())
    ids = torch.randint(0, exported.vocab, (1, prompt), generator=torch.Generator().manual_seed(0))
    lm.generate(ids, new)
    return lm.stats.decode_s / lm.stats.decode_tokens


LLAMA_CPP = {"fp32": "f32", "int8": "q8_0", "int4": "q4_0"}  # llama.cpp's same format


def gguf_file(model, kind: str = "f32") -> str:
    """The model's weights as a GGUF file of ``kind`` (f32, q8_0, q4_0) in a temporary
    directory."""
    import tempfile

    from llamacpp_peer import write_gguf

    path = os.path.join(tempfile.mkdtemp(prefix="roller-gguf-"), f"model-{kind}.gguf")
    write_gguf(model, path, kind)
    return path


def peer_models(model, bf16: bool, torchao: bool) -> dict:
    """HF eager in fp32 (the model), and optionally in bf16 and with torchao's int8
    weight-only linear layers (copies)."""
    import copy

    peers = {"HF fp32": model}
    if bf16:
        peers["HF bf16"] = copy.deepcopy(model).to(torch.bfloat16)
    if torchao:
        from torchao.quantization import Int8WeightOnlyConfig, quantize_

        quantized = copy.deepcopy(model)
        quantize_(quantized, Int8WeightOnlyConfig())
        peers["torchao int8"] = quantized
    return peers


def measure_prompt(n: int, args, cfg, lms: dict, peers: dict, ggufs: dict, nbytes: dict,
                   dram: float, cache_per_pos: int) -> list:
    """One prompt length: every roller format, HF peer and llama.cpp file, rounds
    interleaved; one row per roller format (its peers' figures beside it)."""
    ids = torch.randint(0, cfg.vocab_size, (1, n), generator=torch.Generator().manual_seed(n))
    ours = {f: [] for f in lms}
    theirs = {name: [] for name in peers}
    cpp = {f: [] for f in ggufs}
    outs, refs = {}, {}
    for _ in range(args.rounds):
        for fmt, lm in lms.items():
            outs[fmt] = lm.generate(ids, args.new)
            ours[fmt].append((lm.stats.prefill_s, lm.stats.decode_s / lm.stats.decode_tokens))
        for name, peer in peers.items():
            pre, dec, refs[name] = hf_times(peer, ids, args.new)
            theirs[name].append((pre, dec))
        for fmt, path in ggufs.items():
            cpp[fmt].append(llamacpp_greedy(path, ids[0].tolist(), args.new, args.threads,
                                            args.llama_repack))

    def med(pairs, i):
        return statistics.median(p[i] for p in pairs)

    ref = refs["HF fp32"]
    peer_text = "  ".join(f"{name} {n / med(t, 0):.1f} / {1 / med(t, 1):.2f}"
                          for name, t in theirs.items())
    print(f"prompt {n:5d} peers (prefill / decode tok/s): {peer_text}", flush=True)
    rows = []
    for fmt in lms:
        pre, dec = med(ours[fmt], 0), med(ours[fmt], 1)
        bw = (nbytes[fmt] + cache_per_pos * (n + args.new // 2)) / dec
        row = dict(prompt=n, new=args.new, weights=fmt, prefill_tok_s=n / pre,
                   decode_tok_s=1 / dec, decode_gbs=bw / 1e9, decode_bw_fraction=bw / dram,
                   weight_bytes=nbytes[fmt],
                   tokens_match_hf_fp32=bool((outs[fmt] == ref).all()))
        for name, t in theirs.items():
            row[f"{name} prefill_tok_s"] = n / med(t, 0)
            row[f"{name} decode_tok_s"] = 1 / med(t, 1)
        text = (f"prompt {n:5d} roller {fmt}: prefill {n / pre:7.1f} tok/s "
                f"({med(theirs['HF fp32'], 0) / pre:.2f}x HF fp32)  decode {1 / dec:6.2f} "
                f"tok/s ({med(theirs['HF fp32'], 1) / dec:.2f}x HF fp32)  {bw / 1e9:5.1f} GB/s "
                f"= {bw / dram:.0%} of DRAM at {nbytes[fmt] / 1e9:.3f} GB  tokens "
                f"{'= HF fp32' if row['tokens_match_hf_fp32'] else 'differ from HF fp32'}")
        if fmt in cpp:
            cpre, cdec = med(cpp[fmt], 0), med(cpp[fmt], 1)
            # (the GGUF file's layout checked: llama.cpp's greedy tokens against HF's)
            cpp_same = list(cpp[fmt][-1][2]) == ref[0].tolist()
            row.update(llamacpp_format=LLAMA_CPP[fmt], llamacpp_prefill_tok_s=n / cpre,
                       llamacpp_decode_tok_s=1 / cdec, llamacpp_tokens_match_hf_fp32=cpp_same)
            text += (f"\n{'':14s}llama.cpp {LLAMA_CPP[fmt]}: prefill {n / cpre:7.1f} tok/s "
                     f"(roller {cpre / pre:.2f}x)  decode {1 / cdec:6.2f} tok/s "
                     f"(roller {cdec / dec:.2f}x)  tokens "
                     f"{'= HF fp32' if cpp_same else 'differ from HF fp32'}")
        print(text, flush=True)
        rows.append(row)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="qwen2-0.5b", choices=sorted(CONFIGS))
    ap.add_argument("--prompts", default="128,1024")
    ap.add_argument("--new", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--weights", default="fp32",
                    help="roller's weight formats, comma-separated: fp32, int8, int4")
    ap.add_argument("--json", default=None)
    ap.add_argument("--llama-cpp", action="store_true",
                    help="also time llama.cpp (llama-cpp-python) on the same weights in the same "
                         "format (f32, q8_0, q4_0)")
    ap.add_argument("--llama-repack", action="store_true",
                    help="llama.cpp's quantized files with its repacked weight layouts on "
                         "(off by default: they crashed on an Emerald Rapids build)")
    ap.add_argument("--hf-bf16", action="store_true", help="also time HF eager in bf16")
    ap.add_argument("--torchao", action="store_true",
                    help="also time HF eager with torchao's int8 weight-only linear layers")
    ap.add_argument("--target", default=None,
                    help="roller's target as JSON (e.g. the AVX2-only '{\"kind\": \"llvm\", "
                         "\"mcpu\": \"haswell\", \"num-cores\": 2}'); default: this host")
    ap.add_argument("--native-tokens", action="store_true",
                    help="with --target: also build each format for this host and check that "
                         "both builds give the same tokens")
    ap.add_argument("--tvm-default", action="store_true",
                    help="also time TVM's own CPU build's decode (dlight CPU rules; prompt 16, "
                         "8 new tokens: its unscheduled prefill GEMMs are slow)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    prompts = [int(p) for p in args.prompts.split(",")]
    model, cfg = build(args.config)
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    dram = Context.make(host_target()).device.dram.bandwidth_gbs * 1e9
    target = json.loads(args.target) if args.target else None
    lms, nbytes, compile_s, natives = {}, {}, {}, {}
    for fmt in args.weights.split(","):
        t0 = time.perf_counter()
        lms[fmt] = llm.compile(model, target, max_seq_len=max(prompts) + args.new, weights=fmt,
                               cache=False)
        compile_s[fmt] = time.perf_counter() - t0
        if target is not None and args.native_tokens:
            natives[fmt] = llm.compile(model, max_seq_len=max(prompts) + args.new,
                                       weights=fmt, cache=False)
        nbytes[fmt] = decode_read_bytes(lms[fmt], model, cfg, fmt)
        print(f"{args.config} {fmt}: {nbytes[fmt] / 1e9:.3f} GB of weights read per token "
              f"(fp32 model {weight_bytes / 1e9:.2f} GB), compile {compile_s[fmt]:.1f} s, "
              f"{len(lms[fmt].report)} entries, DRAM {dram / 1e9:.1f} GB/s calibrated",
              flush=True)
    lm = next(iter(lms.values()))
    cache_per_pos = lm.cache.position_bytes
    ggufs = {f: gguf_file(model, LLAMA_CPP[f]) for f in lms} if args.llama_cpp else {}
    peers = peer_models(model, args.hf_bf16, args.torchao)
    rows = []
    for n in prompts:
        rows += measure_prompt(n, args, cfg, lms, peers, ggufs, nbytes, dram, cache_per_pos)
        ids = torch.randint(0, cfg.vocab_size, (1, n), generator=torch.Generator().manual_seed(n))
        for fmt, native in natives.items():
            same = bool((native.generate(ids, args.new) == lms[fmt].generate(ids, args.new)).all())
            print(f"prompt {n:5d} {fmt}: tokens of the {args.target} build "
                  f"{'=' if same else 'DIFFER from'} the native build's", flush=True)
            rows.append(dict(prompt=n, weights=fmt, tokens_match_native=same))
    attention = attention_profile(lm, dram, [c for c in (128, 512, 1024) if c < lm.max_seq_len])
    tvm_default = None
    if args.tvm_default:
        t0 = time.perf_counter()
        tvm_default = tvm_default_decode(model, 32, 16, 8)
        print(f"TVM's own CPU build (dlight GEMV / reduction rules): decode {1 / tvm_default:.2f}"
              f" tok/s at context ~20, {(weight_bytes / tvm_default) / dram:.1%} of DRAM "
              f"(built and run in {time.perf_counter() - t0:.0f} s)", flush=True)
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    print(f"peak resident memory {rss / 1e9:.2f} GB (HF's model, its peers and roller's "
          "weights in every format all held)")
    if args.json:
        write_json(args.json, dict(config=args.config, compile_s=compile_s, rows=rows,
                                   weight_bytes=nbytes, peak_rss=rss, attention=attention,
                                   tvm_default_decode_s=tvm_default))


if __name__ == "__main__":
    main()
