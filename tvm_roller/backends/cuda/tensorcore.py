"""Tensor-core lowering of fp16 matmuls (fp16 operands, fp32 accumulation) for the CUDA backend:
the schedule.

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
padding follows from the tile and the extents (``tensorcore_gemm.padded_extents``);
``tensorcore_gemm.padding_notes`` explains it for ``explain``.

Two tensor-core flavours (``tile.tensor_core``):

* ``"wmma_16x16x16_f16f32"`` (``WMMA``): ``nvcuda::wmma`` load/mma/store on 16x16x16 fragments,
  sm_70+. Any operand layout: A[.., M, K] or A[.., K, M], B[.., K, N] or B[.., N, K].
* ``"mma_m16n8k16_f16f32"`` (``MMA``): ``ldmatrix`` + ``mma.sync.aligned.m16n8k16`` (two per
  16x16 tile), sm_80+, what is faster on Ampere and Hopper. A[.., M, K] with B[.., K, N] or
  B[.., N, K]; needs ``tensorcore_pipeline.tir_pipeline(tile)``.

Where the rest lives: ``tensorcore_gemm`` (the GEMM recognised, the tile rules, padding and
shared-memory sizes), ``tensorcore_intrinsics`` (roller's own tensor intrinsics, tensorized
here) and ``tensorcore_pipeline`` (compiling the schedule: ``build``, ``pass_config``).

What was checked without a GPU (``tests/backends/cuda/test_tensorcore.py``, padded kernels in
``test_tensorcore_padding.py``): TVM lowers the schedules; nvcc (sm_80, sm_90) compiles them
with no spills and no stack frame; ``verify_gpu_code`` passes on the lowered kernel; the PTX
holds (wmma.)mma.sync and cp.async; and the generated CUDA, run
on the host by an emulator (threads as OS threads, barriers, warp-collective ldmatrix / mma.sync
and wmma with the PTX ISA's fragment layouts, deferred cp.async), matches numpy on small shapes.
Never checked: timing, and behaviour on a real GPU.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple

from tvm import s_tir
from tvm.s_tir.schedule import LoopRV, SBlockRV

from tvm_roller.analysis import FuncAnalysis, unwrap_func
from tvm_roller.analysis.access import build_access
from tvm_roller.analysis.schedule import SCHEDULE_ERRORS, attempt, axis_loops
from tvm_roller.backends.cuda.tensorcore_gemm import (AB_PAD, FRAG, MMA, SMEM_SCOPE, WARP, Gemm,
                                                      check_tile, copy_lanes, gemm_structure,
                                                      pad_unit, padded_extents, staging_row,
                                                      store_lanes, tile_dims)
from tvm_roller.backends.cuda.tensorcore_intrinsics import mma_intrinsics, wmma_intrinsics
from tvm_roller.core.errors import UnsupportedError
from tvm_roller.core.rtile import RTile
from tvm_roller.hardware.model import dtype_bytes


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
        # tensorcore_intrinsics._ldmatrix_layout(r % 16, c % 16), written as splits of r and c
        # that TVM's iterator analysis can invert (it rejects the nested (r % 16) % 8)
        lane = 4 * (r % 8) + (c % 8) // 2
        elem = 4 * ((c % FRAG) // 8) + ((r % FRAG) // 8) * 2 + c % 2
        return (*idx[:-2], lane, r // FRAG, c // FRAG, elem)

    return IndexMap.from_func(f, ndim=len(buf.shape), index_dtype=str(buf.shape[0].ty))


@dataclass(frozen=True)
class _Loops:
    """The main block's loops that the later steps attach to, bind, unroll or tensorize."""

    n0: LoopRV  # blockIdx.x (N / BN): the accumulator's staging store goes under it
    warp: LoopRV  # threadIdx.y (the warps): the accumulator's fragments go under it
    k0: LoopRV  # the K chunks: shared-memory copies, software-pipelined
    k1: LoopRV  # the 16-wide K steps of a chunk: fragment loads
    m2: LoopRV  # a warp's 16-row fragments
    n2: LoopRV  # a warp's 16-column fragments
    m3: LoopRV  # one 16x16x16 fragment product (tensorized)


