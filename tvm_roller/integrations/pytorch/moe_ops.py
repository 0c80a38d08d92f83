"""The ops a mixture-of-experts layer exports to, which TVM 0.27's importer lacks.

HuggingFace's experts (``grouped_mm`` implementation) sort the (token, expert) pairs by expert,
count each expert's rows with ``histc``, and multiply each group of rows by its expert's weight
with ``_grouped_mm`` (or transformers' ``grouped_mm_fallback`` op, same semantics). Other MoE
code combines expert outputs with ``index_add`` / ``scatter_add``.

``grouped_mm`` of rows (2-D × 3-D, ``offs`` the groups' cumulative ends) becomes products that
each read one expert's weight, the expert a scalar read at run time (``routed_matmul``: an
ordinary matmul for the planner, its weight indexed by a scalar parameter): a few static rows (a
decode step's top-k) one product per row; a prompt's rows one product per group over that
group's rows (a run-time count). An unrouted expert's weight is never read. Rows past the last
end are zero (PyTorch leaves them undefined).
"""
from __future__ import annotations

import numpy as np

from tvm_roller.analysis.routed import routed_attrs
from tvm_roller.core.errors import UnsupportedError
from tvm_roller.integrations.pytorch.emit import emit_kernel

_LOW = ("bfloat16", "float16")


def _arg(args, node, i: int, name: str, default):
    if len(args) > i and args[i] is not None:
        return args[i]
    return node.kwargs.get(name, default)


def group_of_rows(rows, offs):
    """``group[s]``: how many of the cumulative ends ``offs`` are ≤ ``s``, clamped to the last
    group (a te compute; rows past the last end are masked after the product)."""
    from tvm import te, tirx

    groups = offs.shape[0]
    g = te.reduce_axis((0, groups), name="g")
    count = te.compute((rows,), lambda s: te.sum(tirx.if_then_else(
        offs[g].astype("int64") <= s.astype("int64"), tirx.const(1, "int64"),
        tirx.const(0, "int64")), axis=g), name="group_count")
    return te.compute((rows,), lambda s: tirx.min(count[s], tirx.const(int(groups) - 1, "int64")),
                      name="group_of_rows")


def routed_matmul(a, w, expert, transposed: bool, out_dtype: str):
    """``out = a @ w[expert]`` (``@ w[expert].T`` when ``transposed``: rows along K read in
    place), ``expert`` a scalar known at run time: only that expert's weight is read."""
    from tvm import te

    rows, depth = a.shape
    cols = w.shape[1] if transposed else w.shape[2]
    acc = "float32" if str(a.dtype) in _LOW else str(a.dtype)
    k = te.reduce_axis((0, depth), name="k")

    def weight(kk, n):
        return w[expert, n, kk] if transposed else w[expert, kk, n]

    out = te.compute((rows, cols), lambda s, n: te.sum(
        a[s, k].astype(acc) * weight(k, n).astype(acc), axis=k), name="routed_matmul")
    if acc == out_dtype:
        return out
    return te.compute((rows, cols), lambda s, n: out[s, n].astype(out_dtype), name="cast")


def rows_of(a, start, rows):
    """``a[start:start + rows]``, ``start`` and ``rows`` known at run time (a group's rows)."""
    from tvm import te

    return te.compute((rows, a.shape[1]), lambda s, k: a[start + s, k], name="rows_of")


def _routed(importer, rows, stored, expert, transposed: bool, out_dtype: str):
    """A routed product, its kernel marked as one (``analysis.routed``)."""
    return emit_kernel(importer, routed_matmul, rows, stored, expert, transposed, out_dtype,
                       attrs=routed_attrs(transposed, expert))


def _scalars(bb, tensor, count: int, name: str):
    """The ``count`` values of a 1-D int tensor as shape variables (read at run time)."""
    from tvm import relax, tirx

    values = [tirx.Var(f"{name}{i}", "int64") for i in range(count)]
    # (kept out of the dataflow blocks by ``passes.shape_reads``, so fusion cannot move a
    # product whose type uses them above this read)
    shape = bb.emit(relax.op.tensor_to_shape(relax.op.astype(tensor, "int64")))
    bb.match_cast(shape, relax.ShapeType(values))
    return values


