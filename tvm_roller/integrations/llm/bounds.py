"""Roofline bounds for the integer kernels of quantized weights (``quant_linear``): they are
built whole for the route, not planned, so the scheduler gives them no bound; each gets the
bound of one row, a decode step's (its packed weight's bytes at the bandwidth of the level
they live in), a lower bound for a prompt's rows too."""
from __future__ import annotations

from tvm import tirx

from tvm_roller.analysis.symbolic import shape_vars, specialize
from tvm_roller.core.errors import UnsupportedError
from tvm_roller.planner import Context
from tvm_roller.planner.roofline import bound_of


def one_row_bounds(report: list, mod, ctx: Context) -> None:
    """Every "quant-linear" entry of ``report`` without a bound gets its kernel's (in
    ``mod``) at one row."""
    funcs = {str(gv.name_hint): f for gv, f in mod.functions_items()}
    for entry in report:
        func = funcs.get(entry["name"])
        if entry.get("kind") != "quant-linear" or entry.get("bound_s") is not None \
                or not isinstance(func, tirx.PrimFunc):
            continue
        try:
            b = bound_of(specialize(func, {n: 1 for n in shape_vars(func)}), ctx)
        except UnsupportedError:
            continue
        if b is not None:
            entry["bound_s"], entry["bound_by"] = b.seconds, f"{b.by} (one row)"
