"""Convolutions from real models (ResNet-50, MobileNetV2, ViT-base, Whisper-tiny, wav2vec2-base),
as the Relax pipeline hands them to roller: channels last (NHWC/HWIO, NWC/WIO), padding, bias
and ReLU fused (LegalizeOps + FuseOps + FuseTIR). Each is built with roller and timed against
PyTorch's native NCHW/NCW path (conv + bias + relu) on the same 2 threads.

    python python/bench_convs.py [--only NAME,...] [--explain]

Prints a markdown table: conv, roller class, roller ms, torch ms, ratio (torch / roller: > 1 is
roller faster), and the geomean.
"""
from __future__ import annotations

import argparse
import math
import sys
import time

import numpy as np

import tvm

import tvm_roller

# name, dims, cin, spatial size, cout, kernel, stride, pad, groups (batch 1)
SHAPES = [
    ("resnet50 stem 7x7 s2 3->64 @224", 2, 3, 224, 64, 7, 2, 3, 1),
    ("resnet50 1x1 64->64 @56", 2, 64, 56, 64, 1, 1, 0, 1),
    ("resnet50 3x3 64->64 @56", 2, 64, 56, 64, 3, 1, 1, 1),
    ("resnet50 1x1 64->256 @56", 2, 64, 56, 256, 1, 1, 0, 1),
    ("resnet50 1x1 256->64 @56", 2, 256, 56, 64, 1, 1, 0, 1),
    ("resnet50 3x3 s2 128->128 @56", 2, 128, 56, 128, 3, 2, 1, 1),
    ("resnet50 1x1 s2 256->512 @56", 2, 256, 56, 512, 1, 2, 0, 1),
    ("resnet50 3x3 256->256 @14", 2, 256, 14, 256, 3, 1, 1, 1),
    ("resnet50 3x3 512->512 @7", 2, 512, 7, 512, 3, 1, 1, 1),
    ("resnet50 1x1 2048->512 @7", 2, 2048, 7, 512, 1, 1, 0, 1),
    ("mbv2 3x3 s2 3->32 @224", 2, 3, 224, 32, 3, 2, 1, 1),
    ("mbv2 dw 3x3 32 @112", 2, 32, 112, 32, 3, 1, 1, 32),
    ("mbv2 dw 3x3 s2 96 @112", 2, 96, 112, 96, 3, 2, 1, 96),
    ("mbv2 dw 3x3 144 @56", 2, 144, 56, 144, 3, 1, 1, 144),
    ("mbv2 dw 3x3 576 @14", 2, 576, 14, 576, 3, 1, 1, 576),
    ("mbv2 dw 3x3 960 @7", 2, 960, 7, 960, 3, 1, 1, 960),
    ("mbv2 1x1 32->16 @112", 2, 32, 112, 16, 1, 1, 0, 1),
    ("mbv2 1x1 24->144 @56", 2, 24, 56, 144, 1, 1, 0, 1),
    ("mbv2 1x1 320->1280 @7", 2, 320, 7, 1280, 1, 1, 0, 1),
    ("vit patch 16x16 s16 3->768 @224", 2, 3, 224, 768, 16, 16, 0, 1),
    ("whisper conv1d k3 80->384 L3000", 1, 80, 3000, 384, 3, 1, 1, 1),
    ("whisper conv1d k3 s2 384->384 L3000", 1, 384, 3000, 384, 3, 2, 1, 1),
    ("wav2vec2 conv1d k10 s5 1->512 L16000", 1, 1, 16000, 512, 10, 5, 0, 1),
    ("wav2vec2 conv1d k3 s2 512->512 L3199", 1, 512, 3199, 512, 3, 2, 0, 1),
    ("wav2vec2 posconv k128 g16 768 L49", 1, 768, 49, 768, 128, 1, 64, 16),
    # a wav2vec2 feature-extractor layer whose output length is prime (399 -> 199)
    ("wav2vec2 conv1d k3 s2 512->512 L399 (prime out)", 1, 512, 399, 512, 3, 2, 0, 1),
    # few output channels (an image head): a "reduction" by vector length, "tiled" by reuse
    ("rgb head 3x3 64->3 @112", 2, 64, 112, 3, 3, 1, 1, 1),
]


