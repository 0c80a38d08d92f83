"""Division with a Python number, in the tensor's dtype; ``empty`` of a symbolic size.

TVM 0.27's importer makes ``x // 2`` of an int64 tensor a division by an int32 constant, which
Relax rejects ("Binary operators must have the same datatype"); MoE routing does exactly that
(``perm // top_k``). The constant takes the tensor's dtype here; an integer true division is
taken in float32, as PyTorch promotes it."""
from __future__ import annotations


def _div(node, importer):
    from tvm import relax

    args = importer.retrieve_args(node)
    x, y = args[0], args[1]
    mode = args[2] if len(node.args) > 2 else node.kwargs.get("rounding_mode", None)
    if not isinstance(y, (int, float)) or not isinstance(x, relax.Expr):
        return importer.create_convert_map()["div.Tensor_mode"](node)
    dtype = str(x.ty.dtype)
    integer = dtype.startswith(("int", "uint"))
    emit = importer.block_builder.emit
    if mode is None or (integer and isinstance(y, float)):
        if integer:
            x, dtype = emit(relax.op.astype(x, "float32")), "float32"
        out = emit(relax.op.divide(x, relax.const(y, dtype)))
        return out if mode is None else emit(
            relax.op.floor(out) if mode == "floor" else relax.op.trunc(out))
    c = relax.const(y, dtype)
    if mode == "floor":
        return emit(relax.op.floor_divide(x, c))
    if mode == "trunc":
        return emit(relax.op.divide(x, c)) if integer else \
            emit(relax.op.trunc(relax.op.divide(x, c)))
    raise ValueError(f"Unsupported rounding_mode: {mode}")


def _empty(node, importer):
    """``torch.empty(sizes)`` where a size is symbolic (``empty_like`` of a prompt-long
    tensor): the importer passes the fx nodes on unconverted. Zeros, as the importer's."""
    import torch
    from tvm import relax

    dims = [importer.env[d] if isinstance(d, torch.fx.Node) else d for d in node.args[0]]
    dims = [getattr(d, "value", d) if isinstance(d, relax.Expr) else d for d in dims]
    dtype = importer._convert_data_type(node.kwargs.get("dtype", torch.get_default_dtype()),
                                        importer.env)
    return importer.block_builder.emit(relax.op.zeros(relax.ShapeExpr(dims), dtype))


CONVERTERS = {"div.Tensor_mode": _div, "empty.memory_format": _empty, "empty.default": _empty,
              "empty_permuted.default": _empty}
