"""CPU kernels over a paged key/value cache updated in place: the write of new positions and
the attention of one query position per sequence over its cache, split along the context.

The cache is a pool of fixed-size blocks of ``block`` positions, allocated once and shared by
the sequences in flight (``integrations.llm.block_pool`` keeps the bookkeeping):

* keys ``[layers, kv_heads, pool, head_dim, block]`` (positions innermost: a query's scores
  over a block of positions are one vector multiply-add per head-dim element, no horizontal
  sums; each block contiguous, so a task streams it from memory);
* values ``[layers, kv_heads, pool, block, head_dim]`` (a probability times a value row, along
  the head dimension).

The pool's size is a shape variable (one compiled module serves any pool). Each kernel takes a
block table ``tables [batch, nb]`` (int32: the pool blocks of a sequence's positions, in
order; ``nb`` covers the longest sequence of the call) and the live lengths ``lengths
[batch]`` (int32) as data: a sequence's ``m`` new positions are ``[n - m, n)``, ``n`` its
length, and its query attends to ``[0, n)``. The attention runs in two phases: each
(sequence, kv head, block of positions) in parallel gives its queries' running max, sum of
exponentials and weighted values; a merge rescales them (the flash-decoding split), so a
single query still uses every core. Positions past ``n`` inside a sequence's last block are
masked (a pool starts zeroed: what they hold is finite). The block and the register tiles are
planned from the device model (``attention_plan``).
"""
from __future__ import annotations

from dataclasses import dataclass

from tvm import tirx
from tvm.script import tirx as T

from tvm_roller.backends.cpu.attention_plan import AttentionTiles
from tvm_roller.backends.vector_math import rewrite_vector_math
from tvm_roller.core.errors import UnsupportedError


