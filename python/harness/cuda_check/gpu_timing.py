"""Timing on the GPU with CUDA events (``gpu_check``'s run half): the median time of a call,
measured in batches queued behind a GPU sleep, and how many input copies to rotate so the L2
does not flatter.

Nothing here may import TVM or the rest of tvm_roller: the GPU machine has neither.
"""
from __future__ import annotations

import math
import statistics
import time
from typing import Callable, Dict


def time_calls(call: Callable[[int], None], budget_s: float = 0.25, min_batches: int = 5,
               max_batches: int = 30, batch_us: float = 300.0) -> Dict[str, float]:
    """Median GPU time of ``call(k)`` (k rotates the input copies) in microseconds.

    Calls run in batches between two CUDA events; a batch is queued behind a GPU sleep so the
    CPU's launch overhead does not leave gaps between kernels. The batch size makes a batch
    ~``batch_us``; the number of batches fits ``budget_s`` (within [min, max])."""
    import torch

    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    call(0)
    torch.cuda.synchronize()
    t = time.perf_counter()
    e0.record()
    for i in range(3):
        call(i)
    e1.record()
    cpu_us = (time.perf_counter() - t) / 3 * 1e6
    e1.synchronize()
    est_us = max(e0.elapsed_time(e1) * 1e3 / 3, 1.0)
    batch = int(min(200, max(1, batch_us // est_us)))
    # a pathologically slow kernel (seconds) gets fewer than min_batches rather than minutes
    min_batches = max(1, min(min_batches, int(4 * budget_s * 1e6 // est_us)))
    nb = int(min(max_batches, max(min_batches, budget_s * 1e6 // (batch * est_us))))
    sleep = getattr(torch.cuda, "_sleep", None)
    ghz = 1.5
    times, k = [], 3
    for _ in range(nb):
        if sleep is not None:  # keep the GPU busy while the CPU queues the batch
            sleep(int(min(20000.0, batch * cpu_us * 1.5 + 50) * ghz * 1e3))
        e0.record()
        for _ in range(batch):
            call(k)
            k += 1
        e1.record()
        e1.synchronize()
        times.append(e0.elapsed_time(e1) * 1e3 / batch)
    return {"us": statistics.median(times), "batch": batch, "batches": nb,
            "min_us": min(times)}


def n_copies(set_bytes: int, l2_bytes: int, cap_bytes: int = 2**30, most: int = 32) -> int:
    """Input copies to rotate: enough to cover 3x the L2 when they fit ``cap_bytes``."""
    want = math.ceil(3 * l2_bytes / max(1, set_bytes))
    return int(max(1, min(most, want, cap_bytes // max(1, set_bytes))))
