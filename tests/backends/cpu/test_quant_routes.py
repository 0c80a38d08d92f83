"""The dot-product routes of the quantized linear layer (``microkernel.quant_dot``), each on its
own: the route each CPU gets; the int8 / int4 kernels built for it, run (where this host runs
the target's code) against the exact integer product of the quantized operands, with the
activations' quantization reproduced in numpy; what the assembly holds (no zmm on Haswell, no
vpdpbusd on Skylake-AVX512, VEX vpdpbusd on Alder Lake); vpmaddubsw's int16 saturation at the
extreme codes; the plain-TIR route (run here); AArch64 builds (compile only: the ELF machine,
``sdot``); and the decline of a target without a route."""
from __future__ import annotations

import dataclasses
import json
import re
from functools import lru_cache
from typing import Optional

import numpy as np
import pytest
import tvm
from tvm.target import codegen

from tvm_roller.backends.cpu.microkernel.quant_dot import GENERIC, QuantDotRoute, \
    pick_quant_route
from tvm_roller.backends.cpu.quant_format import FORMATS, GROUP, pack, quantize
from tvm_roller.backends.cpu.quant_linear import matmul_kernel, quantize_rows_kernel
from tvm_roller.core.errors import UnsupportedError
from tvm_roller.hardware import host_target

# each x86 CPU and the route it gets
X86_ROUTES = {"haswell": "avx2", "skylake-avx512": "avx512bw", "alderlake": "avxvnni",
              "cascadelake": "avx512vnni", "znver3": "avx2", "znver4": "avx512vnni",
              "sapphirerapids": "avx512vnni"}
# m = 1 and primes; n: 3 and 5 blocks of 16; K = 32 · 3, 5, 7
SHAPES = [(1, 48, 96), (7, 80, 160), (13, 48, 224)]
ARM_DOT = {"kind": "llvm", "mtriple": "aarch64-linux-gnu", "mattr": ["+neon", "+dotprod", "+i8mm"]}
ARM_PLAIN = {"kind": "llvm", "mtriple": "aarch64-linux-gnu", "mattr": ["+neon"]}
# the vector ISA whose instructions the kernels may hold (system extensions left out)
_VECTOR_ISA = {"avx", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512dq",
               "avx512cd", "avx512vnni", "avxvnni", "avx512vbmi", "avx512bf16"}


def _x86(cpu: str) -> tvm.target.Target:
    return tvm.target.Target({"kind": "llvm", "mcpu": cpu, "num-cores": 2})


def _is_x86(target: tvm.target.Target) -> bool:
    return str(target.attrs.get("mtriple") or codegen.llvm_get_system_triple()).startswith("x86")


def _runs_here(target: tvm.target.Target) -> bool:
    """Whether this host has every vector extension ``target`` lets LLVM use."""
    def isa(t):
        return {str(f) for f in codegen.llvm_get_cpu_features(t)} & _VECTOR_ISA

    host = host_target()
    return _is_x86(host) and isa(target) <= isa(host)


@lru_cache(maxsize=None)
def _built(target_json: str, route: QuantDotRoute, fmt: str, n: int, k: int):
    """(quantize_rows, matmul) built for the target; cached across the tests."""
    target = tvm.target.Target(json.loads(target_json))
    f = FORMATS[fmt]

    def build(func):
        mod = tvm.IRModule({"main": func.with_attr("global_symbol", "main")})
        return tvm.compile(mod, target=target).mod

    return build(quantize_rows_kernel(f, k, route)), build(matmul_kernel(f, n, k, route))


def _build_for(spec: dict, fmt: str, n: int, k: int, route: Optional[QuantDotRoute] = None):
    """The route (``spec``'s best unless given) and its two kernels."""
    route = route or pick_quant_route(spec)
    return route, _built(json.dumps(spec, sort_keys=True), route, fmt, n, k)


def _t(a):
    return tvm.runtime.tensor(a, tvm.cpu())


