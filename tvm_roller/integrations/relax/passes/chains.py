"""Relax: group each matmul -> ... -> matmul chain into one primitive function.

TVM's FuseOps never puts two matmuls in one PrimFunc. This pass, run before legalization, finds a
matmul whose first operand is computed from another matmul's result by a region of other ops
(reshapes, softmax, masks, GELU, bias adds, ...) that nothing else uses, and moves the two
matmuls and that region into a function marked ``Primitive``: LegalizeOps and FuseTIR then make
it one PrimFunc, which roller's planner fuses (or runs operator by operator) as the data-movement
model decides. The second matmul's other operand and any value the region reads from outside are
parameters of the new function.
"""
from __future__ import annotations

import math
from typing import Callable, Dict, List, Optional, Set, Tuple

import tvm
from tvm import relax, s_tir

from tvm_roller.analysis.visit import post_order_visit

_MATMUL = tvm.ir.Op.get("relax.matmul")


def _is_matmul(binding) -> bool:
    v = getattr(binding, "value", None)
    return isinstance(v, relax.Call) and v.op.same_as(_MATMUL)


def _vars_of(expr) -> List[relax.Var]:
    return list(relax.analysis.free_vars(expr))


@relax.expr_functor.mutator
class _Rename(relax.expr_functor.PyExprMutator):
    """Replace variables by the function's parameters / new bindings."""

    def __init__(self, mapping: Dict[relax.Var, relax.Expr]):
        super().__init__()
        self.mapping = mapping

    def visit_var_(self, op):  # noqa: N802 (TVM's visitor name)
        return self.mapping.get(op, op)

    def visit_dataflow_var_(self, op):  # noqa: N802
        return self.mapping.get(op, op)

    def visit_generic_const_(self, op):  # noqa: N802
        return self.mapping.get(op, op)



def find_chains(block) -> List[Tuple[int, List[int], int]]:
    """(first matmul, region between, second matmul) binding indices in a dataflow block."""
    bindings = list(block.bindings)
    index = {b.var: i for i, b in enumerate(bindings)}
    users: Dict[int, Set[int]] = {i: set() for i in range(len(bindings))}
    for i, b in enumerate(bindings):
        for v in _vars_of(b.value):
            if v in index:
                users[index[v]].add(i)
    taken: Set[int] = set()
    chains = []
    for j, b2 in enumerate(bindings):
        if not _is_matmul(b2) or j in taken:
            continue
        a = b2.value.args[0]
        if a not in index:
            continue
        back, first = set(), None
        stack = [index[a]]
        while stack:  # what the first operand is computed from, back to a matmul
            i = stack.pop()
            if i in back:
                continue
            if _is_matmul(bindings[i]):
                if first is None or first == i:
                    first = i
                    continue
                first = -1  # two matmuls feed it: not a simple chain
                break
            back.add(i)
            stack += [index[v] for v in _vars_of(bindings[i].value) if v in index]
        if first is None or first < 0 or first in taken or \
                not _rows_carried(bindings[first], b2):
            continue
        fwd, stack = set(), [first]
        while stack:  # what the first matmul's result flows into
            i = stack.pop()
            for u in users[i]:
                if u not in fwd and u != j:
                    fwd.add(u)
                    stack.append(u)
        region = sorted(back & fwd)
        group = set(region) | {first}
        # closed: nothing but the group and the second matmul uses what the group computes
        if any(u not in group and u != j for i in group for u in users[i]):
            continue
        if index.get(a) not in group:
            continue
        chains.append((first, region, j))
        taken |= group | {j}
    return chains


def _static_shape(expr) -> Optional[List[int]]:
    dims = getattr(expr.ty, "shape", None)
    if dims is None or not all(isinstance(d, tvm.tirx.IntImm) for d in dims):
        return None
    return [int(d) for d in dims]


def _rows_carried(first, second) -> bool:
    """Whether the second matmul's left operand has the first matmul's rows and columns (an
    m x l matrix per batch, reached through elementwise and row-wise ops): a chain a fused
    kernel can compute row block by row block. A reshape or a permutation in between (a Q
    projection feeding Q.K^T through the heads' split) makes other rows: no chain."""
    out, a = _static_shape(first.var), _static_shape(second.value.args[0])
    if out is None or a is None or len(out) < 2 or len(a) < 2:
        return False
    return out[-2:] == a[-2:] and math.prod(out[:-2]) == math.prod(a[:-2])


def chain_shape(first, second) -> Optional[Tuple[List[int], int, int, int, int, str]]:
    """(batch, m, k, l, n, dtype) of a matmul -> ... -> matmul chain from the bindings' types;
    None when a shape is not static or the matmuls are not plain (batch) ones."""
    def shape(expr):
        ty = expr.ty
        dims = getattr(ty, "shape", None)
        if dims is None or not all(isinstance(d, tvm.tirx.IntImm) for d in dims):
            return None
        return [int(d) for d in dims]

    a, b = (shape(x) for x in first.value.args)
    d = shape(second.value.args[1])
    out = shape(second.var)
    if None in (a, b, d, out) or len(a) < 2 or len(b) < 2 or len(d) < 2:
        return None
    m, k = a[-2:]
    l, n = b[-1], d[-1]  # noqa: E741
    return out[:-2], m, k, l, n, str(first.var.ty.dtype)


