"""Elementwise ops move before the reshapes around them (``passes.sink_reshape``): the values
stay, and the activation after a Linear on 3-D input fuses into the matmul's kernel."""
from __future__ import annotations

import numpy as np
import pytest
import torch
import tvm
import tvm_ffi
from torch import nn
from tvm import relax

import tvm_roller.relax as rr
from tvm_roller.integrations.relax.passes.sink_reshape import sink_reshape_pass

from conftest import TARGET, device


def _import(model, x):
    from tvm.relax.frontend.torch import from_exported_program

    ep = torch.export.export(model.eval(), (x,))
    return from_exported_program(ep, keep_params_as_input=False, unwrap_unit_return_tuple=True)


class _TanhGelu(nn.Module):
    """GPT-2's MLP: a Linear on 3-D input, the tanh GELU written out in scalar ops."""

    def __init__(self, d: int, h: int):
        super().__init__()
        self.fc, self.proj = nn.Linear(d, h), nn.Linear(h, d)

    def forward(self, x):
        y = self.fc(x)
        y = 0.5 * y * (1.0 + torch.tanh(0.7978845608 * (y + 0.044715 * torch.pow(y, 3.0))))
        return self.proj(y)


@pytest.mark.parametrize("model,shape", [
    (nn.Sequential(nn.Linear(24, 40), nn.GELU()), (1, 13, 24)),
    (nn.Sequential(nn.Linear(24, 40), nn.SiLU(), nn.Linear(40, 7)), (2, 1, 24)),
    (_TanhGelu(16, 48), (1, 31, 16)),
])
def test_values_stay_and_activations_join_the_matmul(model, shape):
    torch.manual_seed(4)
    x = torch.randn(*shape)
    mod = _import(model, x)
    sunk = sink_reshape_pass()(mod)
    report = []
    ex = rr.compile(mod, TARGET, report, device(), cache=False)
    vm = relax.VirtualMachine(ex, tvm.cpu())
    out = vm["main"](tvm.runtime.tensor(x.numpy())).numpy()
    with torch.no_grad():
        ref = model(x).double().numpy()
    assert np.abs(out - ref).max() <= 1e-4 * max(1.0, np.abs(ref).max())
    # the activation runs inside a matmul's kernel (or a matmul chain's): none of its own
    names = [e["name"] for e in report]
    act = [n for n in names if any(a in n for a in ("gelu", "sigmoid", "tanh"))]
    assert all("matmul" in n for n in act), names
    assert act or any("chain" in n for n in names), names
    # and the rewrite alone keeps the graph's values
    ex0 = tvm.compile(sunk, target="llvm")
    out0 = relax.VirtualMachine(ex0, tvm.cpu())["main"](tvm.runtime.tensor(x.numpy())).numpy()
    assert np.abs(out0 - ref).max() <= 1e-4 * max(1.0, np.abs(ref).max())


def test_reshapes_that_change_the_layout_stay():
    """An op mixing a reshaped tensor with a tensor of the reshaped shape is left alone."""
    bb = relax.BlockBuilder()
    a = relax.Var("a", relax.TensorType((4, 6), "float32"))
    b = relax.Var("b", relax.TensorType((2, 12), "float32"))
    with bb.function("main", [a, b]):
        with bb.dataflow():
            r = bb.emit(relax.op.reshape(a, (2, 12)))
            out = bb.emit_output(relax.op.add(r, b))
        bb.emit_func_output(out)
    mod = bb.get()
    assert tvm_ffi.structural_equal(sink_reshape_pass()(mod), mod)
