"""Vectorizable erf / GELU for the Relax pipeline.

LLVM lowers ``erf`` to a scalar libm call per element, so a GELU epilogue runs at a few ns per
element whatever the schedule. Here erf is roller's rational function of x^2 (multiplies, adds
and one divide, all of which vectorize; :func:`tvm_roller.backends.vector_math.erf`, the
one the CPU lowering also puts in place of ``T.erf``): max abs error 3.5e-7 in float32. Only
float32 is rewritten (float64 would lose precision); other dtypes keep TVM's own legalization.
"""
from __future__ import annotations

from typing import Callable, Dict

import tvm
from tvm import relax, te

from tvm_roller.backends.vector_math import erf_expr

_SQRT_HALF = 0.7071067811865476
_F32 = "float32"


def _f32(v: float) -> tvm.tirx.PrimExpr:
    return tvm.tirx.const(v, _F32)


def _legalize(op_name: str, body: Callable) -> Callable:
    default = tvm.ir.Op.get(op_name).get_attr("FLegalize")

    def legalize(bb: relax.BlockBuilder, call: relax.Call) -> relax.Expr:
        x = call.args[0]
        if str(getattr(x.ty, "dtype", "")) != _F32:
            return default(bb, call)
        name = op_name.split(".")[-1]
        return bb.call_te(lambda t: te.compute(t.shape, lambda *i: body(t(*i)), name=name), x,
                          primfunc_name_hint=name)

    return legalize


def legalize_map() -> Dict[str, Callable]:
    """``LegalizeOps(customize_legalize_map=...)`` entries for erf and exact GELU."""
    return {
        "relax.erf": _legalize("relax.erf", erf_expr),
        "relax.nn.gelu": _legalize(
            "relax.nn.gelu", lambda x: _f32(0.5) * x * (_f32(1.0) + erf_expr(x * _f32(_SQRT_HALF)))),
    }