def apply_tensorcore(func, fa: FuncAnalysis, tile: RTile, *,
                     async_copy: Optional[bool] = None) -> s_tir.Schedule:
    """Schedule ``func`` (a (batched) fp16 matmul with an fp32 accumulator and elementwise
    epilogues) on tensor cores with ``tile``; see the module docstring for the loop nest and
    ``tensorcore_gemm`` for the tile rules. ``async_copy`` (default: ``tile.stages >= 2``) marks
    the pipelined shared-memory copies as cp.async (compile under
    ``tensorcore_pipeline.pass_config(tile)``)."""
    func = unwrap_func(func)
    g = gemm_structure(fa)
    check_tile(fa, g, tile)
    if async_copy is None:
        async_copy = tile.stages >= 2
    bm, bn, _, wm, wn = tile_dims(g, tile)
    warps = (bm // wm) * (bn // wn)
    mma = tile.tensor_core == MMA
    intrin, scopes = _intrinsics(g, mma)

    sch = s_tir.Schedule(func)
    main = sch.get_sblock(fa.main)
    read_idx = {"A": _read_index(sch, main, g.a), "B": _read_index(sch, main, g.b)}
    pad_in, pad_out = _pad(sch, main, fa, g, tile)
    loops = _split_and_bind(sch, main, g, tile)
    smem = _cache_operands_in_shared(sch, main, read_idx, loops.k0)
    # the zero-filling pad blocks first: the copies then read if_then_else(in bounds, A, 0)
    _inline_producers(sch, fa.producers + pad_in)
    if not _spread_operand_copies(sch, smem, g, warps):
        async_copy = False
    frags = _cache_fragments(sch, main, smem, scopes, loops.k1)
    c_frag = _stage_accumulator(sch, main, fa, g, scopes["C"], loops, warps, pad_out)
    _pipeline_k_loop(sch, loops.k0, tile.stages, async_copy)
    init = sch.decompose_reduction(main, loops.k0)
    load_loops = _split_fragment_loads(sch, frags, g)
    store_name, store_loop = _split_fragment_store(sch, c_frag)
    if mma:
        _lane_major_fragments(sch, frags, c_frag)
    _tensorize(sch, intrin, load_loops, store_loop, init, loops, fa.main, tile.tensor_core)
    _pad_staging_rows(sch, store_name, g, tile)
    return sch


def _intrinsics(g: Gemm, mma: bool) -> Tuple[Dict[str, str], Dict[str, str]]:
    """Register (once) and name the flavour's intrinsics for ``g``'s operand layout; the storage
    scopes of the A, B and C fragments they work on."""
    if mma:
        return mma_intrinsics(g.trans_b), {"A": "warp", "B": "warp", "C": "warp"}
    return (wmma_intrinsics(g.trans_a, g.trans_b),
            {"A": "wmma.matrix_a", "B": "wmma.matrix_b", "C": "wmma.accumulator"})


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


def _split_and_bind(sch: s_tir.Schedule, main: SBlockRV, g: Gemm, tile: RTile) -> _Loops:
    """Split the main block's loops into the nest of the module docstring (block tile, warps,
    K chunks and steps, 16x16x16 fragments) and bind the block and warp loops."""
    bm, bn, bk, wm, wn = tile_dims(g, tile)
    warps_m, warps_n = bm // wm, bn // wn
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
    return _Loops(n0=n0, warp=warp, k0=k0, k1=k1, m2=m2, n2=n2, m3=m3)


def _cache_operands_in_shared(sch: s_tir.Schedule, main: SBlockRV, read_idx: Dict[str, int],
                              k0: LoopRV) -> Dict[str, SBlockRV]:
    """The global -> shared copies of the A and B tiles, per K chunk, with padded rows."""
    smem = {}
    for role in ("A", "B"):
        s = sch.cache_read(main, read_idx[role], SMEM_SCOPE)
        sch.compute_at(s, k0)
        sch.storage_align(s, 0, axis=-2, factor=16, offset=AB_PAD)
        smem[role] = s
    return smem


def _spread_operand_copies(sch: s_tir.Schedule, smem: Dict[str, SBlockRV], g: Gemm,
                           warps: int) -> bool:
    """Spread the A and B tile copies over all threads, in 16-byte vectors where the rows allow;
    whether every copy can still be a cp.async."""
    async_ok = True
    for role, s in smem.items():
        lanes = copy_lanes(g.a_row if role == "A" else g.b_row)
        if _contiguous_copy(sch, s):
            # 16-byte vectors of what is read (4 elements when a producer casts from fp32),
            # fewer when rows are not whole vectors (an odd K or N)
            elem = max(dtype_bytes(r.source.dtype) for r in sch.get(s).reads)
            vec = min(lanes, 16 // elem)
            _coop_copy(sch, s, warps, vec, 2, vectorize=vec > 1)
            if vec * elem < 4:  # cp.async moves 4, 8 or 16 bytes
                async_ok = False
        else:
            # an inlined producer (a transpose) makes the copy a gather: 8 scalar loads per
            # thread, no cp.async (TVM 0.27 would emit one 16-byte cp.async from the first
            # element, and a gathered half8 vector as an invalid make_uint4 of 8 halves)
            _coop_copy(sch, s, warps, lanes, 2, vectorize=False)
            async_ok = False
    return async_ok


def _cache_fragments(sch: s_tir.Schedule, main: SBlockRV, smem: Dict[str, SBlockRV],
                     scopes: Dict[str, str], k1: LoopRV) -> Dict[str, SBlockRV]:
    """shared -> fragments of A and B, per warp and K step."""
    frags = {}
    for role in ("A", "B"):
        f = sch.cache_read(main, _read_index(sch, main, _written_buffer(sch, smem[role])),
                           scopes[role])
        sch.compute_at(f, k1)
        frags[role] = f
    return frags


def _stage_accumulator(sch: s_tir.Schedule, main: SBlockRV, fa: FuncAnalysis, g: Gemm,
                       scope: str, loops: _Loops, warps: int, pad_out: List[str]) -> SBlockRV:
    """The accumulator: fragments -> shared (fp32 staging tile) -> global through the epilogue,
    spread over all threads. Returns the fragment -> shared block."""
    c_smem = sch.cache_write(main, 0, SMEM_SCOPE)
    c_frag = sch.cache_write(main, 0, scope)
    sch.reverse_compute_at(c_frag, loops.warp)
    if pad_out:
        # the crop of the padded result becomes the store's predicate (only what is in bounds
        # is written); after reverse_compute_at, which in TVM 0.27 drops a block's predicate
        sch.reverse_compute_at(c_smem, loops.n0)
        _inline_consumers(sch, c_smem, pad_out + fa.consumers)
        _check_store_guarded(sch, c_smem)
    else:
        _inline_consumers(sch, c_smem, fa.consumers)
        sch.reverse_compute_at(c_smem, loops.n0)
    vec_c = store_lanes(fa.axes[g.n].extent)
    _coop_copy(sch, c_smem, warps, vec_c, 2, vectorize=vec_c > 1)
    return c_frag


def _pipeline_k_loop(sch: s_tir.Schedule, k0: LoopRV, stages: int, async_copy: bool) -> None:
    """Software-pipeline the K chunks over ``stages`` buffers (the copies async if asked)."""
    if stages >= 2:
        sch.annotate(k0, "software_pipeline_stage", [0, 0, stages - 1])
        sch.annotate(k0, "software_pipeline_order", [0, 1, 2])
        if async_copy:
            sch.annotate(k0, "software_pipeline_async_stages", [0])


def _split_fragment_loads(sch: s_tir.Schedule, frags: Dict[str, SBlockRV], g: Gemm
                          ) -> Dict[str, LoopRV]:
    """Fragment loads: the M (N) dimension split into 16-wide fragments, hoisted and unrolled.
    Returns the loop each load is tensorized at."""
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
    return load_loops


def _split_fragment_store(sch: s_tir.Schedule, c_frag: SBlockRV) -> Tuple[str, LoopRV]:
    """Accumulator store, per 16x16 fragment. Returns the store block's name (tensorize renames
    the block) and the loop it is tensorized at."""
    store_name = sch.get(c_frag).name_hint
    r, c = sch.get_loops(c_frag)[-2:]
    ro, ri = sch.split(r, [None, FRAG])
    co, _ = sch.split(c, [None, FRAG])
    sch.reorder(ro, co, ri)
    sch.unroll(ro)
    sch.unroll(co)
    return store_name, ri


def _lane_major_fragments(sch: s_tir.Schedule, frags: Dict[str, SBlockRV],
                          c_frag: SBlockRV) -> None:
    """The mma path's register fragments: [.., r, c] -> [.., lane, r/16, c/16, element]."""
    for role in ("A", "B"):
        buf = sch.get(frags[role]).writes[0].source
        sch.transform_layout(frags[role], ("write", 0), _fragment_index_map(buf))
    buf = sch.get(c_frag).reads[0].source
    sch.transform_layout(c_frag, ("read", 0), _fragment_index_map(buf))


def _tensorize(sch: s_tir.Schedule, intrin: Dict[str, str], load_loops: Dict[str, LoopRV],
               store_loop: LoopRV, init: SBlockRV, loops: _Loops, main_name: str,
               tensor_core: str) -> None:
    """Tensorize the fragment loads, the accumulator store, its zero-fill and the fragment
    products; UnsupportedError when the blocks do not match the intrinsics."""
    try:
        sch.tensorize(load_loops["A"], intrin["load_a"])
        sch.tensorize(load_loops["B"], intrin["load_b"])
        sch.tensorize(store_loop, intrin["store"])
        il = sch.get_loops(init)
        sch.unroll(il[-4])
        sch.unroll(il[-3])
        sch.tensorize(il[-2], intrin["init"])
        sch.unroll(loops.m2)
        sch.unroll(loops.n2)
        sch.unroll(loops.k1)
        sch.tensorize(loops.m3, intrin["compute"])
    except SCHEDULE_ERRORS as e:  # the block does not match the intrinsic
        raise UnsupportedError(f"tensor cores: {main_name} does not match the {tensor_core} "
                               f"intrinsics ({type(e).__name__}: {str(e).splitlines()[-1]})") \
            from None


def _pad_staging_rows(sch: s_tir.Schedule, store_name: str, g: Gemm, tile: RTile) -> None:
    """Pad the staging tile's rows (set on the tensorized block: tensorize drops block
    attributes)."""
    # stride = the padded row exactly: the smallest s >= bn with s % (row + 16) == row
    row = staging_row(g, tile)
    sch.storage_align(sch.get_sblock(store_name + "_o"), 0, axis=-2, factor=row + 16, offset=row)


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
