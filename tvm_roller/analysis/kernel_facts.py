"""What a scheduled kernel does that its roofline bound does not see.

The bound (``planner.roofline``) assumes every byte moves once at full bandwidth over all cores,
every multiply-add at the vector peak. A kernel is far from it for a reason its loop nest shows:
few or many parallel regions (each a fork/join of the thread pool), a parallel extent under the
core count, no vectorized loop, an innermost loop that steps through a buffer with a stride (a
cache line per element) or reads through an index tensor (a gather). These facts, read off the
scheduled kernel, go into its report entry, and ``tvm-roller profile-model`` states them for a
kernel it flags as 10x or more over its bound.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Dict, List, Optional

import tvm_ffi
from tvm import s_tir, sym, tirx
from tvm.ir.expr import TensorLoad  # what tirx.BufferLoad(...) builds in TVM 0.27

from tvm_roller.analysis.visit import child_nodes, post_order_visit


@dataclass(frozen=True)
class KernelFacts:
    """Loop-nest facts of one kernel (see the module docstring)."""

    parallel_regions: int = 0  # outermost parallel loops: one fork/join of the pool each
    parallel_extent: int = 0  # the smallest extent among them (0: no parallel loop)
    vector_lanes: int = 0  # the widest vectorized loop (0: none)
    # buffer -> the largest element step of an innermost loop through it (> 1 only)
    strided: Dict[str, int] = field(default_factory=dict)
    gathers: List[str] = field(default_factory=list)  # buffers indexed by loaded values
    # arithmetic operations the kernel's stores evaluate, over all iterations (index arithmetic
    # not counted): the elementwise and transcendental work the roofline bound leaves out
    arith_ops: int = 0

    def to_dict(self) -> dict:
        return asdict(self)

    def summary(self) -> str:
        parts = [f"{self.parallel_regions} parallel region(s)"
                 + (f", extent {self.parallel_extent}" if self.parallel_regions else "")]
        parts.append(f"vector {self.vector_lanes} lanes" if self.vector_lanes else "no vector loop")
        if self.strided:
            steps = ", ".join(f"{b} step {s}" for b, s in sorted(self.strided.items()))
            parts.append(f"strided innermost access: {steps}")
        if self.gathers:
            parts.append(f"gather through {', '.join(sorted(self.gathers))}")
        if self.arith_ops:
            parts.append(f"{self.arith_ops:.3g} arithmetic operations")
        return "; ".join(parts)


def _flat_index(buffer: tirx.Buffer, indices) -> Optional[tirx.PrimExpr]:
    """The element offset of ``buffer[indices]`` (row-major), None for symbolic shapes."""
    dims = [getattr(d, "value", None) for d in buffer.shape]
    if len(dims) != len(indices) or any(d is None for d in dims):
        return None
    offset = tirx.const(0, "int64")
    for d, i in zip(dims, indices):
        offset = offset * int(d) + tirx.Cast("int64", i)
    return offset


def _step(buffer: tirx.Buffer, indices, var: tirx.Var, bindings: list) -> Optional[int]:
    """The element step of ``buffer[indices]`` per iteration of ``var`` (None: not constant):
    the offset at ``var`` = 1 less the offset at 0, the block iterators bound to their loops."""
    indices = list(indices)
    if any(isinstance(i, tirx.Ramp) for i in indices):
        return 1  # a vector access: LLVM emits it contiguous
    offset = _flat_index(buffer, indices)
    if offset is None:
        return None
    at = []
    for value in (0, 1):
        ana = sym.Analyzer()
        for v, e in bindings:
            ana.bind(v, e)
        ana.bind(var, tirx.const(value, var.ty.dtype))
        at.append(ana.simplify(ana.simplify(offset)))  # twice: nested blocks' iterators chain
    step = getattr(sym.Analyzer().simplify(at[1] - at[0]), "value", None)
    return None if step is None else abs(int(step))


class _Walker:
    def __init__(self) -> None:
        self.regions: List[int] = []
        self.lanes = 0
        self.strided: Dict[str, int] = {}
        self.gathers: set = set()
        self.bindings: list = []  # (block iterator, its loop expression)
        self.ops = 0

    def stmt(self, node, in_parallel: bool, trips: int = 1) -> None:
        self._bind(node)
        if isinstance(node, tirx.BufferStore):
            self.ops += _arith(node.value) * trips
        if isinstance(node, tirx.For):
            extent = getattr(node.extent, "value", None)
            trips *= int(extent) if extent is not None else 1
            if node.kind == tirx.ForKind.PARALLEL and not in_parallel:
                self.regions.append(int(extent) if extent is not None else 0)
                in_parallel = True
            if node.kind == tirx.ForKind.VECTORIZED and extent is not None:
                self.lanes = max(self.lanes, int(extent))
            if not _has_loop(node.body) and (extent is None or extent > 1):
                self._innermost(node)
        for child in child_nodes(node):
            for item in (child if isinstance(child, (list, tuple)) or
                         type(child).__name__ == "Array" else [child]):
                if isinstance(item, tirx.Stmt):
                    self.stmt(item, in_parallel, trips)

    def _bind(self, node) -> None:
        if isinstance(node, s_tir.SBlockRealize):
            self.bindings.extend((iv.var, v) for iv, v in zip(node.block.iter_vars,
                                                               node.iter_values))

    def _innermost(self, loop: tirx.For) -> None:
        post_order_visit(loop.body, self._bind)  # the blocks under the loop, before their loads

        def visit(n) -> None:
            if isinstance(n, (TensorLoad, tirx.BufferStore)):
                buf = n.buffer if isinstance(n, tirx.BufferStore) else n.source
                name = str(buf.name)
                if any(_loads_inside(i) for i in n.indices):
                    self.gathers.add(name)
                    return
                step = _step(buf, n.indices, loop.loop_var, self.bindings)
                if step is not None and step > 1:
                    self.strided[name] = max(self.strided.get(name, 0), step)
        post_order_visit(loop.body, visit)


_ARITH = {"Add", "Sub", "Mul", "Div", "Max", "Min", "Select", "Call", "FloorDiv", "FloorMod"}


def _arith(expr) -> int:
    """Arithmetic nodes of a stored value, not entering loads (their indices are addresses)."""
    if isinstance(expr, TensorLoad) or not isinstance(expr, tvm_ffi.core.Object):
        return 0
    own = 1 if type(expr).__name__ in _ARITH else 0
    total = own
    for child in child_nodes(expr):
        for item in (child if isinstance(child, (list, tuple)) or
                     type(child).__name__ == "Array" else [child]):
            total += _arith(item)
    return total


def _has_loop(stmt) -> bool:
    found = []
    post_order_visit(stmt, lambda n: found.append(1) if isinstance(n, tirx.For) else None)
    return bool(found)


def _loads_inside(expr) -> bool:
    found = []
    post_order_visit(expr, lambda n: found.append(1) if isinstance(n, TensorLoad) else None)
    return bool(found)


def kernel_facts(kernel: tirx.PrimFunc) -> KernelFacts:
    """The loop-nest facts of a scheduled (not yet lowered) kernel."""
    w = _Walker()
    w.stmt(kernel.body, False)
    return KernelFacts(len(w.regions), min(w.regions) if w.regions else 0, w.lanes,
                       dict(w.strided), sorted(w.gathers), int(w.ops))
