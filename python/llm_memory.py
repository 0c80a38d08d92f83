"""Resident memory of a compiled LM against what it must hold: the weights as decode reads them
(packed, where quantized) plus the key/value cache.

    python python/llm_memory.py --config qwen2-0.5b --weights int4 --max-seq-len 1152

Each format runs in its own process (``--weights`` one at a time), so nothing of another
format is resident. Measured: the process's resident set after its imports and a tiny model's
compile and run (the libraries: torch, TVM, and the code pages of LLVM and the importer a
compile touches), after the compile with the HF model deleted, freed memory handed back to the
OS (``malloc_trim``) and one generation run; the difference is what the compiled LM holds. The
peak (``ru_maxrss``) includes the fp32 HF model the compile starts from.
"""
from __future__ import annotations

import argparse
import ctypes
import gc
import os
import resource
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import tvm_roller.llm as llm  # noqa: E402
from tvm_roller.tools.models.llm_configs import build  # noqa: E402


def resident() -> int:
    """Bytes resident now (``/proc/self/statm``), after freed heap is handed back."""
    ctypes.CDLL("libc.so.6").malloc_trim(0)
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="qwen2-0.5b")
    ap.add_argument("--weights", default="int4")
    ap.add_argument("--max-seq-len", type=int, default=1152)
    args = ap.parse_args()
    torch.set_num_threads(2)
    # the libraries' code pages the compile touches (LLVM, the importer) are resident from the
    # first compile on: a tiny model compiled first and freed puts them in the baseline
    tiny, _ = build("tiny")
    warm = llm.compile(tiny, max_seq_len=32, weights=args.weights, cache=False)
    warm.generate(torch.zeros((1, 4), dtype=torch.long), 2)
    del warm, tiny
    gc.collect()
    base = resident()
    model, cfg = build(args.config)
    fp32 = sum(p.numel() * p.element_size() for p in model.parameters())
    lm = llm.compile(model, max_seq_len=args.max_seq_len, weights=args.weights, cache=False)
    del model
    gc.collect()
    lm.generate(torch.randint(0, cfg.vocab_size, (1, 128)), 8)
    held = resident() - base
    packed = sum(w.numpy().nbytes for w in lm.decode_weights)
    cache = sum(b.numpy().nbytes for b in lm.buffers()[:2])
    need = packed + cache
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    print(f"{args.config} {args.weights}: held {held / 1e9:.3f} GB = {held / need:.2f}x the "
          f"weights as decode reads them ({packed / 1e9:.3f} GB) + the cache "
          f"({cache / 1e9:.3f} GB); libraries {base / 1e9:.2f} GB; peak {peak / 1e9:.2f} GB "
          f"(the fp32 model, {fp32 / 1e9:.2f} GB, held during the compile)")


if __name__ == "__main__":
    main()
