"""rTiles for a GEMM-like function on AMX tiles (``amx``): the register tile is the
instruction's 32×32 output block, the reduction chunk a multiple of its 32 (bf16) / 64 (int8)
elements, and the per-task tile is grown from it by the micro-model (traffic per task at the
tile rate, wave quantization over the cores) — ROLLER's construction with the instruction's
tile as the aligned unit.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import List, Tuple

from tvm_roller.analysis import FuncAnalysis
from tvm_roller.backends.cpu.amx import BLOCK, AmxKind, kind_for
from tvm_roller.core.errors import InvalidTile, UnsupportedError
from tvm_roller.core.rtile import RTile
from tvm_roller.hardware.model import DeviceModel

MAX_CHUNK = 512  # reduction elements per micro-kernel call: C's tiles are loaded/stored per call
# one core's sustained rate of the 2×2 micro-kernel over L1/L2-resident operands (GFLOP/s and
# GOP/s), set from the Xeon (Emerald Rapids) this was written on: 1024³ bf16 at 1000-1400 GF/s
# on two cores; the instruction alone 600-1900 per core (the shared host moved it 3× between
# runs); int8's instruction is twice that. Not calibrated per machine yet.
_TILE_GOPS = {"bf16": 700.0, "int8": 1400.0}


@dataclass(frozen=True)
class GemmRoles:
    """Which block axes and operands of the main block play a GEMM's parts."""

    m: int  # output rows: A's, not B's
    n: int  # output columns (its last axis): B's, not A's
    k: int  # the one reduction axis
    a: str  # the operand read along (m, k)
    b: str  # the operand read along (k, n)
    kind: AmxKind


def gemm_roles(fa: FuncAnalysis) -> GemmRoles:
    """The GEMM parts of ``fa`` (UnsupportedError, with the reason, when it has none an AMX
    tile product can take)."""
    if len(fa.reduction) != 1:
        raise UnsupportedError(f"an AMX tile product reduces over one axis; {fa.main} reduces "
                               f"over {len(fa.reduction)}")
    if fa.dynamic_axes:
        raise UnsupportedError("AMX kernels for symbolic extents are not built")
    k, n = fa.reduction[0], fa.writes[0].innermost_axis()
    if n is None or fa.axes[n].kind != "S" or len(fa.reads) != 2:
        raise UnsupportedError("an AMX tile product needs two operands and an output whose "
                               "last dimension is one spatial axis")
    a_acc, b_acc = sorted(fa.reads, key=lambda r: n in r.axes_used())
    rows = [i for i in a_acc.axes_used() if i not in b_acc.axes_used() and i != k]
    if n in a_acc.axes_used() or len(rows) != 1 or k not in b_acc.axes_used():
        raise UnsupportedError("the operands do not read as A[.., m, k] and B[.., k, n]")
    m = rows[0]
    acc = fa.writes[0].dtype  # the main block's accumulator (the output may be an epilogue's)
    kind = kind_for(a_acc.dtype, b_acc.dtype, acc)
    if kind is None:
        raise UnsupportedError(f"no AMX product takes {a_acc.dtype} × {b_acc.dtype} → {acc} "
                               "(bf16 → float32, int8 / uint8 → int32)")
    return GemmRoles(m, n, k, a_acc.buffer, b_acc.buffer, kind)


