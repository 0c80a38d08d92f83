"""Symbolic extents: a PrimFunc's shape variables, and the function at given values of them.

A function exported with a dynamic batch or sequence length has buffers whose shapes are
expressions of shape variables (``(n, 768)``, ``(1, n + 1)``), and sometimes the variable as a
scalar parameter too. Roller plans static functions: :func:`specialize` gives the function at
one value of each variable (what a bucket is planned at), and :func:`dynamic_axes` says which
axes of the main block follow a variable (what the bucket's kernel pads to its task tile).
"""
from __future__ import annotations

from typing import Dict, List, Mapping, Optional, Sequence, Tuple

import tvm
import tvm.sym
from tvm import s_tir, tirx

from tvm_roller.analysis.func import Axis, _is_buffer, unwrap_func
from tvm_roller.core.errors import UnsupportedError


def shape_vars(func) -> Dict[str, tirx.Var]:
    """name -> variable, for every variable in the parameters' shapes, in order of
    appearance; {} for a static function. (A scalar parameter is one only when a shape names
    it: one used as data, a divisor say, is not a shape.)"""
    func = unwrap_func(func)
    found: Dict[str, tirx.Var] = {}
    for p in func.params:
        if _is_buffer(p):
            for dim in p.shape:
                if not isinstance(dim, tirx.IntImm):
                    for var in tirx.analysis.undefined_vars(dim, []):
                        found.setdefault(str(var.name), var)
    return found


def is_symbolic(func) -> bool:
    return bool(shape_vars(func))


def specialize(func, values: Mapping[str, int]) -> tirx.PrimFunc:
    """``func`` with each named shape variable replaced by its value: the buffers whose shapes
    name a variable bare re-declared with the values and scalar parameters bound (TVM's
    ``specialize`` substitutes the values into every other shape). A variable without a value,
    one that no buffer or parameter binds alone, or a shape that is not positive, is an
    UnsupportedError."""
    func = unwrap_func(func)
    variables = shape_vars(func)
    missing = sorted(set(variables) - set(values))
    if missing:
        raise UnsupportedError(f"no value for shape variable(s) {', '.join(missing)}")
    binding = {variables[n]: tirx.IntImm(str(variables[n].ty.dtype), int(values[n]))
               for n in variables}
    ana = tvm.sym.Analyzer()
    for var, value in binding.items():
        ana.bind(var, value)
    mapping, bound = {}, set()
    for p in func.params:
        if not _is_buffer(p):
            if p.same_as(variables.get(str(p.name))):
                mapping[p] = binding[p]
                bound.add(str(p.name))
            continue
        dims = [d for d in p.shape if not isinstance(d, tirx.IntImm)]
        if not dims or not all(isinstance(d, tvm.ir.expr.Var) for d in dims):
            continue  # static, or an expression: substituted by specialize
        shape = []
        for i, dim in enumerate(p.shape):
            value = ana.simplify(dim)
            if int(value.value) <= 0:
                raise UnsupportedError(f"dimension {i} of {p.name} is {dim} = {value} at "
                                       f"{dict(values)}")
            shape.append(value)
        bound.update(str(d.name) for d in dims)
        # (the same alignment: TVM's specialize checks it; a hand-written kernel such as
        # TVM's topk declares 8-byte buffers)
        mapping[p] = tirx.decl_buffer(shape, p.dtype, p.name,
                                      data_alignment=int(p.data_alignment))
    unbound = sorted(set(variables) - bound)
    if unbound:
        raise UnsupportedError(f"shape variable(s) {', '.join(unbound)} appear only inside "
                               "shape expressions: no buffer or parameter binds them")
    out = func.specialize(mapping)
    for p in out.params:
        for i, dim in enumerate(getattr(p, "shape", None) or ()):
            # (TVM's specialize leaves a constant expression unfolded: the schedule helpers
            # read shapes as numbers)
            if not isinstance(dim, tirx.IntImm) or int(dim.value) <= 0:
                raise UnsupportedError(f"dimension {i} of {p.name} is {dim} at {dict(values)}")
    return out


def dynamic_axes(at: Sequence[Axis], elsewhere: Sequence[Axis]) -> List[int]:
    """The axes whose extent differs between two specialisations of one function (the
    main block's axes at two values of the shape variables): those that follow a variable."""
    if [a.name for a in at] != [a.name for a in elsewhere]:
        raise UnsupportedError("the main block's axes change with the shape variables")
    return [i for i, (a, b) in enumerate(zip(at, elsewhere)) if a.extent != b.extent]


def dispatch(func: tirx.PrimFunc, branches: Sequence[Tuple[Optional[tirx.PrimExpr],
                                                           tirx.PrimFunc]]) -> tirx.PrimFunc:
    """One function running the first branch whose condition holds (the last branch's
    condition is not tested): each branch a scheduled version of ``func``, its root block's
    buffers allocated inside its branch, except the function's own intermediates that every
    branch still holds (one buffer allocated twice fails TVM's lowering): those once, at the
    top. Every branch must have ``func``'s parameters."""
    func = unwrap_func(func)
    roots = []
    for kernel in (k for _, k in branches):
        if len(kernel.params) != len(func.params) or \
                not all(a.same_as(b) for a, b in zip(kernel.params, func.params)):
            raise UnsupportedError("a bucket's kernel has other parameters than its function")
        if not isinstance(kernel.body, s_tir.SBlockRealize):
            raise UnsupportedError("a bucket's kernel has no root block")
        roots.append(kernel.body.block)
    seen: Dict[int, int] = {}
    shared: List = []
    for root in roots:
        for buf in root.alloc_buffers:
            seen[buf.id_] = seen.get(buf.id_, 0) + 1
            if seen[buf.id_] == 2:
                shared.append(buf)
    stmt = None
    for i in reversed(range(len(branches))):
        root = roots[i]
        own = [b for b in root.alloc_buffers if seen[b.id_] == 1]
        body = s_tir.SBlockRealize([], True, s_tir.SBlock(
            [], [], [], f"bucket_{i}", root.body, alloc_buffers=own))
        cond = branches[i][0]
        stmt = body if stmt is None or cond is None else tirx.IfThenElse(cond, body, stmt)
    top = s_tir.SBlockRealize([], True, s_tir.SBlock([], [], [], "root", stmt,
                                                     alloc_buffers=shared))
    out = tirx.PrimFunc(func.params, top, func.ret_type, branches[0][1].attrs)
    # the kernels share the function's loop variables: each branch gets its own (a variable
    # defined twice, with other bounds, fails TVM's analyzer)
    return s_tir.transform.ConvertSSA()(tvm.IRModule({"main": out}))["main"]
