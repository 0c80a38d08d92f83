"""Flash attention over whole tensors against a float64 reference: odd, prime and unit lengths
(partial query tiles and key blocks), more keys than queries and fewer, grouped-query heads,
biases broadcast every way (and a row masked everywhere), causal, one kernel for several
lengths, and tiles planned for this host and for the AVX2 target."""
from __future__ import annotations

import numpy as np
import pytest
import tvm

from conftest import device_for
from test_kv_cache import TARGETS, _build, _target
from tvm_roller.backends.cpu.attention_plan import plan_tiles
from tvm_roller.backends.cpu.flash_attention import FLOAT32_MIN, AttentionShape, \
    flash_attention_kernel
from tvm_roller.core.errors import UnsupportedError


def _tensor(a):
    return tvm.runtime.tensor(np.ascontiguousarray(a), tvm.cpu())


def _reference(q, k, v, bias, scale, causal):
    group = q.shape[1] // k.shape[1]
    k = np.repeat(k.astype("f8"), group, 1)
    v = np.repeat(v.astype("f8"), group, 1)
    s = np.einsum("bhqd,bhkd->bhqk", q.astype("f8"), k) * scale
    if bias is not None:
        s = np.maximum(s + bias.astype("f8"), FLOAT32_MIN)
    if causal:
        sq, sk = q.shape[2], k.shape[2]
        later = np.arange(sk)[None, :] > np.arange(sk - sq, sk)[:, None]
        s = np.where(later, -np.inf, s)
    p = np.exp(s - s.max(-1, keepdims=True))
    return np.einsum("bhqk,bhkd->bhqd", p / p.sum(-1, keepdims=True), v)


def _run(shape: AttentionShape, sq: int, sk: int, target=None, seed=0, bias_fill=None):
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((shape.batch, shape.heads, sq, shape.head_dim)).astype("float32")
    k = rng.standard_normal((shape.batch, shape.kv_heads, sk, shape.head_dim)).astype("float32")
    v = rng.standard_normal((shape.batch, shape.kv_heads, sk, shape.head_dim)).astype("float32")
    bias = None
    if shape.bias is not None:
        bb, bh, rows = shape.bias
        bias = (rng.standard_normal((bb, bh, sq if rows else 1, sk)) * 3).astype("float32")
        if bias_fill is not None:
            bias_fill(bias)
    scale = 1.0 / np.sqrt(shape.head_dim)
    tiles = plan_tiles(device_for(_target(target)), shape.head_dim, sk,
                       shape.heads // shape.kv_heads)
    func = _build(flash_attention_kernel(shape, scale, tiles), target)
    out = _tensor(np.full(q.shape, np.nan, "float32"))
    keys = k
    if shape.keys_transposed:  # [.., head_dim, positions], padded past whole blocks
        keys = rng.standard_normal(k.shape[:2] + (k.shape[3], -(-sk // tiles.block) * tiles.block
                                                   + 3)).astype("float32")
        keys[..., :sk] = k.transpose(0, 1, 3, 2)
    args = [_tensor(q), _tensor(keys), _tensor(v)] + ([] if bias is None else [_tensor(bias)])
    func(*args, out)
    np.testing.assert_allclose(out.numpy(), _reference(q, k, v, bias, scale, shape.causal),
                               rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("transposed", [False, True])
@pytest.mark.parametrize("sq,sk", [(1, 1), (13, 13), (131, 131), (5, 70), (67, 29)])
@pytest.mark.parametrize("heads,kv_heads,head_dim", [(4, 2, 16), (3, 3, 72), (2, 1, 64)])
def test_matches_float64(target, transposed, sq, sk, heads, kv_heads, head_dim):
    _run(AttentionShape(2, heads, kv_heads, head_dim, keys_transposed=transposed), sq, sk,
         target)


@pytest.mark.parametrize("bias", [(1, 1, False), (2, 1, False), (1, 3, True), (2, 3, True)])
@pytest.mark.parametrize("causal", [False, True])
def test_biases_broadcast_and_causal(bias, causal):
    sq, sk = (37, 37) if causal else (37, 53)
    _run(AttentionShape(2, 3, 3, 32, bias, causal, keys_transposed=causal), sq, sk,
         seed=sum(bias[:2]))


def test_a_row_masked_everywhere_is_uniform_and_a_masked_key_weighs_nothing():
    """HF's masks put float32's minimum where masked: a key masked for every query weighs
    nothing; a query masked everywhere averages the values, as the softmax of equal scores."""
    def fill(bias):
        bias[0, 0, :, 3] = FLOAT32_MIN     # key 3 masked for every query
        bias[0, 0, 5, :] = FLOAT32_MIN     # query 5 masked everywhere
    _run(AttentionShape(1, 2, 2, 16, (1, 1, True)), 9, 70, bias_fill=fill)


def test_one_kernel_serves_every_length():
    shape = AttentionShape(1, 2, 1, 32, (1, 1, False))
    tiles = plan_tiles(device_for(_target(None)), 32, 128, 2)
    func = _build(flash_attention_kernel(shape, 0.5, tiles))
    rng = np.random.default_rng(1)
    for sq, sk in [(1, 1), (7, 7), (40, 97)]:
        q = rng.standard_normal((1, 2, sq, 32)).astype("float32")
        k, v = (rng.standard_normal((1, 1, sk, 32)).astype("float32") for _ in range(2))
        bias = rng.standard_normal((1, 1, 1, sk)).astype("float32")
        out = _tensor(np.full(q.shape, np.nan, "float32"))
        func(_tensor(q), _tensor(k), _tensor(v), _tensor(bias), out)
        np.testing.assert_allclose(out.numpy(), _reference(q, k, v, bias, 0.5, False),
                                   rtol=2e-5, atol=2e-5)


def test_bad_shapes_are_declined():
    with pytest.raises(UnsupportedError, match="float32"):
        AttentionShape(1, 2, 2, 16, dtype="float64")
    with pytest.raises(UnsupportedError, match="kv heads"):
        AttentionShape(1, 3, 2, 16)
    with pytest.raises(UnsupportedError, match="broadcast"):
        AttentionShape(2, 4, 4, 16, (3, 1, False))
