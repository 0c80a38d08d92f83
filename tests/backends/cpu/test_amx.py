"""bf16 and int8 compute-bound kernels on AMX tiles, through ``tvm_roller.build``: GEMMs and
batch matmuls with epilogues at 1, primes and odd sizes against float64 on the same bf16 / int8
inputs (bf16: 1e-2 relative, fp32 accumulation; int8 → int32: exact), bf16 elementwise and
reduction kernels, and the declines of a target without AMX. The kernels run where the host has
AMX; they are planned for the pinned ``AMX_TARGET`` and its preset-derived model (never the
host's caches), so each decision asserted is the same on every host."""
from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import te

import tvm_roller
from tvm_roller import UnsupportedError
from tvm_roller.hardware import host_target
from tvm_roller.hardware.cpu import detect_isa

from conftest import AMX_TARGET, device, device_for

AMX = {"amx-bf16", "amx-int8"} <= detect_isa(host_target())[1]
needs_amx = pytest.mark.skipif(not AMX, reason="this CPU has no AMX")


def _plan(func, **kw):
    return tvm_roller.plan(func, AMX_TARGET, device=device_for(AMX_TARGET), **kw)


def _build(func):
    return tvm_roller.build(func, AMX_TARGET, device=device_for(AMX_TARGET))


def to_bf16(x: np.ndarray) -> np.ndarray:
    """float32 → bfloat16 bits (round to nearest even), as uint16."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    u = u + 0x7FFF + ((u >> 16) & 1)
    return (u >> 16).astype(np.uint16)


def from_bf16(bits: np.ndarray) -> np.ndarray:
    return (bits.astype(np.uint32) << 16).view(np.float32)


def _data(shape, dtype, rng):
    """(bits as stored, float64 values) of random non-zero data."""
    if dtype == "bfloat16":
        x = rng.uniform(-1.0, 1.0, shape)
        x[x == 0] = 0.5
        bits = to_bf16(x.astype(np.float32))
        return bits, from_bf16(bits).astype(np.float64)
    lo, hi = (-128, 128) if dtype == "int8" else (0, 256)
    x = rng.integers(lo, hi, size=shape)
    x[x == 0] = 3
    return x.astype(dtype), x.astype(np.float64)


def _tensor(x, dtype):
    t = tvm.runtime.empty(x.shape, dtype, tvm.cpu())
    t.copyfrom(x)
    return t


def gemm(m, n, k, a_dt, b_dt, acc, batch=0, epilogue=None):
    ash, bsh = ((batch,) if batch else ()) + (m, k), ((batch,) if batch else ()) + (k, n)
    A = te.placeholder(ash, a_dt, name="A")
    B = te.placeholder(bsh, b_dt, name="B")
    r = te.reduce_axis((0, k), name="k")
    C = te.compute(ash[:-1] + (n,), lambda *i: te.sum(
        A[(*i[:-1], r)].astype(acc) * B[(*i[:-2], r, i[-1])].astype(acc), axis=r), name="C")
    args = [A, B]
    if epilogue == "bias_relu":
        bias = te.placeholder((n,), acc, name="bias")
        C = te.compute(C.shape, lambda *i: te.max(C(*i) + bias[i[-1]], tvm.tirx.const(0, acc)),
                       name="D")
        args.append(bias)
    elif epilogue == "requantize":  # int32 → float scale → int8 (round, clip): a quantized layer
        scale = te.placeholder((n,), "float32", name="scale")
        C = te.compute(C.shape, lambda *i: te.max(te.min(tvm.tirx.round(
            C(*i).astype("float32") * scale[i[-1]]), 127.0), -128.0).astype("int8"), name="Q")
        args.append(scale)
    return te.create_prim_func(args + [C])


def _check(m, n, k, a_dt, b_dt, acc, batch=0, epilogue=None, seed=0):
    func = gemm(m, n, k, a_dt, b_dt, acc, batch, epilogue)
    plan = _plan(func)
    if plan.analysis.kind == "tiled":  # (a GEMV-like shape is a streamed reduction)
        assert plan.rule.name == "microkernel"
    lib = _build(func)
    rng = np.random.default_rng(seed)
    pre = (batch,) if batch else ()
    a, a64 = _data(pre + (m, k), a_dt, rng)
    b, b64 = _data(pre + (k, n), b_dt, rng)
    args = [_tensor(a, a_dt), _tensor(b, b_dt)]
    ref = a64 @ b64
    if epilogue == "bias_relu":
        bias, bias64 = _data((n,), "bfloat16" if acc == "float32" else "int8", rng)
        bias = bias64.astype(acc)
        ref = np.maximum(ref + bias64, 0.0)
        args.append(_tensor(bias, acc))
    elif epilogue == "requantize":
        scale = rng.uniform(0.5, 2.0, n).astype(np.float32) / max(1.0, np.abs(ref).max() / 100)
        args.append(_tensor(scale, "float32"))
        ref = np.clip(np.round((ref.astype(np.float32) * scale).astype(np.float64)), -128, 127)
    out_dt = "int8" if epilogue == "requantize" else acc
    out = _tensor(np.full(ref.shape, -77, out_dt), out_dt)
    lib(*args, out)
    got = out.numpy().astype(np.float64)
    if acc == "float32":
        err = np.abs(got - ref).max() / np.abs(ref).max()
        assert err <= 1e-2, err
    elif epilogue == "requantize":  # float32 rounding of the scale product: off by one at most
        assert np.abs(got - ref).max() <= 1
    else:
        np.testing.assert_array_equal(got, ref)


@needs_amx
@pytest.mark.parametrize("m,n,k", [(1, 1, 1), (1, 37, 61), (13, 97, 131), (64, 64, 64),
                                   (127, 33, 521), (200, 160, 1030)])
def test_bf16_gemm(m, n, k):
    _check(m, n, k, "bfloat16", "bfloat16", "float32")


@needs_amx
@pytest.mark.parametrize("a_dt,b_dt", [("uint8", "int8"), ("int8", "int8"), ("uint8", "uint8"),
                                       ("int8", "uint8")])
@pytest.mark.parametrize("m,n,k", [(1, 7, 3), (13, 97, 131), (67, 41, 257)])
def test_int8_gemm_exact(a_dt, b_dt, m, n, k):
    _check(m, n, k, a_dt, b_dt, "int32")


@needs_amx
@pytest.mark.parametrize("dt,acc", [("bfloat16", "float32"), ("int8", "int32")])
def test_batch_matmul_with_epilogue(dt, acc):
    _check(11, 29, 67, dt, dt, acc, batch=3, epilogue="bias_relu")


@needs_amx
def test_int8_requantize_epilogue():
    _check(17, 53, 97, "uint8", "int8", "int32", epilogue="requantize")


@needs_amx
def test_bf16_elementwise_and_reduction():
    """Memory-bound bf16 kernels are roller's too, computed in float32."""
    A = te.placeholder((13, 67), "bfloat16", name="A")
    B = te.placeholder((13, 67), "bfloat16", name="B")
    C = te.compute((13, 67), lambda i, j: A[i, j] * B[i, j] + A[i, j], name="C")
    r = te.reduce_axis((0, 67), "r")
    S = te.compute((13,), lambda i: te.sum(C[i, r].astype("float32"), axis=r), name="S")
    func = te.create_prim_func([A, B, S])
    assert _plan(func).analysis.kind == "reduction"
    lib = _build(func)
    rng = np.random.default_rng(4)
    a, a64 = _data((13, 67), "bfloat16", rng)
    b, b64 = _data((13, 67), "bfloat16", rng)
    out = _tensor(np.zeros(13, np.float32), "float32")
    lib(_tensor(a, "bfloat16"), _tensor(b, "bfloat16"), out)
    ref = (a64 * b64 + a64).sum(1)  # each product rounded to bf16 by C's storage: 1e-2
    np.testing.assert_allclose(out.numpy(), ref, rtol=2e-2, atol=2e-2)


