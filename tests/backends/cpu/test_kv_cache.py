"""The in-place key/value cache kernels: writes of new positions and one query's attention over
the cache (split along the context), against float64 references on random data, with tiles
planned for this host and for the AVX2 target (haswell: 8 lanes, 16 vector registers)."""
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


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("heads,kv_heads,head_dim", [(4, 2, 16), (7, 1, 32), (3, 3, 64),
                                                     (5, 5, 72), (40, 2, 16)])
def test_write_then_attend_matches_float64(target, heads, kv_heads, head_dim):
    layers, layer, total = 3, 1, 131  # a prime: the last block is partial
    lay, tiles = planned(target, layers, kv_heads, head_dim, total, heads)
    assert lay.length % lay.block == 0 and lay.length >= total
    rng = np.random.default_rng(heads)
    keys = rng.standard_normal((1, kv_heads, total, head_dim)).astype("float32")
    values = rng.standard_normal((1, kv_heads, total, head_dim)).astype("float32")
    kc, vc = _tensor(np.zeros(lay.key_shape, "float32")), _tensor(np.zeros(lay.value_shape,
                                                                         "float32"))
    write_k = _build(write_kernel(lay, layer, True), target)
    write_v = _build(write_kernel(lay, layer, False), target)
    # a prompt of 1 position, then 60, then one at a time: positions [n - m, n) each time
    ends = [1, 61] + list(range(62, total + 1))
    start = 0
    for end in ends:
        marker = _tensor(np.zeros(end, "int64"))
        write_k(kc, _tensor(keys[:, :, start:end]), marker)
        write_v(vc, _tensor(values[:, :, start:end]), marker)
        start = end
    blocked = kc.numpy()[layer]  # [kv, blocks, head_dim, block] -> [kv, position, head_dim]
    by_position = blocked.transpose(0, 1, 3, 2).reshape(kv_heads, -1, head_dim)
    np.testing.assert_array_equal(by_position[:, :total], keys[0])
    np.testing.assert_array_equal(vc.numpy()[layer][:, :total], values[0])
    assert not kc.numpy()[0].any() and not vc.numpy()[2].any()  # other layers untouched

    scale = 1.0 / np.sqrt(head_dim)
    attend = _build(attention_kernel(lay, layer, scale, tiles), target)
    group = heads // kv_heads
    # a block's edges, where the cache holds them (a small head's block can pass the prompt)
    for n in sorted({n for n in (1, 2, lay.block - 1, lay.block, lay.block + 1, total)
                     if n <= total}):
        q = rng.standard_normal((1, heads, 1, head_dim)).astype("float32")
        out = _tensor(np.full((1, 1, heads, head_dim), np.nan, "float32"))
        attend(_tensor(q), kc, vc, _tensor(np.zeros(n, "int64")), out)
        k = np.repeat(keys[0, :, :n].astype("f8"), group, 0)
        v = np.repeat(values[0, :, :n].astype("f8"), group, 0)
        s = np.einsum("hd,hjd->hj", q[0, :, 0].astype("f8"), k) * scale
        p = np.exp(s - s.max(1, keepdims=True))
        ref = np.einsum("hj,hjd->hd", p / p.sum(1, keepdims=True), v)
        np.testing.assert_allclose(out.numpy()[0, 0], ref, rtol=1e-5, atol=1e-5)


def test_far_below_the_maximum_scores_weigh_nothing():
    """Scores e^-90 below the best: weights 0 (no subnormal arithmetic), the result the best
    position's value."""
    lay, tiles = planned(None, 1, 1, 16, 5, 1)
    kc = np.zeros(lay.key_shape, "float32")
    vc = np.zeros(lay.value_shape, "float32")
    kc[0, 0, 0, 0, :5] = [0.0, 0.0, 100.0, 0.0, 0.0]  # only d = 0 of the keys
    vc[0, 0, :5] = np.arange(5, dtype="float32")[:, None]
    q = np.zeros((1, 1, 1, 16), "float32")
    q[0, 0, 0, 0] = 1.0
    out = _tensor(np.zeros((1, 1, 1, 16), "float32"))
    _build(attention_kernel(lay, 0, 1.0, tiles))(_tensor(q), _tensor(kc), _tensor(vc),
                                          _tensor(np.zeros(5, "int64")), out)
    np.testing.assert_allclose(out.numpy()[0, 0, 0], np.full(16, 2.0), rtol=1e-6)
