"""A prompt's causal attention over the paged key/value cache (``kv_cache``'s layout): ``m``
query positions ``[n - m, n)`` of one sequence (a whole prompt, or one chunk of it) each attend
to the sequence's positions up to their own, read through its block table.

The flash-attention order on a CPU: a task is (query head, tile of ``rows`` queries); it walks
the cache's blocks of positions up to its last query's position, keeping each query's running
max, sum of exponentials and weighted values (rescaled when the max grows), so the scores never
leave the cache (no ``[heads, m, n]`` matrix, no repeat of grouped-query keys). Register
tiles: the scores of ``sub`` queries over ``wide`` positions accumulate over the head dimension
(a key vector loaded once per ``sub`` multiply-adds, the query elements broadcast), and the
weighted values over ``wide`` elements of a head row. The tile's last rows past ``m`` repeat row
``m - 1`` (in bounds) and are not stored. Every size is planned from the device model
(``attention_plan``).
"""
from __future__ import annotations

from tvm import tirx
from tvm.script import tirx as T

from tvm_roller.backends.cpu.attention_plan import AttentionTiles, vector_part
from tvm_roller.backends.cpu.kv_cache import CacheLayout, mark_scheduled
from tvm_roller.backends.cpu.online_softmax import online_softmax_step
from tvm_roller.backends.vector_math import rewrite_vector_math


def prompt_attention_kernel(layout: CacheLayout, layer: int, scale: float,
                            tiles: AttentionTiles) -> tirx.PrimFunc:
    """``q [1, heads, m, head_dim]`` (positions ``[n - m, n)``, ``n = lengths[0]``) over
    ``cache[layer]`` positions ``[0, n)`` through ``tables[0]``, causal -> ``out [1, m, heads,
    head_dim]`` (the layout HF's attention functions return)."""
    hd, grp, heads, dtype = layout.head_dim, layout.group, layout.heads, layout.dtype
    rows, sub, wide = tiles.rows, tiles.sub, tiles.wide
    block, lanes = layout.block, tiles.lanes
    part = wide if hd % wide == 0 else vector_part(hd, lanes)
    neg = -3.0e38

    @T.prim_func(private=True)
    def attend(q_var: T.handle, kc_var: T.handle, vc_var: T.handle, tables_var: T.handle,
               lengths_var: T.handle, out_var: T.handle):
        m, pool, nb = T.int64(), T.int64(), T.int64()
        q = T.match_buffer(q_var, (1, heads, m, hd), dtype)
        kc = T.match_buffer(kc_var, layout.key_shape(pool), dtype)
        vc = T.match_buffer(vc_var, layout.value_shape(pool), dtype)
        tables = T.match_buffer(tables_var, (1, nb), "int32")
        lengths = T.match_buffer(lengths_var, (1,), "int32")
        out = T.match_buffer(out_var, (1, m, heads, hd), dtype)
        n = T.Cast("int64", lengths[0])
        # heads outer: the static split of the tasks over the cores gives each whole heads
        # (equal work under the causal triangle)
        for ht in T.parallel(heads * ((m + rows - 1) // rows)):
            reg = T.alloc_buffer((sub, wide), dtype)  # stack arrays: registers
            acc = T.alloc_buffer((sub, part), dtype)
            lane = T.alloc_buffer((rows, lanes), dtype)
            scores = T.alloc_buffer((rows, block), dtype)
            weighted = T.alloc_buffer((rows, hd), dtype)
            top = T.alloc_buffer((rows,), dtype)
            total = T.alloc_buffer((rows,), dtype)
            rescale = T.alloc_buffer((rows,), dtype)
            h = ht // ((m + rows - 1) // rows)
            r0 = ht % ((m + rows - 1) // rows) * rows
            for i in T.serial(rows):
                top[i] = T.float32(neg)
                total[i] = T.float32(0)
                for d in T.vectorized(hd):
                    weighted[i, d] = T.float32(0)
            # blocks up to the tile's last query position
            for b in T.serial((n - m + T.min(r0 + rows - 1, m - 1)) // block + 1):
                for rs in T.serial(rows // sub * (block // wide)):
                    for i in T.unroll(sub):
                        for j in T.vectorized(wide):
                            reg[i, j] = T.float32(0)
                    for d in T.serial(hd):
                        for i in T.unroll(sub):
                            for j in T.vectorized(wide):
                                reg[i, j] = reg[i, j] \
                                    + q[0, h, T.min(r0 + rs // (block // wide) * sub + i, m - 1),
                                        d] \
                                    * kc[layer, h // grp, T.Cast("int64", tables[0, b]), d,
                                         rs % (block // wide) * wide + j]
                    for i in T.unroll(sub):
                        for j in T.vectorized(wide):
                            # causal: a position after the query's own weighs nothing
                            scores[rs // (block // wide) * sub + i,
                                   rs % (block // wide) * wide + j] = T.Select(
                                b * block + rs % (block // wide) * wide + j
                                <= n - m + T.min(r0 + rs // (block // wide) * sub + i, m - 1),
                                reg[i, j] * T.float32(scale), T.float32(neg))
                online_softmax_step(scores, lane, top, total, rescale, rows, lanes, block)
                for rp in T.serial(rows // sub * (hd // part)):
                    for i in T.unroll(sub):
                        for d in T.vectorized(part):
                            acc[i, d] = T.float32(0)
                    for j in T.serial(block):
                        for i in T.unroll(sub):
                            for d in T.vectorized(part):
                                acc[i, d] = acc[i, d] \
                                    + scores[rp // (hd // part) * sub + i, j] \
                                    * vc[layer, h // grp, T.Cast("int64", tables[0, b]), j,
                                         rp % (hd // part) * part + d]
                    for i in T.unroll(sub):
                        for d in T.vectorized(part):
                            weighted[rp // (hd // part) * sub + i, rp % (hd // part) * part + d] = \
                                weighted[rp // (hd // part) * sub + i,
                                         rp % (hd // part) * part + d] \
                                * rescale[rp // (hd // part) * sub + i] + acc[i, d]
            for i in T.serial(rows):
                if r0 + i < m:
                    for d in T.vectorized(hd):
                        out[0, r0 + i, h, d] = weighted[i, d] / total[i]

    return mark_scheduled(rewrite_vector_math(attend))
