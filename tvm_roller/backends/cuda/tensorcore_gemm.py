"""What the tensor-core path takes: the (batched) fp16 GEMM it recognises, and the tiles valid
for it, with the padding and the shared memory such a tile implies.

``gemm_structure(fa)`` finds the matmul roles of the main block's axes and operands (``Gemm``);
``validate_tile(fa, tile, dev)`` checks a CUDA ``RTile`` against the rules below;
``padded_extents`` / ``padding_notes`` are the padding a tile implies; ``copy_lanes`` /
``store_lanes`` the vector widths of the shared-memory copies and of the epilogue store;
``smem_bytes`` the shared memory of ``tensorcore.apply_tensorcore``'s schedule. The constants
are the schedule's fragment shapes, vector widths and row padding, which both the rules and the
schedule read.

A tile is valid for tensor cores (``validate_tile`` raises ``UnsupportedError`` with the reason
otherwise) when, for the main block's axes (batch b..., M, N, K as found from the accesses):

  * the main block is a (batched) matmul ``C[b.., m, n] += f32(A[..]) * f32(B[..])``: float16
    operands, a float32 accumulator, one reduction axis; each operand indexed by plain axes
    (batch axes first, possibly broadcast) and the output by [b.., M, N];
  * batch axes: ``l1 = reg = 1`` (one batch element per thread block, on blockIdx.z);
  * M, N: ``reg`` (warp tile WM, WN) divides ``l1`` (block tile BM, BN) and is a multiple of
    16; WM * WN <= 4096 (the fp32 accumulator is WM*WN/32 registers per thread: <= 128);
  * K: ``l1`` (chunk BK) a multiple of 16, or all of K (one chunk, padded to 16s: BK below is
    then K rounded up to 16); ``reg`` 16 (or 0/1: taken as 16);
  * an M, N or K that BM, BN, BK does not divide is padded, the tile at most the extent (the
    padding then less than half the padded work);
  * ``threads`` = 32 x (BM/WM) x (BN/WN), at most 1024 and the device's limit;
  * the A and B tiles load in whole vectors of ``copy_lanes(row)`` halves (8 when the operand's
    rows are a multiple of 8): BM*BK and BK*BN multiples of lanes x threads;
  * ``stages`` >= 1 (>= 2 pipelines the K loop with cp.async: needs sm_80+);
  * ``smem_bytes(fa, tile)`` within ``hardware.gpu.smem_limit(dev)`` (dynamic shared memory; TVM's
    CUDA runtime raises the per-kernel limit above 48 KB at launch);
  * ``tensor_core`` one of ``TENSOR_CORE_SHAPES``; MMA needs sm_80+ and A not transposed.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple

from tvm import s_tir

from tvm_roller.analysis import FuncAnalysis
from tvm_roller.analysis.access import build_access
from tvm_roller.core.errors import UnsupportedError
from tvm_roller.core.rtile import RTile, ceil_div
from tvm_roller.hardware import gpu

WMMA = "wmma_16x16x16_f16f32"
MMA = "mma_m16n8k16_f16f32"
TENSOR_CORE_SHAPES = (WMMA, MMA)

SMEM_SCOPE = "shared.dyn"
AB_PAD = 8  # halves appended to every row of the A/B tiles (16 B: keeps ldm a multiple of 8)
C_PAD = 4  # floats appended to every row of the accumulator staging tile (16 B), at least
VEC_AB = 8  # halves per global -> shared vector (16 B)
VEC_C = 4  # elements per epilogue vector (a float4 from shared)
# lanes of a warp: wmma / mma.sync fragments are defined for 32-lane warps, and the tile rules
# and the schedule have no device model (validate_tile reads the device's limits)
WARP = 32
MAX_WARP_TILE = 64 * 64  # WM * WN: the accumulator is WM*WN/32 fp32 registers per thread
FRAG = 16


# ------------------------------------------------------------------------------------------------
# GEMM structure of the main block
# ------------------------------------------------------------------------------------------------
@dataclass
class Gemm:
    """Roles of the main block's axes (indices into ``fa.axes``) and of its two operands."""

    batch: List[int]
    m: int
    n: int
    k: int
    a: str  # buffer read as the left operand (carries M)
    b: str  # buffer read as the right operand (carries N)
    a_batch: List[int]  # batch axes indexing A (in its dimension order)
    b_batch: List[int]
    trans_a: bool  # A stored [.., K, M]
    trans_b: bool  # B stored [.., N, K]
    a_row: int = 0  # elements in a row (the last dimension) of A and of B as the main block
    b_row: int = 0  # reads them: a padded copy vectorizes only in whole vectors of a row


