"""rTiles for a GEMM-like function on a micro-kernel route (``microkernel``): the register tile
is the route's block, the reduction chunk a multiple of its step, and the per-task tile is grown
from it by the micro-model (traffic per task at the route's rate, wave quantization over the
cores) — ROLLER's construction with the instruction's block as the aligned unit. Every route the
device has for the operands competes; the predicted time picks the route, its block and the
task tile (a route slower than another, e.g. a bf16 dot product at half rate, loses there).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import List, Tuple

from tvm_roller.analysis import FuncAnalysis
from tvm_roller.backends.cpu.microkernel import Candidate, Operands, candidates, route_named
from tvm_roller.analysis.constants import constant_operand
from tvm_roller.core.errors import InvalidTile, UnsupportedError
from tvm_roller.core.rtile import RTile
from tvm_roller.hardware.model import DeviceModel

MAX_CHUNK = 512  # reduction elements per micro-kernel call: C's block is loaded/stored per call


@dataclass(frozen=True)
class GemmRoles:
    """Which block axes and operands of the main block play a GEMM's parts."""

    m: int  # output rows: A's, not B's
    n: int  # output columns (its last axis): B's, not A's
    k: int  # the one reduction axis
    a: str  # the operand read along (m, k)
    b: str  # the operand read along (k, n)
    ops: Operands


def gemm_roles(fa: FuncAnalysis) -> GemmRoles:
    """The GEMM parts of ``fa`` (UnsupportedError, with the reason, when it has none a
    micro-kernel can take)."""
    if len(fa.reduction) != 1:
        raise UnsupportedError(f"a micro-kernel product reduces over one axis; {fa.main} "
                               f"reduces over {len(fa.reduction)}")
    if fa.dynamic_axes:
        raise UnsupportedError("micro-kernel products for symbolic extents are not built")
    k, n = fa.reduction[0], fa.writes[0].innermost_axis()
    if n is None or fa.axes[n].kind != "S" or len(fa.reads) != 2:
        raise UnsupportedError("a micro-kernel product needs two operands and an output whose "
                               "last dimension is one spatial axis")
    a_acc, b_acc = sorted(fa.reads, key=lambda r: n in r.axes_used())
    rows = [i for i in a_acc.axes_used() if i not in b_acc.axes_used() and i != k]
    if n in a_acc.axes_used() or len(rows) != 1 or k not in b_acc.axes_used():
        raise UnsupportedError("the operands do not read as A[.., m, k] and B[.., k, n]")
    acc = fa.writes[0].dtype  # the main block's accumulator (the output may be an epilogue's)
    return GemmRoles(rows[0], n, k, a_acc.buffer, b_acc.buffer,
                     Operands(a_acc.dtype, b_acc.dtype, acc))


