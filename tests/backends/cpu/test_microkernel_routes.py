"""The micro-kernel layer: every route this host can run, forced by giving it the fastest rate in
the device model, is correct on random data at 1, primes and odd sizes (bf16: float64 reference
of the rounded inputs, fp32 accumulation; int8 → int32: exact); the routes the device model
picks per CPU (from presets: the same on every host); the AArch64 routes build (compile only)."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import tvm

import tvm_roller
from tvm_roller.backends.cpu.microkernel import ROUTES, Operands, candidates
from tvm_roller.backends.cpu.rules.microkernel import MicroKernelRule
from tvm_roller.planner import Context
from tvm_roller.hardware.cpu import detect_isa, from_target, host_cpu

from backends.cpu.test_amx import _data, _tensor, gemm
from conftest import device_for

HOST = {"kind": "llvm", "mcpu": host_cpu(), "num-cores": 2}
_HOST_MODEL = from_target(tvm.target.Target(HOST), use_cache=False, host_caches=False)
_PRODUCTS = [Operands("bfloat16", "bfloat16", "float32"), Operands("uint8", "int8", "int32"),
             Operands("int8", "uint8", "int32"), Operands("int8", "int8", "int32"),
             Operands("uint8", "uint8", "int32")]


def _forced(dev, route, ops):
    """``dev`` whose rates make ``route`` (every block of it) the fastest for ``ops``."""
    rates = {c.key: (1e6 if c.route is route else 1.0) for c in candidates(dev, ops)}
    return dataclasses.replace(dev, cpu=dataclasses.replace(dev.cpu, route_gops=rates))


_HOST_ROUTES = [(r, o) for r in ROUTES for o in _PRODUCTS if r.usable(_HOST_MODEL, o)]


@pytest.mark.parametrize("route,ops", _HOST_ROUTES,
                         ids=[f"{r.name}-{o.label}" for r, o in _HOST_ROUTES])
@pytest.mark.parametrize("m,n,k", [(1, 1, 1), (7, 41, 67), (37, 53, 131)])
def test_every_host_route_is_correct(route, ops, m, n, k):
    func = gemm(m, n, k, ops.a, ops.b, ops.acc)
    dev = _forced(_HOST_MODEL, route, ops)
    plan = tvm_roller.plan(func, HOST, device=dev)
    if plan.analysis.kind != "tiled":
        pytest.skip("a GEMV-like shape is a streamed reduction")
    assert plan.tiles[0].tensor_core.startswith(route.name + ":")
    lib = tvm_roller.build(func, HOST, device=dev)
    rng = np.random.default_rng(m * 1000 + n)
    a, a64 = _data((m, k), ops.a, rng)
    b, b64 = _data((k, n), ops.b, rng)
    out = _tensor(np.full((m, n), 7, ops.acc), ops.acc)
    lib(_tensor(a, ops.a), _tensor(b, ops.b), out)
    ref, got = a64 @ b64, out.numpy().astype(np.float64)
    if ops.acc == "int32":
        np.testing.assert_array_equal(got, ref)
    else:
        assert np.abs(got - ref).max() <= 1e-5 * np.abs(a64).dot(np.abs(b64)).max() + 1e-6


@pytest.mark.parametrize("mcpu,mattr,bf16,int8", [
    ("haswell", None, "bf16_fma", "avx2_madd"),
    ("alderlake", None, "bf16_fma", "avxvnni"),
    ("skylake-avx512", None, "bf16_fma", "avx512bw_madd"),
    ("cascadelake", None, "bf16_fma", "avx512vnni"),
    ("znver4", None, "avx512bf16", "avx512vnni"),
    ("sapphirerapids", None, "amx_bf16", "amx_int8"),
    # Intel's vdpbf16ps issues at a quarter of the FMA rate (the route's preset says so)
    ("sapphirerapids", ["-amx-tile", "-amx-bf16", "-amx-int8"], "bf16_fma", "avx512vnni"),
    ("znver5", None, "avx512bf16", "avx512vnni"),
])
def test_route_picked_by_the_model(mcpu, mattr, bf16, int8):
    """From the presets' rates, which know the core (on Intel's server cores ``vdpbf16ps``
    runs at half the fp32 FMA rate and loses to bf16 → fp32 FMAs; on Zen 4 / 5 at twice)."""
    target = {"kind": "llvm", "mcpu": mcpu, "num-cores": 2, **({"mattr": mattr} if mattr else {})}
    dev = device_for(target)
    for ops, want in ((_PRODUCTS[0], bf16), (_PRODUCTS[1], int8)):
        plan = tvm_roller.plan(gemm(256, 256, 256, ops.a, ops.b, ops.acc), target, device=dev)
        assert plan.tiles[0].tensor_core.split(":")[0] == want, plan.tiles[0].tensor_core
        assert "route: " in plan.tiles[0].notes[0] and "(preset)" in plan.tiles[0].notes[0]


def test_measured_rate_decides():
    """A route measured slower than another is not taken (vdpbf16ps at half rate)."""
    target = {"kind": "llvm", "mcpu": "znver4", "num-cores": 2}
    dev = device_for(target)
    ops = _PRODUCTS[0]
    rates = {c.key: (50.0 if c.route.name == "avx512bf16" else 200.0)
             for c in candidates(dev, ops)}
    dev = dataclasses.replace(dev, cpu=dataclasses.replace(dev.cpu, route_gops=rates))
    plan = tvm_roller.plan(gemm(256, 256, 256, ops.a, ops.b, ops.acc), target, device=dev)
    assert plan.tiles[0].tensor_core.startswith("bf16_fma:")
    assert "(measured)" in plan.tiles[0].notes[0]


@pytest.mark.parametrize("mcpu", sorted({host_cpu(), "haswell"}))
@pytest.mark.parametrize("m,n,k", [(3, 17, 5), (7, 41, 67), (37, 53, 131)])
def test_fp32_route_is_correct(mcpu, m, n, k):
    """The fp32 FMA route (zmm on AVX-512, ymm on AVX2: no zmm register in haswell code),
    planned and lowered by the micro-kernel rule directly: fp32 GEMMs stay on the tiled rule
    by default (its register tile measures as fast; see BENCHMARKS)."""
    target = {"kind": "llvm", "mcpu": mcpu, "num-cores": 2}
    ctx = Context.make(target, device=device_for(target))
    fa = ctx.backend.analyze(gemm(m, n, k, "float32", "float32", "float32"))
    rule = MicroKernelRule()
    tile = rule.construct(fa, ctx.device, 1)[0]
    assert tile.tensor_core.startswith("fp32_fma:"), tile.tensor_core
    with ctx.pass_context():
        lib = tvm.compile(rule.lower(fa.func, fa, tile, ctx.device).mod, target=ctx.target)
    if mcpu == "haswell":
        assert "zmm" not in lib.mod.inspect_source("asm")
    rng = np.random.default_rng(m + n + k)
    a, b = rng.standard_normal((m, k)), rng.standard_normal((k, n))
    out = tvm.runtime.tensor(np.full((m, n), 7, "float32"))
    lib(tvm.runtime.tensor(a.astype("float32")), tvm.runtime.tensor(b.astype("float32")), out)
    ref = a.astype("float32").astype(np.float64) @ b.astype("float32").astype(np.float64)
    assert np.abs(out.numpy() - ref).max() <= 1e-5 * (np.abs(a) @ np.abs(b)).max()


AARCH64 = {"kind": "llvm", "mtriple": "aarch64-linux-gnu", "mattr": ["+neon", "+dotprod", "+i8mm"]}


@pytest.mark.parametrize("a_dt,b_dt,instruction", [("int8", "int8", "sdot"),
                                                   ("uint8", "uint8", "udot"),
                                                   ("uint8", "int8", "usdot"),
                                                   ("bfloat16", "bfloat16", "fmla")])
def test_aarch64_routes_build(a_dt, b_dt, instruction):
    """NEON dot products (and bf16 → fp32 FMAs) through the same layer: compile only."""
    acc = "float32" if a_dt == "bfloat16" else "int32"
    func = gemm(64, 64, 128, a_dt, b_dt, acc)
    dev = device_for(AARCH64)
    plan = tvm_roller.plan(func, AARCH64, device=dev)
    assert plan.rule.name == "microkernel"
    lib = tvm_roller.build(func, AARCH64, device=dev)
    asm = lib.mod.inspect_source("asm") if hasattr(lib.mod, "inspect_source") else \
        lib.mod.get_source("asm")
    assert instruction in asm


def test_host_features_are_known():
    """(The routes above were chosen from LLVM's features of the host's mcpu.)"""
    assert detect_isa(tvm.target.Target(HOST))[0] in ("avx512", "avx2", "neon", "sse")
