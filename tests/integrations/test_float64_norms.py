"""float64 RMS and layer norms through roller's Relax pipeline stay float64 end to end (TOPI
computes rms_norm in float32 and refuses a float64 layer_norm); float32 keeps TVM's own."""
from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import relax
from tvm.script import relax as R

import tvm_roller.relax as rr
from conftest import TARGET, device


def _module(op: str, shape, dtype: str, axes):
    bb = relax.BlockBuilder()
    norm_shape = [shape[a] for a in axes]
    x = relax.Var("x", relax.TensorType(shape, dtype))
    g = relax.Var("g", relax.TensorType(norm_shape, dtype))
    b = relax.Var("b", relax.TensorType(norm_shape, dtype))
    params = [x, g] if op == "rms" else [x, g, b]
    with bb.function("main", params):
        with bb.dataflow():
            y = R.nn.rms_norm(x, g, axes, 1e-5) if op == "rms" else \
                R.nn.layer_norm(x, g, b, axes, 1e-5)
            out = bb.emit_output(y)
        bb.emit_func_output(out)
    return bb.get()


def _reference(op, x, g, b, axes):
    axes = tuple(axes)
    if op == "rms":
        return x / np.sqrt(np.mean(x * x, axis=axes, keepdims=True) + 1e-5) * g
    mu = np.mean(x, axis=axes, keepdims=True)
    var = np.mean((x - mu) ** 2, axis=axes, keepdims=True)
    return (x - mu) / np.sqrt(var + 1e-5) * g + b


@pytest.mark.parametrize("op", ["rms", "layer"])
@pytest.mark.parametrize("shape,axes", [((91, 848), [1]), ((31, 616), [-1]), ((1, 7), [1]),
                                        ((3, 5, 13), [1, 2])])
def test_float64_norms_stay_float64(op, shape, axes):
    rng = np.random.default_rng(sum(shape))
    ax = [a % len(shape) for a in axes]
    x = rng.uniform(-2, 2, shape)
    g = rng.uniform(0.5, 1.5, [shape[a] for a in ax])
    b = rng.uniform(-1, 1, [shape[a] for a in ax])
    ex = rr.compile(_module(op, shape, "float64", axes), TARGET, [], device(), cache=False)
    vm = relax.VirtualMachine(ex, tvm.cpu())
    args = [x, g] if op == "rms" else [x, g, b]
    got = vm["main"](*[tvm.runtime.tensor(a) for a in args]).numpy()
    gb = [g.reshape([shape[a] if a in ax else 1 for a in range(len(shape))]),
          b.reshape([shape[a] if a in ax else 1 for a in range(len(shape))])]
    want = _reference(op, x, gb[0], gb[1], ax)
    assert got.dtype == np.float64
    assert np.abs(got - want).max() / np.abs(want).max() < 1e-12
