"""A chain roller declines to fuse, built as its operators one by one: the same kernels roller
builds for each operator alone, in one function.

The chain's PrimFunc is cut into operator groups, each the function of a single operator (the
first matmul with its padding and the elementwise stages after it; the row-wise stages such as
softmax; the second matmul), each group is planned and scheduled by roller as if it were alone,
and the scheduled bodies are put back in order into the chain's function, the intermediates
between groups allocated there. Each group keeps the original buffers, so the stitched function
has the chain's parameters and nothing is copied.

The result is scheduled IR, not a schedule trace: MetaSchedule records take the traceable
in-function schedule (``lower_cpu.apply_unfused``) instead.
"""
from __future__ import annotations

import logging
from typing import Callable, Dict, List, Sequence

import tvm
import tvm_ffi
from tvm import s_tir, tirx

from tvm_roller.analysis import unwrap_func
from tvm_roller.analysis.visit import post_order_visit
from tvm_roller.core.errors import UnsupportedError
from tvm_roller.fusion.chain import GemmChain

logger = logging.getLogger("tvm_roller")


def _is_injective(block) -> bool:
    return all(int(iv.iter_type) == 0 for iv in block.iter_vars)


def _root(func: tirx.PrimFunc):
    realize = func.body
    if not isinstance(realize, s_tir.SBlockRealize):
        raise UnsupportedError("chain function without a root block: cannot split it")
    return realize.block


def _top_level(root) -> List[tirx.Stmt]:
    body = root.body
    return list(body.seq) if isinstance(body, tirx.SeqStmt) else [body]


def _block_of(stmt: tirx.Stmt):
    """The one block a top-level loop nest of ``te.create_prim_func`` computes."""
    found = []

    def visit(node):
        if isinstance(node, s_tir.SBlock):
            found.append(node)

    post_order_visit(stmt, visit)
    if len(found) != 1:
        raise UnsupportedError(f"a top-level loop nest with {len(found)} blocks: cannot split "
                               "the chain into its operators")
    return found[0]


def operator_groups(chain: GemmChain, blocks: Dict[str, object]) -> List[List[str]]:
    """The chain's blocks as the operators a model would run one by one: the first matmul with
    its prologue and the elementwise stages after it (an epilogue), the rest of the stages
    (a row-wise op such as softmax), the second matmul."""
    between = list(chain.between)
    lead = 0
    while lead < len(between) and _is_injective(blocks[between[lead]]):
        lead += 1
    groups = [chain.producers + [chain.first] + between[:lead]]
    if between[lead:]:
        groups.append(between[lead:])
    groups.append([chain.second])
    return groups


def _blocks(func: tirx.PrimFunc):
    """(the root block, block name -> its top-level statement, block name -> block)."""
    root = _root(func)
    owner, blocks = {}, {}
    for stmt in _top_level(root):
        blk = _block_of(stmt)
        owner[blk.name_hint] = stmt
        blocks[blk.name_hint] = blk
    return root, owner, blocks


def split_groups(func: tirx.PrimFunc, groups: Sequence[Sequence[str]]):
    """(one PrimFunc per group of blocks, the buffers between groups), sharing the function's
    Buffer objects; ``groups`` cover every block, in order."""
    func = unwrap_func(func)
    root, owner, blocks = _blocks(func)
    if sorted(n for g in groups for n in g) != sorted(owner):
        raise UnsupportedError("the chain's function has blocks outside the chain: cannot split")
    # buffers by identity: two operators' outputs may share a name (TOPI's "conv2d_nhwc")
    params = {p.id_ for p in func.params}  # 0.27: a parameter is its buffer
    allocated = {b.id_ for b in root.alloc_buffers}
    written_by = {}
    for g, names in enumerate(groups):
        for n in names:
            for w in blocks[n].writes:
                written_by[w.source.id_] = g
    parts, between = [], []
    for g, names in enumerate(groups):
        reads = {r.source.id_: r.source for n in names for r in blocks[n].reads}
        writes = {w.source.id_: w.source for n in names for w in blocks[n].writes}
        used_later = {r.source.id_ for h in groups[g + 1:] for n in h for r in blocks[n].reads}
        inputs = [b for key, b in reads.items() if written_by.get(key) != g]
        outputs = [b for key, b in writes.items() if key in used_later or key in params]
        local = [b for key, b in writes.items()
                 if key not in used_later and key not in params and key in allocated]
        between += [b for key, b in writes.items() if key in used_later and key not in params]
        body = s_tir.SBlockRealize([], True, s_tir.SBlock(
            [], [], [], "root", tirx.SeqStmt([owner[n] for n in names])
            if len(names) > 1 else owner[names[0]], alloc_buffers=local))
        parts.append(tirx.PrimFunc(inputs + outputs, body, attrs=func.attrs))
    return parts, between


def split_chain(func: tirx.PrimFunc, chain: GemmChain):
    """(one PrimFunc per operator group, the intermediate buffers between them)."""
    return split_groups(func, operator_groups(chain, _blocks(unwrap_func(func))[2]))