def _by_rows(importer, a, stored, offs, transposed, out_dtype):
    """Few static rows (a decode step's top-k): one routed product per row, over its group's
    weight only; rows past the last group zeroed."""
    from tvm import relax

    bb = importer.block_builder

    rows, groups = int(a.ty.shape[0]), int(offs.ty.shape[0])
    group = emit_kernel(importer, group_of_rows, rows, offs)
    experts = _scalars(bb, group, rows, "expert")
    single = [bb.emit(relax.op.strided_slice(a, [0], [s], [s + 1])) for s in range(rows)]
    outs = [_routed(importer, row, stored, experts[s], transposed, out_dtype)
            for s, row in enumerate(single)]
    out = outs[0] if rows == 1 else bb.emit(relax.op.concat(outs, axis=0))
    last = bb.emit(relax.op.strided_slice(offs, [0], [groups - 1], [groups]))
    live = bb.emit(relax.op.less(relax.op.arange(0, rows, 1, "int64"),
                                 relax.op.astype(last, "int64")))
    zero = relax.const(0, out_dtype)
    return bb.emit(relax.op.where(relax.op.expand_dims(live, 1), out, zero))


def _by_groups(importer, a, stored, offs, transposed, out_dtype):
    """Rows sorted by group (a prompt's): one product per group over its rows (a run-time row
    count, zero for an unrouted expert) and its weight; rows past the last end are zero."""
    from tvm import relax, tirx

    bb = importer.block_builder

    groups = int(offs.ty.shape[0])
    ends = _scalars(bb, offs, groups, "end")
    # each group's row count its own variable: the kernel's one symbolic extent
    offs64 = bb.emit(relax.op.astype(offs, "int64"))
    zero = relax.const(np.zeros(1, "int64"), "int64")
    starts = zero if groups == 1 else bb.emit(relax.op.concat(
        [zero, relax.op.strided_slice(offs64, [0], [0], [groups - 1])], axis=0))
    counts = _scalars(bb, bb.emit(relax.op.subtract(offs64, starts)), groups, "rows")
    cols = stored.ty.shape[1] if transposed else stored.ty.shape[2]
    pieces, start = [], tirx.const(0, "int64")
    for g in range(groups):
        group = emit_kernel(importer, rows_of, a, start, counts[g])
        pieces.append(_routed(importer, group, stored, tirx.const(g, "int64"), transposed,
                              out_dtype))
        start = ends[g]
    total = a.ty.shape[0]
    pieces.append(bb.emit(relax.op.zeros(relax.ShapeExpr([total - start, cols]), out_dtype)))
    out = bb.emit(relax.op.concat(pieces, axis=0))
    return bb.match_cast(out, relax.TensorType([total, cols], out_dtype))


def _transposed_weight(importer, w):
    """``(w, True)`` when ``w`` is the last-two-axes transpose of a stored ``[G, N, K]`` tensor
    (HF passes ``weight.transpose(-2, -1)``): the kernel then reads rows along K in place."""
    from tvm import relax

    try:
        bound = importer.block_builder.lookup_binding(w)
    except Exception:  # noqa: BLE001  (a parameter or constant: no binding)
        bound = None
    if isinstance(bound, relax.Call) and bound.op.name == "relax.permute_dims" \
            and bound.attrs.axes is not None and [int(x) for x in bound.attrs.axes] == [0, 2, 1]:
        return bound.args[0], True
    return w, False


def _grouped_mm(node, importer):
    from tvm import relax, tirx

    args = importer.retrieve_args(node)
    a, w = args[0], args[1]
    offs = _arg(args, node, 2, "offs", None)
    bias = _arg(args, node, 3, "bias", None)
    out_dtype = _arg(args, node, 4, "out_dtype", None)
    bb = importer.block_builder
    out_dtype = str(a.ty.dtype) if out_dtype is None else _dtype_name(out_dtype)
    ranks = (a.ty.ndim, w.ty.ndim)
    if ranks == (3, 3) and offs is None:  # one product per group: a batch matmul
        out = bb.emit(relax.op.matmul(a, w, out_dtype=out_dtype))
        return out if bias is None else bb.emit(relax.op.add(out, relax.op.expand_dims(bias, 1)))
    if ranks != (2, 3) or offs is None:
        raise UnsupportedError(f"grouped_mm of a {ranks[0]}-D by a {ranks[1]}-D operand"
                               f"{' without offs' if offs is None else ''} is not supported "
                               "(rows grouped over stacked weights, 2-D x 3-D, and 3-D x 3-D are)")
    stored, transposed = _transposed_weight(importer, w)
    rows = a.ty.shape[0]
    few = isinstance(rows, tirx.IntImm) and int(rows) <= int(offs.ty.shape[0])
    out = (_by_rows if few else _by_groups)(importer, a, stored, offs, transposed, out_dtype)
    if bias is not None:
        group = emit_kernel(importer, group_of_rows, rows, offs)
        out = bb.emit(relax.op.add(out, relax.op.take(bias, group, axis=0)))
    return out


