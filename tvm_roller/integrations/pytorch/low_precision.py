"""Converters that keep bf16 / fp16 matmuls and convolutions in their operands' dtype."""
from __future__ import annotations

#: operand dtypes whose matmul result keeps the operands' dtype (PyTorch's semantics)
_LOW_PRECISION = ("bfloat16", "float16")


# TVM 0.27's importer gives every matmul and convolution a float32 result: a bf16 model then
# turns float32 after its first linear layer (the binary ops promote, weights included), and
# addmm of a bf16 bias (batch_norm after a bf16 convolution) fails to type-check. These
# converters keep the operands' dtype for bf16 / fp16 (the float32 accumulation is the Relax
# pipeline's, ``passes.accumulate_f32``) and emit what the importer does otherwise.


def _out_dtype(a, b) -> str:
    da, db = str(a.ty.dtype), str(b.ty.dtype)
    return da if da == db and da in _LOW_PRECISION else "float32"


def _matmul(node, importer):
    from tvm import relax

    a, b = importer.retrieve_args(node)[:2]
    if str(a.ty.dtype) != str(b.ty.dtype):  # (the importer promotes: float32 here)
        a, b = (importer.block_builder.emit(relax.op.astype(v, "float32")) for v in (a, b))
    return importer.block_builder.emit(relax.op.matmul(a, b, out_dtype=_out_dtype(a, b)))


def _addmm(node, importer):
    from tvm import relax

    bias, a, b = importer.retrieve_args(node)[:3]
    alpha, beta = node.kwargs.get("alpha", 1), node.kwargs.get("beta", 1)
    emit = importer.block_builder.emit
    res = None
    if alpha != 0:
        res = emit(relax.op.matmul(a, b, out_dtype=_out_dtype(a, b)))
        if alpha != 1:
            res = emit(relax.op.multiply(res, relax.const(alpha, str(res.ty.dtype))))
    if beta != 0:
        if beta != 1:
            bias = emit(relax.op.multiply(bias, relax.const(beta, str(bias.ty.dtype))))
        res = bias if res is None else emit(relax.op.add(bias, res))
    return res


def _linear(node, importer):
    from tvm import relax

    args = importer.retrieve_args(node)
    x, w = args[0], args[1]
    bias = args[2] if len(args) > 2 else None
    return importer.block_builder.emit(relax.op.linear(x, w, bias, _out_dtype(x, w)))


def _conv(name: str):
    """A convolution of bf16 / fp16 operands with its result in their dtype; any other (float32,
    transposed) as the importer converts it."""
    def convert(node, importer):
        from tvm import relax

        args = list(importer.retrieve_args(node)) + [None] * 9

        def arg(i, default):
            return default if args[i] is None else args[i]

        x, w, bias = args[0], args[1], args[2]
        dims = len(x.ty.shape) - 2
        transposed = bool(arg(6, False)) if name == "convolution.default" else False
        if _out_dtype(x, w) == "float32" or transposed or dims not in (1, 2):
            return importer.create_convert_map()[name](node)
        groups = arg(8, 1) if name == "convolution.default" else arg(6, 1)
        make = relax.op.nn.conv1d if dims == 1 else relax.op.nn.conv2d
        layouts = ("NCW", "OIW") if dims == 1 else ("NCHW", "OIHW")
        y = importer.block_builder.emit(make(
            x, w, strides=arg(3, 1), padding=arg(4, 0), dilation=arg(5, 1),
            groups=groups, data_layout=layouts[0], kernel_layout=layouts[1],
            out_dtype=_out_dtype(x, w)))
        if bias is None:
            return y
        bias = relax.op.reshape(bias, (1, -1) + (1,) * dims)
        return importer.block_builder.emit(relax.op.add(y, bias))
    return convert


MATMULS = {"mm.default": _matmul, "bmm.default": _matmul, "matmul.default": _matmul,
            "addmm.default": _addmm, "linear.default": _linear,
            **{name: _conv(name) for name in ("conv1d.default", "conv2d.default",
                                              "convolution.default")}}
