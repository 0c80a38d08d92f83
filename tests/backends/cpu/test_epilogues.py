"""Epilogues that are not a plain chain of elementwise stages, as EfficientNet and MobileViT
produce them: SiLU after a convolution (x * sigmoid(x) reads two stages: a DAG), and a
squeeze-and-excitation gate (a 1x1 convolution on pooled channels whose sigmoid multiplies a
bigger feature map: a broadcasting consumer). Both used to fail inside roller's tiled lowering;
both must build and match float64 numpy."""
from __future__ import annotations

import numpy as np
import pytest
from tvm import relax

import tvm_roller
from harness.examples.fused_funcs import fused_prim_func
from conftest import F32_TOL_LONG, TARGET, assert_close, conv_nlc, device, rand, run


def _sigmoid(v):
    return 1.0 / (1.0 + np.exp(-v))


@pytest.mark.parametrize("size,cin,cout", [(13, 3, 8), (8, 5, 17)])
def test_conv_silu_epilogue(size, cin, cout):
    def body(bb, x, w, s, b):
        y = bb.emit(relax.op.nn.conv2d(x, w, strides=2, padding=1, data_layout="NHWC",
                                       kernel_layout="HWIO"))
        y = bb.emit(relax.op.add(relax.op.multiply(y, s), b))
        return bb.emit(relax.op.multiply(y, relax.op.sigmoid(y)))

    func = fused_prim_func(body, [("x", (1, size, size, cin)), ("w", (3, 3, cin, cout)),
                         ("s", (cout,)), ("b", (cout,))])
    x, w = rand((1, size, size, cin), seed=1), rand((3, 3, cin, cout), seed=2)
    s, b = rand((cout,), seed=3), rand((cout,), seed=4)
    lib = tvm_roller.build(func, TARGET, device=device())
    out = run(lib, [x, w, s, b], [int(d) for d in func.params[-1].shape], "float32")
    y = conv_nlc(x.astype(np.float64), w.astype(np.float64), 2, 1) * s + b
    assert_close(out, y * _sigmoid(y), F32_TOL_LONG)


def test_squeeze_excitation_gate_broadcasts_over_the_feature_map():
    c, r, hw = 24, 7, 11

    def body(bb, pooled, w, b, fmap):
        g = bb.emit(relax.op.nn.conv2d(pooled, w, data_layout="NHWC", kernel_layout="HWIO"))
        g = bb.emit(relax.op.sigmoid(relax.op.add(g, b)))
        return bb.emit(relax.op.multiply(fmap, g))

    func = fused_prim_func(body, [("pooled", (1, 1, 1, r)), ("w", (1, 1, r, c)), ("b", (c,)),
                         ("fmap", (1, hw, hw, c))])
    pooled, w = rand((1, 1, 1, r), seed=1), rand((1, 1, r, c), seed=2)
    b, fmap = rand((c,), seed=3), rand((1, hw, hw, c), seed=4)
    lib = tvm_roller.build(func, TARGET, device=device())
    out = run(lib, [pooled, w, b, fmap], [1, hw, hw, c], "float32")
    gate = _sigmoid(pooled.astype(np.float64).reshape(1, r) @ w.reshape(r, c) + b)
    assert_close(out, fmap * gate.reshape(1, 1, 1, c), F32_TOL_LONG)
