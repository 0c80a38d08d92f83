"""The stride-parity guard of transposed convolutions (``analysis.parity``): found where TE's
te_workload (in the reduction), topi and Relax's legalized conv2d/conv1d_transpose (in the
dilating producer) put it, never in a plain or strided convolution; and the rewrite into one
sub-convolution per output parity class computes what the function computes (both built with
TVM's default, unscheduled lowering), with no floormod left in any reduction."""
from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import relax, te, tirx, topi
from tvm.s_tir.meta_schedule.testing import te_workload as W

from tvm_roller.analysis import parity
from conftest import parity_guards, rand

HOST = {"kind": "llvm"}


def _te(*args, dtype="float32"):
    return te.create_prim_func(list(W.conv2d_transpose_nhwc(*args, in_dtype=dtype,
                                                            out_dtype=dtype)))


def _topi_nchw(n=1, ci=16, h=7, co=8, k=4, s=2, p=1):
    X = te.placeholder((n, ci, h, h), name="X")
    Wt = te.placeholder((ci, co, k, k), name="W")
    return te.create_prim_func([X, Wt, topi.nn.conv2d_transpose_nchw(X, Wt, (s, s), (p, p),
                                                                    "float32", (0, 0))])


def _relax_func(body: str, params: str, fuse: bool = False):
    """The PrimFunc Relax legalizes ``body`` into (fused with its epilogue: FuseOps/FuseTIR)."""
    src = ("@I.ir_module\nclass Mod:\n    @R.function\n"
           f"    def main({params}):\n        with R.dataflow():\n"
           + "".join(f"            {line}\n" for line in body.strip().splitlines())
           + "            R.output(y)\n        return y\n")
    passes = [relax.transform.LegalizeOps()]
    if fuse:
        passes += [relax.transform.AnnotateTIROpPattern(), relax.transform.FuseOps(),
                   relax.transform.FuseTIR()]
    mod = tvm.transform.Sequential(passes)(tvm.script.from_source(src))
    funcs = [f for _, f in mod.functions_items() if isinstance(f, tirx.PrimFunc)]
    assert len(funcs) == 1, [gv for gv, _ in mod.functions_items()]
    return funcs[0]


def _relax_conv2d_transpose(fuse=False, output_padding=0):
    conv = ("R.nn.conv2d_transpose(x, w, strides=2, padding=1, "
            f"output_padding={output_padding})")
    body = f"y = R.nn.relu(R.add({conv}, b))" if fuse else f"y = {conv}"
    params = ('x: R.Tensor((1, 6, 5, 5), "float32"), w: R.Tensor((6, 4, 3, 3), "float32"), '
              'b: R.Tensor((1, 4, 1, 1), "float32")')
    return _relax_func(body, params, fuse)


def _relax_grouped_conv2d_transpose():
    return _relax_func("y = R.nn.conv2d_transpose(x, w, strides=2, padding=1, groups=2)",
                       'x: R.Tensor((1, 4, 5, 5), "float32"), w: R.Tensor((4, 3, 4, 4), "float32")')


def _relax_conv1d_transpose():
    return _relax_func("y = R.nn.conv1d_transpose(x, w, strides=3, padding=2)",
                       'x: R.Tensor((2, 5, 7), "float32"), w: R.Tensor((5, 3, 5), "float32")')


def _specs(func):
    from tvm.s_tir.meta_schedule.arg_info import ArgInfo

    return [(tuple(int(d) for d in a.shape), str(a.dtype)) for a in ArgInfo.from_prim_func(func)]


def _default_build_output(func, arrays):
    ex = tvm.compile(tvm.IRModule({"main": func.with_attr("global_symbol", "main")}), HOST)
    shape, dtype = _specs(func)[-1]
    dev = tvm.cpu()
    out = tvm.runtime.tensor(np.full(shape, np.nan, dtype), dev)
    ex(*[tvm.runtime.tensor(a, dev) for a in arrays], out)
    return out.numpy()


