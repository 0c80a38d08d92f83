"""PyTorch's advanced indexing (``aten.index.Tensor``, ``index_put``) as one gather / scatter.

TVM 0.27's importer stacks index tensors of different ranks into ``relax.op.index_tensor``,
whose shape inference rejects them ("cannot broadcast index shapes"), and its mixed
index / slice path is an outer product, not PyTorch's semantics. Here the index tensors
broadcast right-aligned as in PyTorch; the broadcast dimensions replace the indexed ones where
those are adjacent, and go first otherwise; a negative index counts from the end.
"""
from __future__ import annotations

from typing import List, Sequence

from tvm_roller.integrations.pytorch.emit import emit_kernel


def _is_one(dim) -> bool:
    return getattr(dim, "value", dim) == 1


def broadcast_shape(shapes: Sequence[Sequence]) -> list:
    """The right-aligned broadcast of ``shapes`` (a symbolic dimension is taken as the size
    where the others are 1 or the same)."""
    rank = max(len(s) for s in shapes)
    out = []
    for q in range(rank):
        dims = [s[len(s) - rank + q] for s in shapes if len(s) - rank + q >= 0]
        wide = [d for d in dims if not _is_one(d)]
        out.append(wide[0] if wide else dims[0])
    return out


def _layout(shape, indices: List, dims: List[int]):
    """The result's shape of indexing a tensor of ``shape`` with ``indices`` on ``dims``, and
    the map from a result position to the tensor's coordinates (int64 expressions)."""
    from tvm import tirx

    nd = len(shape)
    bshape = broadcast_shape([list(i.shape) for i in indices])
    rest = [d for d in range(nd) if d not in dims]
    adjacent = dims == list(range(dims[0], dims[0] + len(dims)))
    before = [d for d in rest if d < dims[0]] if adjacent else []
    after = [d for d in rest if d not in before]
    nb, rb = len(before), len(bshape)

    def coords(*o) -> list:
        coord = {d: o[j].astype("int64") for j, d in enumerate(before)}
        coord.update({d: o[nb + rb + j].astype("int64") for j, d in enumerate(after)})
        for ind, d in zip(indices, dims):
            r = len(ind.shape)
            sub = [0 if _is_one(ind.shape[q]) else o[nb + rb - r + q] for q in range(r)]
            v = ind(*sub).astype("int64")
            coord[d] = tirx.Select(v < 0, v + shape[d].astype("int64"), v)
        return [coord[d] for d in range(nd)]

    out = [shape[d] for d in before] + bshape + [shape[d] for d in after]
    return out, coords


def advanced_index(data, indices: List, dims: List[int]):
    """``data[...]`` with ``indices[j]`` on dimension ``dims[j]`` (ascending) and whole slices
    elsewhere (a te compute)."""
    from tvm import te

    shape, coords = _layout(list(data.shape), indices, dims)
    return te.compute(shape, lambda *o: data(*coords(*o)), name="index_tensor")


def flat_positions(data, indices: List, dims: List[int]):
    """Where each element of ``data[...]`` lives in ``data`` flattened (row-major, int64)."""
    from tvm import te

    shape, coords = _layout(list(data.shape), indices, dims)

    def position(*o):
        flat = None
        for c, size in zip(coords(*o), data.shape):
            flat = c if flat is None else flat * size.astype("int64") + c
        return flat

    return te.compute(shape, position, name="index_positions")


def _known_shapes(*tensors) -> bool:
    """Whether every tensor's shape is known (emit_te needs it; a shape computed at run time
    keeps the importer's conversion)."""
    from tvm import relax

    return all(isinstance(getattr(t.ty, "shape", None), relax.ShapeExpr) for t in tensors)


def _index_tensor(node, importer):
    data, indices = importer.retrieve_args(node)[:2]
    used = [(d, i) for d, i in enumerate(indices) if i is not None]
    if not used or any(str(i.ty.dtype) == "bool" for _, i in used) \
            or not _known_shapes(data, *[i for _, i in used]):
        # a boolean mask selects a data-dependent number of elements: the importer's way
        return importer.create_convert_map()["index.Tensor"](node)
    return emit_kernel(importer, advanced_index, data, [i for _, i in used],
                                          [d for d, _ in used])


def _index_put(node, importer):
    """``data[indices] = values`` (``+=`` with ``accumulate``: repeated positions add up), the
    indices broadcast as in ``index.Tensor``, missing trailing ones whole slices: a scatter
    into ``data`` flattened."""
    from tvm import relax

    args = importer.retrieve_args(node)
    data, indices, values = args[0], list(args[1]), args[2]
    accumulate = bool(args[3]) if len(args) > 3 else bool(node.kwargs.get("accumulate", False))
    used = [(d, i) for d, i in enumerate(indices) if i is not None]
    if not used or any(str(i.ty.dtype) == "bool" for _, i in used) \
            or not _known_shapes(data, values, *[i for _, i in used]):
        return importer.create_convert_map()["index_put.default"](node)
    bb = importer.block_builder
    where = emit_kernel(importer, flat_positions, data, [i for _, i in used], [d for d, _ in used])
    values = bb.emit(relax.op.broadcast_to(relax.op.astype(values, str(data.ty.dtype)),
                                           where.ty.shape))
    flat = bb.emit(relax.op.reshape(data, [-1]))
    out = bb.emit(relax.op.scatter_elements(
        flat, relax.op.reshape(where, [-1]), relax.op.reshape(values, [-1]), axis=0,
        reduction="add" if accumulate else "update"))
    return bb.emit(relax.op.reshape(out, data.ty.shape))


CONVERTERS = {"index.Tensor": _index_tensor, "index_put.default": _index_put,
              "index_put_.default": _index_put}