def _quantize_rows_numpy(x: np.ndarray):
    """The kernel's activation quantization: per group of 32, ``sx = max|x| / 127`` and
    ``x_q = round(x · (127 / max|x|))``, in float32 as the kernel computes it."""
    m, k = x.shape
    g = x.reshape(m, k // GROUP, GROUP)
    amax = np.abs(g).max(-1)
    inv = np.where(amax > 0, np.float32(127) / np.where(amax > 0, amax, 1), 0).astype("f4")
    xq = np.rint(g * inv[..., None]).astype(np.int64)
    return xq.reshape(m, k), (amax / np.float32(127)).astype("f4")


def _run(libs, route: QuantDotRoute, fmt: str, x: np.ndarray, w: np.ndarray):
    """The kernels' ``y`` and the reference: exact integer dots of the numpy-quantized
    activations and the weights' codes per group, then the float64 scales."""
    f = FORMATS[fmt]
    (m, k), n = x.shape, w.shape[0]
    codes, scales = quantize(f, w)
    words, sc = pack(f, codes, scales)
    xq, xs, xc = _t(np.zeros((m, k), "int8")), _t(np.zeros((m, k // GROUP), "float32")), \
        _t(np.zeros((m, k // GROUP), "int32"))
    libs[0]["main"](_t(x), xq, xs, xc)
    ref_q, ref_s = _quantize_rows_numpy(x)
    np.testing.assert_array_equal(xq.numpy(), ref_q)
    np.testing.assert_allclose(xs.numpy(), ref_s, rtol=1e-6)
    np.testing.assert_array_equal(
        xc.numpy(), ref_q.reshape(m, -1, GROUP).sum(-1) * route.offset(f))
    y = _t(np.full((m, n), np.nan, "float32"))
    libs[1]["main"](xq, xs, xc, _t(words), _t(sc), y)
    q = codes.astype(np.int64).reshape(n, k // GROUP, GROUP) - f.offset
    dots = np.einsum("mgj,ngj->mng", ref_q.reshape(m, k // GROUP, GROUP), q)  # exact, int64
    ref = (dots * ref_s.astype("f8")[:, None, :] * scales.astype("f8")[None]).sum(-1)
    return y.numpy(), ref


def _assert_close(y: np.ndarray, ref: np.ndarray) -> None:
    assert np.isfinite(y).all()
    assert np.abs(y - ref).max() <= 1e-4 * np.abs(ref).max()


def _data(m: int, n: int, k: int, seed: int):
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((n, k)).astype("float32")
    x = (rng.standard_normal((m, k)) * 3).astype("float32")
    w[w == 0], x[x == 0] = 0.5, 0.5  # never zeros
    return x, w


@pytest.mark.parametrize("cpu", sorted(X86_ROUTES))
def test_each_cpu_gets_its_best_route(cpu):
    route = pick_quant_route(_x86(cpu))
    assert route.name == X86_ROUTES[cpu]
    assert 16 % route.lanes == 0


def test_aarch64_routes():
    assert pick_quant_route(ARM_DOT).name == "neon_dot"
    plain = pick_quant_route(ARM_PLAIN)  # no dotprod: plain NEON, 128-bit vectors
    assert plain.name == "generic" and plain.lanes == 4


@pytest.mark.parametrize("fmt", ["int8", "int4"])
@pytest.mark.parametrize("m,n,k", SHAPES)
@pytest.mark.parametrize("cpu", sorted(X86_ROUTES))
def test_matmul_on_each_x86_route_matches_the_integer_product(cpu, m, n, k, fmt):
    spec = {"kind": "llvm", "mcpu": cpu, "num-cores": 2}
    if not _runs_here(tvm.target.Target(spec)):
        pytest.skip(f"this host cannot run {cpu} code")
    route, libs = _build_for(spec, fmt, n, k)
    x, w = _data(m, n, k, seed=m * 1000 + n + k)
    _assert_close(*_run(libs, route, fmt, x, w))


@pytest.mark.parametrize("fmt", ["int8", "int4"])
@pytest.mark.parametrize("cpu", ["haswell", "skylake-avx512", "alderlake", "cascadelake"])
def test_extreme_codes_do_not_saturate(cpu, fmt):
    """Every product at its largest magnitude, all of one sign per row (int8: |q| = |x| = 127,
    a vpmaddubsw pair 2 · 127 · 127 from int16's limit; unsigned codes would saturate)."""
    spec = {"kind": "llvm", "mcpu": cpu, "num-cores": 2}
    if not _runs_here(tvm.target.Target(spec)):
        pytest.skip(f"this host cannot run {cpu} code")
    m, n, k = 2, 32, 96
    sign = np.where(np.random.default_rng(5).random(k) < 0.5, -1.0, 1.0)
    w = (np.outer(np.linspace(0.5, 2.0, n), sign)).astype("float32")
    x = np.stack([sign * 3.0, -sign * 3.0]).astype("float32")  # agreeing, then opposite signs
    route, libs = _build_for(spec, fmt, n, k)
    y, ref = _run(libs, route, fmt, x, w)
    _assert_close(y, ref)
    assert (ref[0] > 0).all() and (ref[1] < 0).all()


@pytest.mark.parametrize("fmt", ["int8", "int4"])
def test_assembly_holds_the_routes_instructions(fmt):
    def asm(cpu):
        return _build_for({"kind": "llvm", "mcpu": cpu, "num-cores": 2}, fmt, 48, 96)[1][1] \
            .inspect_source("asm")

    haswell = asm("haswell")
    assert "zmm" not in haswell and "vpmaddubsw" in haswell and "vpmaddwd" in haswell
    assert ("vpsignb" in haswell) == (fmt == "int8")  # the sign trick on int8 weights only
    skx = asm("skylake-avx512")
    assert "vpdpbusd" not in skx and re.search(r"vpmaddubsw\s.*%zmm", skx)
    adl = asm("alderlake")  # AVX-VNNI: the VEX encoding on ymm, no AVX-512
    assert "zmm" not in adl and re.search(r"\{vex\}\s+vpdpbusd\s.*%ymm", adl)
    clx = asm("cascadelake")
    assert re.search(r"vpdpbusd\s.*%zmm", clx) and "vpmaddubsw" not in clx


@pytest.mark.parametrize("fmt", ["int8", "int4"])
@pytest.mark.parametrize("lanes,signed", [(4, False), (8, True), (16, False), (4, True)])
def test_plain_tir_route_runs(fmt, lanes, signed):
    """The generic route (AArch64 without dotprod) on this host: the same TIR on any CPU. Its
    signed variant takes int8 weights as signed bytes with no correction, as ``neon_dot`` does
    (which only builds here)."""
    spec = {"kind": "llvm", "mcpu": "haswell", "num-cores": 2}
    if not _runs_here(tvm.target.Target(spec)):
        pytest.skip("this host cannot run haswell code")
    route = dataclasses.replace(GENERIC, lanes=lanes, weight_signed=signed)
    m, n, k = 7, 48, 160
    _, libs = _build_for(spec, fmt, n, k, route)
    x, w = _data(m, n, k, seed=11)
    _assert_close(*_run(libs, route, fmt, x, w))


@pytest.mark.parametrize("fmt", ["int8", "int4"])
@pytest.mark.parametrize("spec,route_name", [(ARM_DOT, "neon_dot"), (ARM_PLAIN, "generic")])
def test_aarch64_builds(spec, route_name, fmt, tmp_path):
    route, (rows, mm) = _build_for(spec, fmt, 48, 160)
    assert route.name == route_name
    for lib, name in ((rows, "rows"), (mm, "matmul")):
        path = tmp_path / f"{name}.o"
        lib.write_to_file(str(path))
        head = path.read_bytes()[:20]
        assert head[:4] == b"\x7fELF" and int.from_bytes(head[18:20], "little") == 183  # AArch64
    asm = mm.inspect_source("asm")
    assert ("sdot\tv" in asm) == (route_name == "neon_dot")
    assert "zmm" not in asm and "ymm" not in asm


@pytest.mark.parametrize("spec,missing", [
    ({"kind": "llvm", "mcpu": "nehalem"}, "avx2"),  # SSE4.2: no AVX2
    ({"kind": "llvm", "mcpu": "x86-64"}, "avx2"),  # the baseline: SSE2
    ({"kind": "cuda", "arch": "sm_90"}, "llvm"),
])
def test_a_target_without_a_route_is_declined(spec, missing):
    with pytest.raises(UnsupportedError, match=missing):
        pick_quant_route(spec)
