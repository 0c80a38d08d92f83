"""CPU kernels over a key/value cache updated in place: the write of new positions and one
query position's attention over the cache, split along the context.

The cache is two buffers of ``max_len`` positions per layer, allocated once:

* keys ``[layers, kv_heads, max_len / block, head_dim, block]`` (positions innermost: a
  query's scores over a block of positions are one vector multiply-add per head-dim element,
  no horizontal sums; each block of positions contiguous, so a task streams it from memory);
* values ``[layers, kv_heads, max_len, head_dim]`` (a probability times a value row, along the
  head dimension).

The live length ``n`` is the extent of a marker buffer (``[n]``): positions ``[n - m, n)`` are
written by the ``m`` new ones, and a decode step's query attends to ``[0, n)``. The attention
runs in two phases: each (kv head, block of positions) in parallel gives its queries' running
max, sum of exponentials and weighted values; a merge rescales them (the flash-decoding split),
so a single query still uses every core. Positions past ``n`` inside the last block are masked;
``max_len`` is a multiple of the block (:func:`padded_length`) so they are in bounds (the
buffers start zeroed: what they hold is finite). The block and the register tiles are planned
from the device model (``attention_plan``).
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
    """The cache's static dimensions (``length`` already padded to whole ``block``s of
    positions) and the attention's heads."""

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
    def key_shape(self):
        return (self.layers, self.kv_heads, self.length // self.block, self.head_dim,
                self.block)

    @property
    def value_shape(self):
        return (self.layers, self.kv_heads, self.length, self.head_dim)


def mark_scheduled(func: tirx.PrimFunc) -> tirx.PrimFunc:
    """Marked done (the planner leaves it alone) and opaque to Relax's operator fusion."""
    return func.with_attr("tirx.is_scheduled", True).with_attr("op_pattern", 8)