FORMS = {
    "te_nhwc_k4_s2_p1": lambda: _te(1, 4, 4, 8, 6, 4, 2, 1),
    "te_nhwc_k5_s3_p2_batch2": lambda: _te(2, 5, 7, 4, 5, 5, 3, 2),
    "te_nhwc_k1_s2": lambda: _te(1, 4, 4, 4, 4, 1, 2, 0),  # classes without taps
    "te_nhwc_f64": lambda: _te(1, 3, 3, 4, 4, 3, 2, 1, dtype="float64"),
    "topi_nchw": _topi_nchw,
    "relax_conv2d_transpose": _relax_conv2d_transpose,
    "relax_conv2d_transpose_output_padding": lambda: _relax_conv2d_transpose(output_padding=1),
    "relax_fused_bias_relu": lambda: _relax_conv2d_transpose(fuse=True),
    "relax_grouped": _relax_grouped_conv2d_transpose,  # a group's channels: c // 3 * 2 + dc
    "relax_conv1d_transpose_s3": _relax_conv1d_transpose,
}


@pytest.mark.parametrize("form", sorted(FORMS))
def test_guard_found_and_rewrite_computes_the_same(form):
    func = FORMS[form]()
    guard = parity.find_parity_guard(func)
    assert guard is not None
    # the te_workload keeps the guard in the reduction, topi and Relax in a producer
    assert guard.inlined == (not form.startswith("te_"))
    assert 0 < guard.useful < 1 and all(k >= 2 for _, k in guard.split)
    dec = parity.decompose(func)
    assert dec is not None and dec.kind == "parity" and "parity" in dec.reason
    n_classes = sum(1 for label in dec.labels if label != "prologue")
    assert n_classes == len(guard.classes) == np.prod([k for _, k in guard.split])
    assert len(dec.groups) == len(dec.labels)
    assert bool(parity_guards(func)) == (not guard.inlined)  # the check sees a guard
    assert not parity_guards(dec.func)
    arrays = [rand(s, d, i) for i, (s, d) in enumerate(_specs(func)[:-1])]
    ref = _default_build_output(func, arrays)
    out = _default_build_output(dec.func, arrays)
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-6)


def test_te_guard_terms_and_classes():
    guard = parity.find_parity_guard(_te(1, 4, 4, 8, 6, 4, 2, 1))
    assert guard.describe() == "(h + rh) % 2 == 0 and (w + rw) % 2 == 0"
    assert guard.useful == pytest.approx(0.25)
    assert len(guard.classes) == 4 and not any(c.zero for c in guard.classes)
    for c in guard.classes:  # 2 of the 4 taps per axis, every other one
        assert sorted((d, j) for _, d, _, j in c.taps) == [(2, 2), (2, 2)]
    # a 1x1 kernel of stride 2: only the even outputs have a tap
    k1 = parity.find_parity_guard(_te(1, 4, 4, 4, 4, 1, 2, 0))
    assert sum(1 for c in k1.classes if c.zero) == 3


def test_stride3_odd_extents_per_class_extents():
    guard = parity.find_parity_guard(_te(1, 5, 5, 4, 4, 5, 3, 2))  # output 12 - 4 + 5 = 13
    extents = sorted({a for c in guard.classes for _, a in c.extents})
    assert extents == [4, 5]  # 13 = 5 + 4 + 4 outputs per residue


@pytest.mark.parametrize("make", [
    lambda: te.create_prim_func(list(W.conv2d_nhwc(1, 9, 9, 8, 16, 3, 2, 1))),  # strided conv
    lambda: te.create_prim_func(list(W.conv1d_nlc(1, 16, 8, 8, 3, 2, 1))),
    lambda: _te(1, 5, 5, 8, 8, 3, 1, 0),  # a transposed conv of stride 1: no dilation
    lambda: te.create_prim_func(list(W.matmul(16, 16, 16))),
])
def test_no_guard_in_plain_functions(make):
    func = make()
    assert parity.find_parity_guard(func) is None
    assert parity.decompose(func) is None


def test_a_guard_that_does_not_multiply_is_not_taken():
    """``(h + r) % 2 == 0`` selecting a term that is *added*: zero taps are not zero terms."""
    X = te.placeholder((8,), name="X")
    Y = te.placeholder((4,), name="Y")
    r = te.reduce_axis((0, 4), "r")
    out = te.compute((6,), lambda h: te.sum(
        te.if_then_else((h + r) % 2 == 0, X[(h + r) // 2], 0.0) + Y[r], axis=r), name="out")
    assert parity.find_parity_guard(te.create_prim_func([X, Y, out])) is None
