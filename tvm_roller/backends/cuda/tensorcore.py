"""Tensor-core lowering of fp16 matmuls (fp16 operands, fp32 accumulation) for the CUDA backend.

``apply_tensorcore(func, fa, tile)`` turns a (batched) matmul PrimFunc and a CUDA ``RTile`` into a
``tvm.s_tir.Schedule``:

    blockIdx.z: batch (all batch axes fused) · blockIdx.y: M / BM · blockIdx.x: N / BN
      threadIdx.y: warps (BM/WM x BN/WN) · K / BK chunks (software-pipelined, ``stages``)
        A, B tiles: global -> shared.dyn, 16-byte vectors (8 halves) over all threads,
                    rows padded by 8 halves (``storage_align``), cp.async when stages >= 2
                    (shorter vectors, down to scalars without cp.async, when the operand's
                    rows are not whole 8-half vectors: an odd K or N)
        BK / 16 steps: 16x16 fragments of A and B from shared, WM/16 x WN/16 mma per warp
      accumulator fragments -> shared.dyn (fp32, rows padded by 4 floats)
      epilogue (the fp16 cast and any elementwise consumers: bias, relu, ...) from shared to
      global: 4 elements per thread and vector, consecutive threads on consecutive columns

Padding (ROLLER's alignment of an axis to the execution unit): an M, N or K that the block tile
(K chunk) does not divide is padded up to a multiple of it, ``sch.pad_einsum``: the shared-memory
copies read ``if_then_else(in bounds, A[..], 0)`` (zero-filling cp.async, ``@p cp.async`` /
``@!p st.shared``, where the copy is a vector: each vector lies wholly inside a row, so it is
wholly in bounds or wholly padding) and the epilogue store is predicated on the bounds. The
padding follows from the tile and the extents (``padded_extents``); ``padding_notes`` explains it
for ``explain``.

Two tensor-core flavours (``tile.tensor_core``):

* ``"wmma_16x16x16_f16f32"`` (``WMMA``): ``nvcuda::wmma`` load/mma/store on 16x16x16 fragments,
  sm_70+. Any operand layout: A[.., M, K] or A[.., K, M], B[.., K, N] or B[.., N, K].
* ``"mma_m16n8k16_f16f32"`` (``MMA``): ``ldmatrix`` + ``mma.sync.aligned.m16n8k16`` (two per
  16x16 tile), sm_80+, what is faster on Ampere and Hopper. A[.., M, K] with B[.., K, N] or
  B[.., N, K]; needs ``tir_pipeline(tile)`` (see below).

The intrinsics are roller's own (``roller_*``, registered once per process on first use), not
``tvm.s_tir.tensor_intrin.cuda``, whose import registers ~80 intrinsics and takes 30-50 s.

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

Build the scheduled module with ``build(mod, tile, target)``, or ``tvm.compile(mod, target,
tir_pipeline=tir_pipeline(tile))`` under ``PassContext(config=pass_config(tile))``:

  * ``tirx.use_async_copy`` turns the pipelined shared-memory copies into cp.async (without it
    the pipeline still works, with synchronous copies);
  * the mma path keeps its register fragments in TVM "warp" buffers, which TVM 0.27's
    LowerWarpMemory lowers only one per statement sequence and not through CSE variables:
    ``tir_pipeline(tile)`` names a copy of TVM's "s_tir" pipeline that runs without CSE and
    repeats the pass (for every function of the module it compiles).

What was checked without a GPU (``tests/backends/cuda/test_tensorcore.py``, padded kernels in
``test_tensorcore_padding.py``): TVM lowers the schedules; nvcc (sm_80, sm_90) compiles them
with no spills and no stack frame; ``verify_gpu_code`` passes on the lowered kernel; the PTX
holds (wmma.)mma.sync and cp.async; and the generated CUDA, run
on the host by an emulator (threads as OS threads, barriers, warp-collective ldmatrix / mma.sync
and wmma with the PTX ISA's fragment layouts, deferred cp.async), matches numpy on small shapes.
Never checked: timing, and behaviour on a real GPU.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple

from tvm import s_tir

from tvm_roller.analysis import FuncAnalysis, unwrap_func
from tvm_roller.analysis.access import build_access
from tvm_roller.analysis.schedule import SCHEDULE_ERRORS, attempt, axis_loops
from tvm_roller.core.errors import UnsupportedError
from tvm_roller.core.rtile import RTile, ceil_div
from tvm_roller.hardware import gpu
from tvm_roller.hardware.model import dtype_bytes

WMMA = "wmma_16x16x16_f16f32"
MMA = "mma_m16n8k16_f16f32"
TENSOR_CORE_SHAPES = (WMMA, MMA)

SMEM_SCOPE = "shared.dyn"
AB_PAD = 8  # halves appended to every row of the A/B tiles (16 B: keeps ldm a multiple of 8)
C_PAD = 4  # floats appended to every row of the accumulator staging tile (16 B), at least
VEC_AB = 8  # halves per global -> shared vector (16 B)
VEC_C = 4  # elements per epilogue vector (a float4 from shared)
# lanes of a warp: wmma / mma.sync fragments are defined for 32-lane warps, and the tile rules
# and the schedule below have no device model (validate_tile reads the device's limits)
WARP = 32
MAX_WARP_TILE = 64 * 64  # WM * WN: the accumulator is WM*WN/32 fp32 registers per thread
FRAG = 16
_LOCK = threading.Lock()  # registration of intrinsics and of the TIR pipeline


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


def _tile_dims(g: Gemm, tile: RTile) -> Tuple[int, int, int, int, int]:
    """Block tile BM, BN, the K chunk BK as scheduled (a whole K padded to 16s), warp tile."""
    bm, bn, bk = tile.l1[g.m], tile.l1[g.n], tile.l1[g.k]
    if _whole_k(g, tile):
        bk = ceil_div(bk, FRAG) * FRAG
    wm, wn = tile.reg[g.m], tile.reg[g.n]
    return bm, bn, bk, wm, wn


def _check_tile(fa: FuncAnalysis, g: Gemm, tile: RTile) -> None:
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
    bm, bn, bk, wm, wn = _tile_dims(g, tile)
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
    return _tile_dims(g, tile)[2] if ax == g.k else tile.l1[ax]


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
    bm, bn, bk, _, _ = _tile_dims(g, tile)
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


def _c_row(g: Gemm, tile: RTile) -> int:
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
    _check_tile(fa, g, tile)
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


TIR_PIPELINE = "roller_s_tir"


def _lower_all_warp_memory():
    """TVM 0.27's LowerWarpMemory lowers only the first "warp" buffer of a statement sequence;
    the mma path has several (A, B and accumulator fragments, and the pipeline's copies): repeat
    it until nothing changes."""
    import tvm
    import tvm_ffi

    @tvm.transform.module_pass(opt_level=0, name="RollerLowerAllWarpMemory")
    def _pass(mod, _ctx):
        for _ in range(64):
            new = tvm.tirx.transform.LowerWarpMemory()(mod)
            if tvm_ffi.structural_equal(new, mod):
                return new
            mod = new
        return mod

    return _pass


def _register_pipeline() -> None:
    from tvm.tirx import compilation_pipeline as cp

    if TIR_PIPELINE in cp.PIPELINE_MAP:
        return

    def factory(**kwargs):
        import tvm

        pipeline, finalize_host, finalize_device = cp.get_tir_pipeline("s_tir", **kwargs)

        @tvm.transform.module_pass(opt_level=0, name="RollerSTirPipelineWithoutCSE")
        def pipeline_without_cse(mod, ctx):
            # CSE would hide the lane (threadIdx.x) of warp-buffer indices in let variables,
            # which TVM 0.27's LowerWarpMemory cannot see through
            config = dict(ctx.config)
            config["tirx.disable_cse_tir"] = True
            with tvm.transform.PassContext(opt_level=ctx.opt_level, config=config,
                                           required_pass=list(ctx.required_pass),
                                           disabled_pass=list(ctx.disabled_pass),
                                           instruments=list(ctx.instruments)):
                return pipeline(mod)

        def finalize_device_all_warps():
            return tvm.transform.Sequential([_lower_all_warp_memory(), finalize_device()])

        return pipeline_without_cse, finalize_host, finalize_device_all_warps

    with _LOCK:
        if TIR_PIPELINE not in cp.PIPELINE_MAP:
            cp.register_tir_pipeline(TIR_PIPELINE, factory)


def tir_pipeline(tile: RTile) -> str:
    """The TIR pipeline to compile the schedule with (``tvm.compile(..., tir_pipeline=...)``,
    ``relax.build(..., tir_pipeline=...)``): TVM's default (the "s_tir" pipeline) for WMMA; for
    the mma path ``TIR_PIPELINE``: the same pipeline without CSE and with every warp buffer
    lowered to registers (TVM's default pipeline fails on, or keeps in local memory, all but
    one of them)."""
    if tile.tensor_core == MMA:
        _register_pipeline()
        return TIR_PIPELINE
    return "default"


def build(mod, tile: RTile, target):
    """``tvm.compile`` of a scheduled module (``apply_tensorcore(...).mod``) under
    ``pass_config(tile)`` and ``tir_pipeline(tile)``; returns the ``tvm.runtime.Executable``."""
    import tvm

    with tvm.transform.PassContext(config=pass_config(tile)):
        return tvm.compile(mod, target, tir_pipeline=tir_pipeline(tile))


def lower_device_kernel(mod, tile: RTile, target):
    """The lowered device kernel (``calling_conv`` 2) of a scheduled module, the function
    ``tvm.s_tir.analysis.verify_gpu_code`` checks; warp buffers already lowered."""
    import tvm

    tgt = tvm.target.Target(target) if not isinstance(target, tvm.target.Target) else target
    from tvm.tirx import compilation_pipeline as cp

    with tvm.transform.PassContext(config=pass_config(tile)):
        pipeline, _, finalize_device = cp.get_tir_pipeline(tir_pipeline(tile))
        low = pipeline(tvm.tirx.transform.BindTarget(tgt.with_host("llvm"))(mod))
        kernels = [f for _, f in low.functions_items()
                   if f.attrs is not None and f.attrs.get("calling_conv") is not None
                   and int(f.attrs["calling_conv"]) == 2]
        if len(kernels) != 1:
            raise RuntimeError(f"expected one device kernel, got {len(kernels)}")
        dev = finalize_device()(tvm.IRModule({"kernel": kernels[0]}))
    return dev["kernel"]


def pass_config(tile: RTile) -> Dict[str, object]:
    """PassContext config to compile the schedule with: cp.async for a pipelined K loop (TVM 0.27
    emits cp.async for ``software_pipeline_async_stages`` even without it; kept for clarity)."""
    return {"tirx.use_async_copy": True} if tile.stages >= 2 else {}


# ------------------------------------------------------------------------------------------------
# roller's own tensor intrinsics (registered on first use, once per process)
# ------------------------------------------------------------------------------------------------
def _register(name: str, make) -> str:
    from tvm.s_tir import TensorIntrin

    if TensorIntrin.get(name, allow_missing=True) is None:
        with _LOCK:
            if TensorIntrin.get(name, allow_missing=True) is None:
                TensorIntrin.register(name, *make())
    return name


def _frag_index(buf, stride):
    """Index of the 16x16 fragment at ``buf``'s offset in a fragment array of row stride
    ``stride`` (TVM's wmma codegen keeps one array of fragments per buffer)."""
    return (buf.elem_offset // stride // FRAG) * (stride // FRAG) + buf.elem_offset % stride // FRAG


def _copy_desc(dtype: str, src_scope: str, dst_scope: str):
    """What a fragment load or store computes: a 16x16 copy between two scopes."""
    from tvm.script import tirx as T

    @T.prim_func(s_tir=True)
    def desc(a: T.handle, c: T.handle) -> None:
        A = T.match_buffer(a, (16, 16), dtype, align=64, offset_factor=16, scope=src_scope)
        C = T.match_buffer(c, (16, 16), dtype, align=64, offset_factor=16, scope=dst_scope)
        with T.sblock("root"):
            T.reads(A[0:16, 0:16])
            T.writes(C[0:16, 0:16])
            for i, j in T.grid(16, 16):
                with T.sblock("copy"):
                    vi, vj = T.axis.remap("SS", [i, j])
                    C[vi, vj] = A[vi, vj]

    return desc


def _wmma_load(operand: str, col_major: bool, scope: str):
    from tvm.script import tirx as T

    frag_scope = f"wmma.matrix_{operand}"
    layout = "col_major" if col_major else "row_major"

    desc = _copy_desc("float16", scope, frag_scope)

    @T.prim_func(s_tir=True)
    def impl(a: T.handle, c: T.handle) -> None:
        s1 = T.int32()
        s0 = T.int32()
        d1 = T.int32()
        d0 = T.int32()
        A = T.match_buffer(a, (16, 16), "float16", align=64, offset_factor=16, scope=scope,
                           strides=[s1, s0])
        C = T.match_buffer(c, (16, 16), "float16", align=64, offset_factor=16, scope=frag_scope,
                           strides=[d1, d0])
        with T.sblock("root"):
            T.reads(A[0:16, 0:16])
            T.writes(C[0:16, 0:16])
            T.evaluate(T.tvm_load_matrix_sync(C.data, 16, 16, 16, _frag_index(C, d1),
                                              A.access_ptr("r", ptr_type="float16"), s1, layout,
                                              dtype="void"))

    return desc, impl


def _wmma_fill():
    from tvm.script import tirx as T

    @T.prim_func(s_tir=True)
    def desc(c: T.handle) -> None:
        C = T.match_buffer(c, (16, 16), "float32", align=64, offset_factor=16,
                           scope="wmma.accumulator")
        with T.sblock("root"):
            T.reads()
            T.writes(C[0:16, 0:16])
            for i, j in T.grid(16, 16):
                with T.sblock("init"):
                    vi, vj = T.axis.remap("SS", [i, j])
                    C[vi, vj] = T.float32(0)

    @T.prim_func(s_tir=True)
    def impl(c: T.handle) -> None:
        d1 = T.int32()
        d0 = T.int32()
        C = T.match_buffer(c, (16, 16), "float32", align=64, offset_factor=16,
                           scope="wmma.accumulator", strides=[d1, d0])
        with T.sblock("root"):
            T.reads()
            T.writes(C[0:16, 0:16])
            T.evaluate(T.tvm_fill_fragment(C.data, 16, 16, 16, _frag_index(C, d1), T.float32(0),
                                           dtype="void"))

    return desc, impl


def _wmma_store(scope: str):
    from tvm.script import tirx as T

    desc = _copy_desc("float32", "wmma.accumulator", scope)

    @T.prim_func(s_tir=True)
    def impl(a: T.handle, c: T.handle) -> None:
        s1 = T.int32()
        s0 = T.int32()
        d1 = T.int32()
        d0 = T.int32()
        A = T.match_buffer(a, (16, 16), "float32", align=64, offset_factor=16,
                           scope="wmma.accumulator", strides=[d1, d0])
        C = T.match_buffer(c, (16, 16), "float32", align=64, offset_factor=16, scope=scope,
                           strides=[s1, s0])
        with T.sblock("root"):
            T.reads(A[0:16, 0:16])
            T.writes(C[0:16, 0:16])
            T.evaluate(T.tvm_store_matrix_sync(A.data, 16, 16, 16, _frag_index(A, d1),
                                               C.access_ptr("w", ptr_type="float32"), s1,
                                               "row_major", dtype="void"))

    return desc, impl


def _wmma_sync(trans_a: bool, trans_b: bool):
    from tvm.script import tirx as T

    def a_idx(i, k):
        return (k, i) if trans_a else (i, k)

    def b_idx(k, j):
        return (j, k) if trans_b else (k, j)

    @T.prim_func(s_tir=True)
    def desc(a: T.handle, b: T.handle, c: T.handle) -> None:
        A = T.match_buffer(a, (16, 16), "float16", align=64, offset_factor=16,
                           scope="wmma.matrix_a")
        B = T.match_buffer(b, (16, 16), "float16", align=64, offset_factor=16,
                           scope="wmma.matrix_b")
        C = T.match_buffer(c, (16, 16), "float32", align=64, offset_factor=16,
                           scope="wmma.accumulator")
        with T.sblock("root"):
            T.reads(C[0:16, 0:16], A[0:16, 0:16], B[0:16, 0:16])
            T.writes(C[0:16, 0:16])
            for i, j, k in T.grid(16, 16, 16):
                with T.sblock(""):
                    vi, vj, vk = T.axis.remap("SSR", [i, j, k])
                    ai, ak = T.meta_var(a_idx(vi, vk))
                    bk, bj = T.meta_var(b_idx(vk, vj))
                    C[vi, vj] = C[vi, vj] + T.Cast("float32", A[ai, ak]) * T.Cast(
                        "float32", B[bk, bj])

    @T.prim_func(s_tir=True)
    def impl(a: T.handle, b: T.handle, c: T.handle) -> None:
        a1 = T.int32()
        a0 = T.int32()
        b1 = T.int32()
        b0 = T.int32()
        c1 = T.int32()
        c0 = T.int32()
        A = T.match_buffer(a, (16, 16), "float16", align=64, offset_factor=16,
                           scope="wmma.matrix_a", strides=[a1, a0])
        B = T.match_buffer(b, (16, 16), "float16", align=64, offset_factor=16,
                           scope="wmma.matrix_b", strides=[b1, b0])
        C = T.match_buffer(c, (16, 16), "float32", align=64, offset_factor=16,
                           scope="wmma.accumulator", strides=[c1, c0])
        with T.sblock("root"):
            T.reads(C[0:16, 0:16], A[0:16, 0:16], B[0:16, 0:16])
            T.writes(C[0:16, 0:16])
            T.evaluate(T.tvm_mma_sync(C.data, _frag_index(C, c1), A.data, _frag_index(A, a1),
                                      B.data, _frag_index(B, b1), C.data, _frag_index(C, c1),
                                      dtype="void"))

    return desc, impl


def _scope_tag(scope: str) -> str:
    return scope.replace(".", "_")


def wmma_intrinsics(trans_a: bool, trans_b: bool, scope: str = SMEM_SCOPE) -> Dict[str, str]:
    """Register (once) and name roller's WMMA intrinsics for one operand layout."""
    tag = _scope_tag(scope)
    lay = lambda t: "col" if t else "row"  # noqa: E731
    return {
        "load_a": _register(f"roller_wmma_load_a_{lay(trans_a)}_{tag}",
                            lambda: _wmma_load("a", trans_a, scope)),
        "load_b": _register(f"roller_wmma_load_b_{lay(trans_b)}_{tag}",
                            lambda: _wmma_load("b", trans_b, scope)),
        "compute": _register(f"roller_wmma_sync_f16f16f32_{'t' if trans_a else 'n'}"
                             f"{'t' if trans_b else 'n'}", lambda: _wmma_sync(trans_a, trans_b)),
        "init": _register("roller_wmma_fill_f32", _wmma_fill),
        "store": _register(f"roller_wmma_store_f32_{tag}", lambda: _wmma_store(scope)),
    }


def _ldmatrix_layout(i, j):
    """(lane, element) of entry (i, j) of a 16x16 fp16 tile in an ldmatrix.x4 / mma m16n8k16
    register fragment (8 halves per lane)."""
    return 4 * (i % 8) + (j % 8) // 2, 4 * (j // 8) + (i // 8) * 2 + (j % 2)


def _ldmatrix_inverse(lane, elem):
    return 8 * (elem % 4 // 2) + lane // 4, 8 * (elem // 4) + (lane % 4) * 2 + (elem % 2)


# Register fragments of the mma path live in "warp" buffers laid out [.., lane, r/16, c/16,
# element] (``_fragment_index_map``): the lane outermost, so that TVM's LowerWarpMemory sees
# every access as ``lane * m + x`` with ``x < m`` and turns the buffer into m registers per thread
# with constant indices; one 16x16 tile is the [32, 1, 1, 8] region of a lane's 8 elements.
def _ldmatrix(operand: str, trans: bool, scope: str):
    """shared [16, 16] -> the warp's register fragment [32 lanes, 8], one ``ldmatrix.x4``.
    A is stored [M, K]; B [K, N] (loaded with ``.trans``) or [N, K] (``trans``)."""
    from tvm.script import tirx as T

    if operand == "a":
        ld_trans, row_major_input = False, True
    else:
        ld_trans, row_major_input = not trans, not trans

    def smem_offset(tx, stride):
        if row_major_input:  # lanes 0-15 address rows 0-15 of columns 0-7, lanes 16-31 of 8-15
            return stride * (tx % 16) + 8 * (tx // 16)
        # B stored [N, K]: lanes 0-7 rows 0-7 / k 0-7, 8-15 rows 0-7 / k 8-15, 16-31 rows 8-15
        return stride * 8 * (tx // 16) + stride * (tx % 8) + 8 * ((tx % 16) // 8)

    @T.prim_func(s_tir=True)
    def desc(warp_handle: T.handle, shared_handle: T.handle) -> None:
        shared = T.match_buffer(shared_handle, (16, 16), "float16", align=64, offset_factor=16,
                                scope=scope)
        warp = T.match_buffer(warp_handle, (32, 1, 1, 8), "float16", offset_factor=1,
                              scope="warp")
        with T.sblock("root"):
            T.reads(shared[0:16, 0:16])
            T.writes(warp[0:32, 0:1, 0:1, 0:8])
            for ax0, ax1 in T.grid(16, 16):
                with T.sblock("shared_warp"):
                    v0, v1 = T.axis.remap("SS", [ax0, ax1])
                    T.reads(shared[v0, v1])
                    lane, elem = T.meta_var(_ldmatrix_layout(v0, v1))
                    T.writes(warp[lane, 0, 0, elem])
                    warp[lane, 0, 0, elem] = shared[v0, v1]

    @T.prim_func(s_tir=True)
    def impl(warp_handle: T.handle, shared_handle: T.handle) -> None:
        s0 = T.int32()
        s1 = T.int32()
        w0 = T.int32()
        w1 = T.int32()
        w2 = T.int32()
        w3 = T.int32()
        shared = T.match_buffer(shared_handle, (16, 16), "float16", align=64, offset_factor=16,
                                scope=scope, strides=[s0, s1])
        warp = T.match_buffer(warp_handle, (32, 1, 1, 8), "float16", offset_factor=1,
                              scope="warp", strides=[w0, w1, w2, w3])
        with T.sblock("root"):
            T.reads(shared[0:16, 0:16])
            T.writes(warp[0:32, 0:1, 0:1, 0:8])
            for tx in T.thread_binding(0, 32, "threadIdx.x"):
                T.evaluate(T.ptx_legacy.ldmatrix(ld_trans, 4, ".b16", warp.data,
                                                 warp.elem_offset + w0 * tx,
                                                 shared.access_ptr("r"), smem_offset(tx, s0),
                                                 dtype="float16"))

    return desc, impl


def _mma_sync(trans_b: bool):
    """C[16, 16] += A[16, 16] x B[16, 16] on register fragments: two ``mma.sync m16n8k16``
    (fp16 inputs, fp32 accumulators), the second on the B and C halves of columns 8-15."""
    from tvm.script import tirx as T

    def b_idx(k, j):
        return (j, k) if trans_b else (k, j)

    @T.prim_func(s_tir=True)
    def desc(a: T.handle, b: T.handle, c: T.handle) -> None:
        A = T.match_buffer(a, (32, 1, 1, 8), "float16", offset_factor=1, scope="warp")
        B = T.match_buffer(b, (32, 1, 1, 8), "float16", offset_factor=1, scope="warp")
        C = T.match_buffer(c, (32, 1, 1, 8), "float32", offset_factor=1, scope="warp")
        with T.sblock("root"):
            T.reads(C[0:32, 0:1, 0:1, 0:8], A[0:32, 0:1, 0:1, 0:8], B[0:32, 0:1, 0:1, 0:8])
            T.writes(C[0:32, 0:1, 0:1, 0:8])
            for i, j, k in T.grid(16, 16, 16):
                with T.sblock("C"):
                    vi, vj, vk = T.axis.remap("SSR", [i, j, k])
                    tc, lc = T.meta_var(_ldmatrix_layout(vi, vj))
                    ta, la = T.meta_var(_ldmatrix_layout(vi, vk))
                    b0, b1 = T.meta_var(b_idx(vk, vj))
                    tb, lb = T.meta_var(_ldmatrix_layout(b0, b1))
                    T.reads(C[tc, 0, 0, lc], A[ta, 0, 0, la], B[tb, 0, 0, lb])
                    T.writes(C[tc, 0, 0, lc])
                    C[tc, 0, 0, lc] = C[tc, 0, 0, lc] + T.Cast(
                        "float32", A[ta, 0, 0, la]) * T.Cast("float32", B[tb, 0, 0, lb])

    @T.prim_func(s_tir=True)
    def impl(a: T.handle, b: T.handle, c: T.handle) -> None:
        a0 = T.int32()
        a1 = T.int32()
        a2 = T.int32()
        a3 = T.int32()
        b0 = T.int32()
        b1 = T.int32()
        b2 = T.int32()
        b3 = T.int32()
        c0 = T.int32()
        c1 = T.int32()
        c2 = T.int32()
        c3 = T.int32()
        A = T.match_buffer(a, (32, 1, 1, 8), "float16", offset_factor=1, scope="warp",
                           strides=[a0, a1, a2, a3])
        B = T.match_buffer(b, (32, 1, 1, 8), "float16", offset_factor=1, scope="warp",
                           strides=[b0, b1, b2, b3])
        C = T.match_buffer(c, (32, 1, 1, 8), "float32", offset_factor=1, scope="warp",
                           strides=[c0, c1, c2, c3])
        with T.sblock("root"):
            T.reads(C[0:32, 0:1, 0:1, 0:8], A[0:32, 0:1, 0:1, 0:8], B[0:32, 0:1, 0:1, 0:8])
            T.writes(C[0:32, 0:1, 0:1, 0:8])
            for tx in T.thread_binding(0, 32, "threadIdx.x"):
                T.evaluate(T.ptx_legacy.mma("m16n8k16", "row", "col", "fp16", "fp16", "fp32",
                                            A.data, A.elem_offset + tx * a0,
                                            B.data, B.elem_offset + tx * b0,
                                            C.data, C.elem_offset + tx * c0, False,
                                            dtype="float32"))
                T.evaluate(T.ptx_legacy.mma("m16n8k16", "row", "col", "fp16", "fp16", "fp32",
                                            A.data, A.elem_offset + tx * a0,
                                            B.data, B.elem_offset + tx * b0 + 4,
                                            C.data, C.elem_offset + tx * c0 + 4, False,
                                            dtype="float32"))

    return desc, impl


def _mma_fill():
    from tvm.script import tirx as T

    @T.prim_func(s_tir=True)
    def desc(c: T.handle) -> None:
        C = T.match_buffer(c, (32, 1, 1, 8), "float32", offset_factor=1, scope="warp")
        with T.sblock("root"):
            T.reads()
            T.writes(C[0:32, 0:1, 0:1, 0:8])
            for i0, i1 in T.grid(16, 16):
                with T.sblock("C_warp"):
                    i, j = T.axis.remap("SS", [i0, i1])
                    lane, elem = T.meta_var(_ldmatrix_layout(i, j))
                    T.reads()
                    T.writes(C[lane, 0, 0, elem])
                    C[lane, 0, 0, elem] = T.float32(0)

    @T.prim_func(s_tir=True)
    def impl(c: T.handle) -> None:
        c0 = T.int32()
        c1 = T.int32()
        c2 = T.int32()
        c3 = T.int32()
        C = T.match_buffer(c, (32, 1, 1, 8), "float32", offset_factor=1, scope="warp",
                           strides=[c0, c1, c2, c3])
        with T.sblock("root"):
            T.reads()
            T.writes(C[0:32, 0:1, 0:1, 0:8])
            for tx in T.thread_binding(0, 32, "threadIdx.x"):
                for elem in T.unroll(8):
                    C[tx, 0, 0, elem] = T.float32(0)

    return desc, impl


def _mma_store(scope: str):
    """The fp32 register fragment -> a [16, 16] tile in shared memory, each lane storing its 8
    accumulators."""
    from tvm.script import tirx as T

    @T.prim_func(s_tir=True)
    def desc(a: T.handle, c: T.handle) -> None:
        C_warp = T.match_buffer(a, (32, 1, 1, 8), "float32", offset_factor=1, scope="warp")
        C = T.match_buffer(c, (16, 16), "float32", offset_factor=1, scope=scope)
        with T.sblock("root"):
            T.reads(C_warp[0:32, 0:1, 0:1, 0:8])
            T.writes(C[0:16, 0:16])
            for i0, i1 in T.grid(16, 16):
                with T.sblock("C_warp"):
                    v0, v1 = T.axis.remap("SS", [i0, i1])
                    lane, elem = T.meta_var(_ldmatrix_layout(v0, v1))
                    T.reads(C_warp[lane, 0, 0, elem])
                    T.writes(C[v0, v1])
                    C[v0, v1] = C_warp[lane, 0, 0, elem]

    @T.prim_func(s_tir=True)
    def impl(a: T.handle, c: T.handle) -> None:
        s0 = T.int32()
        s1 = T.int32()
        w0 = T.int32()
        w1 = T.int32()
        w2 = T.int32()
        w3 = T.int32()
        C_warp = T.match_buffer(a, (32, 1, 1, 8), "float32", offset_factor=1, scope="warp",
                                strides=[w0, w1, w2, w3])
        C = T.match_buffer(c, (16, 16), "float32", offset_factor=1, scope=scope,
                           strides=[s0, s1])
        with T.sblock("root"):
            T.reads(C_warp[0:32, 0:1, 0:1, 0:8])
            T.writes(C[0:16, 0:16])
            for tx in T.thread_binding(0, 32, "threadIdx.x"):
                for elem in T.unroll(8):
                    row, col = T.meta_var(_ldmatrix_inverse(tx, elem))
                    C[row, col] = C_warp[tx, 0, 0, elem]

    return desc, impl


def mma_intrinsics(trans_b: bool, scope: str = SMEM_SCOPE) -> Dict[str, str]:
    """Register (once) and name roller's ldmatrix + mma.sync intrinsics (A stored [M, K])."""
    tag = _scope_tag(scope)
    return {
        "load_a": _register(f"roller_ldmatrix_a_{tag}", lambda: _ldmatrix("a", False, scope)),
        "load_b": _register(f"roller_ldmatrix_b_{'nk' if trans_b else 'kn'}_{tag}",
                            lambda: _ldmatrix("b", trans_b, scope)),
        "compute": _register(f"roller_mma_m16n8k16_f16f16f32_{'nt' if trans_b else 'nn'}",
                             lambda: _mma_sync(trans_b)),
        "init": _register("roller_mma_fill_f32", _mma_fill),
        "store": _register(f"roller_mma_store_f32_{tag}", lambda: _mma_store(scope)),
    }


# ------------------------------------------------------------------------------------------------
# The schedule
# ------------------------------------------------------------------------------------------------
def _read_index(sch: s_tir.Schedule, block, name: str) -> int:
    reads = sch.get(block).reads
    for i, r in enumerate(reads):
        if r.source.name == name:
            return i
    raise UnsupportedError(f"tensor cores: {sch.get(block).name_hint} does not read {name}")


def _inline_producers(sch: s_tir.Schedule, names: List[str]) -> None:
    for name in reversed(names):
        if not attempt(sch.compute_inline, sch.get_sblock(name)):
            raise UnsupportedError(f"tensor cores: producer {name} cannot be inlined into the "
                                   "shared-memory loads")


def _inline_consumers(sch: s_tir.Schedule, store, names: List[str]) -> None:
    """Fold the elementwise consumers (fp16 cast, bias, relu, ...) into the store from the
    accumulator staging tile to global memory."""
    store_name = sch.get(store).name_hint
    for name in names:
        blk = sch.get_sblock(name)
        if attempt(sch.reverse_compute_inline, blk):
            continue
        # another input of the consumer (a broadcast bias) may be a block of its own: inline
        # what can be (a refused one stays a block and the retry below says so)
        for p in sch.get_producers(blk):
            if sch.get(p).name_hint != store_name:
                attempt(sch.compute_inline, p)
        if not attempt(sch.reverse_compute_inline, blk):
            raise UnsupportedError(f"tensor cores: epilogue block {name} is not elementwise on "
                                   "the matmul result")


def _contiguous_copy(sch: s_tir.Schedule, block) -> bool:
    """Whether every global read of a tile copy moves with unit stride along the tile's rows."""
    blk = sch.get(block)
    variables = [iv.var for iv in blk.iter_vars]
    inner = len(variables) - 1
    for r in blk.reads:
        acc = build_access(r, variables, "read")
        if not acc.unit_stride_innermost(inner) or acc.dims[-1].coeffs is None \
                or any(c for i, c in enumerate(acc.dims[-1].coeffs) if i != inner):
            return False
    return True


def _coop_copy(sch: s_tir.Schedule, block, warps: int, vec: int, ndim: int,
               vectorize: bool = True) -> None:
    """Spread a tile copy over the block: [rest, warps (ty), WARP (tx), vec], vectorized."""
    loops = sch.get_loops(block)[-ndim:]
    fused = sch.fuse(*loops)
    rest, ty, tx, v = sch.split(fused, [None, warps, WARP, vec])
    sch.bind(ty, "threadIdx.y")
    sch.bind(tx, "threadIdx.x")
    if vectorize:
        sch.vectorize(v)
    else:
        sch.unroll(v)
    sch.unroll(rest)


def _fragment_index_map(buf):
    """[.., r, c] -> [.., lane, r/16, c/16, element]: register fragments, lane outermost (after
    the batch dimensions) so that TVM's LowerWarpMemory sees ``lane * m + x`` with ``x < m``."""
    from tvm.tirx import IndexMap

    def f(*idx):
        r, c = idx[-2], idx[-1]
        # _ldmatrix_layout(r % 16, c % 16), written as splits of r and c that TVM's iterator
        # analysis can invert (it rejects the nested (r % 16) % 8)
        lane = 4 * (r % 8) + (c % 8) // 2
        elem = 4 * ((c % FRAG) // 8) + ((r % FRAG) // 8) * 2 + c % 2
        return (*idx[:-2], lane, r // FRAG, c // FRAG, elem)

    return IndexMap.from_func(f, ndim=len(buf.shape), index_dtype=str(buf.shape[0].ty))


def apply_tensorcore(func, fa: FuncAnalysis, tile: RTile, *,
                     async_copy: Optional[bool] = None) -> s_tir.Schedule:
    """Schedule ``func`` (a (batched) fp16 matmul with an fp32 accumulator and elementwise
    epilogues) on tensor cores with ``tile``; see the module docstring for the loop nest and the
    tile rules. ``async_copy`` (default: ``tile.stages >= 2``) marks the pipelined shared-memory
    copies as cp.async (compile under ``pass_config(tile)``)."""
    func = unwrap_func(func)
    g = gemm_structure(fa)
    _check_tile(fa, g, tile)
    if async_copy is None:
        async_copy = tile.stages >= 2
    bm, bn, bk, wm, wn = _tile_dims(g, tile)
    warps_m, warps_n = bm // wm, bn // wn
    warps = warps_m * warps_n
    mma = tile.tensor_core == MMA
    if mma:
        intrin = mma_intrinsics(g.trans_b)
        scopes = {"A": "warp", "B": "warp", "C": "warp"}
    else:
        intrin = wmma_intrinsics(g.trans_a, g.trans_b)
        scopes = {"A": "wmma.matrix_a", "B": "wmma.matrix_b", "C": "wmma.accumulator"}

    sch = s_tir.Schedule(func)
    main = sch.get_sblock(fa.main)
    read_idx = {"A": _read_index(sch, main, g.a), "B": _read_index(sch, main, g.b)}
    pad_in, pad_out = _pad(sch, main, fa, g, tile)
    loops = axis_loops(sch, main)
    lb = [loops[i] for i in g.batch]
    m0, m1, m2, m3 = sch.split(loops[g.m], [None, warps_m, wm // FRAG, FRAG])
    n0, n1, n2, n3 = sch.split(loops[g.n], [None, warps_n, wn // FRAG, FRAG])
    k0, k1, k2 = sch.split(loops[g.k], [None, bk // FRAG, FRAG])
    sch.reorder(*lb, m0, n0, m1, n1, k0, k1, m2, n2, m3, n3, k2)
    if lb:
        bz = sch.fuse(*lb) if len(lb) > 1 else lb[0]
        sch.bind(bz, "blockIdx.z")
    sch.bind(m0, "blockIdx.y")
    sch.bind(n0, "blockIdx.x")
    warp = sch.fuse(m1, n1)
    sch.bind(warp, "threadIdx.y")

    # global -> shared tiles, all threads, 16-byte vectors, padded rows
    smem = {}
    for role in ("A", "B"):
        s = sch.cache_read(main, read_idx[role], SMEM_SCOPE)
        sch.compute_at(s, k0)
        sch.storage_align(s, 0, axis=-2, factor=16, offset=AB_PAD)
        smem[role] = s
    # the zero-filling pad blocks first: the copies then read if_then_else(in bounds, A, 0)
    _inline_producers(sch, fa.producers + pad_in)
    for role, s in smem.items():
        lanes = copy_lanes(g.a_row if role == "A" else g.b_row)
        if _contiguous_copy(sch, s):
            # 16-byte vectors of what is read (4 elements when a producer casts from fp32),
            # fewer when rows are not whole vectors (an odd K or N)
            elem = max(dtype_bytes(r.source.dtype) for r in sch.get(s).reads)
            vec = min(lanes, 16 // elem)
            _coop_copy(sch, s, warps, vec, 2, vectorize=vec > 1)
            if vec * elem < 4:  # cp.async moves 4, 8 or 16 bytes
                async_copy = False
        else:
            # an inlined producer (a transpose) makes the copy a gather: 8 scalar loads per
            # thread, no cp.async (TVM 0.27 would emit one 16-byte cp.async from the first
            # element, and a gathered half8 vector as an invalid make_uint4 of 8 halves)
            _coop_copy(sch, s, warps, lanes, 2, vectorize=False)
            async_copy = False

    # shared -> fragments, per warp and K step
    frags = {}
    for role in ("A", "B"):
        f = sch.cache_read(main, _read_index(sch, main, _written_buffer(sch, smem[role])),
                           scopes[role])
        sch.compute_at(f, k1)
        frags[role] = f
    # the accumulator: fragments -> shared (fp32 staging tile) -> global through the epilogue
    c_smem = sch.cache_write(main, 0, SMEM_SCOPE)
    c_frag = sch.cache_write(main, 0, scopes["C"])
    sch.reverse_compute_at(c_frag, warp)
    if pad_out:
        # the crop of the padded result becomes the store's predicate (only what is in bounds
        # is written); after reverse_compute_at, which in TVM 0.27 drops a block's predicate
        sch.reverse_compute_at(c_smem, n0)
        _inline_consumers(sch, c_smem, pad_out + fa.consumers)
        _check_store_guarded(sch, c_smem)
    else:
        _inline_consumers(sch, c_smem, fa.consumers)
        sch.reverse_compute_at(c_smem, n0)
    vec_c = store_lanes(fa.axes[g.n].extent)
    _coop_copy(sch, c_smem, warps, vec_c, 2, vectorize=vec_c > 1)

    if tile.stages >= 2:
        sch.annotate(k0, "software_pipeline_stage", [0, 0, tile.stages - 1])
        sch.annotate(k0, "software_pipeline_order", [0, 1, 2])
        if async_copy:
            sch.annotate(k0, "software_pipeline_async_stages", [0])

    init = sch.decompose_reduction(main, k0)

    # fragment loads: the M (N) dimension split into 16-wide fragments, hoisted and unrolled
    load_loops = {}
    for role, trans in (("A", g.trans_a), ("B", g.trans_b)):
        f = frags[role]
        r, c = sch.get_loops(f)[-2:]
        mn_is_row = (role == "A") != trans
        if mn_is_row:
            ro, ri = sch.split(r, [None, FRAG])
            sch.unroll(ro)
            load_loops[role] = ri
        else:
            co, _ = sch.split(c, [None, FRAG])
            sch.reorder(co, r)
            sch.unroll(co)
            load_loops[role] = r
    # accumulator store, per 16x16 fragment
    store_name = sch.get(c_frag).name_hint
    r, c = sch.get_loops(c_frag)[-2:]
    ro, ri = sch.split(r, [None, FRAG])
    co, _ = sch.split(c, [None, FRAG])
    sch.reorder(ro, co, ri)
    sch.unroll(ro)
    sch.unroll(co)
    if mma:  # register fragments: [.., r, c] -> [.., lane, r/16, c/16, element]
        for role in ("A", "B"):
            buf = sch.get(frags[role]).writes[0].source
            sch.transform_layout(frags[role], ("write", 0), _fragment_index_map(buf))
        buf = sch.get(c_frag).reads[0].source
        sch.transform_layout(c_frag, ("read", 0), _fragment_index_map(buf))
    try:
        sch.tensorize(load_loops["A"], intrin["load_a"])
        sch.tensorize(load_loops["B"], intrin["load_b"])
        sch.tensorize(ri, intrin["store"])
        il = sch.get_loops(init)
        sch.unroll(il[-4])
        sch.unroll(il[-3])
        sch.tensorize(il[-2], intrin["init"])
        sch.unroll(m2)
        sch.unroll(n2)
        sch.unroll(k1)
        sch.tensorize(m3, intrin["compute"])
    except SCHEDULE_ERRORS as e:  # the block does not match the intrinsic
        raise UnsupportedError(f"tensor cores: {fa.main} does not match the {tile.tensor_core} "
                               f"intrinsics ({type(e).__name__}: {str(e).splitlines()[-1]})") \
            from None
    # pad the staging tile's rows (set on the tensorized block: tensorize drops block attributes)
    # stride = the padded row exactly: the smallest s >= bn with s % (row + 16) == row
    row = _c_row(g, tile)
    sch.storage_align(sch.get_sblock(store_name + "_o"), 0, axis=-2, factor=row + 16, offset=row)
    return sch


def _pad(sch: s_tir.Schedule, main, fa: FuncAnalysis, g: Gemm, tile: RTile
         ) -> Tuple[List[str], List[str]]:
    """Pad the main block's M, N, K up to the block tile (K chunk) where it does not divide them
    (``sch.pad_einsum``): zero-filled copies of the operands feed it, and a crop block copies the
    padded result out. Returns the names of the pad (producer) and crop (consumer) blocks, for
    the shared-memory copies and the epilogue store to absorb."""
    pads = padded_extents(fa, tile, g)
    if not pads:
        return [], []
    before_p = {sch.get(b).name_hint for b in sch.get_producers(main)}
    before_c = {sch.get(b).name_hint for b in sch.get_consumers(main)}
    factors = [pad_unit(g, tile, i) if i in pads else 1 for i in range(len(fa.axes))]
    if not attempt(sch.pad_einsum, main, factors):
        raise UnsupportedError(f"tensor cores: {fa.main} cannot be padded to {factors}")
    pad_in = [sch.get(b).name_hint for b in sch.get_producers(main)
              if sch.get(b).name_hint not in before_p]
    pad_out = [sch.get(b).name_hint for b in sch.get_consumers(main)
               if sch.get(b).name_hint not in before_c]
    return pad_in, pad_out


def _check_store_guarded(sch: s_tir.Schedule, store) -> None:
    """The epilogue store of a padded M or N must be predicated on the bounds (else it writes
    past the output): a guard against schedule primitives that lose the crop's predicate."""
    import tvm

    realize = tvm.get_global_func("s_tir.schedule.GetSBlockRealize")(sch, store)
    pred = realize.predicate
    if isinstance(pred, tvm.tirx.IntImm) and int(pred.value) == 1:
        raise UnsupportedError("tensor cores: the padded epilogue store lost its bounds "
                               "predicate (it would write out of bounds)")


def _written_buffer(sch: s_tir.Schedule, block) -> str:
    return sch.get(block).writes[0].source.name