# ops between the matmuls that reduce each row (a fused kernel must hold whole rows for them)
_ROW_REDUCTIONS = {"relax.nn.softmax", "relax.nn.log_softmax", "relax.max", "relax.min",
                   "relax.sum", "relax.mean", "relax.nn.layer_norm", "relax.nn.rms_norm",
                   "tir:reduction"}

def _tir_kind(func) -> str:
    kinds = set()
    post_order_visit(func.body, lambda n: kinds.update(int(iv.iter_type) for iv in n.iter_vars)
                     if isinstance(n, s_tir.SBlock) else None)
    return "tir:reduction" if 2 in kinds else "tir:elementwise"


def stage_kinds(mod: tvm.IRModule, region) -> List[str]:
    """What each binding between the matmuls does: its Relax op's name; ``tir:reduction`` or
    ``tir:elementwise`` for a PrimFunc it calls; ``identity`` for a broadcast to its own shape."""
    kinds = []
    for b in region:
        v = b.value
        if not (isinstance(v, relax.Call) and isinstance(v.op, tvm.ir.Op)):
            kinds.append(type(v).__name__)
        elif v.op.name == "relax.call_tir" and v.args[0] in mod.get_global_vars():
            kinds.append(_tir_kind(mod[v.args[0]]))
        elif v.op.name == "relax.broadcast_to" and \
                list(v.args[0].ty.shape) == list(b.var.ty.shape):
            kinds.append("identity")
        else:
            kinds.append(v.op.name)
    return kinds


def reduces_rows(kinds: List[str]) -> bool:
    """Whether a stage reduces rows (a softmax, a norm)."""
    return any(k in _ROW_REDUCTIONS for k in kinds)


def group_gemm_chains(mod: tvm.IRModule, func_name: str = "main",
                      decide: Optional[Callable] = None) -> Tuple[tvm.IRModule, List[str]]:
    """The module with each chain of ``func_name`` in its own primitive function; their names.
    ``decide(first, second, kinds)`` (the two matmul bindings, ``stage_kinds`` of the bindings
    between them) -> bool keeps a chain out when False:
    its operators then go through the normal per-operator fusion and scheduling."""
    func = mod[func_name]
    body = func.body
    if not isinstance(body, relax.SeqExpr):
        return mod, []
    bb = relax.BlockBuilder(mod)
    new_blocks, names = [], []
    for block in body.blocks:
        if not isinstance(block, relax.DataflowBlock):
            new_blocks.append(block)
            continue
        chains = find_chains(block)
        if not chains:
            new_blocks.append(block)
            continue
        bindings = list(block.bindings)
        replace: Dict[int, relax.Binding] = {}
        drop: Set[int] = set()
        for first, region, second in chains:
            if decide is not None and not decide(
                    bindings[first], bindings[second],
                    stage_kinds(mod, [bindings[i] for i in region])):
                continue
            name = f"roller_gemm_chain_{len(names)}"
            gv, call = _outline(bb, name, [bindings[i] for i in [first] + region + [second]])
            replace[second] = relax.VarBinding(bindings[second].var, call)
            drop |= set([first] + region)
            names.append(gv.name_hint)
        kept = [replace.get(i, b) for i, b in enumerate(bindings) if i not in drop]
        new_blocks.append(relax.DataflowBlock(kept))
    if not names:
        return mod, []
    new_func = relax.Function(func.params, relax.SeqExpr(new_blocks, body.body), func.ret_ty,
                              func.is_pure, func.attrs)
    bb.update_func(bb.get().get_global_var(func_name), new_func)
    return relax.transform.Normalize()(bb.get()), names


def _name(v) -> str:
    name = getattr(v, "name_hint", None)
    return str(name) if name else str(v)


def _outline(bb: relax.BlockBuilder, name: str, group: List[relax.Binding]):
    """A primitive function computing ``group`` (bindings in order) from its free variables."""
    defined = {b.var for b in group}
    inputs: list = []
    for b in group:
        for v in _vars_of(b.value):
            if v not in defined and v not in inputs:
                inputs.append(v)
    # tensor constants (weights) become parameters too: FuseTIR takes none inside a primitive
    # function (scalars stay, they become TIR immediates)
    consts: list = []
    for b in group:
        relax.analysis.post_order_visit(b.value, lambda n: consts.append(n) if isinstance(
            n, tvm.ir.expr.GenericConst) and getattr(n.ty, "ndim", 0) != 0 and
            not any(n.same_as(c) for c in consts) else None)
    inputs += consts
    params = [relax.Var(_name(v) if not isinstance(v, tvm.ir.expr.GenericConst)
                        else f"weight{i}", v.ty) for i, v in enumerate(inputs)]
    mapping: Dict[relax.Var, relax.Expr] = dict(zip(inputs, params))
    # built in a builder of its own, then added: BlockBuilder.add_func returns the GlobalVar of
    # an existing, structurally equal function (a repeated layer's chain) instead of a new name
    local = relax.BlockBuilder()
    with local.function(name, params, attrs={"Primitive": True}, pure=True, private=True):
        with local.dataflow():
            out: Optional[relax.Var] = None
            for b in group:
                value = _Rename(mapping).visit_expr(b.value)
                out = local.emit(value, name_hint=_name(b.var))
                mapping[b.var] = out
            res = local.emit_output(out)
        local.emit_func_output(res)
    built = local.get()
    gv = bb.add_func(built[built.get_global_var(name)], name)
    return gv, relax.Call(gv, inputs)
