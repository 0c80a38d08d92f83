"""Accuracy of roller's int8 / int4 weights against fp32, beside llama.cpp's q8_0 / q4_0 of the
same weights: top-1 agreement and mean KL divergence of the next-token distribution over
teacher-forced positions.

    python python/quant_accuracy.py --config qwen2-0.5b --positions 256 [--llama-cpp]

Random weights of HF's default init give nearly flat logits, which any quantization leaves flat.
The weights are made to look trained where it matters (``trained_like``): a few input channels
of every matrix ×10–×20 (the outlier channels of trained LLMs, which set a group's scale and
cost the other weights in it their precision) and sharper logits. Both sides get the same
weights and the same token ids; the reference is HF's fp32 forward over the whole sequence.
roller's logits come from ``CausalLM.logits`` (one decode step per position), llama.cpp's from
one evaluation with ``logits_all``.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import tvm_roller.llm as llm  # noqa: E402
from tvm_roller.tools.models.llm_configs import build  # noqa: E402

LLAMA_CPP = {"fp32": "f32", "int8": "q8_0", "int4": "q4_0"}


def trained_like(model, seed: int = 0, outliers: int = 4, sharpen: float = 8.0) -> None:
    """In place: ``outliers`` input channels of each hidden size ×U(10, 20) in every matrix
    that reads it (the same channels across layers), and the final norm's weight ×``sharpen``
    (logits of ~4 nats of entropy instead of ~12; larger layer weights instead make a random
    network chaotic: with every matrix ×3, llama.cpp's f32 and HF's fp32 forward disagree on
    3% of the top-1 tokens from summation order alone)."""
    rng = np.random.default_rng(seed)
    channels: dict = {}
    with torch.no_grad():
        model.model.norm.weight.mul_(sharpen)
        for name, p in model.named_parameters():
            if p.dim() != 2 or "embed" in name or "lm_head" in name:
                continue
            k = p.shape[1]
            if k not in channels:
                channels[k] = (rng.choice(k, outliers, replace=False),
                               rng.uniform(10, 20, outliers))
            cols, gains = channels[k]
            p[:, torch.as_tensor(cols)] *= torch.as_tensor(gains, dtype=p.dtype)


def metrics(ref: np.ndarray, got: np.ndarray) -> dict:
    """Top-1 agreement and mean KL(ref || got) of the softmaxes, over the rows."""
    def log_softmax(z):
        z = z.astype(np.float64)
        z = z - z.max(-1, keepdims=True)
        return z - np.log(np.exp(z).sum(-1, keepdims=True))

    lr, lg = log_softmax(ref), log_softmax(got)
    kl = (np.exp(lr) * (lr - lg)).sum(-1)
    return dict(top1=float((ref.argmax(-1) == got.argmax(-1)).mean()), kl=float(kl.mean()))


def llamacpp_logits(path: str, ids, threads: int) -> np.ndarray:
    import llama_cpp
    from llamacpp_peer import _without_weight_repacking

    if not path.endswith("-f32.gguf"):
        _without_weight_repacking(llama_cpp)
    lm = llama_cpp.Llama(model_path=path, n_ctx=len(ids) + 8, n_threads=threads,
                         n_threads_batch=threads, n_batch=512, logits_all=True, verbose=False)
    lm.eval(list(ids))
    out = np.array(lm.scores[:len(ids)], dtype=np.float32)
    lm.close()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="qwen2-0.5b")
    ap.add_argument("--positions", type=int, default=256)
    ap.add_argument("--formats", default="int8,int4")
    ap.add_argument("--llama-cpp", action="store_true")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    model, cfg = build(args.config)
    trained_like(model)
    ids = torch.randint(0, cfg.vocab_size, (1, args.positions),
                        generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ref = model(ids).logits[0].float().numpy()
    probs = np.exp(ref - ref.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    entropy = float(-(probs * np.log(probs + 1e-30)).sum(-1).mean())
    print(f"{args.config}, {args.positions} positions: fp32 next-token entropy {entropy:.2f} "
          f"nats (flat: {np.log(cfg.vocab_size):.2f})", flush=True)
    rows = []
    for fmt in args.formats.split(","):
        t0 = time.perf_counter()
        lm = llm.compile(model, max_seq_len=args.positions + 8, weights=fmt, cache=False)
        got = lm.logits(ids)
        row = dict(engine="roller", format=fmt, **metrics(ref, got))
        rows.append(row)
        print(f"roller {fmt:5s}: top-1 {row['top1']:.1%}  KL {row['kl']:.5f}  "
              f"({time.perf_counter() - t0:.0f} s)", flush=True)
        del lm
    if args.llama_cpp:
        from llamacpp_peer import write_gguf

        tmp = tempfile.mkdtemp(prefix="roller-acc-")
        for fmt in ["fp32"] + args.formats.split(","):
            kind = LLAMA_CPP[fmt]
            path = os.path.join(tmp, f"model-{kind}.gguf")
            write_gguf(model, path, kind)
            got = llamacpp_logits(path, ids[0].tolist(), args.threads)
            os.remove(path)
            row = dict(engine="llama.cpp", format=kind, **metrics(ref, got))
            rows.append(row)
            print(f"llama.cpp {kind:5s}: top-1 {row['top1']:.1%}  KL {row['kl']:.5f}",
                  flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(config=args.config, positions=args.positions, entropy=entropy,
                           rows=rows), f, indent=1)


if __name__ == "__main__":
    main()
