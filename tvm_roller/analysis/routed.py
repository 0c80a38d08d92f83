"""The mark of a routed product: ``rows @ stored[expert]`` (a mixture-of-experts layer's product
over one of its stacked experts, the expert chosen at run time) is a PrimFunc carrying
``ROUTED``: its weight's layout and, when fixed, the expert it reads. A later pass finds the
product by the mark instead of by the kernel's shape (weight-only quantization rewrites it onto
the packed experts)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import tvm
from tvm import relax, tirx

ROUTED = "roller.routed_matmul"


def routed_attrs(transposed: bool, expert) -> dict:
    """The PrimFunc attributes of a routed product (``expert``: an int when fixed; a variable
    otherwise, then the call's one scalar argument)."""
    fixed = int(expert) if isinstance(expert, (int, tirx.IntImm)) else -1
    return {ROUTED: {"transposed": int(transposed), "expert": fixed}}


@dataclass(frozen=True)
class RoutedCall:
    """One routed product as a Relax call reads it: ``rows [m, k]`` by expert ``expert`` of
    ``stored`` (``[experts, n, k]`` when ``transposed``, else ``[experts, k, n]``)."""

    rows: relax.Expr
    stored: relax.Expr
    expert: tirx.PrimExpr
    transposed: bool


def routed_call(expr, mod: tvm.IRModule) -> Optional[RoutedCall]:
    """``expr`` as a routed product (a ``call_tir`` of a marked PrimFunc in ``mod``), or None."""
    if not (isinstance(expr, relax.Call) and getattr(expr.op, "name", "") == "relax.call_tir"):
        return None
    gv = expr.args[0]
    func = mod.functions.get(gv) if isinstance(gv, tvm.ir.GlobalVar) else None
    mark = func.attrs.get(ROUTED) if func is not None and func.attrs is not None else None
    if mark is None:
        return None
    args = list(expr.args[1].fields)
    fixed = int(mark["expert"])
    if fixed >= 0:
        expert = tirx.IntImm("int64", fixed)
    elif len(args) > 2 and tvm.ir.is_prim_expr(args[2]):  # (a scalar argument is its value)
        expert = args[2]
    else:
        return None
    return RoutedCall(args[0], args[1], expert, bool(int(mark["transposed"])))
