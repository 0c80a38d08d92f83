"""Attention over whole tensors (an encoder's, or a prompt's without a cache), flash-style:
``softmax(Q·Kᵀ · scale + bias) · V`` in one kernel, the scores never leaving the task.

A task is (batch, query head, tile of ``rows`` queries); it walks the keys in blocks of
``block`` positions, read with the positions along the vector lanes: from keys given transposed
and padded to whole blocks (``keys_transposed``: ``[batch, kv_heads, head_dim, >= blocks x
block]``, made once per call outside the kernel), or else transposed block by block into a task
buffer (a cost per task the transposed input saves: it is paid again by every query tile); the
scores of ``sub`` queries over ``wide`` positions accumulated over the head
dimension in registers, the bias added, then each query's running max, sum of exponentials and
weighted values updated (rescaled when the max grows), and the weighted values of ``sub``
queries over ``wide`` elements of a head row in registers. Grouped-query heads read their kv
head. The tiles are planned from the device model (``attention_plan``).

Masks are additive biases (HF's: the dtype's minimum where masked), broadcast over batch, heads
and query rows; a score is kept at or above float32's minimum, so a row masked everywhere is
uniform, as a softmax of equal values is. Positions past the keys' end inside the last block,
and, with ``causal``, positions after a query's own, weigh nothing.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Tuple

from tvm import tirx
from tvm.script import tirx as T

from tvm_roller.backends.cpu.attention_plan import AttentionTiles, vector_part
from tvm_roller.backends.cpu.kv_cache import mark_scheduled
from tvm_roller.backends.cpu.online_softmax import online_softmax_step
from tvm_roller.backends.vector_math import rewrite_vector_math
from tvm_roller.core.errors import UnsupportedError

FLOAT32_MIN = -3.4028234663852886e38


@dataclass(frozen=True)
class AttentionShape:
    """The operands: ``q [batch, heads, q_len, head_dim]``, ``k`` / ``v [batch, kv_heads,
    kv_len, head_dim]``, an optional additive bias ``[bias[0], bias[1], q_len or 1, kv_len]``
    (``bias``: its batch and heads extents, each 1 or the full one, and whether it has a row per
    query); the lengths are the kernel's variables."""

    batch: int
    heads: int
    kv_heads: int
    head_dim: int
    bias: Optional[Tuple[int, int, bool]] = None
    causal: bool = False
    keys_transposed: bool = False
    dtype: str = "float32"

    def __post_init__(self) -> None:
        if self.dtype != "float32":
            raise UnsupportedError(f"flash attention is a float32 kernel, not {self.dtype}")
        if self.heads % self.kv_heads:
            raise UnsupportedError(f"{self.heads} query heads over {self.kv_heads} kv heads")
        if self.bias is not None and (self.bias[0] not in (1, self.batch)
                                      or self.bias[1] not in (1, self.heads)):
            raise UnsupportedError(f"a bias over {self.bias[:2]} does not broadcast over "
                                   f"{(self.batch, self.heads)}")