def write_kernel(layout: CacheLayout, layer: int, keys: bool) -> tirx.PrimFunc:
    """``cache[layer]`` positions ``[n - m, n)`` := ``new[0, :, 0:m, :]`` in place (``new`` is
    ``[1, kv_heads, m, head_dim]``, the marker ``[n]``); keys are stored in blocks of
    positions. (Two parsed functions: the stores differ in indexing and in the vectorized loop,
    which TVMScript cannot take as a parameter.)"""
    kvh, hd, dtype, block = layout.kv_heads, layout.head_dim, layout.dtype, layout.block
    shape = layout.key_shape if keys else layout.value_shape

    if keys:
        @T.prim_func(private=True)
        def write(cache: T.Buffer(shape, dtype), new_var: T.handle, marker_var: T.handle):
            m, n = T.int64(), T.int64()
            new = T.match_buffer(new_var, (1, kvh, m, hd), dtype)
            T.match_buffer(marker_var, (n,), "int64")
            for hj in T.parallel(kvh * m):
                for d in T.serial(hd):
                    cache[layer, hj // m, (n - m + hj % m) // block, d,
                          (n - m + hj % m) % block] = new[0, hj // m, hj % m, d]
    else:
        @T.prim_func(private=True)
        def write(cache: T.Buffer(shape, dtype), new_var: T.handle, marker_var: T.handle):
            m, n = T.int64(), T.int64()
            new = T.match_buffer(new_var, (1, kvh, m, hd), dtype)
            T.match_buffer(marker_var, (n,), "int64")
            for hj in T.parallel(kvh * m):
                for d in T.vectorized(hd):
                    cache[layer, hj // m, n - m + hj % m, d] = new[0, hj // m, hj % m, d]

    return mark_scheduled(write)


def attention_kernel(layout: CacheLayout, layer: int, scale: float,
                     tiles: AttentionTiles) -> tirx.PrimFunc:
    """One query position's attention over ``cache[layer]`` positions ``[0, n)``:
    ``q [1, heads, 1, head_dim]`` -> ``out [1, 1, heads, head_dim]`` (the layout HF's attention
    functions return), grouped-query heads sharing their kv head's reads.

    Register tiles: the scores of ``tiles.group_sub`` of a group's queries over one vector of
    positions accumulate over the head dimension in registers (those queries unrolled), and
    the weighted values over a part of a head row at a time (``AttentionTiles.row_part``)."""
    kvh, hd, grp, dtype = layout.kv_heads, layout.head_dim, layout.group, layout.dtype
    block, lanes, gs = layout.block, tiles.lanes, tiles.group_sub
    blocks_max = layout.length // block
    heads = layout.heads
    part = tiles.row_part(hd, gs)
    neg = -3.0e38

    @T.prim_func(private=True)
    def attend(q: T.Buffer((1, heads, 1, hd), dtype), kc: T.Buffer(layout.key_shape, dtype),
               vc: T.Buffer(layout.value_shape, dtype), marker_var: T.handle,
               out: T.Buffer((1, 1, heads, hd), dtype)):
        n = T.int64()
        T.match_buffer(marker_var, (n,), "int64")
        part_max = T.alloc_buffer((kvh, blocks_max, grp), dtype)
        part_sum = T.alloc_buffer((kvh, blocks_max, grp), dtype)
        part_out = T.alloc_buffer((kvh, blocks_max, grp, hd), dtype)
        # the scores: one slice per task of a buffer allocated once per call (a task's own
        # would be over the stack allocation limit: a heap allocation per task)
        scores = T.alloc_buffer((kvh * blocks_max, grp, block), dtype)
        for gb in T.parallel(kvh * ((n + block - 1) // block)):
            # "global" scope under the stack limit: a stack array LLVM keeps in registers
            # (TVM serves a "local" one from the workspace pool: a heap pointer, stored every
            # iteration)
            reg = T.alloc_buffer((gs, lanes), dtype)
            acc = T.alloc_buffer((gs, part), dtype)
            lane = T.alloc_buffer((lanes,), dtype)
            g = gb // ((n + block - 1) // block)
            b = gb % ((n + block - 1) // block)
            base = b * block
            for gi in T.serial(grp // gs):
                for sb in T.serial(block // lanes):
                    for i in T.unroll(gs):
                        for j in T.vectorized(lanes):
                            reg[i, j] = T.float32(0)
                    for d in T.serial(hd):
                        for i in T.unroll(gs):
                            for j in T.vectorized(lanes):
                                reg[i, j] = reg[i, j] + q[0, g * grp + gi * gs + i, 0, d] \
                                    * kc[layer, g, b, d, sb * lanes + j]
                    for i in T.unroll(gs):
                        for j in T.vectorized(lanes):
                            # (a Select vectorizes; TVM scalarizes an if_then_else)
                            scores[gb, gi * gs + i, sb * lanes + j] = T.Select(
                                base + sb * lanes + j < n, reg[i, j] * T.float32(scale),
                                T.float32(neg))
            for i in T.serial(grp):
                for j in T.vectorized(lanes):
                    lane[j] = scores[gb, i, j]
                for c in T.serial(1, block // lanes):
                    for j in T.vectorized(lanes):
                        lane[j] = T.max(lane[j], scores[gb, i, c * lanes + j])
                part_max[g, b, i] = T.float32(neg)
                for j in T.serial(lanes):
                    part_max[g, b, i] = T.max(part_max[g, b, i], lane[j])
                # below e^-80 a weight is 0: exp's result (and the products with it) would be
                # subnormal, each costing a microcode assist (masked positions are all there)
                for j in T.vectorized(block):
                    scores[gb, i, j] = T.Select(
                        scores[gb, i, j] - part_max[g, b, i] > T.float32(-80.0),
                        T.exp(scores[gb, i, j] - part_max[g, b, i]), T.float32(0))
                for j in T.vectorized(lanes):
                    lane[j] = scores[gb, i, j]
                for c in T.serial(1, block // lanes):
                    for j in T.vectorized(lanes):
                        lane[j] = lane[j] + scores[gb, i, c * lanes + j]
                part_sum[g, b, i] = T.float32(0)
                for j in T.serial(lanes):
                    part_sum[g, b, i] = part_sum[g, b, i] + lane[j]
            for gh in T.serial(grp // gs * (hd // part)):
                for i in T.unroll(gs):
                    for d in T.vectorized(part):
                        acc[i, d] = T.float32(0)
                for j in T.serial(block):
                    for i in T.unroll(gs):
                        for d in T.vectorized(part):
                            acc[i, d] = acc[i, d] + scores[gb, gh // (hd // part) * gs + i, j] \
                                * vc[layer, g, base + j, gh % (hd // part) * part + d]
                for i in T.unroll(gs):
                    for d in T.vectorized(part):
                        part_out[g, b, gh // (hd // part) * gs + i,
                                 gh % (hd // part) * part + d] = acc[i, d]
        # the merge is light (heads x blocks x head_dim): serial, no second parallel launch
        for gi in T.serial(kvh * grp):
            top = T.alloc_buffer((1,), dtype)
            total = T.alloc_buffer((1,), dtype)
            weight = T.alloc_buffer((1,), dtype)
            top[0] = T.float32(neg)
            for b in T.serial((n + block - 1) // block):
                top[0] = T.max(top[0], part_max[gi // grp, b, gi % grp])
            total[0] = T.float32(0)
            for d in T.vectorized(hd):
                out[0, 0, gi, d] = T.float32(0)
            for b in T.serial((n + block - 1) // block):
                weight[0] = T.Select(part_max[gi // grp, b, gi % grp] - top[0] > T.float32(-80.0),
                                     T.exp(part_max[gi // grp, b, gi % grp] - top[0]),
                                     T.float32(0))
                total[0] = total[0] + weight[0] * part_sum[gi // grp, b, gi % grp]
                for d in T.vectorized(hd):
                    out[0, 0, gi, d] = out[0, 0, gi, d] \
                        + weight[0] * part_out[gi // grp, b, gi % grp, d]
            for d in T.vectorized(hd):
                out[0, 0, gi, d] = out[0, 0, gi, d] / total[0]

    return mark_scheduled(rewrite_vector_math(attend))
