"""Low-precision convolutions as GEMMs (im2col), for the tile products.

AMX multiplies 16-row tiles of contiguous reduction elements; a convolution reduces over the
window and the input channels (three axes), which no tile product takes directly. A bf16 / int8
``conv2d`` in NHWC / HWIO (``conv_layout`` puts them there), one group, no dilation, becomes

    xp   = pad(x)                                               (when the window pads)
    cols[b, i, j, kh, u] = xp[b, i·s + kh, j·s + u // C, u % C]   (u < KW·C)
    y = reshape(matmul(reshape(cols, [N·OH·OW, KH·KW·C]), reshape(w, [KH·KW·C, CO])))

— a 1×1 stride-1 convolution is a reshape and a matmul. The window copy (``cols``) is one
memory-bound kernel of whole-vector runs (KW·C elements of one input row each), kept apart
from the padding and the reshapes so none of them turns its runs into gathers; the reshapes
are views. The GEMM is roller's micro-kernel GEMM with the convolution's epilogue (the batch
norm, residual and activation after the reshape sink into it: ``sink_reshape``).
"""
from __future__ import annotations

from typing import Optional

import tvm
from tvm import relax, te

from tvm_roller.integrations.relax.passes.mutate import mutate_with_new_functions

_LOW = ("bfloat16", "int8", "uint8")
_OPAQUE = 8  # TVM's OpPatternKind kOpaque: FuseOps fuses nothing into or after it


def _ints(values) -> list:
    return [int(v) for v in values]


def _static(shape) -> Optional[list]:
    dims = list(shape) if shape is not None else []
    if not dims or not all(isinstance(d, tvm.tirx.IntImm) for d in dims):
        return None
    return [int(d) for d in dims]


def _im2col(x: te.Tensor, window: tuple) -> te.Tensor:
    """``cols[b, i, j, r, u] = x[b, i·sh + r, j·sw + u // C, u % C]`` over an input padded
    already: the KW·C elements of one window row are one run of ``x``'s memory (C innermost),
    so the copy reads and writes whole vectors."""
    kh, kw, sh, sw, oh, ow = window
    c = int(x.shape[3])
    return te.compute((int(x.shape[0]), oh, ow, kh, kw * c),
                      lambda b, i, j, r, u: x[b, i * sh + r, j * sw + u // c, u % c],
                      name="im2col")


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
        if pt or pl or pb or pr:
            x = builder.emit(relax.op.nn.pad(x, [0, 0, pt, pb, pl, pr, 0, 0]))
        window = (kh, kw, sh, sw, oh, ow)
        cols = builder.call_te(_im2col, x, window, primfunc_name_hint="im2col")
        _keep_alone(builder, cols)
        cols = relax.op.reshape(cols, [n * oh * ow, kh * kw * c])
    out_dtype = str(a.out_dtype) if str(a.out_dtype) else str(call.ty.dtype)
    y = relax.op.matmul(cols, relax.op.reshape(w, [kh * kw * c, co]), out_dtype=out_dtype)
    return relax.op.reshape(y, [n, oh, ow, co])


def _keep_alone(builder: relax.BlockBuilder, call: relax.Expr) -> None:
    """Mark the copy's PrimFunc opaque to FuseOps: fused with the padding (or a transpose) its
    reads would test bounds or gather, and fused with the reshape after it, its writes would be
    indexed through divisions by KH·KW·C; alone, the reshape is a view."""
    gv = call.args[0] if isinstance(call, relax.Call) else None
    if isinstance(gv, tvm.ir.GlobalVar):
        func = builder.get()[gv]
        builder.update_func(gv, func.with_attr("op_pattern", _OPAQUE))


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