def flash_attention_kernel(shape: AttentionShape, scale: float,
                           tiles: AttentionTiles) -> tirx.PrimFunc:
    """``(q, k, v[, bias]) -> out [batch, heads, q_len, head_dim]`` (see the module)."""
    b, h, hd = shape.batch, shape.heads, shape.head_dim
    grp, dtype, causal = shape.heads // shape.kv_heads, shape.dtype, shape.causal
    has_bias, kt_in = shape.bias is not None, shape.keys_transposed
    bb, bh, per_row = shape.bias if has_bias else (1, 1, False)
    rows, sub, wide, block, lanes = tiles.rows, tiles.sub, tiles.wide, tiles.block, tiles.lanes
    part = wide if hd % wide == 0 else vector_part(hd, lanes)
    lo, gone = FLOAT32_MIN, float("-inf")

    @T.prim_func(private=True)
    def attend(q_var: T.handle, k_var: T.handle, v_var: T.handle, bias_var: T.handle,
               out_var: T.handle):
        # the lengths are variables (bound by the call): only the outer loops' extents and
        # the clamps at the ends read them, so one kernel serves every length
        sq, sk, skp = T.int64(), T.int64(), T.int64()
        q = T.match_buffer(q_var, (b, h, sq, hd), dtype)
        k = T.match_buffer(k_var, (b, h // grp, hd, skp) if kt_in else (b, h // grp, sk, hd),
                           dtype)
        v = T.match_buffer(v_var, (b, h // grp, sk, hd), dtype)
        bias = T.match_buffer(bias_var, (bb, bh, sq if per_row else 1, sk), dtype)
        out = T.match_buffer(out_var, (b, h, sq, hd), dtype)
        for t in T.parallel(b * h * ((sq + rows - 1) // rows)):
            reg = T.alloc_buffer((sub, wide), dtype)  # stack arrays: registers
            acc = T.alloc_buffer((sub, part), dtype)
            kt = T.alloc_buffer((1, 1) if kt_in else (hd, block), dtype)
            lane = T.alloc_buffer((rows, lanes), dtype)
            scores = T.alloc_buffer((rows, block), dtype)
            weighted = T.alloc_buffer((rows, hd), dtype)
            top = T.alloc_buffer((rows,), dtype)
            total = T.alloc_buffer((rows,), dtype)
            rescale = T.alloc_buffer((rows,), dtype)
            bi = t // (h * ((sq + rows - 1) // rows))
            hi = t // ((sq + rows - 1) // rows) % h
            r0 = t % ((sq + rows - 1) // rows) * rows
            for i in T.serial(rows):
                top[i] = T.float32(lo)
                total[i] = T.float32(0)
                for d in T.vectorized(hd):
                    weighted[i, d] = T.float32(0)
            # the blocks up to the last key (causal: the tile's last query's)
            for blk in T.serial(((T.min(r0 + rows - 1, sq - 1) + sk - sq) if causal else sk - 1)
                                // block + 1):
                if not kt_in:
                    # the block's keys, positions along the lanes (past the end: the last key)
                    for j in T.serial(block):
                        for d in T.serial(hd):
                            kt[d, j] = k[bi, hi // grp, T.min(blk * block + j, sk - 1), d]
                for rs in T.serial(rows // sub * (block // wide)):
                    for i in T.unroll(sub):
                        for j in T.vectorized(wide):
                            reg[i, j] = T.float32(0)
                    for d in T.serial(hd):
                        for i in T.unroll(sub):
                            for j in T.vectorized(wide):
                                reg[i, j] = reg[i, j] \
                                    + q[bi, hi, T.min(r0 + rs // (block // wide) * sub + i,
                                                      sq - 1), d] \
                                    * (k[bi, hi // grp, d,
                                         blk * block + rs % (block // wide) * wide + j]
                                       if kt_in else kt[d, rs % (block // wide) * wide + j])
                    for i in T.unroll(sub):
                        for j in T.vectorized(wide):
                            scores[rs // (block // wide) * sub + i,
                                   rs % (block // wide) * wide + j] = T.Select(
                                (blk * block + rs % (block // wide) * wide + j < sk
                                 and blk * block + rs % (block // wide) * wide + j
                                 <= T.min(r0 + rs // (block // wide) * sub + i, sq - 1) + sk - sq)
                                if causal else blk * block + rs % (block // wide) * wide + j < sk,
                                T.max(reg[i, j] * T.float32(scale) + (
                                    bias[0 if bb == 1 else bi, 0 if bh == 1 else hi,
                                         T.min(r0 + rs // (block // wide) * sub + i, sq - 1)
                                         if per_row else 0,
                                         T.min(blk * block + rs % (block // wide) * wide + j,
                                               sk - 1)] if has_bias else T.float32(0)),
                                      T.float32(lo)),
                                T.float32(gone))
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
                                    * v[bi, hi // grp, T.min(blk * block + j, sk - 1),
                                        rp % (hd // part) * part + d]
                    for i in T.unroll(sub):
                        for d in T.vectorized(part):
                            weighted[rp // (hd // part) * sub + i, rp % (hd // part) * part + d] = \
                                weighted[rp // (hd // part) * sub + i,
                                         rp % (hd // part) * part + d] \
                                * rescale[rp // (hd // part) * sub + i] + acc[i, d]
            for i in T.serial(rows):
                if r0 + i < sq:
                    for d in T.vectorized(hd):
                        out[bi, hi, r0 + i, d] = weighted[i, d] / total[i]

    func = attend if has_bias else _without_param(attend, 3)
    return mark_scheduled(rewrite_vector_math(func))


def _without_param(func: tirx.PrimFunc, index: int) -> tirx.PrimFunc:
    """``func`` without its parameter ``index`` (one its body never reads)."""
    params = [p for i, p in enumerate(func.params) if i != index]
    return tirx.PrimFunc(params, func.body, func.ret_type, func.attrs)
