"""Every convolution is a tiled convolution: channels-last convolutions as the Relax pipeline
hands them to roller (pad + conv + bias + ReLU fused by FuseTIR, int64 extents), 1-D and 2-D,
strided, patchify, grouped, depthwise, with small, odd and prime sizes and few output channels.
Each is classified "tiled" (by its reuse), gets the convolution construction (accumulators in
registers over the whole window) among its candidates and matches a float64 numpy reference."""
from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import relax

import tvm_roller
from harness.examples.fused_funcs import channels_last_conv
from conftest import F32_TOL_LONG, TARGET, assert_close, conv_nlc, device, rand, run


def _fused_conv(dims, n, cin, size, cout, k, s, p, g, relu=True, dtype="float32", d=1):
    """The fused PrimFunc of conv (NHWC/HWIO or NWC/WIO) + bias add (+ relu)."""
    return channels_last_conv(dims, n, cin, size, cout, k, s, p, g, relu, dtype, d)


def _check(dims, n, cin, size, cout, k, s, p, g, relu=True, dtype="float32", d=1):
    func = _fused_conv(dims, n, cin, size, cout, k, s, p, g, relu, dtype, d)
    plan = tvm_roller.plan(func, TARGET, topk=2, device=device())
    assert plan.analysis.kind == "tiled", tvm_roller.explain(func, TARGET, device=device())
    # the convolution's construction leads, or follows a generic tile the micro-model
    # predicts clearly faster (and says so)
    own = [t for t in plan.tiles if t.acc_level == "reg" and
           any("convolution" in note for note in t.notes)]
    assert own, plan.tiles
    assert own[0] is plan.tiles[0] or any("generic tile is predicted" in n for n in own[0].notes)
    x = rand((n,) + (size,) * dims + (cin,), dtype, 1)
    w = rand((k,) * dims + (cin // g, cout), dtype, 2)
    b = rand((cout,), dtype, 3)
    lib = tvm_roller.build(func, TARGET, device=device())
    out_shape = [int(d) for d in func.params[-1].shape]
    out = run(lib, [x, w, b], out_shape, dtype)
    expect = conv_nlc(x.astype(np.float64), w.astype(np.float64), s, p, d, g) + b
    if relu:
        expect = np.maximum(expect, 0.0)
    assert_close(out, expect, 1e-12 if dtype == "float64" else F32_TOL_LONG)
    return plan


# (dims, n, cin, size, cout, kernel, stride, pad, groups)
CASES = {
    "conv2d_3x3_odd": (2, 1, 5, 13, 7, 3, 1, 1, 1),
    "conv2d_3x3_prime_cout3": (2, 1, 3, 17, 3, 3, 1, 1, 1),  # few output channels (< 4)
    "conv2d_cout1": (2, 1, 1, 11, 1, 3, 1, 1, 1),
    "conv2d_strided_s2": (2, 1, 6, 15, 20, 3, 2, 1, 1),
    "conv2d_stem_7x7_s2": (2, 1, 3, 23, 16, 7, 2, 3, 1),
    "conv2d_1x1": (2, 1, 19, 9, 33, 1, 1, 0, 1),
    "conv2d_1x1_s2": (2, 2, 8, 11, 24, 1, 2, 0, 1),
    "patchify_4x4_s4": (2, 1, 3, 20, 40, 4, 4, 0, 1),
    "patchify_5x5_s5_prime": (2, 1, 3, 35, 17, 5, 5, 0, 1),
    "grouped2d": (2, 1, 12, 9, 18, 3, 1, 1, 3),
    "grouped2d_wide_groups": (2, 1, 32, 7, 64, 3, 1, 1, 2),
    "depthwise2d": (2, 1, 24, 13, 24, 3, 1, 1, 24),
    "depthwise2d_s2": (2, 1, 40, 15, 40, 3, 2, 1, 40),
    "depthwise2d_c3": (2, 1, 3, 19, 3, 3, 1, 1, 3),
    "depthwise2d_5x5": (2, 1, 17, 11, 17, 5, 1, 2, 17),
    "conv1d_k3": (1, 1, 7, 37, 11, 3, 1, 1, 1),  # prime length: a predicated tail tile
    "conv2d_prime_width_tail": (2, 1, 4, 37, 16, 3, 1, 1, 1),
    "conv1d_k3_s2": (1, 1, 16, 41, 32, 3, 2, 1, 1),
    "conv1d_k10_s5_cin1": (1, 1, 1, 101, 24, 10, 5, 0, 1),
    "conv1d_grouped_k8_pad4": (1, 1, 32, 19, 32, 8, 1, 4, 4),
    "conv1d_depthwise": (1, 1, 48, 29, 48, 5, 2, 2, 48),
    "conv1d_batch2": (1, 2, 9, 23, 20, 3, 1, 1, 1),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_conv_tiled_and_correct(name):
    _check(*CASES[name])


def test_conv_dilated_and_batched():
    _check(2, 1, 5, 15, 12, 3, 1, 2, 1, d=2)
    _check(1, 1, 8, 31, 16, 3, 1, 3, 1, d=3)
    _check(2, 3, 4, 9, 8, 3, 1, 1, 1)


def test_conv_without_relu_and_float64():
    _check(2, 1, 6, 9, 10, 3, 1, 1, 1, relu=False)
    _check(1, 1, 5, 17, 9, 3, 2, 1, 1, dtype="float64")


def test_depthwise_blocks_output_width():
    """Depthwise: little reuse across channels; vectorized over channels (the vector axis) and
    register-blocked over output width (x before y: the contiguous walk of the input)."""
    plan = _check(2, 1, 32, 14, 32, 3, 1, 1, 32)
    fa, t = plan.analysis, plan.tiles[0]
    names = [a.name for a in fa.axes]
    assert names[fa.vector_axis].endswith("ff")
    y, x = names.index("v_yy"), names.index("v_xx")
    assert t.reg[x] > 1 and t.reg[x] >= t.reg[y], t.reg


def test_prime_length_gets_a_real_register_tile():
    """A prime output length (wav2vec2's 199) keeps a multi-position register tile with a
    predicated tail instead of falling back to one position per tile."""
    plan = _check(1, 1, 16, 399, 32, 3, 2, 0, 1)  # 399 -> 199 outputs
    fa, t = plan.analysis, plan.tiles[0]
    x = [a.name for a in fa.axes].index("v_yy")
    assert fa.axes[x].extent == 199 and t.reg[x] > 1, t.reg


def test_conv_batchnorm_residual_epilogue():
    """conv -> batch-norm (multiply, add) -> residual add -> relu: one tiled kernel with the
    whole epilogue folded into the register tile's write-back."""
    n, h, c, co = 1, 10, 8, 24
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((n, h, h, c), "float32"))
    w = relax.Var("w", relax.TensorType((3, 3, c, co), "float32"))
    sc = relax.Var("scale", relax.TensorType((co,), "float32"))
    sh = relax.Var("shift", relax.TensorType((co,), "float32"))
    res = relax.Var("res", relax.TensorType((n, h // 2, h // 2, co), "float32"))
    with bb.function("main", [x, w, sc, sh, res]):
        with bb.dataflow():
            y = bb.emit(relax.op.nn.conv2d(x, w, strides=2, padding=1, data_layout="NHWC",
                                           kernel_layout="HWIO"))
            y = bb.emit(relax.op.add(relax.op.multiply(y, sc), sh))
            y = bb.emit(relax.op.nn.relu(relax.op.add(y, res)))
            out = bb.emit_output(y)
        bb.emit_func_output(out)
    mod = tvm.transform.Sequential([
        relax.transform.LegalizeOps(), relax.transform.AnnotateTIROpPattern(),
        relax.transform.FuseOps(), relax.transform.FuseTIR()])(bb.get())
    prims = [f for _, f in mod.functions_items() if isinstance(f, tvm.tirx.PrimFunc)]
    assert len(prims) == 1
    func = prims[0].with_attr("global_symbol", "main")
    plan = tvm_roller.plan(func, TARGET, device=device())
    assert plan.analysis.kind == "tiled" and plan.tiles[0].acc_level == "reg"
    arrays = [rand((n, h, h, c), seed=1), rand((3, 3, c, co), seed=2), rand((co,), seed=3),
              rand((co,), seed=4), rand((n, h // 2, h // 2, co), seed=5)]
    # FuseTIR may order the parameters differently: match them by shape
    by_shape = {}
    for a in arrays:
        by_shape.setdefault(a.shape, []).append(a)
    args = [by_shape[tuple(int(d) for d in prm.shape)].pop(0) for prm in func.params[:-1]]
    lib = tvm_roller.build(func, TARGET, device=device())
    out = run(lib, args, [int(d) for d in func.params[-1].shape], "float32")
    xa, wa, sca, sha, ra = [a.astype(np.float64) for a in arrays]
    expect = np.maximum(conv_nlc(xa, wa, 2, 1) * sca + sha + ra, 0.0)
    assert_close(out, expect, F32_TOL_LONG)


def test_few_output_channels_classified_by_reuse():
    """A 3-output-channel convolution reuses its filter H*W times: tiled, not a reduction."""
    func = _fused_conv(2, 1, 8, 12, 3, 3, 1, 1, 1)
    fa = tvm_roller.plan(func, TARGET, device=device()).analysis
    assert fa.kind == "tiled" and fa.axes[fa.vector_axis].extent == 3
