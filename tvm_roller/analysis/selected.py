"""How much of each buffer parameter a function can touch.

A dimension every access indexes by the same value that no loop varies (a scalar parameter: the
expert a mixture-of-experts product reads, chosen at run time; a constant) is one slice of that
dimension, not all of it: a routed product of 8 stacked experts moves one expert's bytes."""
from __future__ import annotations

import math
from typing import Dict, Optional

import tvm_ffi
from tvm import tirx
from tvm.ir.expr import TensorLoad  # what tirx.BufferLoad(...) builds in TVM 0.27

from tvm_roller.analysis.visit import post_order_visit
from tvm_roller.hardware.model import dtype_bytes


def _free_of_loops(expr, scalars) -> bool:
    # (the visitor does not call back on its root); a value loaded from a buffer varies
    if isinstance(expr, TensorLoad):
        return False
    if isinstance(expr, tirx.Var):
        return any(expr.same_as(s) for s in scalars)
    found = []

    def f(n):
        if isinstance(n, TensorLoad) or (
                isinstance(n, tirx.Var) and not any(n.same_as(s) for s in scalars)):
            found.append(n)

    post_order_visit(expr, f)
    return not found


def selected_fraction(func: tirx.PrimFunc) -> Dict[str, float]:
    """Per buffer parameter (by name): the share of it the function can touch (1.0: all)."""
    scalars = [p for p in func.params if getattr(p.ty, "shape", None) is None]
    fixed: Dict[str, list] = {}  # per buffer, per dimension: its one loop-free index, or None

    def visit(node):
        if isinstance(node, (TensorLoad, tirx.BufferStore)):
            buf = node.buffer if isinstance(node, tirx.BufferStore) else node.source
            name = str(buf.name)
            index = [i if _free_of_loops(i, scalars) else None for i in node.indices]
            old = fixed.get(name)
            fixed[name] = index if old is None else [
                a if a is not None and b is not None and tvm_ffi.structural_equal(a, b) else None
                for a, b in zip(old, index)]

    post_order_visit(func.body, visit)
    out = {}
    for p in func.params:
        shape = getattr(p.ty, "shape", None)
        if shape is None or str(p.name) not in fixed:
            continue
        share = 1.0
        for index, size in zip(fixed[str(p.name)], shape):
            if index is not None and isinstance(size, tirx.IntImm) and int(size) > 1:
                share /= int(size)
        out[str(p.name)] = share
    return out


def touched_param_bytes(func: tirx.PrimFunc) -> Optional[int]:
    """One read or write of every buffer parameter, of the slice it can touch; None when a
    shape is symbolic."""
    total = 0
    share = selected_fraction(func)
    for p in func.params:
        shape = getattr(getattr(p, "ty", None), "shape", None)
        if shape is None:
            continue  # a scalar
        dims = [getattr(d, "value", d) for d in shape]
        if not all(isinstance(d, int) for d in dims):
            return None
        total += int(math.prod(dims) * dtype_bytes(str(p.dtype)) * share.get(str(p.name), 1.0))
    return total