def padded_length(max_len: int, block: int) -> int:
    """The cache's position count: ``max_len`` rounded up to a whole number of blocks."""
    return -(-max_len // block) * block


@dataclass(frozen=True)
class CacheLayout:
    """The cache's static dimensions and the attention's heads: ``length`` is the most
    positions one sequence holds (padded to whole ``block``s), the table's widest row."""

    layers: int
    kv_heads: int
    head_dim: int
    length: int
    heads: int
    block: int
    dtype: str = "float32"

    def __post_init__(self) -> None:
        # the kernels' constants and exp cut-offs are float32's: another element type would
        # mix float32 constants into its arithmetic
        if self.dtype != "float32":
            raise UnsupportedError(f"KV-cache kernels are float32 kernels, not {self.dtype}")
        if self.block < 1 or self.length % self.block:
            raise UnsupportedError(f"a cache of {self.length} positions is not whole blocks "
                                   f"of {self.block}")

    @property
    def group(self) -> int:
        return self.heads // self.kv_heads

    @property
    def max_blocks(self) -> int:
        """Blocks one sequence holds at most (a block table's widest row)."""
        return self.length // self.block

    @property
    def position_bytes(self) -> int:
        """Bytes one position of a sequence takes: its keys and values in every layer."""
        return 2 * self.layers * self.kv_heads * self.head_dim * 4  # float32 (__post_init__)

    def key_shape(self, pool):
        """The keys of a pool of ``pool`` blocks (an int, or a shape variable)."""
        return (self.layers, self.kv_heads, pool, self.head_dim, self.block)

    def value_shape(self, pool):
        return (self.layers, self.kv_heads, pool, self.block, self.head_dim)


def mark_scheduled(func: tirx.PrimFunc) -> tirx.PrimFunc:
    """Marked done (the planner leaves it alone) and opaque to Relax's operator fusion."""
    return func.with_attr("tirx.is_scheduled", True).with_attr("op_pattern", 8)


def write_kernel(layout: CacheLayout, layer: int, keys: bool) -> tirx.PrimFunc:
    """``cache[layer]``: each sequence ``s``'s positions ``[n_s - m, n_s)`` := ``new[s, :, 0:m,
    :]`` in place, through its block table (``new`` is ``[batch, kv_heads, m, head_dim]``).
    (Two parsed functions: the stores differ in indexing and in the vectorized loop, which
    TVMScript cannot take as a parameter.)"""
    kvh, hd, dtype, block = layout.kv_heads, layout.head_dim, layout.dtype, layout.block

    if keys:
        @T.prim_func(private=True)
        def write(cache_var: T.handle, new_var: T.handle, tables_var: T.handle,
                  lengths_var: T.handle):
            pool, bsz, m, nb = T.int64(), T.int64(), T.int64(), T.int64()
            cache = T.match_buffer(cache_var, layout.key_shape(pool), dtype)
            new = T.match_buffer(new_var, (bsz, kvh, m, hd), dtype)
            tables = T.match_buffer(tables_var, (bsz, nb), "int32")
            lengths = T.match_buffer(lengths_var, (bsz,), "int32")
            for shj in T.parallel(bsz * kvh * m):
                s = shj // (kvh * m)
                pos = T.Cast("int64", lengths[s]) - m + shj % m
                for d in T.serial(hd):
                    cache[layer, shj // m % kvh, T.Cast("int64", tables[s, pos // block]), d,
                          pos % block] = new[s, shj // m % kvh, shj % m, d]
    else:
        @T.prim_func(private=True)
        def write(cache_var: T.handle, new_var: T.handle, tables_var: T.handle,
                  lengths_var: T.handle):
            pool, bsz, m, nb = T.int64(), T.int64(), T.int64(), T.int64()
            cache = T.match_buffer(cache_var, layout.value_shape(pool), dtype)
            new = T.match_buffer(new_var, (bsz, kvh, m, hd), dtype)
            tables = T.match_buffer(tables_var, (bsz, nb), "int32")
            lengths = T.match_buffer(lengths_var, (bsz,), "int32")
            for shj in T.parallel(bsz * kvh * m):
                s = shj // (kvh * m)
                pos = T.Cast("int64", lengths[s]) - m + shj % m
                for d in T.vectorized(hd):
                    cache[layer, shj // m % kvh, T.Cast("int64", tables[s, pos // block]),
                          pos % block, d] = new[s, shj // m % kvh, shj % m, d]

    return mark_scheduled(write)


def attention_kernel(layout: CacheLayout, layer: int, scale: float,
                     tiles: AttentionTiles) -> tirx.PrimFunc:
    """One query position per sequence attending to ``cache[layer]`` positions ``[0, n_s)``
    through its block table: ``q [batch, heads, 1, head_dim]`` -> ``out [batch, 1, heads,
    head_dim]`` (the layout HF's attention functions return), grouped-query heads sharing their
    kv head's reads.

    Register tiles: the scores of ``tiles.group_sub`` of a group's queries over one vector of
    positions accumulate over the head dimension in registers (those queries unrolled), and
    the weighted values over a part of a head row at a time (``AttentionTiles.row_part``)."""
    kvh, hd, grp, dtype = layout.kv_heads, layout.head_dim, layout.group, layout.dtype
    block, lanes, gs = layout.block, tiles.lanes, tiles.group_sub
    heads = layout.heads
    part = tiles.row_part(hd, gs)
    neg = -3.0e38

    @T.prim_func(private=True)
    def attend(q_var: T.handle, kc_var: T.handle, vc_var: T.handle, tables_var: T.handle,
               lengths_var: T.handle, out_var: T.handle):
        pool, bsz, nb = T.int64(), T.int64(), T.int64()
        q = T.match_buffer(q_var, (bsz, heads, 1, hd), dtype)
        kc = T.match_buffer(kc_var, layout.key_shape(pool), dtype)
        vc = T.match_buffer(vc_var, layout.value_shape(pool), dtype)
        tables = T.match_buffer(tables_var, (bsz, nb), "int32")
        lengths = T.match_buffer(lengths_var, (bsz,), "int32")
        out = T.match_buffer(out_var, (bsz, 1, heads, hd), dtype)
        part_max = T.alloc_buffer((bsz * kvh * nb, grp), dtype)
        part_sum = T.alloc_buffer((bsz * kvh * nb, grp), dtype)
        part_out = T.alloc_buffer((bsz * kvh * nb, grp, hd), dtype)
        # the scores: one slice per task of a buffer allocated once per call (a task's own
        # would be over the stack allocation limit: a heap allocation per task)
        scores = T.alloc_buffer((bsz * kvh * nb, grp, block), dtype)
        # tasks: (sequence, kv head, block of its positions); a block past a shorter
        # sequence's end is an empty task
        for t in T.parallel(bsz * kvh * nb):
            # "global" scope under the stack limit: a stack array LLVM keeps in registers
            # (TVM serves a "local" one from the workspace pool: a heap pointer, stored every
            # iteration)
            reg = T.alloc_buffer((gs, lanes), dtype)
            acc = T.alloc_buffer((gs, part), dtype)
            lane = T.alloc_buffer((lanes,), dtype)
            s = t // (kvh * nb)
            g = t // nb % kvh
            base = t % nb * block
            n = T.Cast("int64", lengths[s])
            phys = T.Cast("int64", tables[s, t % nb])
            if base < n:
                for gi in T.serial(grp // gs):
                    for sb in T.serial(block // lanes):
                        for i in T.unroll(gs):
                            for j in T.vectorized(lanes):
                                reg[i, j] = T.float32(0)
                        for d in T.serial(hd):
                            for i in T.unroll(gs):
                                for j in T.vectorized(lanes):
                                    reg[i, j] = reg[i, j] \
                                        + q[s, g * grp + gi * gs + i, 0, d] \
                                        * kc[layer, g, phys, d, sb * lanes + j]
                        for i in T.unroll(gs):
                            for j in T.vectorized(lanes):
                                # (a Select vectorizes; TVM scalarizes an if_then_else)
                                scores[t, gi * gs + i, sb * lanes + j] = T.Select(
                                    base + sb * lanes + j < n, reg[i, j] * T.float32(scale),
                                    T.float32(neg))
                for i in T.serial(grp):
                    for j in T.vectorized(lanes):
                        lane[j] = scores[t, i, j]
                    for c in T.serial(1, block // lanes):
                        for j in T.vectorized(lanes):
                            lane[j] = T.max(lane[j], scores[t, i, c * lanes + j])
                    part_max[t, i] = T.float32(neg)
                    for j in T.serial(lanes):
                        part_max[t, i] = T.max(part_max[t, i], lane[j])
                    # below e^-80 a weight is 0: exp's result (and the products with it) would
                    # be subnormal, each costing a microcode assist (masked positions are all
                    # there)
                    for j in T.vectorized(block):
                        scores[t, i, j] = T.Select(
                            scores[t, i, j] - part_max[t, i] > T.float32(-80.0),
                            T.exp(scores[t, i, j] - part_max[t, i]), T.float32(0))
                    for j in T.vectorized(lanes):
                        lane[j] = scores[t, i, j]
                    for c in T.serial(1, block // lanes):
                        for j in T.vectorized(lanes):
                            lane[j] = lane[j] + scores[t, i, c * lanes + j]
                    part_sum[t, i] = T.float32(0)
                    for j in T.serial(lanes):
                        part_sum[t, i] = part_sum[t, i] + lane[j]
                for gh in T.serial(grp // gs * (hd // part)):
                    for i in T.unroll(gs):
                        for d in T.vectorized(part):
                            acc[i, d] = T.float32(0)
                    for j in T.serial(block):
                        for i in T.unroll(gs):
                            for d in T.vectorized(part):
                                acc[i, d] = acc[i, d] \
                                    + scores[t, gh // (hd // part) * gs + i, j] \
                                    * vc[layer, g, phys, j, gh % (hd // part) * part + d]
                    for i in T.unroll(gs):
                        for d in T.vectorized(part):
                            part_out[t, gh // (hd // part) * gs + i,
                                     gh % (hd // part) * part + d] = acc[i, d]
        # the merge: per (sequence, query head) over that sequence's blocks
        for sh in T.parallel(bsz * heads):
            top = T.alloc_buffer((1,), dtype)
            total = T.alloc_buffer((1,), dtype)
            weight = T.alloc_buffer((1,), dtype)
            s = sh // heads
            first = (s * kvh + sh % heads // grp) * nb  # the task of the head's first block
            i = sh % heads % grp
            used = (T.Cast("int64", lengths[s]) + block - 1) // block
            top[0] = T.float32(neg)
            for b in T.serial(used):
                top[0] = T.max(top[0], part_max[first + b, i])
            total[0] = T.float32(0)
            for d in T.vectorized(hd):
                out[s, 0, sh % heads, d] = T.float32(0)
            for b in T.serial(used):
                weight[0] = T.Select(part_max[first + b, i] - top[0] > T.float32(-80.0),
                                     T.exp(part_max[first + b, i] - top[0]), T.float32(0))
                total[0] = total[0] + weight[0] * part_sum[first + b, i]
                for d in T.vectorized(hd):
                    out[s, 0, sh % heads, d] = out[s, 0, sh % heads, d] \
                        + weight[0] * part_out[first + b, i, d]
            for d in T.vectorized(hd):
                out[s, 0, sh % heads, d] = out[s, 0, sh % heads, d] / total[0]

    return mark_scheduled(rewrite_vector_math(attend))
