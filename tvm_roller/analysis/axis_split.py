"""A function's reduction block split along one spatial axis into a head and a tail part: the
mechanics the tail decompositions share (``vector_tail``, ``window_tail``).

Taken: a function whose top-level statements are perfect loop nests of one block each (the
loops zero-based and bound one to one), the last of them the only reduction (its producers,
e.g. a convolution's padding, before it; nothing after it). The rewritten function keeps the
producers, then the reduction over ``[0, head)`` of the axis, then over ``[head, extent)`` (an
offset in every index: both parts read the original buffers in place and write disjoint parts
of the output); the parts are the producers (when there are any), the head and the tail.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional, Tuple

import tvm
from tvm import s_tir, tirx

from tvm_roller.analysis.func import unwrap_func
from tvm_roller.analysis.parts import Decomposition


@dataclass(frozen=True)
class Nest:
    """A perfect loop nest around one block."""

    loops: Tuple[tirx.For, ...]
    block: s_tir.SBlock
    stmt: tirx.Stmt


@dataclass(frozen=True)
class Reduction:
    """The function's producers' nests, in order, and its reduction's nest (the last)."""

    func: tirx.PrimFunc
    producers: Tuple[Nest, ...]
    main: Nest

    def extent(self, axis: int) -> int:
        return int(self.main.block.iter_vars[axis].dom.extent)


def find_reduction(func) -> Optional[Reduction]:
    """The function as producers and one trailing reduction (see the module doc), or None."""
    func = unwrap_func(func)
    body = func.body
    if not isinstance(body, s_tir.SBlockRealize):
        return None
    stmts = list(body.block.body.seq) if isinstance(body.block.body, tirx.SeqStmt) \
        else [body.block.body]
    nests = [_nest(s) for s in stmts]
    if not nests or any(n is None for n in nests):
        return None
    *producers, main = nests
    if main.block.init is None or any(n.block.init is not None for n in producers):
        return None
    return Reduction(func, tuple(producers), main)


def _nest(stmt: tirx.Stmt) -> Optional[Nest]:
    node, loops = stmt, []
    while isinstance(node, tirx.For):
        loops.append(node)
        node = node.body
    if not isinstance(node, s_tir.SBlockRealize):
        return None
    block = node.block
    if len(loops) != len(block.iter_vars) or not _is_true(node.predicate) or \
            block.alloc_buffers or block.match_buffers:
        return None
    for loop, value, iv in zip(loops, node.iter_values, block.iter_vars):
        if not (isinstance(loop.min, tirx.IntImm) and int(loop.min) == 0 and
                value.same_as(loop.loop_var) and isinstance(iv.dom.extent, tirx.IntImm) and
                int(iv.dom.min) == 0 and int(iv.dom.extent) == int(loop.extent)):
            return None
    return Nest(tuple(loops), block, stmt)


def _is_true(pred) -> bool:
    return isinstance(pred, tirx.IntImm) and int(pred) == 1


def split(red: Reduction, axis: int, head: int, kind: str,
          reason: str) -> Optional[Decomposition]:
    """``red``'s function with its reduction split at ``head`` along block axis ``axis`` (see
    the module doc); None when the result is not well formed."""
    main, extent = red.main, red.extent(axis)
    name = main.block.name_hint
    parts = [_part(main, axis, 0, head, name),
             _part(main, axis, head, extent - head, f"{name}_tail")]
    root = red.func.body.block
    stmts = [n.stmt for n in red.producers] + parts
    new_root = s_tir.SBlock([], [], [], "root", tirx.SeqStmt(stmts),
                            alloc_buffers=list(root.alloc_buffers))
    new = red.func.with_body(s_tir.SBlockRealize([], True, new_root))
    if not s_tir.analysis.verify_well_formed(new, assert_mode=False):
        return None
    var = main.block.iter_vars[axis].var.name
    groups = [(name,), (f"{name}_tail",)]
    labels = [f"{var} 0:{head}", f"{var} {head}:{extent}"]
    if red.producers:
        groups.insert(0, tuple(n.block.name_hint for n in red.producers))
        labels.insert(0, "prologue")
    return Decomposition(kind, reason, new, tuple(groups), tuple(labels))


def _part(main: Nest, axis: int, offset: int, extent: int, name: str) -> tirx.Stmt:
    """The reduction over ``extent`` of ``axis`` from ``offset``, under its loops (fresh
    variables: each part defines its own)."""
    block = main.block
    olds = [iv.var for iv in block.iter_vars]
    news = [tirx.Var(v.name, _dtype(v)) for v in olds]
    values = list(news)
    if offset:
        values[axis] = news[axis] + tirx.IntImm(_dtype(olds[axis]), offset)
    ivs = []
    for i, (iv, var) in enumerate(zip(block.iter_vars, news)):
        dom = iv.dom if i != axis else tvm.ir.Range.from_min_extent(
            tirx.IntImm(_dtype(var), 0), tirx.IntImm(_dtype(var), extent))
        ivs.append(tirx.IterVar(dom, var, iv.iter_type))
    body, init = (_substituted(store, olds, values) for store in (block.body, block.init))
    bare = s_tir.SBlock(ivs, [], [], name, body, init)
    buffers = {r.source: r.source for r in list(block.reads) + list(block.writes)}
    reads, writes = s_tir.analysis.get_sblock_read_write_region(bare, buffers)
    new_block = s_tir.SBlock(ivs, reads, writes, name, body, init, annotations=block.annotations)
    loop_vars = [tirx.Var(lp.loop_var.name, _dtype(lp.loop_var)) for lp in main.loops]
    stmt = s_tir.SBlockRealize(loop_vars, True, new_block)
    for i in reversed(range(len(main.loops))):
        loop = main.loops[i]
        ext = tirx.IntImm(_dtype(loop.extent), extent) if i == axis else loop.extent
        stmt = tirx.For(loop_vars[i], loop.min, ext, tirx.ForKind.SERIAL, stmt)
    return stmt


def _substituted(store, olds, values):
    """``store`` (a BufferStore) with ``olds`` replaced by ``values`` (an IndexMap substitutes
    expressions; TVM 0.27 exposes no statement substitution to Python)."""
    if not isinstance(store, tirx.BufferStore):
        raise ValueError("a reduction whose update is not one store")
    exprs = [store.value] + list(store.indices)
    new = list(tirx.IndexMap(list(olds), exprs, None).map_indices(list(values)))
    return tirx.BufferStore(store.buffer, new[0], new[1:])


def _dtype(e) -> str:
    return str(e.ty.dtype)
