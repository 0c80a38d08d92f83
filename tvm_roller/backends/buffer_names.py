"""Distinct buffers under distinct names.

TE names a stage's buffer after the stage, and TOPI leaves some stages at TE's default name:
``topi.nn.log_softmax`` makes its exp-sum and its output both ``compute``, so the PrimFunc
``create_prim_func`` (or Relax's legalization) makes of it holds two buffers of one name (the
printer shows the second as ``compute_1``, on the page only).

TVM 0.27's ``loop_partition`` matches buffers by name when it rewrites the read / write regions
of the blocks it copies (``BufferIndicesMapExtractor``: a map from a buffer's name to the indices
of its first access). Under a partitioned loop of the log-softmax's output, the exp-sum row
``compute[i]`` gets the indices of the output ``compute[i, j]``: a region of rank 2 on a buffer
of rank 1, which TVM aborts on ("Buffer rank and region dimension mismatch"); at equal ranks a
buffer silently gets another's region. Renaming the function's own buffers before scheduling, or
declining the partition where names are shared (a trace that must replay on the function as
given), avoids both.
"""
from __future__ import annotations

from typing import Dict, List

import tvm_ffi
from tvm import tirx


def _is_buffer(v) -> bool:
    return isinstance(getattr(v, "ty", None), tirx.BufferType)


def buffers_by_name(node) -> Dict[str, List[tirx.Var]]:
    """Every buffer ``node`` (a statement or a PrimFunc) mentions, grouped by name, each
    buffer once, in the order first met."""
    found: Dict[str, List[tirx.Var]] = {}

    def note(v):
        if _is_buffer(v):
            same = found.setdefault(str(v.name), [])
            if not any(b.same_as(v) for b in same):
                same.append(v)
        return v

    tvm_ffi.structural_map(node, (tirx.Var, note))
    return found


def shared_names(node) -> List[str]:
    """The names that more than one distinct buffer under ``node`` carries."""
    return sorted(n for n, bufs in buffers_by_name(node).items() if len(bufs) > 1)


def unique_buffer_names(func: tirx.PrimFunc) -> tirx.PrimFunc:
    """``func`` with each buffer it allocates renamed (``compute`` -> ``compute_1``) when a
    parameter or an earlier allocation has its name; parameters keep theirs (the signature).
    The same object when no name is shared."""
    groups = buffers_by_name(func)
    if not any(len(bufs) > 1 for bufs in groups.values()):
        return func
    params = [p for p in func.params if _is_buffer(p)]
    taken = set(groups)
    renames: Dict[int, tirx.Var] = {}
    for name, bufs in groups.items():
        if len(bufs) < 2:
            continue
        # a parameter keeps the name; otherwise the first allocation does
        keep = next((b for b in bufs if any(b.same_as(p) for p in params)), bufs[0])
        for buf in bufs:
            if buf.same_as(keep) or any(buf.same_as(p) for p in params):
                continue
            k = 1
            while f"{name}_{k}" in taken:
                k += 1
            taken.add(f"{name}_{k}")
            renames[buf.id_] = tirx.Var(f"{name}_{k}", buf.ty)  # same type: shape, dtype, layout
    return tvm_ffi.structural_map(func, (tirx.Var, lambda v: renames.get(v.id_, v)
                                         if _is_buffer(v) else v))
