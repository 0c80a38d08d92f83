"""CPU kernels over a key/value cache updated in place: the write of new positions and one
query position's attention over the cache, split along the context.

The cache is two buffers of ``max_len`` positions per layer, allocated once:

* keys ``[layers, kv_heads, max_len / BLOCK, head_dim, BLOCK]`` (positions innermost: a
  query's scores over a block of positions are one vector multiply-add per head-dim element,
  no horizontal sums; each block of positions contiguous, so a task streams it from memory);
* values ``[layers, kv_heads, max_len, head_dim]`` (a probability times a value row, along the
  head dimension).

The live length ``n`` is the extent of a marker buffer (``[n]``): positions ``[n - m, n)`` are
written by the ``m`` new ones, and a decode step's query attends to ``[0, n)``. The attention
runs in two phases: each (kv head, block of ``BLOCK`` positions) in parallel gives its queries'
running max, sum of exponentials and weighted values; a merge rescales them (the
flash-decoding split), so a single query still uses every core. Positions past ``n`` inside the
last block are masked; ``max_len`` is a multiple of ``BLOCK`` (:func:`padded_length`) so they
are in bounds (the buffers start zeroed: what they hold is finite).
"""
from __future__ import annotations

from dataclasses import dataclass

from tvm import tirx
from tvm.script import tirx as T

from tvm_roller.backends.vector_math import rewrite_vector_math
from tvm_roller.core.errors import UnsupportedError

BLOCK = 64  # positions per parallel task: 4 AVX-512 vectors of scores per query head
LANES = 16  # float32 lanes of one AVX-512 register


