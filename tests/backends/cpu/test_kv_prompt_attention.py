"""A prompt's causal attention over the cache against a float64 reference: prompts of 1, prime
and odd lengths (partial query tiles and cache blocks), a prompt continuing a cache, grouped-query
heads and head dimensions that are not a multiple of the vector width."""
from __future__ import annotations

import numpy as np
import pytest
import tvm

from test_kv_cache import TARGETS, _build, planned, shuffled_tables
from tvm_roller.backends.cpu.kv_prompt_attention import prompt_attention_kernel


def _tensor(a):
    return tvm.runtime.tensor(np.ascontiguousarray(a), tvm.cpu())


def _paged(rows, table, lay, pool, keys):
    """rows [kv, n, head_dim] written through ``table`` into a pool's layer: keys
    [kv, pool, head_dim, block], values [kv, pool, block, head_dim]."""
    kv, n, hd = rows.shape
    full = np.zeros((kv, lay.max_blocks * lay.block, hd), "float32")
    full[:, :n] = rows
    blocks = full.reshape(kv, lay.max_blocks, lay.block, hd)
    if keys:
        blocks = blocks.transpose(0, 1, 3, 2)
    out = np.zeros((kv, pool) + blocks.shape[2:], "float32")
    need = -(-n // lay.block)
    out[:, table[:need]] = blocks[:, :need]
    return out


def _reference(q, keys, values, n, scale, group):
    m = q.shape[2]
    k = np.repeat(keys[:, :n].astype("f8"), group, 0)
    v = np.repeat(values[:, :n].astype("f8"), group, 0)
    s = np.einsum("hmd,hjd->hmj", q[0].astype("f8"), k) * scale
    allowed = np.arange(n)[None, :] <= np.arange(n - m, n)[:, None]
    s = np.where(allowed[None], s, -np.inf)
    p = np.exp(s - s.max(2, keepdims=True))
    return np.einsum("hmj,hjd->mhd", p / p.sum(2, keepdims=True), v)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("heads,kv_heads,head_dim", [(4, 2, 16), (7, 1, 72), (3, 3, 64)])
@pytest.mark.parametrize("n,m", [(1, 1), (13, 13), (131, 131), (70, 5), (200, 67)])
def test_prompt_attention_matches_float64(target, heads, kv_heads, head_dim, n, m):
    layers, layer = 2, 1
    lay, tiles = planned(target, layers, kv_heads, head_dim, 211, heads)
    rng = np.random.default_rng(n * 7 + m)
    keys = rng.standard_normal((kv_heads, n, head_dim)).astype("float32")
    values = rng.standard_normal((kv_heads, n, head_dim)).astype("float32")
    pool = lay.max_blocks + 3
    table = shuffled_tables(rng, lay, [n], pool)
    kc = rng.standard_normal(lay.key_shape(pool)).astype("float32")  # others' blocks: unread
    vc = rng.standard_normal(lay.value_shape(pool)).astype("float32")
    kc[layer] = _paged(keys, table[0], lay, pool, True)
    vc[layer] = _paged(values, table[0], lay, pool, False)
    q = (rng.standard_normal((1, heads, m, head_dim)) * 2).astype("float32")
    scale = 1.0 / np.sqrt(head_dim)
    out = _tensor(np.full((1, m, heads, head_dim), np.nan, "float32"))
    _build(prompt_attention_kernel(lay, layer, scale, tiles), target)(
        _tensor(q), _tensor(kc), _tensor(vc), _tensor(table), _tensor(np.array([n], "int32")),
        out)
    ref = _reference(q, keys, values, n, scale, heads // kv_heads)
    np.testing.assert_allclose(out.numpy()[0], ref, rtol=1e-5, atol=1e-5)
