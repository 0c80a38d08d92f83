"""int8 dynamic quantization of GEMM linear layers on AMX (``weights="int8"``): the layer equals
the float64 product of its quantized operands (per-row activation scales, per-channel weight
scales), the GEMMs are roller's AMX kernels, and a whole model keeps cosine ≥ 0.99."""
from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import relax

import tvm_roller
from tvm_roller.hardware import host_target
from tvm_roller.backends.cpu.microkernel.x86_amx import has_int8_tiles
from tvm_roller.integrations.relax.passes.quantize_dynamic import MIN_ROWS

from conftest import AMX_TARGET, device_for

pytestmark = pytest.mark.skipif(not has_int8_tiles(host_target()), reason="no AMX-INT8")
_DEV = device_for(AMX_TARGET)  # planned for the pinned target, run where the host has AMX


def _net(rows: int, k: int, n: int, w: np.ndarray) -> tvm.IRModule:
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((rows, k), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit(relax.op.matmul(x, relax.op.permute_dims(relax.const(w))))
            out = bb.emit_output(relax.op.nn.relu(y))
        bb.emit_func_output(out)
    return bb.get()


def _reference(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """The layer on the quantized operands, in float64 (w [n, k])."""
    sw = np.abs(w).max(axis=1) / 127.0
    wq = np.clip(np.rint(w / sw[:, None]), -127, 127)
    sx = np.maximum(np.abs(x).max(axis=1, keepdims=True) / 127.0, 1e-30)
    xq = np.clip(np.rint(x.astype(np.float32) / sx.astype(np.float32)), -127, 127)
    return np.maximum((xq @ wq.T) * sx * sw, 0.0)


@pytest.mark.parametrize("rows,k,n", [(MIN_ROWS, 64, 48), (97, 131, 67), (128, 768, 61)])
def test_gemm_layer_equals_quantized_product(rows, k, n):
    rng = np.random.default_rng(rows)
    w = rng.standard_normal((n, k)).astype(np.float32)
    x = rng.standard_normal((rows, k)).astype(np.float32)
    report: list = []
    ex = tvm_roller.relax.compile(_net(rows, k, n, w), AMX_TARGET, report, _DEV, weights="int8")
    amx = [e for e in report if (e.get("rtile") or {}).get("tensor_core", "").startswith("amx")]
    assert amx and all(not e["fallback"] for e in report), report
    out = relax.VirtualMachine(ex, tvm.cpu())["main"](tvm.runtime.tensor(x)).numpy()
    ref = _reference(x.astype(np.float64), w.astype(np.float64))
    scale = np.abs(ref).max()
    # a rounding tie decided differently moves one code by one: 1/127 of one product
    assert np.abs(out - ref).max() <= 2e-3 * scale
    exact = np.maximum(x.astype(np.float64) @ w.T.astype(np.float64), 0.0)
    assert np.abs(out - exact).max() <= 0.03 * np.abs(exact).max()


def test_few_rows_keep_the_group_kernels():
    """A layer of few rows is memory-bound: the group-quantized VNNI kernels take it."""
    rng = np.random.default_rng(2)
    w = rng.standard_normal((64, 64)).astype(np.float32)
    report: list = []
    tvm_roller.relax.compile(_net(MIN_ROWS - 1, 64, 64, w), AMX_TARGET, report, _DEV,
                             weights="int8")
    assert not [e for e in report
                if (e.get("rtile") or {}).get("tensor_core", "").startswith("amx")]
    assert any(e["kind"] == "quant-linear" for e in report)


def test_bert_int8_close_to_float32():
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from tvm_roller.integrations.pytorch import import_torch
    from harness.examples import hf_models

    model, x = hf_models.MODELS["bert"]("small")
    with torch.no_grad():
        ref = model(x).double().flatten()
    ex = tvm_roller.relax.compile(import_torch(model, x), AMX_TARGET, device=_DEV,
                                  weights="int8")
    out = relax.VirtualMachine(ex, tvm.cpu())["main"](tvm.runtime.tensor(x.numpy()))
    got = torch.from_numpy(out.numpy()).double().flatten()
    assert float(torch.dot(got, ref) / (got.norm() * ref.norm())) >= 0.99


@pytest.mark.parametrize("k,stride,pad", [(3, 1, 1), (1, 2, 0), (5, 2, 2)])
def test_conv_equals_quantized_product(k, stride, pad):
    """A float32 convolution quantized (per-tensor activations, per-channel weights) runs as
    an int8 im2col GEMM on a micro-kernel route; odd sizes (9 → 15 channels, 11 × 13 image)."""
    torch = pytest.importorskip("torch")
    from tvm_roller.integrations.pytorch import import_torch

    conv = torch.nn.Conv2d(9, 15, k, stride, pad, bias=True).eval()
    x = torch.randn(1, 9, 11, 13, generator=torch.Generator().manual_seed(k))
    report: list = []
    ex = tvm_roller.relax.compile(import_torch(conv, x), AMX_TARGET, report, _DEV,
                                  weights="int8")
    # (so small a GEMM pads little on a vector route: the model may pick VNNI over AMX)
    routed = [e for e in report if (e.get("rtile") or {}).get("tensor_core")]
    assert routed and all(not e["fallback"] for e in report), report
    out = relax.VirtualMachine(ex, tvm.cpu())["main"](tvm.runtime.tensor(x.numpy())).numpy()
    w = conv.weight.detach().double()
    sw = w.abs().amax(dim=(1, 2, 3)) / 127.0
    wq = torch.clamp(torch.round(w / sw[:, None, None, None]), -127, 127)
    sx = x.abs().max().double() / 127.0
    xq = torch.clamp(torch.round(x.double() / sx), -127, 127)
    ref = torch.nn.functional.conv2d(xq, wq, None, stride, pad) * sx * sw[None, :, None, None] \
        + conv.bias.detach().double()[None, :, None, None]
    assert float((torch.from_numpy(out).double() - ref).abs().max() / ref.abs().max()) <= 2e-3