def padded_length(max_len: int) -> int:
    """The cache's position count: ``max_len`` rounded up to a whole number of blocks."""
    return -(-max_len // BLOCK) * BLOCK


@dataclass(frozen=True)
class CacheLayout:
    """The cache's static dimensions (``length`` already padded) and the attention's heads."""

    layers: int
    kv_heads: int
    head_dim: int
    length: int
    heads: int
    dtype: str = "float32"

    def __post_init__(self) -> None:
        # the kernels' constants, lane counts and exp cut-offs are float32's: another element
        # type would mix float32 constants into its arithmetic
        if self.dtype != "float32":
            raise UnsupportedError(f"KV-cache kernels are float32 kernels, not {self.dtype}")

    @property
    def group(self) -> int:
        return self.heads // self.kv_heads

    @property
    def key_shape(self):
        return (self.layers, self.kv_heads, self.length // BLOCK, self.head_dim, BLOCK)

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
    kvh, hd, dtype = layout.kv_heads, layout.head_dim, layout.dtype
    shape = layout.key_shape if keys else layout.value_shape

    if keys:
        @T.prim_func(private=True)
        def write(cache: T.Buffer(shape, dtype), new_var: T.handle, marker_var: T.handle):
            m, n = T.int64(), T.int64()
            new = T.match_buffer(new_var, (1, kvh, m, hd), dtype)
            T.match_buffer(marker_var, (n,), "int64")
            for hj in T.parallel(kvh * m):
                for d in T.serial(hd):
                    cache[layer, hj // m, (n - m + hj % m) // BLOCK, d,
                          (n - m + hj % m) % BLOCK] = new[0, hj // m, hj % m, d]
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


def vector_part(head_dim: int) -> int:
    """The widest vector (at most ``LANES``) that divides a head row: a row is walked in
    whole parts of this width (head dimensions 72 or 80 included)."""
    return max(w for w in (16, 8, 4, 2, 1) if w <= LANES and head_dim % w == 0)


def _row_part(head_dim: int, group: int) -> int:
    """The widest slice of a head row (whole vectors dividing it) whose accumulators for a
    group of queries fit a stack array (TVM's limit: under 1 KiB)."""
    best = vector_part(head_dim)
    for width in range(LANES, head_dim + 1, LANES):
        if head_dim % width == 0 and group * width * 4 < 1024:
            best = width
    return best


def attention_kernel(layout: CacheLayout, layer: int, scale: float) -> tirx.PrimFunc:
    """One query position's attention over ``cache[layer]`` positions ``[0, n)``:
    ``q [1, heads, 1, head_dim]`` -> ``out [1, 1, heads, head_dim]`` (the layout HF's attention
    functions return), grouped-query heads sharing their kv head's reads.

    Register tiles: the scores of a group's queries over one vector of positions (``LANES``)
    accumulate over the head dimension in registers (the group unrolled), and the weighted
    values over a part of a head row at a time (``_row_part``)."""
    kvh, hd, grp, dtype = layout.kv_heads, layout.head_dim, layout.group, layout.dtype
    blocks_max = layout.length // BLOCK
    heads = layout.heads
    part = _row_part(hd, grp)
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
        scores = T.alloc_buffer((kvh * blocks_max, grp, BLOCK), dtype)
        for gb in T.parallel(kvh * ((n + BLOCK - 1) // BLOCK)):
            # "global" scope under 1 KiB: a stack array LLVM keeps in registers (TVM serves
            # a "local" one from the workspace pool: a heap pointer, stored every iteration)
            reg = T.alloc_buffer((grp, LANES), dtype)
            acc = T.alloc_buffer((grp, part), dtype)
            lane = T.alloc_buffer((LANES,), dtype)
            g = gb // ((n + BLOCK - 1) // BLOCK)
            b = gb % ((n + BLOCK - 1) // BLOCK)
            base = b * BLOCK
            for sb in T.serial(BLOCK // LANES):
                for i in T.unroll(grp):
                    for j in T.vectorized(LANES):
                        reg[i, j] = T.float32(0)
                for d in T.serial(hd):
                    for i in T.unroll(grp):
                        for j in T.vectorized(LANES):
                            reg[i, j] = reg[i, j] + q[0, g * grp + i, 0, d] \
                                * kc[layer, g, b, d, sb * LANES + j]
                for i in T.unroll(grp):
                    for j in T.vectorized(LANES):
                        # (a Select vectorizes; TVM scalarizes an if_then_else)
                        scores[gb, i, sb * LANES + j] = T.Select(
                            base + sb * LANES + j < n, reg[i, j] * T.float32(scale),
                            T.float32(neg))
            for i in T.serial(grp):
                for j in T.vectorized(LANES):
                    lane[j] = scores[gb, i, j]
                for c in T.serial(1, BLOCK // LANES):
                    for j in T.vectorized(LANES):
                        lane[j] = T.max(lane[j], scores[gb, i, c * LANES + j])
                part_max[g, b, i] = T.float32(neg)
                for j in T.serial(LANES):
                    part_max[g, b, i] = T.max(
                        part_max[g, b, i], lane[j])
                # below e^-80 a weight is 0: exp's result (and the products with it) would be
                # subnormal, each costing a microcode assist (masked positions are all there)
                for j in T.vectorized(BLOCK):
                    scores[gb, i, j] = T.Select(
                        scores[gb, i, j] - part_max[g, b, i]
                        > T.float32(-80.0),
                        T.exp(scores[gb, i, j]
                              - part_max[g, b, i]),
                        T.float32(0))
                for j in T.vectorized(LANES):
                    lane[j] = scores[gb, i, j]
                for c in T.serial(1, BLOCK // LANES):
                    for j in T.vectorized(LANES):
                        lane[j] = lane[j] + scores[gb, i, c * LANES + j]
                part_sum[g, b, i] = T.float32(0)
                for j in T.serial(LANES):
                    part_sum[g, b, i] = \
                        part_sum[g, b, i] + lane[j]
            for h in T.serial(hd // part):
                for i in T.unroll(grp):
                    for d in T.vectorized(part):
                        acc[i, d] = T.float32(0)
                for j in T.serial(BLOCK):
                    for i in T.unroll(grp):
                        for d in T.vectorized(part):
                            acc[i, d] = acc[i, d] \
                                + scores[gb, i, j] * vc[layer, g, base + j, h * part + d]
                for i in T.unroll(grp):
                    for d in T.vectorized(part):
                        part_out[g, b, i, h * part + d] = acc[i, d]
        # the merge is light (heads x blocks x head_dim): serial, no second parallel launch
        for gi in T.serial(kvh * grp):
            top = T.alloc_buffer((1,), dtype)
            total = T.alloc_buffer((1,), dtype)
            weight = T.alloc_buffer((1,), dtype)
            top[0] = T.float32(neg)
            for b in T.serial((n + BLOCK - 1) // BLOCK):
                top[0] = T.max(top[0], part_max[gi // grp, b, gi % grp])
            total[0] = T.float32(0)
            for d in T.vectorized(hd):
                out[0, 0, gi, d] = T.float32(0)
            for b in T.serial((n + BLOCK - 1) // BLOCK):
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