def conv_primfunc(dims, cin, size, cout, k, s, p, g, relu=True, seed=0, n=1):
    """The fused PrimFunc (pad + conv + bias add [+ relu]) of a channels-last convolution with
    constant weights, as Relax's pipeline produces it; also the weight and bias arrays."""
    from harness.examples.fused_funcs import channels_last_conv

    rng = np.random.default_rng(seed)
    w = rng.uniform(-1, 1, size=(k,) * dims + (cin // g, cout)).astype("float32")
    b = rng.uniform(-1, 1, size=(cout,)).astype("float32")
    return channels_last_conv(dims, n, cin, size, cout, k, s, p, g, relu, weights=(w, b)), w, b


def torch_fn(dims, cin, size, cout, k, s, p, g, w, b, n=1):
    import torch
    import torch.nn.functional as F

    torch.set_num_threads(2)
    x = torch.rand((n, cin) + (size,) * dims)
    bt = torch.from_numpy(b)
    if dims == 2:
        wt = torch.from_numpy(np.ascontiguousarray(w.transpose(3, 2, 0, 1)))
        return lambda: torch.relu(F.conv2d(x, wt, bt, s, p, 1, g))
    wt = torch.from_numpy(np.ascontiguousarray(w.transpose(2, 1, 0)))
    return lambda: torch.relu(F.conv1d(x, wt, bt, s, p, 1, g))


def torch_median(f, min_repeat_ms=10, repeat=10):
    import torch

    with torch.no_grad():
        f()
        t0 = time.perf_counter()
        f()
        once = max(time.perf_counter() - t0, 1e-6)
        number = max(1, int(min_repeat_ms * 1e-3 / once))
        ts = []
        for _ in range(repeat):
            t0 = time.perf_counter()
            for _ in range(number):
                f()
            ts.append((time.perf_counter() - t0) / number)
    return float(np.median(ts))


def roller_evaluator(ex, func):
    dev = tvm.cpu()
    args = []
    for prm in func.params:
        buf = prm  # in TVM 0.27 a parameter is its buffer
        shape = [int(d) for d in buf.shape]
        args.append(tvm.runtime.tensor(np.random.rand(*shape).astype(str(buf.dtype)), dev))
    ev = ex.mod.time_evaluator("main", dev, number=1, repeat=10, min_repeat_ms=10)
    return lambda: float(ev(*args).median)


def _settled(xs, tol=0.05):
    """The best round was reproduced (within ``tol``) by another: not a lucky outlier, and
    no round left to win from a disturbed machine."""
    best = min(xs)
    return sum(x <= best * (1 + tol) for x in xs) >= 2


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", default="", help="comma-separated substrings of conv names")
    ap.add_argument("--explain", action="store_true")
    ap.add_argument("--no-torch", action="store_true")
    ap.add_argument("--rounds", type=int, default=5,
                    help="interleaved rounds at least; each side's best round median is "
                         "reported (the machine is shared: a round another job disturbed is "
                         "discarded), more rounds until the best is reproduced")
    ap.add_argument("--max-rounds", type=int, default=15)
    a = ap.parse_args(argv)
    target = tvm_roller.hardware.normalize_target("llvm")
    ratios = []
    print("| conv | roller class | roller ms | torch ms | ratio |")
    print("|---|---|---|---|---|")
    for name, *args in SHAPES:
        if a.only and not any(o in name for o in a.only.split(",")):
            continue
        func, w, b = conv_primfunc(*args)
        plan = tvm_roller.plan(func, target)
        cls = plan.tiles[0].kind
        if a.explain:
            print(tvm_roller.explain(func, target, topk=1), file=sys.stderr)
        ex = tvm_roller.build(func, target)
        rt = roller_evaluator(ex, func)
        tf = None if a.no_torch else torch_fn(*args, w, b)
        trs, tts = [], []
        for k in range(a.max_rounds):  # interleaved, so both sides see the same machine
            trs.append(rt())
            tts.append(torch_median(tf) if tf is not None else 0.0)
            if k + 1 >= a.rounds and _settled(trs) and _settled(tts):
                break
        tr, tt = min(trs), (min(tts) if tf is not None else float("nan"))
        ratio = tt / tr
        ratios.append(ratio)
        print(f"| {name} | {cls} | {tr * 1e3:.3f} | {tt * 1e3:.3f} | {ratio:.2f}x |", flush=True)
    good = [r for r in ratios if r == r]
    if good:
        gm = math.exp(sum(math.log(r) for r in good) / len(good))
        print(f"\ngeomean {gm:.2f}x over {len(good)} convs, min {min(good):.2f}x")


if __name__ == "__main__":
    main()
