"""roller's own tensor-core intrinsics: TVMScript descriptions and implementations of the
fragment loads, fills, multiply-accumulates and stores that ``tensorcore.apply_tensorcore``
tensorizes with, registered with ``tvm.s_tir.TensorIntrin`` on first use, once per process.

* ``wmma_intrinsics(trans_a, trans_b)``: ``nvcuda::wmma`` load/fill/mma/store on 16x16x16
  fragments (sm_70+), for any operand layout;
* ``mma_intrinsics(trans_b)``: ``ldmatrix`` + ``mma.sync.aligned.m16n8k16`` (two per 16x16
  tile, sm_80+) on register fragments in TVM "warp" buffers, A stored [M, K].

The intrinsics are roller's own (``roller_*``, registered once per process on first use), not
``tvm.s_tir.tensor_intrin.cuda``, whose import registers ~80 intrinsics and takes 30-50 s.
"""
from __future__ import annotations

import threading
from typing import Dict

from tvm_roller.backends.cuda.tensorcore_gemm import FRAG, SMEM_SCOPE

# registration of intrinsics (here) and of the TIR pipeline (tensorcore_pipeline): TVM's tables
# are process-global, and a name registered twice is an error
REGISTRATION_LOCK = threading.Lock()


# ------------------------------------------------------------------------------------------------
# roller's own tensor intrinsics (registered on first use, once per process)
# ------------------------------------------------------------------------------------------------
def _register(name: str, make) -> str:
    from tvm.s_tir import TensorIntrin

    if TensorIntrin.get(name, allow_missing=True) is None:
        with REGISTRATION_LOCK:
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
# element] (``tensorcore._fragment_index_map``): the lane outermost, so that TVM's
# LowerWarpMemory sees every access as ``lane * m + x`` with ``x < m`` and turns the buffer into
# m registers per thread with constant indices; one 16x16 tile is the [32, 1, 1, 8] region of a
# lane's 8 elements.
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