def _dim_axes(acc, what: str) -> List[int]:
    out = []
    for d in acc.dims:
        nz = [i for i, c in enumerate(d.coeffs or ()) if c]
        if d.coeffs is None or len(nz) != 1 or d.coeffs[nz[0]] != 1 or d.extent != 1:
            raise UnsupportedError(f"tensor cores: {what} {acc.buffer} is not indexed by plain "
                                   "block axes (needs a plain (batched) matmul)")
        out.append(nz[0])
    return out


def gemm_structure(fa: FuncAnalysis) -> Gemm:
    """The (batched) matmul roles of ``fa``'s main block; UnsupportedError if it is not one."""
    if fa.main is None:
        raise UnsupportedError("tensor cores: the function has no reduction (main) block")
    sch = s_tir.Schedule(fa.func)
    blk = sch.get(sch.get_sblock(fa.main))
    variables = [iv.var for iv in blk.iter_vars]
    red = [i for i, a in enumerate(fa.axes) if a.kind == "R"]
    if len(red) != 1:
        raise UnsupportedError(f"tensor cores: the main block {fa.main} has {len(red)} reduction "
                               "axes (a matmul has one)")
    k = red[0]
    if len(blk.writes) != 1:
        raise UnsupportedError(f"tensor cores: the main block {fa.main} writes {len(blk.writes)} "
                               "buffers")
    out = build_access(blk.writes[0], variables, "write")
    if str(blk.writes[0].source.dtype) != "float32":
        raise UnsupportedError(
            f"tensor cores: the main block accumulates in {blk.writes[0].source.dtype}; roller's "
            "tensor-core path needs float32 accumulation (cast to float16 in an epilogue)")
    out_axes = _dim_axes(out, "output")
    spatial = [i for i, a in enumerate(fa.axes) if a.kind == "S"]
    if len(out_axes) < 2 or sorted(out_axes) != spatial:
        raise UnsupportedError("tensor cores: the output must be indexed [batch.., M, N] by every "
                               "spatial axis once")
    m, n, batch = out_axes[-2], out_axes[-1], out_axes[:-2]
    wbuf = blk.writes[0].source
    operands = [r for r in blk.reads if not r.source.same_as(wbuf)]
    if len(operands) != 2:
        raise UnsupportedError(f"tensor cores: the main block reads {len(operands)} tensors "
                               "(a matmul reads two)")
    roles = {}
    for r in operands:
        if str(r.source.dtype) != "float16":
            raise UnsupportedError(f"tensor cores: operand {r.source.name} is {r.source.dtype}, "
                                   "not float16")
        axes = _dim_axes(build_access(r, variables, "read"), "operand")
        mat, lead = axes[-2:], axes[:-2]
        if len(axes) < 2 or any(x not in batch for x in lead) or len(set(axes)) != len(axes):
            raise UnsupportedError(f"tensor cores: operand {r.source.name} is not indexed "
                                   "[batch.., row, col]")
        if set(mat) == {m, k}:
            role, trans = "a", mat == [k, m]
        elif set(mat) == {n, k}:
            role, trans = "b", mat == [n, k]
        else:
            raise UnsupportedError(f"tensor cores: operand {r.source.name} is not indexed by "
                                   "(M, K) or (K, N)")
        if role in roles:
            raise UnsupportedError("tensor cores: both operands carry the same output axis")
        roles[role] = (r.source.name, lead, trans, int(r.source.shape[-1]))
    if set(roles) != {"a", "b"}:
        raise UnsupportedError("tensor cores: expected one operand with M and one with N")
    (a, a_batch, ta, a_row), (b, b_batch, tb, b_row) = roles["a"], roles["b"]
    return Gemm(batch, m, n, k, a, b, a_batch, b_batch, ta, tb, a_row, b_row)