def stitch(func: tirx.PrimFunc, scheduled: Sequence[tirx.PrimFunc],
           between: Sequence[tirx.Buffer]) -> tirx.PrimFunc:
    """The chain's function with each group's scheduled body in turn (a block named as one of
    an earlier group's, e.g. two parts' ``C_global``, renamed: a schedule finds blocks by
    name)."""
    func = unwrap_func(func)
    stmts, allocs = [], list(between)
    taken: set = set()
    for part in scheduled:
        root = _root(_unique_block_names(part, taken))
        allocs += list(root.alloc_buffers)
        stmts.append(root.body)
    body = s_tir.SBlockRealize([], True, s_tir.SBlock(
        [], [], [], "root", tirx.SeqStmt(stmts), alloc_buffers=allocs))
    return tirx.PrimFunc(func.params, body, func.ret_type, func.attrs)


def _unique_block_names(func: tirx.PrimFunc, taken: set) -> tirx.PrimFunc:
    """``func`` with each block whose name is in ``taken`` renamed (``C_global`` ->
    ``C_global_1``); adds its blocks' names to ``taken``."""
    names: List[str] = []
    post_order_visit(func.body, lambda n: names.append(n.name_hint)
                     if isinstance(n, s_tir.SBlock) and n.name_hint != "root" else None)
    renames: Dict[str, str] = {}
    for name in names:
        if name in taken and name not in renames:
            k = 1
            while f"{name}_{k}" in taken or f"{name}_{k}" in names:
                k += 1
            renames[name] = f"{name}_{k}"
    taken.update(renames.get(n, n) for n in names)
    if not renames:
        return func

    def rename(b):
        if b.name_hint not in renames:
            return b
        return s_tir.SBlock(b.iter_vars, b.reads, b.writes, renames[b.name_hint], b.body,
                            b.init, b.alloc_buffers, b.match_buffers, b.annotations)
    return tvm_ffi.structural_map(func, (s_tir.SBlock, rename))


_ASYNC = "software_pipeline_async_stages"


def _synchronous_fetches(sch: s_tir.Schedule) -> None:
    """Drop cp.async from a part that reads an intermediate: allocated in the function (not a
    parameter), TVM's StorageRewrite gives it a vector element type, and its PTX async-copy
    injection then fails on the mismatched lanes (TVM 0.27). The pipeline stays."""
    names = []
    post_order_visit(sch.mod["main"].body, lambda n: names.append(n.name_hint)
                     if isinstance(n, s_tir.SBlock) and n.name_hint != "root" else None)
    done = set()
    for name in names:
        for loop in sch.get_loops(sch.get_sblock(name)):
            node = sch.get(loop)
            if node.loop_var.id_ not in done and _ASYNC in node.annotations:
                sch.unannotate(loop, _ASYNC)
                done.add(node.loop_var.id_)


def reduction_groups(func: tirx.PrimFunc) -> List[List[str]]:
    """A function's blocks as the operators FuseOps would have made of them: each reduction
    with the elementwise blocks before it (its prologue: padding, reshapes) and after it (its
    epilogue) until the next reduction; trailing elementwise blocks join the last one."""
    _, owner, blocks = _blocks(unwrap_func(func))
    groups: List[List[str]] = [[]]
    has_reduction = False
    for name in owner:
        if not _is_injective(blocks[name]) and has_reduction:
            groups.append([])
            has_reduction = False
        groups[-1].append(name)
        has_reduction = has_reduction or not _is_injective(blocks[name])
    return [g for g in groups if g]


def build_unfused(func: tirx.PrimFunc, chain: GemmChain,
                  schedule_one: Callable[[tirx.PrimFunc], s_tir.Schedule]) -> s_tir.Schedule:
    """The chain as its operators one by one, each scheduled by ``schedule_one`` (roller's own
    plan and lowering for a single operator): a Schedule of the stitched function."""
    return build_groups(func, operator_groups(chain, _blocks(unwrap_func(func))[2]),
                        schedule_one)


def build_groups(func: tirx.PrimFunc, groups: List[List[str]],
                 schedule_one: Callable[[tirx.PrimFunc], s_tir.Schedule]) -> s_tir.Schedule:
    """``func`` cut into ``groups`` of blocks, each scheduled by ``schedule_one`` and stitched
    back in order; a group ``schedule_one`` declines is retried block by block."""
    while True:
        parts, between = split_groups(func, groups)
        scheduled = []
        inner = {b.id_ for b in between}
        for g, part in zip(groups, parts):
            try:
                sch = schedule_one(part)
                if any(p.id_ in inner for p in part.params):
                    _synchronous_fetches(sch)
                scheduled.append(sch.mod["main"])
            except UnsupportedError as err:
                if len(g) == 1:
                    raise
                # stages roller does not schedule as one function (a mask built around a
                # softmax, for CUDA): each block on its own
                logger.info("tvm_roller: %s as one function: %s; block by block", g, err)
                i = groups.index(g)
                groups = groups[:i] + [[n] for n in g] + groups[i + 1:]
                break
        else:
            return s_tir.Schedule(tvm.IRModule({"main": stitch(func, scheduled, between)}))
