"""The online-softmax step both flash-style attention kernels take per block of keys
(``kv_prompt_attention`` over the cache, ``flash_attention`` over whole tensors): each query
row's running max grows to the block's, the row's previous sum (and weighted values, by the
caller) rescaled by ``rescale``, the block's scores become their exponentials and are summed.

A TVMScript macro over the kernel's own buffers: ``scores [rows, block]`` (in: the scaled,
masked scores; out: the weights), ``lane [rows, lanes]`` (scratch), ``top`` / ``total`` /
``rescale [rows]``. Below e^-80 a weight is 0: no subnormal arithmetic, and masked positions
(-inf or far below the max) weigh nothing."""
from __future__ import annotations

from tvm.script import tirx as T


@T.macro(hygienic=False)
def online_softmax_step(scores, lane, top, total, rescale, rows, lanes, block):
    # the rows' maxima: lane-wise over the block's vectors, then across the lanes with the
    # rows interleaved (independent chains, not one row's)
    for i in T.unroll(rows):
        for j in T.vectorized(lanes):
            lane[i, j] = scores[i, j]
        for c in T.serial(1, block // lanes):
            for j in T.vectorized(lanes):
                lane[i, j] = T.max(lane[i, j], scores[i, c * lanes + j])
        rescale[i] = top[i]
    for j in T.serial(lanes):
        for i in T.unroll(rows):
            top[i] = T.max(top[i], lane[i, j])
    for i in T.serial(rows):
        rescale[i] = T.Select(rescale[i] - top[i] > T.float32(-80.0),
                              T.exp(rescale[i] - top[i]), T.float32(0))
        for j in T.vectorized(block):
            scores[i, j] = T.Select(scores[i, j] - top[i] > T.float32(-80.0),
                                    T.exp(scores[i, j] - top[i]), T.float32(0))
        for j in T.vectorized(lanes):
            lane[i, j] = scores[i, j]
        for c in T.serial(1, block // lanes):
            for j in T.vectorized(lanes):
                lane[i, j] = lane[i, j] + scores[i, c * lanes + j]
        total[i] = total[i] * rescale[i]
    for j in T.serial(lanes):
        for i in T.unroll(rows):
            total[i] = total[i] + lane[i, j]
