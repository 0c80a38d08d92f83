"""A convolution whose output width has no register-tile divisor (a prime) is planned as its
padding, a head whose width has one and the last positions: which functions are taken, and the
built result against a float64 reference on random data (2-D, dilated, strided, depthwise)."""
from __future__ import annotations

import numpy as np
import pytest
from tvm import te, topi
from tvm.s_tir.meta_schedule.testing import te_workload as W

import tvm_roller
from tvm_roller.analysis import window_tail

from conftest import F32_TOL_LONG, TARGET, assert_close, device, rand, run


def _conv(hw, ci, co, stride=1, dilation=1):
    return list(W.conv2d_nhwc(1, hw, hw, ci, co, 3, stride, 1, dilation))


def _ref(x, w, stride=1, dilation=1, groups=1):
    import torch
    xt = torch.from_numpy(x.astype(np.float64)).permute(0, 3, 1, 2)
    wt = torch.from_numpy(w.astype(np.float64)).permute(3, 2, 0, 1)
    out = torch.nn.functional.conv2d(xt, wt, stride=stride, padding=1, dilation=dilation,
                                     groups=groups)
    return out.permute(0, 2, 3, 1).numpy()


def test_prime_width_split_into_head_and_tail():
    dec = window_tail.decompose(te.create_prim_func(_conv(43, 8, 16)))
    assert dec is not None and dec.kind == "window tail"
    assert dec.labels[0] == "prologue" and [lb.split()[1] for lb in dec.labels[1:]] == \
        ["0:42", "42:43"]


@pytest.mark.parametrize("why,tensors", [
    ("a width with a register-tile divisor", _conv(42, 8, 16)),
    ("a width a register tile takes whole (17)", _conv(17, 8, 16)),
    ("a width with a divisor up to 32 (2 x 23)", _conv(46, 8, 16)),
    ("a short width", _conv(7, 8, 16)),
    ("a matmul (no window)", list(W.matmul(3, 37, 7))),
    ("an epilogue after the convolution", [*(t := _conv(43, 8, 16))[:2], topi.nn.relu(t[2])]),
])
def test_not_taken(why, tensors):
    assert window_tail.decompose(te.create_prim_func(tensors)) is None, why


@pytest.mark.parametrize("hw,ci,co,stride,dilation", [
    (37, 5, 16, 1, 1),     # prime width, odd channels
    (43, 8, 24, 1, 2),     # dilated: 41 outputs a row
    (85, 4, 16, 2, 1),     # strided: 43 outputs a row
])
def test_parts_match_float64(hw, ci, co, stride, dilation):
    ts = _conv(hw, ci, co, stride, dilation)
    func = te.create_prim_func(ts).with_attr("global_symbol", "main")
    plan = tvm_roller.plan(func, TARGET, device=device())
    assert len(plan.parts) == 3, "planned whole"
    x, w = rand((1, hw, hw, ci), seed=1), rand((3, 3, ci, co), seed=2)
    ref = _ref(x, w, stride, dilation)
    lib = tvm_roller.build(func, TARGET, device=device())
    assert_close(run(lib, [x, w], ref.shape, "float32"), ref, F32_TOL_LONG)


def test_depthwise_matches_float64():
    x_t = te.placeholder((1, 37, 37, 32), name="x")
    w_t = te.placeholder((3, 3, 32, 1), name="w")
    y = topi.nn.depthwise_conv2d_nhwc(x_t, w_t, 1, 1, 1)
    func = te.create_prim_func([x_t, w_t, y]).with_attr("global_symbol", "main")
    assert window_tail.decompose(func) is not None
    x, w = rand((1, 37, 37, 32), seed=3), rand((3, 3, 32, 1), seed=4)
    ref = _ref(x, w.transpose(0, 1, 3, 2), groups=32)
    lib = tvm_roller.build(func, TARGET, device=device())
    assert_close(run(lib, [x, w], ref.shape, "float32"), ref, F32_TOL_LONG)
