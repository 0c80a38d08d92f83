"""RMS and layer norms of float64 tensors computed in float64.

TVM 0.27's TOPI computes ``rms_norm`` in float32 whatever the input dtype (a float64 model's
norm is silently single precision, relative error ~1e-7) and refuses a float64 ``layer_norm``
("only support float32 and float16"; even ``FoldConstant`` trips on it). This pass replaces
each float64 norm, before anything legalizes it, by a call of a plain-TE float64 function
(reductions and elementwise stages roller schedules like any other). Norms of other dtypes
keep TVM's own legalization.
"""
from __future__ import annotations

import math
from typing import Callable, Dict, List, Sequence

import tvm
from tvm import relax, te

from tvm_roller.integrations.relax.passes.mutate import mutate_with_new_functions

_F64 = "float64"


def _axes(call: relax.Call, ndim: int) -> List[int]:
    return sorted(int(a) % ndim for a in call.attrs.axes)


def _reduced(x: te.Tensor, axes: Sequence[int], body: Callable, name: str) -> te.Tensor:
    """sum over ``axes`` of ``body(index)``, kept as a tensor over the other axes."""
    keep = [d for d in range(len(x.shape)) if d not in axes]
    red = [te.reduce_axis((0, x.shape[a]), f"r{a}") for a in axes]

    def at(*outer):
        idx = [None] * len(x.shape)
        for d, v in zip(keep, outer):
            idx[d] = v
        for a, r in zip(axes, red):
            idx[a] = r
        return te.sum(body(idx), axis=red)

    return te.compute([x.shape[d] for d in keep], at, name=name)


def _outer(i: Sequence, axes: Sequence[int]) -> list:
    return [v for d, v in enumerate(i) if d not in axes]


def _count(x: te.Tensor, axes: Sequence[int]) -> tvm.tirx.PrimExpr:
    return tvm.tirx.const(math.prod(int(x.shape[a]) for a in axes), _F64)


def _rms_norm_te(x: te.Tensor, w: te.Tensor, axes: Sequence[int], eps: float) -> te.Tensor:
    sq = _reduced(x, axes, lambda idx: x(*idx) * x(*idx), "rms_sq")
    n, e = _count(x, axes), tvm.tirx.const(eps, _F64)
    return te.compute(x.shape, lambda *i: x(*i) * w(*[i[a] for a in axes]) / te.sqrt(
        sq(*_outer(i, axes)) / n + e), name="rms_norm")


def _layer_norm_te(x: te.Tensor, gamma: te.Tensor, beta: te.Tensor, axes: Sequence[int],
                   eps: float, center: bool, scale: bool) -> te.Tensor:
    n, e = _count(x, axes), tvm.tirx.const(eps, _F64)
    total = _reduced(x, axes, lambda idx: x(*idx), "ln_sum")

    def dev(idx):
        d = x(*idx) - total(*_outer(idx, axes)) / n
        return d * d

    var = _reduced(x, axes, dev, "ln_var")

    def out(*i):
        o = _outer(i, axes)
        y = (x(*i) - total(*o) / n) / te.sqrt(var(*o) / n + e)
        w = [i[a] for a in axes]
        y = y * gamma(*w) if scale else y
        return y + beta(*w) if center else y

    return te.compute(x.shape, out, name="layer_norm")


def _dtype_of(expr: relax.Expr) -> str:
    return str(getattr(expr.ty, "dtype", ""))


def _rms(bb: relax.BlockBuilder, call: relax.Call) -> relax.Expr:
    axes, eps = _axes(call, len(call.args[0].ty.shape)), float(call.attrs.epsilon)
    return bb.call_te(lambda a, b: _rms_norm_te(a, b, axes, eps), *call.args,
                      primfunc_name_hint="rms_norm")


def _layer(bb: relax.BlockBuilder, call: relax.Call) -> relax.Expr:
    axes, a = _axes(call, len(call.args[0].ty.shape)), call.attrs
    return bb.call_te(lambda t, g, b: _layer_norm_te(t, g, b, axes, float(a.epsilon),
                                                     bool(a.center), bool(a.scale)),
                      *call.args, primfunc_name_hint="layer_norm")


_IN_DTYPE: Dict[str, Callable] = {"relax.nn.rms_norm": _rms, "relax.nn.layer_norm": _layer}


@relax.expr_functor.mutator
class _NormsInDtype(relax.expr_functor.PyExprMutator):
    def visit_call_(self, call):  # noqa: N802 (TVM's visitor name)
        call = super().visit_call_(call)
        rule = _IN_DTYPE.get(call.op.name) if isinstance(call.op, tvm.ir.Op) else None
        if rule is None or _dtype_of(call.args[0]) != _F64:
            return call
        return rule(self.builder_, call)


def norms_in_dtype_pass() -> tvm.transform.Pass:
    """The rewrite above on every Relax function (the new PrimFuncs join the module)."""

    @tvm.transform.module_pass(opt_level=0, name="RollerNormsInDtype")
    def _rewrite(mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        return mutate_with_new_functions(mod, _NormsInDtype)

    return _rewrite
