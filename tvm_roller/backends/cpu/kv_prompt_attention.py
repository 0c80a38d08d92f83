"""A prompt's causal attention over the key/value cache (``kv_cache``'s layout): ``m`` query
positions ``[n - m, n)`` each attend to cache positions up to their own.

The flash-attention order on a CPU: a task is (query head, tile of ``ROWS`` queries); it walks
the cache's 64-position blocks up to its last query's position, keeping each query's running
max, sum of exponentials and weighted values (rescaled when the max grows), so the scores never
leave the cache (no ``[heads, m, n]`` matrix, no repeat of grouped-query keys). Register
tiles: the scores of the ``ROWS`` queries over one vector of positions accumulate over the head
dimension (a key vector loaded once per ``ROWS`` multiply-adds, the query elements broadcast),
and the weighted values over one vector of a head row. The tile's last rows past ``m`` repeat
row ``m - 1`` (in bounds) and are not stored.
"""
from __future__ import annotations

from tvm import tirx
from tvm.script import tirx as T

from tvm_roller.backends.cpu.kv_cache import BLOCK, LANES, CacheLayout, mark_scheduled, \
    vector_part
from tvm_roller.backends.vector_math import rewrite_vector_math

# queries per task: ROWS x LANES float32 accumulators stay in a stack array under TVM's 1 KiB
# (12 registers of 32, the rest for the key vector and the broadcasts)
ROWS = 12


def prompt_attention_kernel(layout: CacheLayout, layer: int, scale: float) -> tirx.PrimFunc:
    """``q [1, heads, m, head_dim]`` (positions ``[n - m, n)``, ``n`` the marker's length) over
    ``cache[layer]`` positions ``[0, n)``, causal -> ``out [1, m, heads, head_dim]`` (the
    layout HF's attention functions return)."""
    hd, grp, heads, dtype = layout.head_dim, layout.group, layout.heads, layout.dtype
    part = vector_part(hd)
    neg = -3.0e38

    @T.prim_func(private=True)
    def attend(q_var: T.handle, kc: T.Buffer(layout.key_shape, dtype),
               vc: T.Buffer(layout.value_shape, dtype), marker_var: T.handle,
               out_var: T.handle):
        m, n = T.int64(), T.int64()
        q = T.match_buffer(q_var, (1, heads, m, hd), dtype)
        T.match_buffer(marker_var, (n,), "int64")
        out = T.match_buffer(out_var, (1, m, heads, hd), dtype)
        # heads outer: the static split of the tasks over the cores gives each whole heads
        # (equal work under the causal triangle)
        for ht in T.parallel(heads * ((m + ROWS - 1) // ROWS)):
            reg = T.alloc_buffer((ROWS, LANES), dtype)  # stack arrays: registers
            acc = T.alloc_buffer((ROWS, part), dtype)
            lane = T.alloc_buffer((LANES,), dtype)
            scores = T.alloc_buffer((ROWS, BLOCK), dtype)
            weighted = T.alloc_buffer((ROWS, hd), dtype)
            top = T.alloc_buffer((ROWS,), dtype)
            total = T.alloc_buffer((ROWS,), dtype)
            rescale = T.alloc_buffer((ROWS,), dtype)
            h = ht // ((m + ROWS - 1) // ROWS)
            r0 = ht % ((m + ROWS - 1) // ROWS) * ROWS
            for i in T.serial(ROWS):
                top[i] = T.float32(neg)
                total[i] = T.float32(0)
                for d in T.vectorized(hd):
                    weighted[i, d] = T.float32(0)
            # blocks up to the tile's last query position
            for b in T.serial((n - m + T.min(r0 + ROWS - 1, m - 1)) // BLOCK + 1):
                for sb in T.serial(BLOCK // LANES):
                    for i in T.unroll(ROWS):
                        for j in T.vectorized(LANES):
                            reg[i, j] = T.float32(0)
                    for d in T.serial(hd):
                        for i in T.unroll(ROWS):
                            for j in T.vectorized(LANES):
                                reg[i, j] = reg[i, j] + q[0, h, T.min(r0 + i, m - 1), d] \
                                    * kc[layer, h // grp, b, d, sb * LANES + j]
                    for i in T.unroll(ROWS):
                        for j in T.vectorized(LANES):
                            # causal: a position after the query's own weighs nothing
                            scores[i, sb * LANES + j] = T.Select(
                                b * BLOCK + sb * LANES + j <= n - m + T.min(r0 + i, m - 1),
                                reg[i, j] * T.float32(scale), T.float32(neg))
                for i in T.serial(ROWS):
                    for j in T.vectorized(LANES):
                        lane[j] = scores[i, j]
                    for c in T.serial(1, BLOCK // LANES):
                        for j in T.vectorized(LANES):
                            lane[j] = T.max(lane[j], scores[i, c * LANES + j])
                    rescale[i] = top[i]
                    for j in T.serial(LANES):
                        top[i] = T.max(top[i], lane[j])
                    # below e^-80 a weight is 0 (no subnormal arithmetic; masked positions)
                    rescale[i] = T.Select(rescale[i] - top[i] > T.float32(-80.0),
                                          T.exp(rescale[i] - top[i]), T.float32(0))
                    for j in T.vectorized(BLOCK):
                        scores[i, j] = T.Select(scores[i, j] - top[i] > T.float32(-80.0),
                                                T.exp(scores[i, j] - top[i]), T.float32(0))
                    for j in T.vectorized(LANES):
                        lane[j] = scores[i, j]
                    for c in T.serial(1, BLOCK // LANES):
                        for j in T.vectorized(LANES):
                            lane[j] = lane[j] + scores[i, c * LANES + j]
                    total[i] = total[i] * rescale[i]
                    for j in T.serial(LANES):
                        total[i] = total[i] + lane[j]
                for p in T.serial(hd // part):
                    for i in T.unroll(ROWS):
                        for d in T.vectorized(part):
                            acc[i, d] = T.float32(0)
                    for j in T.serial(BLOCK):
                        for i in T.unroll(ROWS):
                            for d in T.vectorized(part):
                                acc[i, d] = acc[i, d] \
                                    + scores[i, j] * vc[layer, h // grp, b * BLOCK + j,
                                                        p * part + d]
                    for i in T.unroll(ROWS):
                        for d in T.vectorized(part):
                            weighted[i, p * part + d] = weighted[i, p * part + d] \
                                * rescale[i] + acc[i, d]
            for i in T.serial(ROWS):
                if r0 + i < m:
                    for d in T.vectorized(hd):
                        out[0, r0 + i, h, d] = weighted[i, d] / total[i]

    return mark_scheduled(rewrite_vector_math(attend))
