"""One buffer access region of the main block, as a function of a tile of its iteration space.

The region comes from the block signature (TVM's region analysis). Each dimension's start is
classified once: affine in the block variables (``detect_linear_equation``), which gives a closed
form, or anything else (``floordiv``/``floormod`` by constants, ...), which is bounded with TVM's
integer-set analysis. Footprints of a tile are then cheap enough for the policy's inner loop.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple

import tvm
from tvm import sym, tirx

from tvm_roller.analysis.visit import post_order_visit


@dataclass(frozen=True)
class DimAccess:
    coeffs: Optional[Tuple[int, ...]]  # per block axis when affine, else None
    extent: int  # constant extent of the region along this dimension
    size: int  # buffer dimension size (a footprint never exceeds it)
    expr: object = None  # the start expression, kept for the non-affine case


class Access:
    """Region of one buffer read or written by the main block."""

    def __init__(self, buffer: str, dtype: str, dims: List[DimAccess], variables: Sequence,
                 mode: str) -> None:
        self.buffer = buffer
        self.dtype = dtype
        self.dims = dims
        self.mode = mode
        self._vars = list(variables)
        self._cache = {}

    def __repr__(self) -> str:
        return f"Access({self.mode} {self.buffer}, dims={len(self.dims)})"

    @property
    def bytes_per_elem(self) -> int:
        return tvm.DataType(self.dtype).bits // 8

    def axes_used(self) -> List[int]:
        used = set()
        for d in self.dims:
            if d.coeffs is None:
                used.update(self._expr_axes(d.expr))
            else:
                used.update(i for i, c in enumerate(d.coeffs) if c)
        return sorted(used)

    def innermost_axis(self) -> Optional[int]:
        """The block axis that moves the last (contiguous) dimension with stride 1, if any."""
        if not self.dims:
            return None
        last = self.dims[-1]
        if last.coeffs is None:
            return None
        nz = [i for i, c in enumerate(last.coeffs) if c]
        if len(nz) == 1 and last.coeffs[nz[0]] == 1:
            return nz[0]
        return None

    def unit_stride_innermost(self, axis: int, max_stride: int = 1) -> bool:
        """``axis`` appears only in the last dimension, affinely with a coefficient in
        [1, max_stride] (other axes may appear there too, e.g. a window offset)."""
        if not self.dims or self.dims[-1].coeffs is None:
            return False
        if not 1 <= self.dims[-1].coeffs[axis] <= max_stride:
            return False
        return all(d.coeffs is not None and d.coeffs[axis] == 0 for d in self.dims[:-1])

    def stride_of_axis(self, axis: int) -> int:
        """Element stride in this buffer when ``axis`` advances by one (0 when unused)."""
        stride, s = 0, 1
        for d in reversed(self.dims):
            if d.coeffs is not None:
                stride += d.coeffs[axis] * s
            elif axis in self._expr_axes(d.expr):
                return s  # non-affine: treat as touching this dimension
            s *= d.size
        return abs(stride)

    def footprint(self, tile: Tuple[int, ...]) -> int:
        """Number of distinct elements (as a dense box) touched by a tile of the block space."""
        return self._box(tuple(tile), strided=True)

    def hull(self, tile: Tuple[int, ...]) -> int:
        """Elements of the dense box that holds a tile's accesses: what a buffer staging them
        (a shared-memory tile) allocates, strided rows and the gaps between them included."""
        return self._box(tuple(tile), strided=False)

    def _box(self, key: Tuple[int, ...], strided: bool) -> int:
        hit = self._cache.get((key, strided))
        if hit is not None:
            return hit
        total = 1
        last = len(self.dims) - 1
        for k, d in enumerate(self.dims):
            if d.coeffs is not None:
                span = sum(abs(c) * (t - 1) for c, t in zip(d.coeffs, key)) + d.extent
                if strided and k != last and d.extent == 1:
                    # a strided window (y * s + ry, s > 1) touches at most one row per point:
                    # a whole row/pixel apart from the next, unlike the contiguous last dim
                    span = min(span, math.prod(t for c, t in zip(d.coeffs, key) if c))
            else:
                span = _nonaffine_span(d.expr, tuple(self._vars), key) + d.extent
            total *= min(span, d.size)
        self._cache[(key, strided)] = total
        return total

    def _expr_axes(self, expr) -> List[int]:
        names = set()

        def f(n):
            if isinstance(n, tirx.Var):
                names.add(n.name)

        post_order_visit(expr, f)
        return [i for i, v in enumerate(self._vars) if v.name in names]


_EXPR_CACHE = {}


def _nonaffine_span(expr, variables: Tuple, tile: Tuple[int, ...]) -> int:
    key = (id(expr), tile)
    hit = _EXPR_CACHE.get(key)
    if hit is not None:
        return hit[1]
    analyzer = sym.Analyzer()
    dom = {v: sym.IntervalSet(0, max(t, 1) - 1) for v, t in zip(variables, tile)}
    s = analyzer.int_set(expr, dom)
    lo, hi = s.min_value, s.max_value
    if not (isinstance(lo, tirx.IntImm) and isinstance(hi, tirx.IntImm)):
        span = 1 << 30  # unbounded: the caller caps it at the buffer size
    else:
        span = int(hi.value) - int(lo.value)
    _EXPR_CACHE[key] = (expr, span)  # keep expr alive so its id stays unique
    return span


def build_access(region, variables: Sequence, mode: str) -> Access:
    buf = region.source
    dims = []
    for rg, size in zip(region.region, buf.shape):
        ext = rg.extent
        ext_i = int(ext.value) if isinstance(ext, tirx.IntImm) else int(size)
        co = sym.detect_linear_equation(rg.min, list(variables))
        if len(co) == len(variables) + 1:
            coeffs = tuple(int(c.value) if isinstance(c, tirx.IntImm) else None for c in co[:-1])
            if any(c is None for c in coeffs):
                coeffs = None
        else:
            coeffs = None
        dims.append(DimAccess(coeffs, ext_i, int(size), rg.min))
    return Access(buf.name, str(buf.dtype), dims, variables, mode)