@needs_amx
@pytest.mark.parametrize("dt,acc", [("bfloat16", "float32"), ("int8", "int32")])
@pytest.mark.parametrize("m,n,k", [(64, 64, 64), (37, 50, 70)])
def test_transposed_operands(dt, acc, m, n, k):
    """A stored [k, m] and B stored [n, k] (attention's Q·Kᵀ): packed from either layout."""
    A = te.placeholder((k, m), dt, name="A")
    B = te.placeholder((n, k), dt, name="B")
    r = te.reduce_axis((0, k), name="r")
    C = te.compute((m, n), lambda i, j: te.sum(A[r, i].astype(acc) * B[j, r].astype(acc),
                                                axis=r), name="C")
    func = te.create_prim_func([A, B, C])
    assert _plan(func).rule.name == "microkernel"
    lib = _build(func)
    rng = np.random.default_rng(1)
    a, a64 = _data((k, m), dt, rng)
    b, b64 = _data((n, k), dt, rng)
    out = _tensor(np.zeros((m, n), acc), acc)
    lib(_tensor(a, dt), _tensor(b, dt), out)
    ref = a64.T @ b64.T
    if acc == "int32":
        np.testing.assert_array_equal(out.numpy(), ref)
    else:
        assert np.abs(out.numpy() - ref).max() / np.abs(ref).max() <= 1e-2


def test_amx_planned_for_large_products():
    """A large product on an AMX target goes to the tile products (the presets' rates)."""
    for dt, acc in (("bfloat16", "float32"), ("uint8", "int32")):
        plan = _plan(gemm(256, 256, 256, dt, "int8" if dt == "uint8" else dt, acc))
        assert plan.tiles[0].tensor_core.startswith("amx_"), plan.tiles[0].tensor_core


def test_unsupported_product_declined():
    """bf16 accumulated in bf16 is no micro-kernel product: declined, saying why."""
    with pytest.raises(UnsupportedError, match="no micro-kernel route computes"):
        _plan(gemm(32, 32, 32, "bfloat16", "bfloat16", "bfloat16"))


@needs_amx
def test_cached_tile_is_reused(tmp_path):
    """A padded shape (K 61 → chunk 64, M 13 → 32) comes back from the schedule cache as it
    was planned: the rule's checks take the instruction's padded tiles."""
    from tvm_roller.cache import ScheduleCache

    cache = ScheduleCache(str(tmp_path))
    func = gemm(13, 97, 61, "bfloat16", "bfloat16", "float32")
    first = _plan(func, cache=cache)
    again = _plan(func, cache=cache)
    assert not first.from_cache and again.from_cache
    assert again.tiles[0].to_dict() == first.tiles[0].to_dict()
