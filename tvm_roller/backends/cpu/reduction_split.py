"""A row reduction over an axis that is not a whole number of vectors (softmax and norms over
197, 198, 1,214 or 1,500 columns), split into an aligned main part and a short tail.

``rfactor`` vectorizes a reduction only over a loop split exactly into lanes (TVM 0.27 drops a
split's predicate when it factors it, and ``loop_partition`` re-runs a reduction's init in each
part), so such a reduction used to run scalar: 4.8 GB/s against 31 for the aligned row. Here the
block becomes two blocks of the same body: the main one folds columns ``[0, E - E % lanes)``
into a new buffer, the tail continues that fold over the last ``E % lanes`` columns from the
main one's result (its init reads it). That is the sequential fold itself, so the result is
exact for any combiner; the main block's extent is whole vectors and is vectorized by rfactor.
"""
from __future__ import annotations

from typing import Dict, List, Optional, Tuple

import tvm
import tvm_ffi
from tvm import s_tir, tirx
from tvm.ir.expr import TensorLoad

#: update expressions whose fold rfactor recognizes (a sum, a product, a max, a min)
_COMBINERS = (tirx.Add, tirx.Mul, tirx.Max, tirx.Min)


def split_unaligned_reductions(func: tirx.PrimFunc, lanes: int) -> tirx.PrimFunc:
    """``func`` with every splittable reduction split (see the module); unchanged if none."""
    realize = func.body
    if not isinstance(realize, s_tir.SBlockRealize) or lanes <= 1:
        return func
    root = realize.block
    body = root.body
    stmts = list(body.seq) if isinstance(body, tirx.SeqStmt) else [body]
    out: List[tirx.Stmt] = []
    allocs = list(root.alloc_buffers)
    for stmt in stmts:
        split = _split_nest(stmt, lanes)
        if split is None:
            out.append(stmt)
            continue
        main, tail, partial = split
        out += [main, tail]
        allocs.append(partial)
    if len(out) == len(stmts):
        return func
    new_root = s_tir.SBlock(root.iter_vars, root.reads, root.writes, root.name_hint,
                            tirx.SeqStmt(out), root.init, allocs, root.match_buffers,
                            root.annotations)
    return tirx.PrimFunc(func.params, s_tir.SBlockRealize([], True, new_root), func.ret_type,
                         func.attrs)


def _nest(stmt: tirx.Stmt) -> Tuple[List[tirx.For], tirx.Stmt]:
    loops = []
    while isinstance(stmt, tirx.For):
        loops.append(stmt)
        stmt = stmt.body
    return loops, stmt


def _const(expr) -> Optional[int]:
    return int(expr.value) if isinstance(expr, tirx.IntImm) else None


def _splittable(loops: List[tirx.For], realize, lanes: int) -> Optional[Tuple[int, int]]:
    """(the reduction's block axis, its loop's position) when the loop nest computes one
    reduction block over one unaligned axis of more than ``lanes`` columns, bound to its own
    loop, with a body ``acc = combine(acc, value)``."""
    if not isinstance(realize, s_tir.SBlockRealize) or not _is_true(realize.predicate):
        return None
    blk = realize.block
    red = [i for i, iv in enumerate(blk.iter_vars) if int(iv.iter_type) == 2]
    if len(red) != 1 or blk.init is None or len(blk.writes) != 1:
        return None
    r = red[0]
    dom = blk.iter_vars[r].dom
    ext = _const(dom.extent)
    if _const(dom.min) != 0 or ext is None or ext <= lanes or ext % lanes == 0:
        return None
    store = blk.body
    if not isinstance(store, tirx.BufferStore) or not isinstance(blk.init, tirx.BufferStore):
        return None
    if not _folds_into(store):
        return None
    binding = realize.iter_values[r]
    pos = next((i for i, l in enumerate(loops) if l.loop_var.same_as(binding)), None)
    if pos is None or _const(loops[pos].min) != 0 or _const(loops[pos].extent) != ext:
        return None
    if sum(1 for v in realize.iter_values if _uses(v, binding)) != 1:
        return None
    return r, pos


def _is_true(pred) -> bool:
    return pred is True or (isinstance(pred, tirx.IntImm) and int(pred.value) == 1)


