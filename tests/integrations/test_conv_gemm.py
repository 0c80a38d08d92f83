"""Low-precision convolutions as im2col GEMMs (``passes.conv_gemm``): the padding as its own
copy, the window copy alone (its rows are runs of KW·C input elements) and viewed as a matrix
without a copy, the GEMM on the micro-kernel route the device model picks. bf16 and u8 × s8
convolutions in NHWC / HWIO against float64, at odd sizes, strides, asymmetric padding and one
channel, for AVX512 (BF16 / VNNI: run where the host has them) and AVX2 targets."""
from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import relax

import tvm_roller
from tvm_roller.hardware import host_target
from tvm_roller.hardware.cpu import detect_isa

from conftest import BF16_DOT_TARGET, HASWELL_TARGET, device_for

_HOST = detect_isa(host_target())[1]
TARGETS = [pytest.param(BF16_DOT_TARGET, id="avx512", marks=pytest.mark.skipif(
               not {"avx512bf16", "avx512vnni"} <= _HOST, reason="no AVX512-BF16 / VNNI")),
           pytest.param(HASWELL_TARGET, id="avx2")]
# (image h, w, channels in, out, window kh, kw, stride, padding top, left, bottom, right)
CASES = [(7, 13, 9, 15, 3, 3, 1, 1, 1, 1, 1), (11, 5, 3, 8, 7, 7, 2, 3, 3, 3, 3),
         (1, 1, 5, 7, 1, 1, 1, 0, 0, 0, 0), (9, 10, 1, 3, 2, 3, 2, 0, 1, 1, 0),
         (13, 7, 17, 4, 5, 1, 3, 2, 0, 2, 0)]


def _conv(dtypes, out_dtype, window):
    h, w, ci, co, kh, kw, s, pt, pl, pb, pr = window
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, h, w, ci), dtypes[0]))
    f = relax.Var("f", relax.TensorType((kh, kw, ci, co), dtypes[1]))
    with bb.function("main", [x, f]):
        with bb.dataflow():
            y = bb.emit(relax.op.nn.conv2d(x, f, strides=s, padding=[pt, pl, pb, pr],
                                           data_layout="NHWC", kernel_layout="HWIO",
                                           out_dtype=out_dtype))
            out = bb.emit_output(y)
        bb.emit_func_output(out)
    return bb.get()


def _reference(x, f, window):
    h, w, ci, co, kh, kw, s, pt, pl, pb, pr = window
    xp = np.pad(x.astype(np.float64), [(0, 0), (pt, pb), (pl, pr), (0, 0)])
    oh, ow = (h + pt + pb - kh) // s + 1, (w + pl + pr - kw) // s + 1
    out = np.zeros((1, oh, ow, co))
    for r in range(kh):
        for t in range(kw):
            patch = xp[:, r:r + s * (oh - 1) + 1:s, t:t + s * (ow - 1) + 1:s, :]
            out += patch @ f[r, t].astype(np.float64)
    return out


def _tensor(a: np.ndarray, dtype: str):
    out = tvm.runtime.empty(a.shape, dtype, tvm.cpu())
    out.copyfrom(a)
    return out


def _run(window, dtypes, out_dtype, x, f, target):
    report: list = []
    ex = tvm_roller.relax.compile(_conv(dtypes, out_dtype, window), target, report,
                                  device_for(target))
    assert not [e for e in report if e["fallback"]], report
    names = [e["name"] for e in report]
    assert [e for e in report if (e.get("rtile") or {}).get("tensor_core")], names  # a route
    pointwise = window[4:] == (1, 1, 1, 0, 0, 0, 0)
    assert ("im2col" in names) != pointwise, names
    # the copy alone (no padding, transpose or reshape fused into it), the view no kernel
    assert not [n for n in names if "im2col" in n and n != "im2col"], names
    assert "reshape" not in names, names
    vm = relax.VirtualMachine(ex, tvm.cpu())
    return vm["main"](_tensor(*x), _tensor(*f)).numpy(), report


def _bf16(a: np.ndarray) -> np.ndarray:
    """float32 values rounded to bf16 (to nearest even), as float32 and as bf16 bits."""
    bits = a.astype(np.float32).view(np.uint32)
    bits = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)
    return (bits.astype(np.uint32) << 16).view(np.float32), bits


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("window", CASES)
def test_bf16_conv_as_gemm(window, target):
    h, w, ci, co, kh, kw = window[:6]
    rng = np.random.default_rng(sum(window))
    x, xb = _bf16(rng.uniform(-1, 1, (1, h, w, ci)))
    f, fb = _bf16(rng.uniform(-1, 1, (kh, kw, ci, co)))
    out, _ = _run(window, ("bfloat16", "bfloat16"), "float32", (xb, "bfloat16"),
                  (fb, "bfloat16"), target)
    ref = _reference(x, f, window)
    # exact bf16 products summed in float32
    assert np.abs(out - ref).max() <= 1e-5 * max(1.0, np.abs(ref).max())


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("window", CASES)
def test_int8_conv_as_gemm(window, target):
    h, w, ci, co, kh, kw = window[:6]
    rng = np.random.default_rng(sum(window) + 1)
    x = rng.integers(1, 256, (1, h, w, ci)).astype(np.uint8)
    f = rng.integers(-128, 128, (kh, kw, ci, co)).astype(np.int8)
    f[f == 0] = 3
    out, _ = _run(window, ("uint8", "int8"), "int32", (x, "uint8"), (f, "int8"), target)
    np.testing.assert_array_equal(out, _reference(x, f, window).astype(np.int64))
