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

# queries per task, and per register tile: SUB queries x WIDE positions (or head-row elements)
# of float32 accumulators, 12 of the 32 vector registers in a stack array under TVM's 1 KiB;
# each loaded key (value) vector serves SUB multiply-adds, each broadcast query element
# (weight) two
ROWS, SUB, WIDE = 12, 6, 2 * LANES


def prompt_attention_kernel(layout: CacheLayout, layer: int, scale: float) -> tirx.PrimFunc:
    """``q [1, heads, m, head_dim]`` (positions ``[n - m, n)``, ``n`` the marker's length) over
    ``cache[layer]`` positions ``[0, n)``, causal -> ``out [1, m, heads, head_dim]`` (the
    layout HF's attention functions return)."""
    hd, grp, heads, dtype = layout.head_dim, layout.group, layout.heads, layout.dtype
    part = WIDE if hd % WIDE == 0 else vector_part(hd)
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
            reg = T.alloc_buffer((SUB, WIDE), dtype)  # stack arrays: registers
            acc = T.alloc_buffer((SUB, part), dtype)
            lane = T.alloc_buffer((ROWS, LANES), dtype)
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
                for rs in T.serial(ROWS // SUB * (BLOCK // WIDE)):
                    for i in T.unroll(SUB):
                        for j in T.vectorized(WIDE):
                            reg[i, j] = T.float32(0)
                    for d in T.serial(hd):
                        for i in T.unroll(SUB):
                            for j in T.vectorized(WIDE):
                                reg[i, j] = reg[i, j] \
                                    + q[0, h, T.min(r0 + rs // (BLOCK // WIDE) * SUB + i, m - 1),
                                        d] \
                                    * kc[layer, h // grp, b, d, rs % (BLOCK // WIDE) * WIDE + j]
                    for i in T.unroll(SUB):
                        for j in T.vectorized(WIDE):
                            # causal: a position after the query's own weighs nothing
                            scores[rs // (BLOCK // WIDE) * SUB + i,
                                   rs % (BLOCK // WIDE) * WIDE + j] = T.Select(
                                b * BLOCK + rs % (BLOCK // WIDE) * WIDE + j
                                <= n - m + T.min(r0 + rs // (BLOCK // WIDE) * SUB + i, m - 1),
                                reg[i, j] * T.float32(scale), T.float32(neg))
                # the rows' maxima and sums: lane-wise over the block's vectors, then across
                # the lanes with the rows interleaved (independent chains, not one row's)
                for i in T.unroll(ROWS):
                    for j in T.vectorized(LANES):
                        lane[i, j] = scores[i, j]
                    for c in T.serial(1, BLOCK // LANES):
                        for j in T.vectorized(LANES):
                            lane[i, j] = T.max(lane[i, j], scores[i, c * LANES + j])
                    rescale[i] = top[i]
                for j in T.serial(LANES):
                    for i in T.unroll(ROWS):
                        top[i] = T.max(top[i], lane[i, j])
                for i in T.serial(ROWS):
                    # below e^-80 a weight is 0 (no subnormal arithmetic; masked positions)
                    rescale[i] = T.Select(rescale[i] - top[i] > T.float32(-80.0),
                                          T.exp(rescale[i] - top[i]), T.float32(0))
                    for j in T.vectorized(BLOCK):
                        scores[i, j] = T.Select(scores[i, j] - top[i] > T.float32(-80.0),
                                                T.exp(scores[i, j] - top[i]), T.float32(0))
                    for j in T.vectorized(LANES):
                        lane[i, j] = scores[i, j]
                    for c in T.serial(1, BLOCK // LANES):
                        for j in T.vectorized(LANES):
                            lane[i, j] = lane[i, j] + scores[i, c * LANES + j]
                    total[i] = total[i] * rescale[i]
                for j in T.serial(LANES):
                    for i in T.unroll(ROWS):
                        total[i] = total[i] + lane[i, j]
                for rp in T.serial(ROWS // SUB * (hd // part)):
                    for i in T.unroll(SUB):
                        for d in T.vectorized(part):
                            acc[i, d] = T.float32(0)
                    for j in T.serial(BLOCK):
                        for i in T.unroll(SUB):
                            for d in T.vectorized(part):
                                acc[i, d] = acc[i, d] \
                                    + scores[rp // (hd // part) * SUB + i, j] \
                                    * vc[layer, h // grp, b * BLOCK + j, rp % (hd // part) * part + d]
                    for i in T.unroll(SUB):
                        for d in T.vectorized(part):
                            weighted[rp // (hd // part) * SUB + i, rp % (hd // part) * part + d] = \
                                weighted[rp // (hd // part) * SUB + i,
                                         rp % (hd // part) * part + d] \
                                * rescale[rp // (hd // part) * SUB + i] + acc[i, d]
            for i in T.serial(ROWS):
                if r0 + i < m:
                    for d in T.vectorized(hd):
                        out[0, r0 + i, h, d] = weighted[i, d] / total[i]

    return mark_scheduled(rewrite_vector_math(attend))