def _ceil_to(x: int, m: int) -> int:
    return -(-x // m) * m


def reduction_chunk(extent: int, step: int) -> int:
    """Equal chunks of at most MAX_CHUNK elements, each a multiple of the kernel's step."""
    padded = _ceil_to(extent, step)
    chunks = -(-padded // MAX_CHUNK)
    return _ceil_to(-(-padded // chunks), step)


def _fixed_levels(fa: FuncAnalysis, roles: GemmRoles, cand: Candidate
                  ) -> Tuple[List[int], List[int], List[int]]:
    """(register tile, L1 tile, padded extents): what the route's block fixes."""
    ext = [a.extent for a in fa.axes]
    shape = cand.shape
    reg = [1] * len(ext)
    reg[roles.m], reg[roles.n] = shape.rows, shape.cols
    kc = reduction_chunk(ext[roles.k], math.lcm(shape.a_k, shape.kgroup))
    padded = [_ceil_to(e, r) for e, r in zip(ext, reg)]
    padded[roles.k] = _ceil_to(ext[roles.k], kc)
    l1 = list(reg)
    l1[roles.k] = kc
    return reg, l1, padded


def tile_label(cand: Candidate, kc: int) -> str:
    """What an rTile's ``tensor_core`` records of its route: ``<route>:<rows>x<cols>x<kc>``."""
    return f"{cand.key}x{kc}"


def candidate_of(tile: RTile, dev: DeviceModel, roles: GemmRoles) -> Candidate:
    """The route and block a tile (e.g. from the schedule cache) was planned for on ``dev``."""
    for cand in candidates(dev, roles.ops):
        if tile.tensor_core.startswith(cand.key + "x"):
            return cand
    raise InvalidTile(f"{tile.tensor_core!r} names no micro-kernel route of "
                      f"{roles.ops.label} products on {dev.name}")


def check_tile(tile: RTile, fa: FuncAnalysis, dev: DeviceModel, roles: GemmRoles) -> None:
    """InvalidTile unless ``tile`` is one this lowering takes on ``dev``."""
    cand = candidate_of(tile, dev, roles)
    reg, l1, padded = _fixed_levels(fa, roles, cand)
    if tile.reg != reg or tile.l1 != l1:
        raise InvalidTile(f"not a {cand.key} tile of this function (register tile "
                          f"{tile.reg}, chunk {tile.l1})")
    for i in fa.spatial:
        if tile.l2[i] % reg[i] or not reg[i] <= tile.l2[i] <= padded[i]:
            raise InvalidTile(f"task tile {tile.l2} does not tile the padded extents {padded}")


def construct(fa: FuncAnalysis, dev: DeviceModel, roles: GemmRoles, topk: int) -> List[RTile]:
    """The best ``topk`` rTiles by the model over every route and block, best first."""
    cands = candidates(dev, roles.ops)
    if not cands:
        units = dev.cpu.matrix_units if dev.cpu else ()
        raise UnsupportedError(f"no micro-kernel route computes {roles.ops.a} × {roles.ops.b} → "
                               f"{roles.ops.acc} on {dev.name} (ISA {dev.isa}, "
                               f"{', '.join(units) or 'no dot-product or matrix units'})")
    scored = []
    for cand in cands:
        scored += _task_tiles(fa, dev, roles, cand)
    scored.sort(key=lambda c: (c[0], c[1]))
    return [_rtile(fa, roles, cand, l2, pred, bound) for pred, _, l2, bound, cand in scored[:topk]]


def _packing_s(fa: FuncAnalysis, dev: DeviceModel, roles: GemmRoles, padded: List[int]) -> float:
    """Seconds of B's copy into panels in every call (read and written once, all cores), or 0
    when B is a constant packed while compiling (a weight: in ``layout_free_buffers``)."""
    if constant_operand(fa.func, roles.b):
        return 0.0
    batch = math.prod(padded[i] for i in fa.spatial if i not in (roles.m, roles.n))
    elems = batch * padded[roles.k] * padded[roles.n]
    return 2.0 * elems * roles.ops.elem_bytes / (dev.levels[-1].bandwidth_gbs * 1e9)


def _task_tiles(fa: FuncAnalysis, dev: DeviceModel, roles: GemmRoles, cand: Candidate) -> list:
    """(predicted seconds, -task size, task tile, bound, candidate) for each task tile."""
    reg, l1, padded = _fixed_levels(fa, roles, cand)
    packing = _packing_s(fa, dev, roles, padded)
    bm, bn, eb = cand.shape.rows, cand.shape.cols, roles.ops.elem_bytes
    rate = cand.gops * 1e9
    l2_bw = dev.levels[1].bandwidth_gbs * 1e9 / max(1, dev.num_units)
    dram_bw = dev.levels[-1].bandwidth_gbs * 1e9 / max(1, dev.num_units)
    # a task's packed rows (A) stay in L2 while its column panels pass (``lower_microkernel``)
    rows_fit = dev.levels[1].capacity_bytes * 0.5 / (eb * padded[roles.k])
    out = []
    for mt in _multiples(padded[roles.m], bm):
        if mt > max(bm, rows_fit):
            continue
        for nt in _multiples(padded[roles.n], bn):
            l2 = list(reg)
            l2[roles.m], l2[roles.n], l2[roles.k] = mt, nt, l1[roles.k]
            waves = -(-_tasks(fa, padded, l2) // dev.num_units)
            flops = 2.0 * mt * nt * padded[roles.k]
            # each register tile reads its A rows and B panel from L2 (or L1); the task's
            # operands come from DRAM once (a model's weights are not cache-resident)
            elem_k = eb * padded[roles.k]
            traffic = elem_k * (mt * (nt // bn) + nt * (mt // bm))
            terms = {"compute": flops / rate, "L2": traffic / l2_bw,
                     "DRAM": elem_k * (mt + nt) / dram_bw}
            bound = max(terms, key=terms.get)
            out.append((packing + waves * terms[bound], -mt * nt, l2, bound, cand))
    return out


def _rtile(fa: FuncAnalysis, roles: GemmRoles, cand: Candidate, l2: List[int], pred: float,
           bound: str) -> RTile:
    reg, l1, padded = _fixed_levels(fa, roles, cand)
    kc = l1[roles.k]
    return RTile(kind="tiled", axes=[a.name for a in fa.axes], extents=[a.extent for a in fa.axes],
                 axis_kinds="".join(a.kind for a in fa.axes), reg=reg, l1=l1, l2=l2,
                 vector_axis=fa.vector_axis, vector_lanes=cand.shape.lanes, acc_level="reg",
                 num_tasks=_tasks(fa, padded, l2), tensor_core=tile_label(cand, kc),
                 predicted_s=pred, bound=bound,
                 notes=[f"route: {cand.describe()}", f"reduction chunk {kc}"])


def _tasks(fa: FuncAnalysis, padded: List[int], l2: List[int]) -> int:
    return math.prod(p // t for p, t, a in zip(padded, l2, fa.axes) if a.kind == "S")


def _multiples(extent: int, block: int) -> List[int]:
    """Task tile sizes along a padded axis: the block × powers of two, and the whole axis."""
    out, t = [], block
    while t < extent:
        if extent % t == 0:
            out.append(t)
        t *= 2
    return out + [extent]
