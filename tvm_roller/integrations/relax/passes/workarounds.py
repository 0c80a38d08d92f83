"""Relax rewrites around TVM 0.27 code-generation defects, run before legalization so that
neither roller's kernels nor TVM's default ones meet them.

- A comparison of two bool tensors (``equal``, ``not_equal``, ``less``, ...; HuggingFace builds
  attention masks this way) legalizes to a TIR ``==`` on ``bool`` values, which TVM's LLVM
  backend emits as a floating-point compare of ``i1`` values: LLVM's verifier rejects the
  module and the whole model fails to build. The operands are compared as int8 instead.
- A cumulative sum or product of bool values (GPT-2's position ids from its mask) makes TIR
  add ``bool`` values, which the LLVM backend refuses (``CreateAdd`` expects floats). It is
  computed in int32 and converted back to bool (non-zero: True), the result's type unchanged.
- A ``strided_slice`` with a negative axis (HuggingFace's causal-mask positions, exported
  with a dynamic sequence length) fails to legalize when the slice bounds are symbolic
  (``axis < src_tensor_dim (-1 vs. 2)``): its axes are counted from the front instead.
- TVM's PyTorch importer turns ``x[:, -1]`` (and ``select``, ``index_select`` with negative
  indices) into ``take(x, -1, mode="fast")``, which reads before the start of the axis: NaN or
  garbage, silently. A constant negative index is made positive (``i % extent``); over an axis
  of symbolic extent the take wraps (``mode="wrap"``) instead.
- A concatenation with an empty operand (Phi-3's rotary embedding concatenates the rotated
  head dimensions with the empty rest, ``x[..., rotary_dim:]`` when the rotation covers the
  whole head) makes a PrimFunc with an empty loop nest: the empty operands are dropped.
"""
from __future__ import annotations

import tvm
from tvm import relax

from tvm_roller.integrations.relax.passes.mutate import mutate_functions

_SCANS = {"relax.cumsum", "relax.cumprod"}
_COMPARISONS = {"relax.equal", "relax.not_equal", "relax.less", "relax.less_equal",
                "relax.greater", "relax.greater_equal"}


def _is_bool(expr) -> bool:
    return str(getattr(expr.ty, "dtype", "")) == "bool"


@relax.expr_functor.mutator
class _Workarounds(relax.expr_functor.PyExprMutator):
    def visit_call_(self, call):  # noqa: N802 (TVM's visitor name)
        call = super().visit_call_(call)
        if isinstance(call.op, tvm.ir.Op) and call.op.name == "relax.strided_slice":
            return _slice_axes_from_front(call)
        if isinstance(call.op, tvm.ir.Op) and call.op.name == "relax.take":
            return _take_from_front(call)
        if isinstance(call.op, tvm.ir.Op) and call.op.name == "relax.concat":
            return _without_empty_operands(call)
        if isinstance(call.op, tvm.ir.Op) and call.op.name in _COMPARISONS and \
                len(call.args) == 2 and all(_is_bool(a) for a in call.args):
            args = [relax.op.astype(a, "int8") for a in call.args]
            return relax.Call(call.op, args, call.attrs)
        if isinstance(call.op, tvm.ir.Op) and call.op.name in _SCANS and \
                str(call.ty.dtype) == "bool":
            make = relax.op.cumsum if call.op.name == "relax.cumsum" else relax.op.cumprod
            scan = make(relax.op.astype(call.args[0], "int32"), axis=call.attrs.axis,
                        dtype="int32", exclusive=call.attrs.exclusive)
            return relax.op.astype(scan, "bool")
        return call


def _slice_axes_from_front(call):
    ndim = getattr(call.args[0].ty, "ndim", -1)
    axes = call.args[1]
    if ndim is None or ndim < 0 or not isinstance(axes, relax.Tuple):
        return call
    values = [int(a.value) if isinstance(a, tvm.tirx.IntImm) else None for a in axes.fields]
    if None in values or all(v >= 0 for v in values):
        return call
    fixed = relax.Tuple([tvm.tirx.IntImm("int64", v % ndim) for v in values])
    return relax.Call(call.op, [call.args[0], fixed, *call.args[2:]], call.attrs)


def _take_from_front(call):
    """A take of constant indices, the negative ones counted from the end of the axis."""
    indices = call.args[1]
    if not isinstance(indices, tvm.ir.expr.Constant):
        return call
    values = indices.value.numpy()
    if values.dtype.kind not in "iu" or not (values < 0).any():
        return call
    shape = getattr(call.args[0].ty, "shape", None)
    axis = call.attrs.axis
    if axis is None or shape is None:
        return call
    axis = int(axis) % len(shape)
    extent = shape[axis]
    if not isinstance(extent, tvm.tirx.IntImm):  # symbolic: wrap around at run time
        return relax.op.take(call.args[0], indices, axis=axis, mode="wrap")
    fixed = relax.const(values % int(extent.value), str(values.dtype))
    return relax.op.take(call.args[0], fixed, axis=axis, mode=call.attrs.mode)


def _without_empty_operands(call):
    """A concatenation of its non-empty operands (the only one itself)."""
    fields = call.args[0]
    if not isinstance(fields, relax.Tuple):
        return call
    kept = [f for f in fields.fields if not _empty(f)]
    if len(kept) == len(fields.fields) or not kept:
        return call
    if len(kept) == 1:
        return kept[0]
    return relax.Call(call.op, [relax.Tuple(kept)], call.attrs)


def _empty(expr) -> bool:
    shape = getattr(expr.ty, "shape", None)
    return shape is not None and any(isinstance(d, tvm.tirx.IntImm) and int(d.value) == 0
                                     for d in shape)


def workarounds_pass() -> tvm.transform.Pass:
    """Every Relax function of the module with the rewrites above."""

    @tvm.transform.module_pass(opt_level=0, name="RollerTVMWorkarounds")
    def _rewrite(mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        # (what the rewrites left unused, an empty slice, goes)
        return relax.transform.DeadCodeElimination()(mutate_functions(mod, _Workarounds()))

    return _rewrite
