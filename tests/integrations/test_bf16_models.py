"""bf16 models (``model.to(torch.bfloat16)``) through roller's Relax pipeline: every PrimFunc
roller's (the matmuls and the convolutions, as im2col GEMMs, each on the micro-kernel route the
device model picks), the output within bf16's precision of the float32 model (cosine ≥ 0.999)
and no further from it than PyTorch's own bf16 run; convolutions of odd shapes against float64;
a convolution's batch norm, residual and activation inside its GEMM's kernel. Planned for pinned
targets and their preset-derived models: AMX (run where the host has AMX-BF16), AVX512-BF16 (where
the host has it) and AVX2 (bf16 widened to fp32 FMAs: every x86-64 host with AVX2)."""
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

from conftest import AMX_TARGET, BF16_DOT_TARGET, HASWELL_TARGET, device_for  # noqa: E402

_HOST = detect_isa(host_target())[1]
_NEEDS_AMX = pytest.mark.skipif("amx-bf16" not in _HOST, reason="this CPU has no AMX-BF16")
TARGETS = [pytest.param(AMX_TARGET, marks=_NEEDS_AMX, id="amx"),
           pytest.param(BF16_DOT_TARGET, id="avx512bf16", marks=pytest.mark.skipif(
               "avx512bf16" not in _HOST, reason="this CPU has no AVX512-BF16")),
           pytest.param(HASWELL_TARGET, id="avx2")]


def _cos(a, b) -> float:
    a, b = a.double().flatten(), b.double().flatten()
    return float(torch.dot(a, b) / (a.norm() * b.norm()))


def _tensor(x):
    if x.dtype != torch.bfloat16:
        return tvm.runtime.tensor(x.numpy())
    out = tvm.runtime.empty(tuple(x.shape), "bfloat16", tvm.cpu())
    out.copyfrom(x.view(torch.int16).numpy().view(np.uint16))
    return out


@_NEEDS_AMX
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


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("k,stride,pad,groups", [(3, 1, 1, 1), (5, 2, 2, 1), (1, 2, 0, 1),
                                                 (3, 1, 1, 3)])
def test_bf16_conv_against_float64(k, stride, pad, groups, target):
    """Odd sizes (7 × 13 image, 9 → 15 channels); a grouped convolution keeps TVM's conv."""
    rng = np.random.default_rng(k)
    conv = torch.nn.Conv2d(9, 15, k, stride, pad, groups=groups, bias=True)
    conv = conv.to(torch.bfloat16).eval()
    x = torch.from_numpy(rng.uniform(-1, 1, (1, 9, 7, 13)).astype("float32")).to(torch.bfloat16)
    ex = tvm_roller.relax.compile(import_torch(conv, x), target, device=device_for(target))
    out = relax.VirtualMachine(ex, tvm.cpu())["main"](_tensor(x))
    got = torch.from_numpy(out.numpy().view(np.int16)).view(torch.bfloat16).double()
    ref = torch.nn.functional.conv2d(x.double(), conv.weight.double(), conv.bias.double(),
                                     stride, pad, groups=groups)
    # float32 sums of exact bf16 products, rounded once to bf16 (2^-8 relative)
    assert float((got - ref).abs().max() / ref.abs().max()) <= 1e-2


class _Bottleneck(torch.nn.Module):
    """A residual block of ResNet's shape: convolutions, batch norms, ReLUs and the sum."""

    def __init__(self, c: int, mid: int):
        super().__init__()
        self.a = torch.nn.Conv2d(c, mid, 1, bias=False)
        self.b = torch.nn.Conv2d(mid, mid, 3, 1, 1, bias=False)
        self.c = torch.nn.Conv2d(mid, c, 1, bias=False)
        self.na, self.nb, self.nc = (torch.nn.BatchNorm2d(n) for n in (mid, mid, c))

    def forward(self, x):
        y = torch.relu(self.na(self.a(x)))
        y = torch.relu(self.nb(self.b(y)))
        return torch.relu(self.nc(self.c(y)) + x)


@pytest.mark.parametrize("target", TARGETS)
def test_bf16_block_runs_its_norms_inside_the_gemms(target):
    """Each convolution's batch norm, ReLU and the residual sum run in its GEMM's kernel (no
    elementwise kernel of their own); the block matches float64 (odd 11 × 5 image, 13 and 7
    channels, running statistics drawn at random)."""
    torch.manual_seed(3)
    block = _Bottleneck(13, 7).eval()
    with torch.no_grad():
        for norm in (block.na, block.nb, block.nc):
            norm.running_mean.uniform_(-0.5, 0.5)
            norm.running_var.uniform_(0.5, 2.0)
            norm.weight.uniform_(0.5, 1.5)
            norm.bias.uniform_(-0.5, 0.5)
    block = block.to(torch.bfloat16)
    x = torch.rand(1, 13, 11, 5).to(torch.bfloat16) - 0.5
    report: list = []
    ex = tvm_roller.relax.compile(import_torch(block, x), target, report,
                                  device=device_for(target))
    names = [e["name"] for e in report]
    assert not [e for e in report if e["fallback"]], names
    alone = [n for n in names if ("multiply" in n or "relu" in n) and "matmul" not in n]
    assert not alone, names
    out = relax.VirtualMachine(ex, tvm.cpu())["main"](_tensor(x))
    got = torch.from_numpy(out.numpy().view(np.int16)).view(torch.bfloat16).double()
    with torch.no_grad():
        ref = block.double()(x.double())
    # bf16 rounding of each intermediate (3 convolutions deep)
    assert float((got - ref).abs().max() / ref.abs().max()) <= 3e-2
