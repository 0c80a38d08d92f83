"""bf16 models (``model.to(torch.bfloat16)``) through roller's Relax pipeline: every PrimFunc
roller's (the matmuls and the convolutions, as im2col GEMMs, each on the micro-kernel route the
device model picks, AMX among them), the output within bf16's
precision of the float32 model (cosine ≥ 0.999) and no further from it than PyTorch's own bf16
run; convolutions of odd shapes against float64. Run where the host has AMX-BF16, planned for the
pinned ``AMX_TARGET`` and its preset-derived model."""
from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

import tvm  # noqa: E402
from tvm import relax  # noqa: E402

import tvm_roller  # noqa: E402
from tvm_roller.hardware import host_target  # noqa: E402
from tvm_roller.hardware.cpu import detect_isa  # noqa: E402
from tvm_roller.integrations.pytorch import import_torch  # noqa: E402
from harness.examples import hf_models  # noqa: E402

from conftest import AMX_TARGET, device_for  # noqa: E402

pytestmark = pytest.mark.skipif(not {"amx-bf16"} <= detect_isa(host_target())[1],
                                reason="this CPU has no AMX-BF16")


def _cos(a, b) -> float:
    a, b = a.double().flatten(), b.double().flatten()
    return float(torch.dot(a, b) / (a.norm() * b.norm()))


def _tensor(x):
    if x.dtype != torch.bfloat16:
        return tvm.runtime.tensor(x.numpy())
    out = tvm.runtime.empty(tuple(x.shape), "bfloat16", tvm.cpu())
    out.copyfrom(x.view(torch.int16).numpy().view(np.uint16))
    return out


@pytest.mark.parametrize("name", ["bert", "gpt2", "llama", "resnet"])
def test_bf16_model_matches_float32(name):
    model, x = hf_models.MODELS[name]("small")
    with torch.no_grad():
        ref = model(x)
        low = model.to(torch.bfloat16)
        if x.is_floating_point():  # (an image: the bf16 model takes bf16 pixels)
            x = x.to(torch.bfloat16)
        torch_bf16 = low(x)
    report: list = []
    ex = tvm_roller.relax.compile(import_torch(low, x), AMX_TARGET, report,
                                  device_for(AMX_TARGET))
    assert not [e for e in report if e["fallback"]], [e["reason"] for e in report if e["fallback"]]
    routes = [(e.get("rtile") or {}).get("tensor_core", "") for e in report]
    products = [e["name"] for e in report if "matmul" in e["name"] or "gemm" in e["name"]]
    # every product on a micro-kernel route; which one the device model picks per shape
    assert sum(1 for r in routes if r) >= len(products) >= 2, list(zip(products, routes))
    assert any(r.startswith("amx") for r in routes), routes
    out = relax.VirtualMachine(ex, tvm.cpu())["main"](_tensor(x))
    assert str(out.dtype) == "bfloat16"
    got = torch.from_numpy(out.numpy().view(np.int16)).view(torch.bfloat16)
    ours, theirs = _cos(got, ref), _cos(torch_bf16, ref)
    assert ours >= 0.999 and ours >= theirs - 1e-4, (ours, theirs)


@pytest.mark.parametrize("k,stride,pad,groups", [(3, 1, 1, 1), (5, 2, 2, 1), (1, 2, 0, 1),
                                                 (3, 1, 1, 3)])
def test_bf16_conv_against_float64(k, stride, pad, groups):
    """Odd sizes (7 × 13 image, 9 → 15 channels); a grouped convolution keeps TVM's conv."""
    rng = np.random.default_rng(k)
    conv = torch.nn.Conv2d(9, 15, k, stride, pad, groups=groups, bias=True)
    conv = conv.to(torch.bfloat16).eval()
    x = torch.from_numpy(rng.uniform(-1, 1, (1, 9, 7, 13)).astype("float32")).to(torch.bfloat16)
    ex = tvm_roller.relax.compile(import_torch(conv, x), AMX_TARGET,
                                  device=device_for(AMX_TARGET))
    out = relax.VirtualMachine(ex, tvm.cpu())["main"](_tensor(x))
    got = torch.from_numpy(out.numpy().view(np.int16)).view(torch.bfloat16).double()
    ref = torch.nn.functional.conv2d(x.double(), conv.weight.double(), conv.bias.double(),
                                     stride, pad, groups=groups)
    # float32 sums of exact bf16 products, rounded once to bf16 (2^-8 relative)
    assert float((got - ref).abs().max() / ref.abs().max()) <= 1e-2