# ------------------------------------------------------------------------------------------------
# Tile rules (what the policy must generate)
# ------------------------------------------------------------------------------------------------
def _whole_k(g: Gemm, tile: RTile) -> bool:
    """The K chunk is all of K, and K not a multiple of 16: one chunk, padded to 16s."""
    bk = tile.l1[g.k]
    return bk % FRAG != 0 and len(tile.extents) == len(tile.l1) and bk == tile.extents[g.k]


def tile_dims(g: Gemm, tile: RTile) -> Tuple[int, int, int, int, int]:
    """Block tile BM, BN, the K chunk BK as scheduled (a whole K padded to 16s), warp tile."""
    bm, bn, bk = tile.l1[g.m], tile.l1[g.n], tile.l1[g.k]
    if _whole_k(g, tile):
        bk = ceil_div(bk, FRAG) * FRAG
    wm, wn = tile.reg[g.m], tile.reg[g.n]
    return bm, bn, bk, wm, wn


def check_tile(fa: FuncAnalysis, g: Gemm, tile: RTile) -> None:
    """The device-independent rules; raises UnsupportedError naming the first one broken."""
    if tile.backend != "cuda":
        raise UnsupportedError(f"tensor cores: the tile is for backend {tile.backend!r}, not cuda")
    if tile.tensor_core not in TENSOR_CORE_SHAPES:
        raise UnsupportedError(f"tensor cores: unknown fragment shape {tile.tensor_core!r} "
                               f"(known: {', '.join(TENSOR_CORE_SHAPES)})")
    n_ax = len(fa.axes)
    if len(tile.l1) != n_ax or len(tile.reg) != n_ax:
        raise UnsupportedError(f"tensor cores: the tile has {len(tile.l1)} block / {len(tile.reg)} "
                               f"warp entries for {n_ax} axes")
    if tile.extents != [a.extent for a in fa.axes]:
        raise UnsupportedError(f"tensor cores: tile extents {tile.extents} are not the "
                               f"function's {[a.extent for a in fa.axes]}")
    for b in g.batch:
        if tile.l1[b] != 1 or tile.reg[b] not in (0, 1):
            raise UnsupportedError(f"tensor cores: batch axis {fa.axes[b].name} needs block and "
                                   f"warp tile 1 (got {tile.l1[b]}, {tile.reg[b]})")
    bm, bn, bk, wm, wn = tile_dims(g, tile)
    ext = {ax: fa.axes[ax].extent for ax in (g.m, g.n, g.k)}
    for ax, blk_t, warp_t in ((g.m, bm, wm), (g.n, bn, wn)):
        name = fa.axes[ax].name
        if warp_t <= 0 or warp_t % FRAG:
            raise UnsupportedError(f"tensor cores: warp tile {warp_t} on {name} is not a multiple "
                                   f"of {FRAG}")
        if blk_t % warp_t:
            raise UnsupportedError(f"tensor cores: block tile {blk_t} on {name} is not a multiple "
                                   f"of the warp tile {warp_t}")
    kname = fa.axes[g.k].name
    if bk <= 0 or bk % FRAG:
        raise UnsupportedError(f"tensor cores: K chunk {tile.l1[g.k]} on {kname} is not a "
                               f"multiple of {FRAG} (nor all of {kname} = {ext[g.k]})")
    _check_padding(fa, g, tile)
    if tile.reg[g.k] not in (0, 1, FRAG):
        raise UnsupportedError(f"tensor cores: the warp's K step must be {FRAG}, got "
                               f"{tile.reg[g.k]}")
    if wm * wn > MAX_WARP_TILE:
        raise UnsupportedError(f"tensor cores: warp tile {wm}x{wn} holds {wm * wn // WARP} "
                               "fp32 accumulators per thread (at most 128 fit in registers)")
    warps = (bm // wm) * (bn // wn)
    if tile.threads != WARP * warps:
        raise UnsupportedError(f"tensor cores: block {bm}x{bn} / warp {wm}x{wn} tiles make "
                               f"{warps} warps = {WARP * warps} threads, the tile says "
                               f"{tile.threads}")
    if tile.threads > 1024:
        raise UnsupportedError(f"tensor cores: {tile.threads} threads per block (at most 1024)")
    lanes_a, lanes_b = copy_lanes(g.a_row), copy_lanes(g.b_row)
    if (bm * bk) % (lanes_a * tile.threads) or (bk * bn) % (lanes_b * tile.threads):
        raise UnsupportedError(
            f"tensor cores: the A ({bm}x{bk}) and B ({bk}x{bn}) tiles must be whole multiples of "
            f"{lanes_a * tile.threads} and {lanes_b * tile.threads} halves ({tile.threads} "
            f"threads x {lanes_a}- and {lanes_b}-half vectors)")
    if tile.stages < 1:
        raise UnsupportedError(f"tensor cores: stages must be >= 1, got {tile.stages}")
    if tile.tensor_core == MMA and g.trans_a:
        raise UnsupportedError("tensor cores: the mma/ldmatrix path needs A stored [.., M, K] "
                               "(use the wmma path for a transposed A)")


def copy_lanes(row: int) -> int:
    """Halves per global -> shared copy of an operand whose rows (last dimension) hold ``row``
    elements: ``VEC_AB`` (16 bytes) when a row is a whole number of those vectors, else the
    largest power of two that divides it (an odd row: scalar copies). Every vector then starts
    at a multiple of its size, inside one row: aligned, and on a padded axis either wholly in
    bounds or wholly padding."""
    lanes = VEC_AB
    while row % lanes:
        lanes //= 2
    return lanes


def store_lanes(n: int) -> int:
    """Elements per epilogue vector for an output row of ``n`` elements: ``VEC_C`` when rows are
    whole vectors (aligned), else the largest power of two dividing ``n``."""
    lanes = VEC_C
    while n % lanes:
        lanes //= 2
    return lanes


# ------------------------------------------------------------------------------------------------
# Padding: M, N and K rounded up to the block tile (K chunk)
# ------------------------------------------------------------------------------------------------
def _roles(g: Gemm) -> Tuple[Tuple[str, int], ...]:
    return (("M", g.m), ("N", g.n), ("K", g.k))


def padded_extents(fa: FuncAnalysis, tile: RTile, g: Optional[Gemm] = None) -> Dict[int, int]:
    """The M, N and K axes (indices into ``fa.axes``) whose extent is not a multiple of the
    tile's block tile (K chunk), each with the multiple ``apply_tensorcore`` pads it up to."""
    g = gemm_structure(fa) if g is None else g
    out = {}
    for _, ax in _roles(g):
        e, t = fa.axes[ax].extent, pad_unit(g, tile, ax)
        if t > 0 and e % t:
            out[ax] = ceil_div(e, t) * t
    return out


def pad_unit(g: Gemm, tile: RTile, ax: int) -> int:
    """What axis ``ax`` is padded to a multiple of: its block tile; for K the chunk as
    scheduled (a K chunk that is all of K, not a multiple of 16, is padded to 16s)."""
    return tile_dims(g, tile)[2] if ax == g.k else tile.l1[ax]


def padding_notes(fa: FuncAnalysis, tile: RTile, g: Optional[Gemm] = None) -> List[str]:
    """Lines for ``explain`` about ``tile``'s padding, M, N, K in that order, e.g.
    ``"tensor cores: M (axis i) padded 197 -> 208 (waste 5.3%)"`` (waste: the padded share of
    the work along that axis)."""
    g = gemm_structure(fa) if g is None else g
    pads = padded_extents(fa, tile, g)
    out = []
    for role, ax in _roles(g):
        if ax in pads:
            e, p = fa.axes[ax].extent, pads[ax]
            out.append(f"tensor cores: {role} (axis {fa.axes[ax].name}) padded {e} -> {p} "
                       f"(waste {(p - e) / p:.1%})")
    return out


def _check_padding(fa: FuncAnalysis, g: Gemm, tile: RTile) -> None:
    """An M, N or K the block tile (K chunk) does not divide is padded up to a multiple of it,
    the tile at most the extent (the padding then less than half the padded work)."""
    need = padded_extents(fa, tile, g)
    for role, ax in _roles(g):
        if ax in need and tile.l1[ax] > fa.axes[ax].extent:
            what = "the K chunk" if role == "K" else "the block tile"
            raise UnsupportedError(f"tensor cores: {what} {tile.l1[ax]} is larger than "
                                   f"{fa.axes[ax].name} = {fa.axes[ax].extent} (padding would "
                                   "be most of the work)")


def _smem_tiles(g: Gemm, tile: RTile) -> Dict[str, Tuple[int, int, int]]:
    """(rows, padded row length, bytes per element) of each shared tile, one stage."""
    bm, bn, bk, _, _ = tile_dims(g, tile)
    a_rows, a_cols = (bk, bm) if g.trans_a else (bm, bk)
    b_rows, b_cols = (bn, bk) if g.trans_b else (bk, bn)
    a, b = (a_rows, a_cols + AB_PAD, 2), (b_rows, b_cols + AB_PAD, 2)
    # TVM 0.27's StorageRewrite reuses a dead fp16 A or B tile for the fp32 staging tile when
    # that one is no larger, and then fails ("tvm_access_ptr element type must match"): pad the
    # staging rows until it is larger than either (free: the A/B stages together are larger
    # still, and dynamic shared memory overlays the staging tile on them)
    biggest = max(r * c * e for r, c, e in (a, b)) * max(1, tile.stages)
    pad = C_PAD
    while bm * (bn + pad) * 4 <= biggest:
        pad += 8  # stays 16-byte aligned, rows keep shifting by 4 banks
    return {"A": a, "B": b, "C": (bm, bn + pad, 4)}


def staging_row(g: Gemm, tile: RTile) -> int:
    """Padded row length (floats) of the accumulator staging tile."""
    return _smem_tiles(g, tile)["C"][1]


def smem_bytes(fa: FuncAnalysis, tile: RTile, gemm: Optional[Gemm] = None) -> int:
    """Shared memory per block of ``apply_tensorcore``'s schedule: the A and B tiles (all
    ``stages``, rows padded) and, after the K loop, the fp32 accumulator staging tile, which
    dynamic shared memory lets TVM overlay on the (then dead) A/B tiles: the larger of the two.
    ``gemm``: ``gemm_structure(fa)``, when the caller has it."""
    g = gemm_structure(fa) if gemm is None else gemm
    t = _smem_tiles(g, tile)
    ab = sum(r * c * e for r, c, e in (t["A"], t["B"])) * max(1, tile.stages)
    r, c, e = t["C"]
    return max(ab, r * c * e)


def validate_tile(fa: FuncAnalysis, tile: RTile, dev, gemm: Optional[Gemm] = None) -> None:
    """Raise UnsupportedError with the reason when ``tile`` is not valid for tensor cores on
    ``dev`` (a GPU ``DeviceModel``); see the module docstring for the rules. ``gemm``:
    ``gemm_structure(fa)``, when the caller has it (the policy checks many tiles)."""
    g = gemm_structure(fa) if gemm is None else gemm
    check_tile(fa, g, tile)
    if getattr(dev, "kind", None) != "gpu":
        raise UnsupportedError(f"tensor cores: device {getattr(dev, 'name', dev)!r} is not a GPU")
    cc = gpu.compute_capability(dev)
    if cc.number < (7, 0):
        raise UnsupportedError(f"tensor cores: {dev.name} (compute capability {cc}) has none")
    if tile.tensor_core == MMA and cc.number < (8, 0):
        raise UnsupportedError(f"tensor cores: mma.sync m16n8k16 needs sm_80+, {dev.name} is {cc}")
    if tile.stages >= 2 and cc.number < (8, 0):
        raise UnsupportedError(f"tensor cores: a {tile.stages}-stage pipeline uses cp.async "
                               f"(sm_80+), {dev.name} is {cc}")
    max_threads = dev.gpu.max_threads_per_block
    if tile.threads > max_threads:
        raise UnsupportedError(f"tensor cores: {tile.threads} threads > {max_threads} on "
                               f"{dev.name}")
    need, limit = smem_bytes(fa, tile, g), gpu.smem_limit(dev)
    if need > limit:
        raise UnsupportedError(f"tensor cores: the tile needs {need} B of shared memory, "
                               f"{dev.name} allows {limit} B per block")

