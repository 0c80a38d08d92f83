"""How big a TIR expression is as code: the nodes of its tree, a shared subexpression counted
each time it is used (what TVM's lowering and LLVM's code generation walk).

Inlining a stage copies its expression into every use of its buffer: composed functions whose
expressions use their argument several times (GELU through a polynomial erf uses it about ten
times) grow geometrically, and a kernel of three composed GELUs took minutes to compile. The
count is done on the shared graph with a memo, so it is linear in the graph's size, and stops
at a limit.
"""
from __future__ import annotations

from typing import Dict

import tvm_ffi
from tvm import tirx

from tvm_roller.analysis.visit import child_nodes


def tree_size(node, limit: int = 1 << 40) -> int:
    """Nodes in the expression tree under ``node`` (at most ``limit``: counting stops there)."""
    memo: Dict[int, int] = {}

    def size(n) -> int:
        if isinstance(n, (list, tuple, tvm_ffi.Array)):
            return min(limit, sum(size(x) for x in n))
        if not isinstance(n, tvm_ffi.core.Object) or isinstance(n, (tirx.Buffer, str)):
            return 0
        key = n.id_
        if key not in memo:
            total = 1
            for child in child_nodes(n):
                total += size(child)
                if total >= limit:
                    break
            memo[key] = min(total, limit)
        return memo[key]

    return size(node)