def _folds_into(store: tirx.BufferStore) -> bool:
    """The update is ``acc[idx] = combine(acc[idx], value)`` (either operand order)."""
    val = store.value
    if not isinstance(val, _COMBINERS):
        return False

    def is_acc(node) -> bool:
        return (isinstance(node, TensorLoad) and node.source.same_as(store.buffer)
                and len(node.indices) == len(store.indices)
                and all(a.same_as(b) for a, b in zip(node.indices, store.indices)))

    return is_acc(val.a) != is_acc(val.b)


def _uses(expr, var) -> bool:
    # (a binding may be the bare loop variable, which analysis.visit, walking fields, skips)
    found = []
    tvm_ffi.structural_map(expr, (tirx.Var, lambda v: found.append(v) or v
                                  if v.same_as(var) else v))
    return bool(found)


def _split_nest(stmt: tirx.Stmt, lanes: int):
    """(the main nest, the tail nest, the main part's buffer), or None."""
    loops, realize = _nest(stmt)
    found = _splittable(loops, realize, lanes)
    if found is None:
        return None
    r, pos = found
    blk = realize.block
    ext_of = blk.iter_vars[r].dom.extent  # int32 or int64: the new bounds take its type
    ext = _const(ext_of)
    main_ext = ext - ext % lanes
    acc = blk.writes[0].source
    partial = tirx.decl_buffer(acc.shape, acc.dtype, f"{acc.name}_main")
    # the main part: the block on [0, main_ext) into ``partial``, with fresh variables (a
    # variable is defined once in a function)
    main_blk = _with_axis(blk, r, _range(0, main_ext, ext_of), f"{blk.name_hint}_main")
    renames: Dict[object, object] = {acc: partial}
    for node in loops:
        renames[node.loop_var] = tirx.Var(str(node.loop_var.name), node.loop_var.ty)
    for iv in blk.iter_vars:
        renames[iv.var] = tirx.Var(str(iv.var.name), iv.var.ty)
    main = _rename(_wrap(loops, pos, _range(0, main_ext, loops[pos].extent), realize,
                         main_blk), renames)
    # the tail: the original block on [main_ext, ext), its fold starting from the main part's
    idx = blk.init.indices
    point = [tvm.ir.Range.from_min_extent(i, 1) for i in idx]
    tail_blk = s_tir.SBlock(
        _axes(blk, r, _range(main_ext, ext - main_ext, ext_of)),
        list(blk.reads) + [tirx.BufferRegion(partial, point)], blk.writes, blk.name_hint,
        blk.body, tirx.BufferStore(acc, tirx.BufferLoad(partial, idx), idx),
        blk.alloc_buffers, blk.match_buffers, blk.annotations)
    tail = _wrap(loops, pos, _range(main_ext, ext - main_ext, loops[pos].extent), realize,
                 tail_blk)
    return main, tail, partial


def _range(start: int, ext: int, like) -> tvm.ir.Range:
    return tvm.ir.Range.from_min_extent(tirx.IntImm(like.ty, start), tirx.IntImm(like.ty, ext))


def _axes(blk, r: int, dom) -> list:
    ivs = list(blk.iter_vars)
    ivs[r] = tirx.IterVar(dom, ivs[r].var, int(ivs[r].iter_type))
    return ivs


def _with_axis(blk, r: int, dom, name: str):
    return s_tir.SBlock(_axes(blk, r, dom), blk.reads, blk.writes, name, blk.body, blk.init,
                        blk.alloc_buffers, blk.match_buffers, blk.annotations)


def _wrap(loops: List[tirx.For], pos: int, span: tvm.ir.Range, realize, blk) -> tirx.Stmt:
    """The loop nest around ``blk`` with loop ``pos`` running over ``span``."""
    body: tirx.Stmt = s_tir.SBlockRealize(realize.iter_values, realize.predicate, blk)
    for i in reversed(range(len(loops))):
        node = loops[i]
        lo, n = (span.min, span.extent) if i == pos else (node.min, node.extent)
        body = tirx.For(node.loop_var, lo, n, node.kind, body, node.thread_binding,
                        node.annotations)
    return body


def _rename(stmt: tirx.Stmt, renames: Dict[object, object]) -> tirx.Stmt:
    by_id = [(old, new) for old, new in renames.items()]

    def swap(v):
        for old, new in by_id:
            if v.same_as(old):
                return new
        return v

    return tvm_ffi.structural_map(stmt, (tirx.Var, swap))
