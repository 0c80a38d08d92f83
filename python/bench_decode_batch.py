"""One decode step for a batch of sequences: does the step read the weights once for the batch?

For each weight format, ``llm.compile(..., max_batch=B)`` and a ``BatchGenerator``; for each
batch size b (1, 2, 4, ... B) b sequences are prefilled with ``--prompt`` random token ids
(seeded) and then decoded together: the median step time over ``--steps`` steps (each step
also picks every row's token), the tokens a second, the ratio to one sequence's, and the
bytes of weights a step reads (the packed ones, where quantized; ``bench_llm``'s count) over
the step time as a fraction of the calibrated DRAM bandwidth.

    python python/bench_decode_batch.py --config qwen2-0.5b --weights fp32,int8,int4 --max-batch 8
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import numpy as np
import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.dirname(__file__))
import tvm_roller.llm as llm  # noqa: E402
from tvm_roller.hardware import host_target  # noqa: E402
from tvm_roller.planner import Context  # noqa: E402
from tvm_roller.tools.models.llm_configs import CONFIGS, build  # noqa: E402
from bench_llm import decode_read_bytes  # noqa: E402


def step_times(lm, batch: int, prompt: int, steps: int, seed: int) -> list:
    """Seconds of each of ``steps`` decode steps of ``batch`` sequences after their prompts."""
    gen = llm.BatchGenerator(lm, batch * lm.cache.max_blocks, batch, prefill_chunk=prompt)
    rng = np.random.default_rng(seed)
    for i in range(batch):
        ids = rng.integers(0, lm.vocab, prompt).tolist()
        gen.add(i, ids, lambda row, _n: int(np.argmax(row)), steps + 2)
    while gen.stats.decode_rows < batch or gen.stats.prefill_tokens:
        gen.step()  # the prompts in, and one step with every row decoding
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        made = gen.step()
        times.append(time.perf_counter() - t0)
        assert len(made) == batch and gen.stats.prefill_tokens == 0
    return times


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="qwen2-0.5b", choices=sorted(CONFIGS))
    ap.add_argument("--weights", default="fp32,int8,int4")
    ap.add_argument("--max-batch", type=int, default=8)
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    torch.set_num_threads(2)
    model, cfg = build(args.config)
    dram = Context.make(host_target()).device.dram.bandwidth_gbs * 1e9
    sizes = sorted({b for b in (1, 2, 4, 8, 16, args.max_batch) if b <= args.max_batch})
    rows = []
    for fmt in args.weights.split(","):
        lm = llm.compile(model, max_seq_len=args.prompt + args.steps + 8, weights=fmt,
                         max_batch=args.max_batch)
        nbytes = decode_read_bytes(lm, model, cfg, fmt)
        one = None
        for b in sizes:
            step = statistics.median(step_times(lm, b, args.prompt, args.steps, args.seed))
            one = one or step
            row = dict(config=args.config, weights=fmt, batch=b, step_ms=1e3 * step,
                       tok_s=b / step, vs_one=(b / step) / (1 / one),
                       weight_bw_of_dram=nbytes / step / dram)
            rows.append(row)
            print(f"{fmt:5s} batch {b:2d}: step {1e3 * step:7.1f} ms, {b / step:7.1f} tok/s "
                  f"({row['vs_one']:.2f}x one), weights {nbytes / 1e9:.3f} GB a step = "
                  f"{row['weight_bw_of_dram']:.0%} of DRAM", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
