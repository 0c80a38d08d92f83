"""No declines on the x86 list: bf16 x bf16 -> float32 and uint8 x int8 -> int32 matmuls are
scheduled by a roller rule for every x86 CPU from Haswell on (AVX2, AVX-512, AVX-VNNI,
AVX512-VNNI / BF16, AMX, and Sapphire Rapids with its AMX switched off), and where this host
can run the target's code they match a float64 numpy reference: bf16 to ~1e-4 sqrt(K) of the
output's magnitude (products exact, float32 accumulation), int8 exactly (with rows and columns
at the range's ends, where a 16-bit pair sum such as ``vpmaddubsw``'s would saturate).

Whether this host runs a target is decided by instruction-set features
(``harness.random_cases.targets.can_run``): every x86-64 host with AVX2 runs Haswell code, an
AMD Zen 4 host does not run Sapphire Rapids' AMX, and Zen code (SSE4A) runs on an Intel host
only when its assembly holds no SSE4A instruction. Plans use each target's preset-derived
device model (``device_for``), never this host's caches or calibration.
"""
from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
import tvm
from tvm import te

import tvm_roller
from tvm_roller import FallbackWarning, UnsupportedError
from tvm_roller.backends.cpu.rules import RULES
from harness.random_cases import targets

from backends.cpu.test_amx import from_bf16, to_bf16
from conftest import device_for

_CPUS = ["haswell", "znver3", "skylake-avx512", "cascadelake", "alderlake", "znver4",
         "sapphirerapids"]
TARGETS = {cpu: {"kind": "llvm", "mcpu": cpu, "num-cores": 2} for cpu in _CPUS}
TARGETS["sapphirerapids-noamx"] = {"kind": "llvm", "mcpu": "sapphirerapids", "num-cores": 2,
                                   "mattr": ["-amx-tile", "-amx-bf16", "-amx-int8"]}
PRODUCTS = {"bf16": ("bfloat16", "bfloat16", "float32"), "u8s8": ("uint8", "int8", "int32")}
SHAPES = [(64, 96, 128), (37, 53, 67)]  # (M, N, K)
ROLLER_RULES = {rule.name for rule in RULES}


def gemm(m: int, n: int, k: int, a_dt: str, b_dt: str, acc: str):
    """C[m, n] = sum_k A[m, k] * B[k, n], the operands cast to ``acc``."""
    A = te.placeholder((m, k), a_dt, name="A")
    B = te.placeholder((k, n), b_dt, name="B")
    r = te.reduce_axis((0, k), name="k")
    C = te.compute((m, n), lambda i, j: te.sum(A[i, r].astype(acc) * B[r, j].astype(acc),
                                               axis=r), name="C")
    return te.create_prim_func([A, B, C])


def operands(m: int, n: int, k: int, product: str, rng: np.random.Generator):
    """(A as stored, B as stored, A and B in float64) of random data."""
    if product == "bf16":
        a_bits = to_bf16(rng.uniform(-1.0, 1.0, (m, k)).astype(np.float32))
        b_bits = to_bf16(rng.uniform(-1.0, 1.0, (k, n)).astype(np.float32))
        return a_bits, b_bits, from_bf16(a_bits).astype(np.float64), \
            from_bf16(b_bits).astype(np.float64)
    a = rng.integers(0, 256, size=(m, k)).astype(np.uint8)
    b = rng.integers(-128, 128, size=(k, n)).astype(np.int8)
    a[0, :] = 255  # the extremes: 255 * 127 + 255 * 127 overflows a 16-bit pair sum
    b[:, 0] = 127
    b[:, -1] = -128
    return a, b, a.astype(np.float64), b.astype(np.float64)


def _tensor(x: np.ndarray, dtype: str):
    t = tvm.runtime.empty(x.shape, dtype, tvm.cpu())
    t.copyfrom(x)  # bf16: the uint16 bits, copied as they are
    return t


def _build(func, target, what: str):
    """roller's build of ``func`` with no fallback: a decline fails the test with its reason."""
    try:
        plan = tvm_roller.plan(func, target, device=device_for(target))
        with warnings.catch_warnings():
            warnings.simplefilter("error", FallbackWarning)
            ex = tvm_roller.build(func, target, fallback=False, device=device_for(target))
    except UnsupportedError as err:
        pytest.fail(f"roller declined {what}: {err}")
    assert plan.rule.name in ROLLER_RULES, plan.rule.name
    return ex


def _runs_here(ex, target) -> targets.RunVerdict:
    tgt = tvm.target.Target(target)
    asm = ex.mod.inspect_source("asm") if targets.needs_asm(tgt) else None
    return targets.can_run(tgt, asm)


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("product", list(PRODUCTS))
@pytest.mark.parametrize("name", list(TARGETS))
def test_low_precision_matmul_is_scheduled_and_correct(name, product, shape):
    target = TARGETS[name]
    m, n, k = shape
    a_dt, b_dt, acc = PRODUCTS[product]
    what = f"{a_dt} x {b_dt} -> {acc} {m}x{n}x{k} for {name}"
    ex = _build(gemm(m, n, k, a_dt, b_dt, acc), target, what)
    verdict = _runs_here(ex, target)
    if not verdict.ok:  # built and not declined: all this host can check
        return
    a, b, a64, b64 = operands(m, n, k, product, np.random.default_rng([m, n, k]))
    fill = np.full((m, n), np.nan if acc == "float32" else np.iinfo(np.int32).min, dtype=acc)
    out = _tensor(fill, acc)
    ex(_tensor(a, a_dt), _tensor(b, b_dt), out)
    got, ref = out.numpy(), a64 @ b64
    if acc == "int32":
        np.testing.assert_array_equal(got, ref.astype(np.int64), err_msg=what)
    else:
        assert np.all(np.isfinite(got)), f"{what}: unwritten (NaN) outputs"
        err = float(np.max(np.abs(got - ref))) / float(np.max(np.abs(ref)))
        assert err <= 1e-4 * math.sqrt(k), f"{what}: relative error {err:.3g}"
