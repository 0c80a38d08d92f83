"""Traffic and register counts of a tile of an analysed function: what every micro-model and
policy reads (the number of tiles, the bytes a tile reads and writes, the loads per reduction
step of a register tile, the accumulators it holds, the bytes a function's parameters move)."""
from __future__ import annotations

import math
from typing import Sequence

from tvm_roller.analysis.func import FuncAnalysis
from tvm_roller.analysis.selected import touched_param_bytes
from tvm_roller.core.rtile import ceil_div


def input_bytes(fa: FuncAnalysis, tile: Sequence[int]) -> int:
    return sum(acc.footprint(tuple(tile)) * acc.bytes_per_elem for acc in fa.reads)


def staged_input_bytes(fa: FuncAnalysis, tile: Sequence[int]) -> int:
    """Bytes of the inputs' dense boxes for a tile: what staging them in a buffer allocates
    (``input_bytes`` counts the distinct elements a strided window touches)."""
    return sum(acc.hull(tuple(tile)) * acc.bytes_per_elem for acc in fa.reads)


def output_bytes(fa: FuncAnalysis, tile: Sequence[int]) -> int:
    return sum(acc.footprint(tuple(tile)) * acc.bytes_per_elem for acc in fa.writes)


def num_tiles(fa: FuncAnalysis, tile: Sequence[int], axes: Sequence[int] = None) -> int:
    axes = range(len(fa.axes)) if axes is None else axes
    return math.prod(ceil_div(fa.axes[i].extent, tile[i]) for i in axes)


def _register_reads(fa: FuncAnalysis, reg: Sequence[int], lanes: int):
    """(access, elements it reads per reduction step, whether as vectors) of each input of a
    register tile: vectors along the vector axis; also a depthwise window's ``ff + rc`` (the
    axis steps the last dimension by one, with a reduction offset)."""
    v = fa.vector_axis
    for acc in fa.reads:
        vec = v is not None and (acc.innermost_axis() == v or acc.unit_stride_innermost(v))
        yield acc, acc.footprint(tuple(reg)), vec


def register_loads(fa: FuncAnalysis, reg: Sequence[int], lanes: int) -> int:
    """Load instructions per reduction step of the register tile (vector loads + broadcasts)."""
    return sum(ceil_div(f, lanes) if vec else f for _, f, vec in _register_reads(fa, reg, lanes))


def register_bytes(fa: FuncAnalysis, reg: Sequence[int], lanes: int) -> int:
    """Bytes the register tile reads from L1 per reduction step: whole vectors along the
    vector axis, one element per broadcast."""
    return sum((ceil_div(f, lanes) * lanes if vec else f) * acc.bytes_per_elem
               for acc, f, vec in _register_reads(fa, reg, lanes))


def accumulator_registers(fa: FuncAnalysis, reg: Sequence[int], lanes: int) -> int:
    v = fa.vector_axis
    if v is None:
        return math.prod(reg)
    return math.prod(r for i, r in enumerate(reg) if i != v) * ceil_div(reg[v], lanes)


def param_bytes(fa: FuncAnalysis) -> int:
    """Bytes of all the function's buffer parameters, each at its own dtype (one read or write
    of every input and output: what a streaming kernel moves; a dimension indexed by one value
    no loop varies counts one slice, ``analysis.selected``)."""
    return touched_param_bytes(fa.func) or 0