def _ceil_to(x: int, m: int) -> int:
    return -(-x // m) * m


def reduction_chunk(extent: int, kind: AmxKind) -> int:
    """Equal chunks of at most MAX_CHUNK elements, each a multiple of the product's step."""
    padded = _ceil_to(extent, kind.kstep)
    chunks = -(-padded // MAX_CHUNK)
    return _ceil_to(-(-padded // chunks), kind.kstep)


def _fixed_levels(fa: FuncAnalysis, roles: GemmRoles) -> Tuple[List[int], List[int], List[int]]:
    """(register tile, L1 tile, padded extents): what the instruction fixes."""
    ext = [a.extent for a in fa.axes]
    reg = [BLOCK if i in (roles.m, roles.n) and a.kind == "S" else 1
           for i, a in enumerate(fa.axes)]
    kc = reduction_chunk(ext[roles.k], roles.kind)
    padded = [_ceil_to(e, r) for e, r in zip(ext, reg)]
    padded[roles.k] = _ceil_to(ext[roles.k], kc)
    l1 = list(reg)
    l1[roles.k] = kc
    return reg, l1, padded


def check_tile(tile: RTile, fa: FuncAnalysis, roles: GemmRoles) -> None:
    """InvalidTile unless ``tile`` (e.g. from the schedule cache) is one this lowering takes."""
    reg, l1, padded = _fixed_levels(fa, roles)
    if tile.reg != reg or tile.l1 != l1 or not tile.tensor_core.startswith(
            f"amx_{roles.kind.name}_"):
        raise InvalidTile(f"not an AMX {roles.kind.name} tile of this function (register tile "
                          f"{tile.reg}, chunk {tile.l1}, {tile.tensor_core!r})")
    for i in fa.spatial:
        if tile.l2[i] % reg[i] or not reg[i] <= tile.l2[i] <= padded[i]:
            raise InvalidTile(f"task tile {tile.l2} does not tile the padded extents {padded}")


def construct_amx(fa: FuncAnalysis, dev: DeviceModel, roles: GemmRoles, topk: int) -> List[RTile]:
    """The best ``topk`` rTiles by the model, best first."""
    kind = roles.kind
    ext = [a.extent for a in fa.axes]
    reg, l1, padded = _fixed_levels(fa, roles)
    kc = l1[roles.k]
    rate = _TILE_GOPS["bf16" if kind.name == "bf16" else "int8"] * 1e9
    l2_bw = dev.levels[1].bandwidth_gbs * 1e9 / max(1, dev.num_units)
    dram_bw = dev.levels[-1].bandwidth_gbs * 1e9 / max(1, dev.num_units)
    # a task's packed rows (A) stay in L2 while its column panels pass (``lower_amx``)
    rows_fit = dev.levels[1].capacity_bytes * 0.5 / (kind.elem_bytes * padded[roles.k])
    cands = []
    for mt in _multiples(padded[roles.m]):
        if mt > max(BLOCK, rows_fit):
            continue
        for nt in _multiples(padded[roles.n]):
            l2 = list(reg)
            l2[roles.m], l2[roles.n], l2[roles.k] = mt, nt, kc
            tasks = _tasks(fa, padded, l2)
            waves = -(-tasks // dev.num_units)
            flops = 2.0 * mt * nt * padded[roles.k]
            # each register tile reads its A rows and B panel from L2 (or L1); the task's
            # operands come from DRAM once (a model's weights are not cache-resident)
            elem_k = kind.elem_bytes * padded[roles.k]
            traffic = elem_k * (mt * (nt // BLOCK) + nt * (mt // BLOCK))
            terms = {"compute": flops / rate, "L2": traffic / l2_bw,
                     "DRAM": elem_k * (mt + nt) / dram_bw}
            bound = max(terms, key=terms.get)
            cands.append((waves * terms[bound], -mt * nt, l2, bound))
    cands.sort(key=lambda c: (c[0], c[1]))
    tiles = []
    for pred, _, l2, bound in cands[:topk]:
        t = RTile(kind="tiled", axes=[a.name for a in fa.axes], extents=ext,
                  axis_kinds="".join(a.kind for a in fa.axes), reg=reg, l1=l1, l2=l2,
                  vector_axis=fa.vector_axis, vector_lanes=16, acc_level="reg",
                  num_tasks=_tasks(fa, padded, l2),
                  tensor_core=f"amx_{kind.name}_32x32x{kc}", predicted_s=pred,
                  bound=bound, notes=[f"AMX {kind.instruction}: 2×2 tiles of 16×16, "
                                          f"reduction chunk {kc}"])
        tiles.append(t)
    return tiles


def _tasks(fa: FuncAnalysis, padded: List[int], l2: List[int]) -> int:
    return math.prod(p // t for p, t, a in zip(padded, l2, fa.axes) if a.kind == "S")


def _multiples(extent: int) -> List[int]:
    """Task tile sizes along a padded axis: BLOCK × powers of two, and the whole axis."""
    out, t = [], BLOCK
    while t < extent:
        if extent % t == 0:
            out.append(t)
        t *= 2
    return out + [extent]
