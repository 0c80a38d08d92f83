"""What the attention kernels (``kv_cache``, ``kv_prompt_attention``, ``flash_attention``)
compute and move: the counts their roofline bounds come from (they are built whole, not planned
from a loop nest the roofline could analyse). Flops: 2 per multiply-add of both products (the
softmax is not counted, so the bound stays a lower bound); bytes: one read of the queries, of the
keys and values attended to and of any other operand, one write of the output."""
from __future__ import annotations

from typing import Tuple

FLOAT_BYTES = 4


def write_work(kv_heads: int, head_dim: int, m: int) -> Tuple[float, int]:
    """Writing ``m`` new positions of one layer's keys (or values): read once, stored once."""
    return 0.0, 2 * kv_heads * m * head_dim * FLOAT_BYTES


def attention_work(heads: int, kv_heads: int, head_dim: int, m: int, n: int, *,
                   causal: bool, batch: int = 1, other_bytes: int = 0) -> Tuple[float, int]:
    """``m`` query positions attending to ``n`` keys (causal: the last ``m`` of ``n``
    positions, each to those up to its own), for ``batch`` sequences of ``heads`` query heads
    over ``kv_heads``; a decode step is ``m = 1``."""
    # causal: query i (of m) sees n - m + i + 1 positions
    pairs = m * (n - m) + m * (m + 1) // 2 if causal else m * n
    flops = 2.0 * 2 * batch * heads * head_dim * pairs
    nbytes = batch * (2 * heads * m + 2 * kv_heads * n) * head_dim * FLOAT_BYTES + other_bytes
    return flops, nbytes
