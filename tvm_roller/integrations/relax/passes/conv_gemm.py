"""Low-precision convolutions as GEMMs (im2col), for the tile products.

AMX multiplies 16-row tiles of contiguous reduction elements; a convolution reduces over the
window and the input channels (three axes), which no tile product takes directly. A bf16 / int8
``conv2d`` in NHWC / HWIO (``conv_layout`` puts them there), one group, no dilation, becomes

    cols[b, i, j, kh, kw, c] = x[b, i·s + kh − p, j·s + kw − p, c]     (0 in the padding)
    y = reshape(matmul(reshape(cols, [N·OH·OW, KH·KW·C]), reshape(w, [KH·KW·C, CO])))

— a 1×1 stride-1 convolution is a reshape and a matmul. The window copy (``cols``) is one
memory-bound kernel; the GEMM is roller's AMX kernel with the convolution's epilogue.
"""
from __future__ import annotations

from typing import Optional

import tvm
from tvm import relax, te

from tvm_roller.integrations.relax.passes.mutate import mutate_with_new_functions

_LOW = ("bfloat16", "int8", "uint8")


def _ints(values) -> list:
    return [int(v) for v in values]


def _static(shape) -> Optional[list]:
    dims = list(shape) if shape is not None else []
    if not dims or not all(isinstance(d, tvm.tirx.IntImm) for d in dims):
        return None
    return [int(d) for d in dims]


def _im2col(x: te.Tensor, window: tuple) -> te.Tensor:
    """``cols[b, i, j, r, t, ch] = x[b, i·sh + r − pt, j·sw + t − pl, ch]`` (0 outside): one
    copy with affine indices (a concat of KH·KW slices selects among them per element)."""
    kh, kw, sh, sw, pt, pl, oh, ow = window
    n, h, w, c = (int(d) for d in x.shape)

    def value(b, i, j, r, t, ch):
        y, z = i * sh + r - pt, j * sw + t - pl
        inside = tvm.tirx.all(y >= 0, y < h, z >= 0, z < w)
        return tvm.tirx.if_then_else(inside, x[b, y, z, ch], tvm.tirx.const(0, x.dtype))

    return te.compute((n, oh, ow, kh, kw, c), value, name="im2col")


def im2col_conv2d(call: relax.Call, builder: relax.BlockBuilder) -> Optional[relax.Expr]:
    """``call`` (a conv2d) as im2col + matmul, or None when it is not one this takes."""
    a = call.attrs
    x, w = call.args
    xs, ws = _static(x.ty.shape), _static(w.ty.shape)
    if str(x.ty.dtype) not in _LOW or xs is None or ws is None or int(a.groups) != 1 or \
            a.data_layout != "NHWC" or a.kernel_layout != "HWIO" or \
            (a.out_layout or "NHWC") != "NHWC" or _ints(a.dilation) != [1, 1]:
        return None
    n, h, wd, c = xs
    kh, kw, _, co = ws
    sh, sw = _ints(a.strides)
    pt, pl, pb, pr = _ints(a.padding)
    oh, ow = (h + pt + pb - kh) // sh + 1, (wd + pl + pr - kw) // sw + 1
    if (kh, kw, sh, sw, pt, pl, pb, pr) == (1, 1, 1, 1, 0, 0, 0, 0):
        cols = relax.op.reshape(x, [n * h * wd, c])
    else:
        window = (kh, kw, sh, sw, pt, pl, oh, ow)
        cols = relax.op.reshape(builder.call_te(_im2col, x, window, primfunc_name_hint="im2col"),
                                [n * oh * ow, kh * kw * c])
    out_dtype = str(a.out_dtype) if str(a.out_dtype) else str(call.ty.dtype)
    y = relax.op.matmul(cols, relax.op.reshape(w, [kh * kw * c, co]), out_dtype=out_dtype)
    return relax.op.reshape(y, [n, oh, ow, co])


@relax.expr_functor.mutator
class _ConvGemm(relax.expr_functor.PyExprMutator):
    def visit_call_(self, call):  # noqa: N802 (TVM's visitor name)
        call = super().visit_call_(call)
        if isinstance(call.op, tvm.ir.Op) and call.op.name == "relax.nn.conv2d":
            gemm = im2col_conv2d(call, self.builder_)
            return call if gemm is None else gemm
        return call


def conv_gemm_pass() -> tvm.transform.Pass:
    """The rewrite above on every Relax function (the window copies are new PrimFuncs)."""

    @tvm.transform.module_pass(opt_level=0, name="RollerConvGemm")
    def _rewrite(mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        return mutate_with_new_functions(mod, _ConvGemm)

    return _rewrite
