"""Timing contenders against each other in one process without one slowing another.

Each contender runs in its own short blocks: a pause (another runtime's worker threads spin for
a while after its last call: ONNX Runtime's made roller's Llama measure 1.7x slower in a plain
one-call round robin), one untimed call, then calls until the block's time is spent. Rounds
alternate the order (forward, then backward), so drift on a shared machine hits every
contender alike. A contender's figure is the median of all its timed calls.
"""
from __future__ import annotations

import time
from typing import Callable, Dict, List

import numpy as np


def time_blocks(runs: Dict[str, Callable[[], object]], rounds: int = 4,
                block_s: float = 0.4, pause_s: float = 0.3,
                min_calls: int = 3) -> Dict[str, Dict[str, float]]:
    """Per contender: ``median_s`` of its calls, ``min_s``, ``calls``, and the spread of its
    block medians (``spread``: half their range over their median)."""
    calls: Dict[str, List[float]] = {name: [] for name in runs}
    blocks: Dict[str, List[float]] = {name: [] for name in runs}
    names = list(runs)
    for r in range(rounds):
        for name in (names if r % 2 == 0 else names[::-1]):
            time.sleep(pause_s)
            run = runs[name]
            run()  # untimed: caches and thread pools warm for this contender
            block: List[float] = []
            start = time.perf_counter()
            while len(block) < min_calls or time.perf_counter() - start < block_s:
                t0 = time.perf_counter()
                run()
                block.append(time.perf_counter() - t0)
            calls[name] += block
            blocks[name].append(float(np.median(block)))
    out = {}
    for name in names:
        med = float(np.median(calls[name]))
        b = blocks[name]
        out[name] = {"median_s": med, "min_s": float(min(calls[name])),
                     "calls": len(calls[name]),
                     "spread": (max(b) - min(b)) / 2 / med if med > 0 else 0.0}
    return out
