"""Tensor shapes simplified with the bounds of the model's shape variables.

``torch.export`` with a dynamic dimension gives the Relax function the variable's bounds
(``tir_var_lower_bound`` / ``tir_var_upper_bound``, e.g. 1 <= seq <= 512), but Relax infers
shapes without them: a slice ``x[:, :1]`` of a ``(1, seq)`` tensor has ``min(1, seq)`` columns,
and HuggingFace's causal-mask code then subtracts two tensors whose lengths Relax cannot prove
equal (``min(seq, min(1, seq) + seq)`` and ``max(min(1, seq) + seq - 1, 0)``, both ``seq``).
Their difference loses its shape and legalization fails (``emit_te now only supports Tensor
that has ShapeExpr shape``). Every binding whose shape simplifies under the bounds is followed
by a ``match_cast`` to the simplified shape, so what is inferred after it is exact again.

Legalization brings a second form of the same defect: a slice with a symbolic end is lowered by
TVM's dynamic slice, whose output shape holds ``if_then_else`` terms that ``FuseOps`` cannot
type (``Cannot find the FInferType attribute registered to op: prim.if_then_else``). Run after
legalization, the pass also simplifies the output types of ``call_tir`` under the bounds.
"""
from __future__ import annotations

from typing import Dict, Optional

import tvm
import tvm.sym
import tvm_ffi
from tvm import relax


def shape_var_bounds(func: relax.Function) -> Dict[str, tuple]:
    """name -> (lower, upper) of the function's shape variables that have bounds (either may
    be None)."""
    attrs = func.attrs
    if attrs is None:
        return {}
    lower = attrs.get("tir_var_lower_bound") or {}
    upper = attrs.get("tir_var_upper_bound") or {}
    names = set(str(k) for k in lower) | set(str(k) for k in upper)
    get = lambda table, n: next((int(v) for k, v in table.items() if str(k) == n), None)  # noqa
    return {n: (get(lower, n), get(upper, n)) for n in names}


def module_bounds(mod: tvm.IRModule) -> Dict[str, tuple]:
    """Shape variable name -> (lower, upper) from every Relax function of ``mod`` (the widest
    bounds any of them gives; None where none bounds it)."""
    out: dict = {}
    for _, func in mod.functions_items():
        if isinstance(func, relax.Function):
            for name, (lo, hi) in shape_var_bounds(func).items():
                old_lo, old_hi = out.get(name, (None, None))
                out[name] = (lo if old_lo is None else min(lo, old_lo) if lo is not None
                             else old_lo,
                             hi if old_hi is None else max(hi, old_hi) if hi is not None
                             else old_hi)
    return out


def _analyzer(func: relax.Function) -> Optional[tvm.sym.Analyzer]:
    bounds = shape_var_bounds(func)
    if not bounds:
        return None
    ana = tvm.sym.Analyzer()
    found = False
    for var in relax.analysis.defined_symbolic_vars(func):
        if var.name in bounds:
            lo, hi = bounds[var.name]
            lo = 0 if lo is None else lo
            if hi is None:
                ana.update(var, tvm.sym.ConstIntBound(lo, tvm.sym.ConstIntBound.POS_INF),
                           override=True)
            else:
                ana.bind(var, tvm.ir.Range(lo, hi + 1))
            found = True
    return ana if found else None


@relax.expr_functor.mutator
class _BoundShapes(relax.expr_functor.PyExprMutator):
    def __init__(self, analyzer: tvm.sym.Analyzer, mod: Optional[tvm.IRModule] = None):
        super().__init__(mod)
        self.ana = analyzer

    def visit_call_(self, call):  # noqa: N802 (TVM's visitor name)
        call = super().visit_call_(call)
        if not (isinstance(call.op, tvm.ir.Op) and call.op.name == "relax.call_tir") or \
                not call.ty_args:
            return call
        types = [self._simplified(t) for t in call.ty_args]
        if all(t is None for t in types):
            return call
        types = [new if new is not None else old for new, old in zip(types, call.ty_args)]
        return relax.Call(call.op, call.args, call.attrs, types)

    def _simplified(self, ty) -> Optional[relax.TensorType]:
        """``ty`` with its shape simplified under the bounds; None when nothing changes."""
        if not isinstance(ty, relax.TensorType) or not isinstance(ty.shape, relax.ShapeExpr):
            return None
        dims = list(ty.shape.values)
        simple = [self.ana.simplify(d) for d in dims]
        if all(tvm_ffi.structural_equal(a, b) for a, b in zip(dims, simple)):
            return None
        return relax.TensorType(simple, ty.dtype)

    def visit_var_binding_(self, binding):  # noqa: N802 (TVM's visitor name)
        value = self.visit_expr(binding.value)
        if isinstance(binding.var, relax.DataflowVar) or not self._in_dataflow():
            var = self.builder_.emit(value, name_hint=binding.var.name)
        else:
            var = self.builder_.emit_output(value, name_hint=binding.var.name)
        self.set_var_remap(binding.var, var)
        # a block's output variable is used after the block: only dataflow variables are
        # re-bound inside a dataflow block
        if not isinstance(binding.var, relax.DataflowVar) and self._in_dataflow():
            return
        simple = self._simplified(var.ty)
        if simple is None:
            return
        cast = self.builder_.match_cast(var, simple, name_hint=binding.var.name)
        self.set_var_remap(binding.var, cast)

    def _in_dataflow(self) -> bool:
        return bool(self.builder_.current_block_is_dataflow())


def bound_shapes_pass() -> tvm.transform.Pass:
    """Every Relax function with shape-variable bounds gets its shapes simplified (above)."""

    @tvm.transform.module_pass(opt_level=0, name="RollerBoundShapes")
    def _rewrite(mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        mod = mod.clone()  # (assigning a function changes the module in place: the caller's)
        for gv, func in list(mod.functions_items()):
            if isinstance(func, relax.Function):
                ana = _analyzer(func)
                if ana is not None:
                    mod[gv] = _BoundShapes(ana, mod).visit_expr(func)
        return relax.transform.Normalize()(mod)

    return _rewrite