def _dtype_name(dtype) -> str:
    import torch

    return str(dtype).replace("torch.", "") if isinstance(dtype, torch.dtype) else str(dtype)


def histogram(x, bins: int, lo: float, hi: float):
    """``torch.histc``: counts of ``x`` in ``bins`` equal bins over ``[lo, hi]`` (``lo == hi``:
    the data's range, widened by 1 each way when flat); values outside are not counted."""
    from tvm import te, tirx

    dt = str(x.dtype)
    axes = [te.reduce_axis((0, d), name=f"r{i}") for i, d in enumerate(x.shape)]
    at = [a.var for a in axes]
    if lo == hi:  # the data's range
        low = te.compute((), lambda: te.min(x(*at), axis=axes), name="histc_min")
        axes2 = [te.reduce_axis((0, d), name=f"q{i}") for i, d in enumerate(x.shape)]
        high = te.compute((), lambda: te.max(x(*[a.var for a in axes2]), axis=axes2),
                          name="histc_max")
        flat = low() == high()
        left = tirx.Select(flat, low() - tirx.const(1, dt), low())
        right = tirx.Select(flat, high() + tirx.const(1, dt), high())
    else:
        left, right = tirx.const(lo, dt), tirx.const(hi, dt)
    axes3 = [te.reduce_axis((0, d), name=f"h{i}") for i, d in enumerate(x.shape)]

    def count(b):
        v = x(*[a.var for a in axes3])
        pos = tirx.floor((v - left) * tirx.const(bins, dt) / (right - left)).astype("int64")
        pos = tirx.Select(v == right, tirx.const(bins - 1, "int64"), pos)
        inside = tirx.all(v >= left, v <= right, pos == b.astype("int64"))
        return te.sum(tirx.Select(inside, tirx.const(1, dt), tirx.const(0, dt)), axis=axes3)

    return te.compute((bins,), count, name="histc")


def _histc(node, importer):
    args = importer.retrieve_args(node)
    x = args[0]
    bins = int(_arg(args, node, 1, "bins", 100))
    lo, hi = float(_arg(args, node, 2, "min", 0)), float(_arg(args, node, 3, "max", 0))
    if bins < 1 or hi < lo:
        raise UnsupportedError(f"histc with bins={bins}, min={lo}, max={hi}")
    return emit_kernel(importer, histogram, x, bins, lo, hi)


def _index_add(node, importer):
    """``self.index_add(dim, index, source, alpha)``: ``source``'s slices added at ``index``
    along ``dim`` (repeated indices accumulate)."""
    from tvm import relax

    args = importer.retrieve_args(node)
    data, dim, index, source = args[0], int(args[1]), args[2], args[3]
    alpha = _arg(args, node, 4, "alpha", 1)
    rank = source.ty.ndim
    dim = dim % rank
    emit = importer.block_builder.emit
    if alpha != 1:
        source = emit(relax.op.multiply(source, relax.const(alpha, str(source.ty.dtype))))
    shape = [1] * rank
    shape[dim] = -1
    spread = emit(relax.op.broadcast_to(relax.op.reshape(index, shape), source.ty.shape))
    return emit(relax.op.scatter_elements(data, spread, source, axis=dim, reduction="add"))


def _scatter_add(node, importer):
    """``self.scatter_add(dim, index, src)``: ``src[i]`` added at ``index[i]`` along ``dim``,
    over ``index``'s extent (``src`` may be larger)."""
    from tvm import relax

    args = importer.retrieve_args(node)
    data, dim, index, src = args[0], int(args[1]), args[2], args[3]
    emit = importer.block_builder.emit
    ishape = [int(d) for d in index.ty.shape]
    if [int(d) for d in src.ty.shape] != ishape:
        src = emit(relax.op.strided_slice(src, list(range(len(ishape))), [0] * len(ishape),
                                          ishape))
    return emit(relax.op.scatter_elements(data, index, src, axis=dim % len(ishape),
                                          reduction="add"))


CONVERTERS = {"_grouped_mm.default": _grouped_mm, "grouped_mm.default": _grouped_mm,
              "grouped_mm_fallback.default": _grouped_mm, "histc.default": _histc,
              "index_add.default": _index_add, "scatter_add.default": _scatter_add}
