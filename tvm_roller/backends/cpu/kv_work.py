"""What the cache kernels (``kv_cache``, ``kv_prompt_attention``) compute and move at a given
context: the counts their roofline bounds come from (they are built whole, not planned from a
loop nest the roofline could analyse). Flops: 2 per multiply-add of both products (the softmax
is not counted, so the bound stays a lower bound); bytes: one read of the queries and of the
cache positions attended to, one write of the output."""
from __future__ import annotations

from typing import Tuple

from tvm_roller.backends.cpu.kv_cache import CacheLayout
from tvm_roller.hardware.model import dtype_bytes


def write_work(layout: CacheLayout, m: int) -> Tuple[float, int]:
    """Writing ``m`` new positions of one layer's keys (or values): read once, stored once."""
    return 0.0, 2 * layout.kv_heads * m * layout.head_dim * dtype_bytes(layout.dtype)


def attention_work(layout: CacheLayout, m: int, n: int) -> Tuple[float, int]:
    """``m`` query positions (the last ``m`` of ``n``) attending causally to positions
    ``[0, n)`` of one layer: a decode step is ``m = 1``."""
    hd, eb = layout.head_dim, dtype_bytes(layout.dtype)
    # query i (of m) sees n - m + i + 1 positions
    pairs = m * (n - m) + m * (m + 1) // 2
    flops = 2.0 * 2 * layout.heads * hd * pairs
    nbytes = (2 * layout.heads * m * hd + 2 * layout.kv_heads * n * hd) * eb
    return flops, nbytes
