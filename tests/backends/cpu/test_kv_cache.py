"""The paged key/value cache kernels: writes of new positions through a block table and one
query per sequence attending over its blocks (split along the context), against float64
references on random data, with tiles planned for this host and for the AVX2 target (haswell:
8 lanes, 16 vector registers)."""
from __future__ import annotations

import platform

import numpy as np
import pytest
import tvm

from conftest import device_for
from tvm_roller.backends.cpu.kv_cache import CacheLayout, attention_kernel, padded_length, \
    write_kernel
from tvm_roller.backends.cpu.attention_plan import plan_tiles
from tvm_roller.hardware import host_target

HASWELL = {"kind": "llvm", "mcpu": "haswell", "num-cores": 2}
TARGETS = [pytest.param(None, id="host"),
           pytest.param(HASWELL, id="haswell",
                        marks=pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"),
                                                 reason="an x86 host runs the haswell code"))]


def _target(target):
    return host_target() if target is None else target


def planned(target, layers, kv_heads, head_dim, total, heads):
    """A cache of ``total`` positions and its kernels' tiles, planned for ``target``."""
    tiles = plan_tiles(device_for(_target(target)), head_dim, total, heads // kv_heads)
    return CacheLayout(layers, kv_heads, head_dim, padded_length(total, tiles.block), heads,
                       tiles.block), tiles


def _build(func, target=None):
    mod = tvm.IRModule({"main": func.with_attr("global_symbol", "main")})
    return tvm.compile(mod, target=_target(target)).mod["main"]


def _tensor(a):
    return tvm.runtime.tensor(np.ascontiguousarray(a), tvm.cpu())


def shuffled_tables(rng, lay, lengths, pool):
    """Each sequence's block table: distinct pool blocks in a random order (no sequence's
    blocks contiguous or shared), ``[batch, max_blocks]`` int32."""
    blocks = rng.permutation(pool)
    tables = np.zeros((len(lengths), lay.max_blocks), "int32")
    taken = 0
    for row, n in zip(tables, lengths):
        need = -(-n // lay.block)
        row[:need] = blocks[taken:taken + need]
        taken += need
    assert taken <= pool
    return tables


def by_position(cache_layer, table, n, keys):
    """A sequence's ``n`` positions read back through its table: ``[kv, n, head_dim]``."""
    rows = cache_layer[:, table]  # keys: [kv, nb, hd, block]; values: [kv, nb, block, hd]
    if keys:
        rows = rows.transpose(0, 1, 3, 2)
    return rows.reshape(rows.shape[0], -1, rows.shape[-1])[:, :n]


def _reference(q, keys, values, scale, group):
    """One query per head over ``keys``/``values`` [kv, n, hd], in float64."""
    k = np.repeat(keys.astype("f8"), group, 0)
    v = np.repeat(values.astype("f8"), group, 0)
    s = np.einsum("hd,hjd->hj", q.astype("f8"), k) * scale
    p = np.exp(s - s.max(1, keepdims=True))
    return np.einsum("hj,hjd->hd", p / p.sum(1, keepdims=True), v)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("heads,kv_heads,head_dim", [(4, 2, 16), (7, 1, 32), (3, 3, 64),
                                                     (5, 5, 72), (40, 2, 16)])
def test_paged_write_then_attend_matches_float64(target, heads, kv_heads, head_dim):
    """Three sequences written a chunk at a time through shuffled block tables, interleaved
    (a prompt of 1 position, then 60, then one at a time), then one batched attention over
    lengths at a block's edges."""
    layers, layer, total = 3, 1, 131  # a prime: the last block is partial
    lay, tiles = planned(target, layers, kv_heads, head_dim, total, heads)
    assert lay.length % lay.block == 0 and lay.length >= total
    rng = np.random.default_rng(heads)
    batch = 3
    pool = batch * lay.max_blocks + 2
    tables = shuffled_tables(rng, lay, [total] * batch, pool)
    keys = rng.standard_normal((batch, kv_heads, total, head_dim)).astype("float32")
    values = rng.standard_normal((batch, kv_heads, total, head_dim)).astype("float32")
    kc = _tensor(np.zeros(lay.key_shape(pool), "float32"))
    vc = _tensor(np.zeros(lay.value_shape(pool), "float32"))
    write_k = _build(write_kernel(lay, layer, True), target)
    write_v = _build(write_kernel(lay, layer, False), target)
    start = 0
    for end in [1, 61] + list(range(62, total + 1)):
        for b in (2, 0, 1):  # each sequence alone, in no particular order
            lengths = _tensor(np.array([end], "int32"))
            table = _tensor(tables[b:b + 1])
            write_k(kc, _tensor(keys[b:b + 1, :, start:end]), table, lengths)
            write_v(vc, _tensor(values[b:b + 1, :, start:end]), table, lengths)
        start = end
    for b in range(batch):
        np.testing.assert_array_equal(by_position(kc.numpy()[layer], tables[b], total, True),
                                      keys[b])
        np.testing.assert_array_equal(by_position(vc.numpy()[layer], tables[b], total, False),
                                      values[b])
    assert not kc.numpy()[0].any() and not vc.numpy()[2].any()  # other layers untouched

    scale = 1.0 / np.sqrt(head_dim)
    attend = _build(attention_kernel(lay, layer, scale, tiles), target)
    group = heads // kv_heads
    # a block's edges, where the cache holds them (a small head's block can pass the prompt)
    edges = sorted({n for n in (1, 2, lay.block - 1, lay.block, lay.block + 1, total)
                    if 1 <= n <= total})
    for n in edges:
        lengths = np.array([n, total, max(1, n - 1)], "int32")  # unequal lengths in one call
        q = rng.standard_normal((batch, heads, 1, head_dim)).astype("float32")
        out = _tensor(np.full((batch, 1, heads, head_dim), np.nan, "float32"))
        attend(_tensor(q), kc, vc, _tensor(tables), _tensor(lengths), out)
        for b, length in enumerate(lengths):
            ref = _reference(q[b, :, 0], keys[b, :, :length], values[b, :, :length], scale,
                             group)
            np.testing.assert_allclose(out.numpy()[b, 0], ref, rtol=1e-5, atol=1e-5)


def test_far_below_the_maximum_scores_weigh_nothing():
    """Scores e^-90 below the best: weights 0 (no subnormal arithmetic), the result the best
    position's value."""
    lay, tiles = planned(None, 1, 1, 16, 5, 1)
    kc = np.zeros(lay.key_shape(2), "float32")
    vc = np.zeros(lay.value_shape(2), "float32")
    kc[0, 0, 1, 0, :5] = [0.0, 0.0, 100.0, 0.0, 0.0]  # only d = 0 of the keys, in block 1
    vc[0, 0, 1, :5] = np.arange(5, dtype="float32")[:, None]
    q = np.zeros((1, 1, 1, 16), "float32")
    q[0, 0, 0, 0] = 1.0
    out = _tensor(np.zeros((1, 1, 1, 16), "float32"))
    _build(attention_kernel(lay, 0, 1.0, tiles))(
        _tensor(q), _tensor(kc), _tensor(vc), _tensor(np.array([[1]], "int32")),
        _tensor(np.array([5], "int32")), out)
    np.testing.assert_allclose(out.numpy()[0, 0, 0], np.full(16, 2.0), rtol=1e-6)
