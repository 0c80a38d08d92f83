"""Tensor-core lowering of fp16 matmuls (``lower.cuda_tensorcore``), checked without a GPU.

* fast (~20 s): workloads, GEMM structure, refused tiles, shared memory accounting against the
  lowered kernel, ``verify_gpu_code``, trace replay, and the generated CUDA of nine variants
  (wmma and ldmatrix + mma.sync; batch; B transposed with a bias + relu epilogue; A transposed
  with an fp32 output; transposing and casting producers; 1-3 pipeline stages) run on the host
  by an emulator and compared with numpy; plus a check that the emulator catches broken kernels;
* slow (``-m slow``, ~35 s): nvcc (sm_90 and sm_80) on the three ``FP16_GEMMS`` and a batched
  GEMM with both tensor-core flavours: no spills, no stack frame, shared memory as computed and
  within the H100 preset, ``verify_gpu_code`` on the lowered kernel, (wmma.)mma.sync (and
  ldmatrix) and cp.async in the PTX.

The emulator (``_emulate``) rewrites TVM's CUDA source into host C++: every CUDA thread is an OS
thread, ``__syncthreads`` a barrier; ``ldmatrix`` / ``mma.sync.m16n8k16`` are warp-collective
functions with the PTX ISA's fragment layouts, ``nvcuda::wmma`` works on whole 16x16 tiles (with
its alignment and ``ldm`` rules checked), and cp.async copies are deferred to the
``cp.async.wait_group`` that must cover them, so a missing wait or barrier shows up as wrong data.
It never stands for timing or for the hardware itself.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile

import numpy as np
import pytest
import tvm
from tvm import te

from tvm_roller import hardware
from tvm_roller.analysis import analyze
from tvm_roller.errors import UnsupportedError
from tvm_roller.hardware import gpu
from tvm_roller.lower import cuda_tensorcore as tc
from tvm_roller.rtile import RTile
from tvm_roller.suite import gpu_workloads as gw

from conftest import CUDA_TARGETS

NVCC = shutil.which("nvcc")
GXX = shutil.which("g++")


def _cuda_include():
    cands = [os.environ.get("CUDA_HOME", ""), "/usr/local/cuda"]
    if NVCC:
        out = subprocess.run(["sh", "-c", f"cat {NVCC}"], capture_output=True, text=True).stdout
        cands += [os.path.dirname(os.path.dirname(p)) for p in re.findall(r"(/\S+/bin/nvcc)", out)]
        cands.append(os.path.dirname(os.path.dirname(os.path.realpath(NVCC))))
    for c in cands:
        if c and os.path.exists(os.path.join(c, "include", "cuda_fp16.h")):
            return os.path.join(c, "include")
    return None


CUDA_INCLUDE = _cuda_include()
needs_nvcc = pytest.mark.skipif(NVCC is None, reason="nvcc not found")
needs_emulator = pytest.mark.skipif(GXX is None or CUDA_INCLUDE is None,
                                    reason="g++ or the CUDA headers (cuda_fp16.h) not found")

TARGETS = CUDA_TARGETS


def target(arch):
    return tvm.target.Target(TARGETS[arch])


def make_tile(fa, l1, reg, stages=2, shape=tc.WMMA):
    """A CUDA RTile for ``fa``'s axes: ``l1`` the block tile, ``reg`` the warp tile."""
    bm_bn_warps = 1
    for i, a in enumerate(fa.axes):
        if a.kind == "S" and reg[i] > 1:
            bm_bn_warps *= l1[i] // reg[i]
    return RTile(kind="tiled", axes=[a.name for a in fa.axes], extents=[a.extent for a in fa.axes],
                 axis_kinds="".join(a.kind for a in fa.axes), reg=list(reg), l1=list(l1),
                 l2=list(l1), vector_axis=None, vector_lanes=8, backend="cuda",
                 threads=32 * bm_bn_warps, stages=stages, tensor_core=shape)


# -- more workloads: layouts and epilogues --------------------------------------------------------
def gemm_nt_bias_relu(M, N, K):
    """relu(A[M, K] @ W[N, K]^T + bias[N]) in fp16 (nn.Linear's layout)."""
    A = te.placeholder((M, K), "float16", name="A")
    W = te.placeholder((N, K), "float16", name="W")
    bias = te.placeholder((N,), "float16", name="bias")
    k = te.reduce_axis((0, K), name="k")
    acc = te.compute((M, N), lambda i, j: te.sum(
        A[i, k].astype("float32") * W[j, k].astype("float32"), axis=k), name="matmul")
    add = te.compute((M, N), lambda i, j: acc[i, j] + bias[j].astype("float32"), name="add")
    out = te.compute((M, N), lambda i, j: te.max(add[i, j], tvm.tirx.const(0, "float32"))
                     .astype("float16"), name="relu")
    return te.create_prim_func([A, W, bias, out]).with_attr("global_symbol", "main")


def gemm_tn_f32(M, N, K):
    """A[K, M]^T @ B[K, N] with a float32 output (no epilogue)."""
    A = te.placeholder((K, M), "float16", name="A")
    B = te.placeholder((K, N), "float16", name="B")
    k = te.reduce_axis((0, K), name="k")
    acc = te.compute((M, N), lambda i, j: te.sum(
        A[k, i].astype("float32") * B[k, j].astype("float32"), axis=k), name="matmul")
    return te.create_prim_func([A, B, acc]).with_attr("global_symbol", "main")


def _matmul_to_f16(a, b, M, N, K, params):
    """C = float16(sum_k float32(a[i, k]) * float32(b[k, j])) as a PrimFunc of ``params``."""
    k = te.reduce_axis((0, K), name="k")
    acc = te.compute((M, N), lambda i, j: te.sum(
        a[i, k].astype("float32") * b[k, j].astype("float32"), axis=k), name="matmul")
    C = te.compute((M, N), lambda i, j: acc[i, j].astype("float16"), name="C")
    return te.create_prim_func(list(params) + [C]).with_attr("global_symbol", "main")


def gemm_transposed_producer(M, N, K):
    """A[M, K] @ BT with BT[k, n] = W[n, k] a block of its own: inlined, the B copy gathers."""
    A = te.placeholder((M, K), "float16", name="A")
    W = te.placeholder((N, K), "float16", name="W")
    BT = te.compute((K, N), lambda k, n: W[n, k], name="BT")
    return _matmul_to_f16(A, BT, M, N, K, [A, W])


def gemm_cast_producer(M, N, K):
    """float16(A32[M, K]) @ B[K, N]: a cast producer, inlined into the A copy (float4 loads)."""
    A = te.placeholder((M, K), "float32", name="A")
    B = te.placeholder((K, N), "float16", name="B")
    Ah = te.compute((M, K), lambda i, k: A[i, k].astype("float16"), name="Ah")
    return _matmul_to_f16(Ah, B, M, N, K, [A, B])


def gemm_f16_acc(M, N, K):
    A = te.placeholder((M, K), "float16", name="A")
    B = te.placeholder((K, N), "float16", name="B")
    k = te.reduce_axis((0, K), name="k")
    C = te.compute((M, N), lambda i, j: te.sum(A[i, k] * B[k, j], axis=k), name="C")
    return te.create_prim_func([A, B, C]).with_attr("global_symbol", "main")


def _reference(name, arrays):
    f = {k: v.astype(np.float64) for k, v in arrays.items()}
    if name == "nt_bias_relu":
        return np.maximum(f["A"] @ f["W"].T + f["bias"], 0)
    if name == "tn":
        return f["A"].T @ f["B"]
    if name == "transposed_producer":
        return f["A"] @ f["W"].T
    if name == "cast_producer":
        return arrays["A"].astype(np.float16).astype(np.float64) @ f["B"]
    return np.matmul(f["A"], f["B"])


# -- the host emulator of TVM's CUDA -------------------------------------------------------------
_PRELUDE = r'''
#include <cuda_fp16.h>
#include <vector_types.h>
#include <vector_functions.h>
#include <pthread.h>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>
#include <thread>
#include <type_traits>
struct emu_dim3 { unsigned x, y, z; };
static thread_local emu_dim3 threadIdx, blockIdx;
static emu_dim3 blockDim, gridDim;
static pthread_barrier_t emu_block_bar;
static pthread_barrier_t emu_warp_bar[32];
alignas(256) static unsigned char emu_smem[EMU_SMEM_BYTES + 64];
static void emu_fail(const char* what, long a, long b) {
  fprintf(stderr, "EMU FAIL: %s (%ld, %ld)\n", what, a, b); fflush(stderr); abort();
}
static inline int emu_tid() { return threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z); }
static inline int emu_lane() { return emu_tid() % 32; }
static inline int emu_warp() { return emu_tid() / 32; }
static inline void emu_syncthreads() { pthread_barrier_wait(&emu_block_bar); }
static inline void emu_syncwarp() { pthread_barrier_wait(&emu_warp_bar[emu_warp()]); }
static inline unsigned emu_cvta_shared(const void* p) {
  long off = (const unsigned char*)p - emu_smem;
  if (off < 0 || off >= EMU_SMEM_BYTES) emu_fail("shared address outside the dynamic shared memory", off, EMU_SMEM_BYTES);
  return (unsigned)off;
}
// cp.async: copies are queued per thread and done at cp.async.wait_group (all but the newest N
// committed groups), so a missing wait shows up as stale data
struct emu_copy { unsigned char* dst; const unsigned char* src; int n; };
static thread_local std::vector<emu_copy> emu_pending;
static thread_local std::vector<std::vector<emu_copy>> emu_groups;
static inline void emu_cp_async(void* dst, const void* src, int n) {
  if (((uintptr_t)dst) % n || ((uintptr_t)src) % n) emu_fail("misaligned cp.async", (long)(uintptr_t)dst % n, (long)(uintptr_t)src % n);
  emu_cvta_shared(dst); emu_cvta_shared((unsigned char*)dst + n - 1);
  emu_pending.push_back({(unsigned char*)dst, (const unsigned char*)src, n});
}
static inline void emu_cp_async_commit() { emu_groups.push_back(emu_pending); emu_pending.clear(); }
static inline void emu_cp_async_wait(int n) {
  while ((int)emu_groups.size() > n) {
    for (auto& c : emu_groups.front()) memcpy(c.dst, c.src, c.n);
    emu_groups.erase(emu_groups.begin());
  }
}
// warp-collective ldmatrix / mma.sync m16n8k16: lanes publish, barrier, compute, barrier
struct emu_warp_state { unsigned addr[32]; unsigned a[32][4]; unsigned b[32][2]; };
static emu_warp_state emu_ws[32];
static inline float emu_h(unsigned u, int hi) { unsigned short s = hi ? (u >> 16) : (u & 0xffff); __half h; memcpy(&h, &s, 2); return __half2float(h); }
static inline unsigned short emu_hbits(const unsigned char* p) { unsigned short s; memcpy(&s, p, 2); return s; }
static void emu_ldmatrix_x4(int trans, unsigned* r0, unsigned* r1, unsigned* r2, unsigned* r3, unsigned addr) {
  emu_warp_state& W = emu_ws[emu_warp()]; int L = emu_lane();
  if (addr % 16) emu_fail("ldmatrix row address not 16-byte aligned", addr, 0);
  W.addr[L] = addr; emu_syncwarp();
  unsigned* r[4] = {r0, r1, r2, r3}; unsigned out[4];
  int g = L / 4, t = L % 4;
  for (int q = 0; q < 4; ++q) {
    if (!trans) {
      memcpy(&out[q], emu_smem + W.addr[q * 8 + g] + 4 * t, 4);
    } else {
      unsigned lo = emu_hbits(emu_smem + W.addr[q * 8 + 2 * t] + 2 * g);
      unsigned hi = emu_hbits(emu_smem + W.addr[q * 8 + 2 * t + 1] + 2 * g);
      out[q] = lo | (hi << 16);
    }
  }
  emu_syncwarp();
  for (int q = 0; q < 4; ++q) *r[q] = out[q];
}
static void emu_mma_m16n8k16_f32(float* d0, float* d1, float* d2, float* d3, unsigned a0, unsigned a1,
                                 unsigned a2, unsigned a3, unsigned b0, unsigned b1, float c0,
                                 float c1, float c2, float c3) {
  emu_warp_state& W = emu_ws[emu_warp()]; int L = emu_lane();
  W.a[L][0] = a0; W.a[L][1] = a1; W.a[L][2] = a2; W.a[L][3] = a3; W.b[L][0] = b0; W.b[L][1] = b1;
  emu_syncwarp();
  float A[16][16], B[16][8];
  for (int l = 0; l < 32; ++l) {
    int g = l / 4, t = l % 4;
    for (int h = 0; h < 2; ++h) {
      A[g][2 * t + h] = emu_h(W.a[l][0], h); A[g + 8][2 * t + h] = emu_h(W.a[l][1], h);
      A[g][2 * t + 8 + h] = emu_h(W.a[l][2], h); A[g + 8][2 * t + 8 + h] = emu_h(W.a[l][3], h);
      B[2 * t + h][g] = emu_h(W.b[l][0], h); B[2 * t + 8 + h][g] = emu_h(W.b[l][1], h);
    }
  }
  emu_syncwarp();
  int g = L / 4, t = L % 4;
  float c[4] = {c0, c1, c2, c3};
  float* d[4] = {d0, d1, d2, d3};
  for (int i = 0; i < 4; ++i) {
    int row = g + (i >= 2 ? 8 : 0), col = 2 * t + (i & 1);
    float s = c[i];
    for (int k = 0; k < 16; ++k) s += A[row][k] * B[k][col];
    *d[i] = s;
  }
}
// nvcuda::wmma on 16x16x16 tiles: every lane computes the whole tile (same arguments in all lanes)
namespace nvcuda { namespace wmma {
struct row_major {}; struct col_major {}; struct matrix_a {}; struct matrix_b {}; struct accumulator {};
enum layout_t { mem_row_major, mem_col_major };
template <class Use, int M, int N, int K, class T, class Layout = void> struct fragment { float x[16][16]; };
template <class Use, class T, class Layout>
void load_matrix_sync(fragment<Use, 16, 16, 16, T, Layout>& f, const T* p, unsigned ldm) {
  if (((uintptr_t)p) % 32) emu_fail("wmma load pointer not 32-byte aligned", (long)((uintptr_t)p % 32), 0);
  if (ldm % 8) emu_fail("wmma load ldm not a multiple of 8", ldm, 0);
  const bool col = std::is_same<Layout, col_major>::value;
  for (int i = 0; i < 16; ++i) for (int j = 0; j < 16; ++j)
    f.x[i][j] = (float)(col ? p[j * ldm + i] : p[i * ldm + j]);
}
template <class T>
void fill_fragment(fragment<accumulator, 16, 16, 16, T, void>& f, T v) {
  for (int i = 0; i < 16; ++i) for (int j = 0; j < 16; ++j) f.x[i][j] = (float)v;
}
template <class LA, class LB>
void mma_sync(fragment<accumulator, 16, 16, 16, float, void>& d, const fragment<matrix_a, 16, 16, 16, __half, LA>& a,
              const fragment<matrix_b, 16, 16, 16, __half, LB>& b, const fragment<accumulator, 16, 16, 16, float, void>& c) {
  float r[16][16];
  for (int i = 0; i < 16; ++i) for (int j = 0; j < 16; ++j) {
    float s = c.x[i][j];
    for (int k = 0; k < 16; ++k) s += a.x[i][k] * b.x[k][j];
    r[i][j] = s;
  }
  memcpy(d.x, r, sizeof(r));
}
inline void store_matrix_sync(float* p, const fragment<accumulator, 16, 16, 16, float, void>& f, unsigned ldm, layout_t l) {
  if (((uintptr_t)p) % 32) emu_fail("wmma store pointer not 32-byte aligned", (long)((uintptr_t)p % 32), 0);
  if (ldm % 4) emu_fail("wmma store ldm not a multiple of 4", ldm, 0);
  for (int i = 0; i < 16; ++i) for (int j = 0; j < 16; ++j)
    (l == mem_row_major ? p[i * ldm + j] : p[j * ldm + i]) = f.x[i][j];
}
}}  // namespace nvcuda::wmma
static inline float max(float a, float b) { return a > b ? a : b; }
static inline float min(float a, float b) { return a < b ? a : b; }
static inline int max(int a, int b) { return a > b ? a : b; }
static inline int min(int a, int b) { return a < b ? a : b; }
static inline __half max(__half a, __half b) { return __half2float(a) > __half2float(b) ? a : b; }
static inline __half min(__half a, __half b) { return __half2float(a) < __half2float(b) ? a : b; }
#define __global__
#define __device__
#define __forceinline__ inline
#define __launch_bounds__(x)
#define __align__(x) alignas(x)
#define __syncthreads() emu_syncthreads()
#define __cvta_generic_to_shared(p) emu_cvta_shared(p)
'''


def _split_top(s):
    out, depth, cur = [], 0, ""
    for ch in s:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        if ch == "," and depth == 0:
            out.append(cur.strip())
            cur = ""
        else:
            cur += ch
    if cur.strip():
        out.append(cur.strip())
    return out


def _operands(s):
    ops = []
    for item in _split_top(s):
        m = re.fullmatch(r'"([=+]?\w+)"\s*\((.*)\)', item, re.S)
        if not m:
            raise ValueError(f"cannot parse asm operand {item!r}")
        ops.append((m.group(1), m.group(2)))
    return ops


_ASM = re.compile(r'__asm__ __volatile__\(\s*((?:"[^"]*"\s*)+):(.*?):(.*?)\);', re.S)


def _rewrite_asm(m):
    text = "".join(re.findall(r'"([^"]*)"', m.group(1)))
    outs, ins = _operands(m.group(2)), _operands(m.group(3))
    out_ptrs = [f"(unsigned*)&({e})" if c == "=r" else f"(float*)&({e})" for c, e in outs]
    in_vals = [e for _, e in ins]
    if text.startswith("ldmatrix.sync.aligned.m8n8.x4"):
        trans = 1 if ".trans" in text else 0
        return f"emu_ldmatrix_x4({trans}, {', '.join(out_ptrs)}, {in_vals[0]});"
    if text.startswith("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32"):
        return f"emu_mma_m16n8k16_f32({', '.join(out_ptrs + in_vals)});"
    raise ValueError(f"the emulator does not know the instruction {text!r}")


def _rewrite_helpers(src):
    """The cp.async helper functions TVM emits (inline PTX) -> the emulator's queue."""
    def fn(m):
        name, params, body = m.group(1), m.group(2), m.group(3)
        if "cp.async.wait_group" in body:
            n = int(re.search(r"cp\.async\.wait_group (\d+)", body).group(1))
            return f"inline void {name}() {{ emu_cp_async_wait({n}); }}\n"
        if "cp.async.commit_group" in body:
            return f"inline void {name}() {{ emu_cp_async_commit(); }}\n"
        if "cp.async.c" in body:
            if "%3" in body:
                raise ValueError("predicated cp.async is not emulated")
            n = int(re.search(r'"n"\((\d+)\)', body).group(1))
            keep = "\n".join(l for l in body.splitlines()
                             if "dst_p =" in l or "src_p =" in l)
            return (f"inline void {name}({params}) {{\n{keep}\n"
                    f"  emu_cp_async(dst_p, src_p, {n});\n}}\n")
        raise ValueError(f"unknown inline-asm helper {name}")

    return re.sub(r"__forceinline__ __device__ void (\w+)\(([^)]*)\) \{\n(.*?)\n\}\n", fn, src,
                  flags=re.S)


def _host_source(src, smem_bytes):
    """The generated CUDA translation unit, rewritten to compile as host C++ with the prelude."""
    body = src
    body = re.sub(r"#include <mma.h>", "", body)
    body = re.sub(r"__device__ half (max|min)\(half a, half b\)\n\{\n.*?\n\}\n", "", body,
                  flags=re.S)
    body = _rewrite_helpers(body)
    body = _ASM.sub(_rewrite_asm, body)
    asm = re.compile(r"\basm\s+volatile\s*\(|__asm__\s+__volatile__\s*\(")
    left = [line for line in body.splitlines() if asm.search(line)]
    if left:
        raise ValueError(f"inline asm left after rewriting: {left[:3]}")
    body = re.sub(r"extern __shared__ __align__\(\d+\) uchar (\w+)\[\];",
                  r"uchar* \1 = emu_smem;", body)
    body = body.replace("__shared__", "static")
    return _PRELUDE.replace("EMU_SMEM_BYTES", str(max(int(smem_bytes), 16))) + body


_DRIVER = r'''
static std::vector<std::vector<unsigned char>> emu_args;
static void* emu_ptr(int i) { return emu_args[i].data(); }
static void emu_thread(emu_dim3 b, emu_dim3 t) {
  blockIdx = b; threadIdx = t;
  main_kernel(@ARGS@);
  if (!emu_pending.empty() || !emu_groups.empty()) emu_cp_async_wait(0);
}
int main(int argc, char** argv) {
  int nargs = @NARGS@;
  for (int i = 0; i < nargs; ++i) {
    FILE* f = fopen(argv[1 + i], "rb"); fseek(f, 0, SEEK_END); long n = ftell(f); fseek(f, 0, SEEK_SET);
    emu_args.emplace_back(n); if (fread(emu_args.back().data(), 1, n, f) != (size_t)n) return 2; fclose(f);
  }
  gridDim = {@GX@, @GY@, @GZ@}; blockDim = {@BX@, @BY@, @BZ@};
  int nthreads = @BX@ * @BY@ * @BZ@;
  pthread_barrier_init(&emu_block_bar, nullptr, nthreads);
  for (int w = 0; w < (nthreads + 31) / 32; ++w) pthread_barrier_init(&emu_warp_bar[w], nullptr, 32);
  for (unsigned bz = 0; bz < @GZ@; ++bz) for (unsigned by = 0; by < @GY@; ++by) for (unsigned bx = 0; bx < @GX@; ++bx) {
    memset(emu_smem, 0xff, sizeof(emu_smem));  // NaN-ish garbage: a read before a write shows
    std::vector<std::thread> ts;
    for (unsigned tz = 0; tz < @BZ@; ++tz) for (unsigned ty = 0; ty < @BY@; ++ty) for (unsigned tx = 0; tx < @BX@; ++tx)
      ts.emplace_back(emu_thread, emu_dim3{bx, by, bz}, emu_dim3{tx, ty, tz});
    for (auto& t : ts) t.join();
  }
  FILE* f = fopen(argv[1 + nargs], "wb"); fwrite(emu_args[@OUT@].data(), 1, emu_args[@OUT@].size(), f); fclose(f);
  return 0;
}
'''


def _emulate(src, grid, block, smem_bytes, args, out_name, workdir=None):
    """Compile ``src`` (TVM's CUDA source with one kernel ``main_kernel``) for the host and run
    it on ``args`` ({buffer name: numpy array}); returns the array ``out_name`` afterwards."""
    sig = re.search(r'extern "C" __global__ void (?:__launch_bounds__\(\d+\) )?'
                    r'main_kernel\(([^)]*)\)\s*\{', src)
    params = [p.strip() for p in sig.group(1).split(",")]
    names = []
    for p in params:
        m = re.fullmatch(r"(\w+)\* __restrict__ (\w+)", p)
        names.append(m.group(2)[:-4] if m.group(2).endswith("_ptr") else m.group(2))
    ctype = {p: re.fullmatch(r"(\w+)\*.*", p).group(1) for p in params}
    call = ", ".join(f"({ctype[p]}*)emu_ptr({i})" for i, p in enumerate(params))
    subst = {"ARGS": call, "NARGS": str(len(params)), "OUT": str(names.index(out_name)),
             "GX": grid[0], "GY": grid[1], "GZ": grid[2], "BX": block[0], "BY": block[1],
             "BZ": block[2]}
    driver = re.sub(r"@(\w+)@", lambda m: str(subst[m.group(1)]), _DRIVER)
    code = _host_source(src, smem_bytes) + driver
    d = workdir or tempfile.mkdtemp(prefix="roller-emu-")
    os.makedirs(d, exist_ok=True)
    cpp, exe = os.path.join(d, "emu.cpp"), os.path.join(d, "emu")
    open(cpp, "w").write(code)
    cuda_inc = CUDA_INCLUDE
    r = subprocess.run(["g++", "-std=c++17", "-O1", "-pthread", "-w", f"-I{cuda_inc}", cpp,
                        "-o", exe], capture_output=True, text=True)
    if r.returncode:
        raise RuntimeError("host compile of the emulated kernel failed:\n" + r.stderr[-4000:])
    files = []
    for i, n in enumerate(names):
        fn = os.path.join(d, f"arg{i}.bin")
        np.ascontiguousarray(args[n]).tofile(fn)
        files.append(fn)
    outf = os.path.join(d, "out.bin")
    r = subprocess.run([exe] + files + [outf], capture_output=True, text=True, timeout=600)
    if r.returncode:
        raise RuntimeError(f"emulated kernel failed (rc {r.returncode}): {r.stderr[-2000:]}")
    ref = args[out_name]
    return np.fromfile(outf, dtype=ref.dtype).reshape(ref.shape)


# -- workloads and structure ----------------------------------------------------------------------
def test_fp16_workloads():
    assert set(gw.FP16_GEMMS) == {"HGEMM:4096", "HGEMM:1024", "HGEMM:128x3072x768"}
    for name, (M, N, K) in gw.FP16_GEMMS.items():
        fa = analyze(gw.create(name), backend="cuda")
        assert fa.main == "matmul" and fa.consumers == ["C"]
        assert [(a.extent, a.kind) for a in fa.axes] == [(M, "S"), (N, "S"), (K, "R")]
    func = gw.create("BHGEMM:3x64x32x16")
    shapes = [tuple(int(d) for d in p.ty.shape) for p in func.params]
    assert shapes == [(3, 64, 16), (3, 16, 32), (3, 64, 32)]
    assert [str(p.dtype) for p in func.params] == ["float16"] * 3
    with pytest.raises(ValueError, match="unknown fp16 GEMM"):
        gw.create("GEMM:12")


@pytest.mark.parametrize("func, expect", [
    (lambda: gw.fp16_gemm(64, 64, 64), ([], False, False)),
    (lambda: gw.fp16_batch_gemm(2, 64, 64, 64), ([0], False, False)),
    (lambda: gemm_nt_bias_relu(64, 64, 64), ([], False, True)),
    (lambda: gemm_tn_f32(64, 64, 64), ([], True, False)),
])
def test_gemm_structure(func, expect):
    g = tc.gemm_structure(analyze(func(), backend="cuda"))
    assert (g.batch, g.trans_a, g.trans_b) == expect


# -- tiles the lowering refuses -------------------------------------------------------------------
H100 = hardware.preset("h100")


@pytest.mark.parametrize("case, func, l1, reg, kw, match", [
    ("odd shape", lambda: gw.fp16_gemm(1000, 1000, 1000), [128, 128, 32], [64, 64, 16], {},
     "not a multiple of the block tile"),
    ("K not a chunk multiple", lambda: gw.fp16_gemm(128, 128, 200), [128, 128, 32],
     [64, 64, 16], {}, "not a multiple of the K chunk"),
    ("warp tile", lambda: gw.fp16_gemm(128, 128, 128), [120, 128, 32], [40, 64, 16], {},
     "not a multiple of 16"),
    ("K chunk", lambda: gw.fp16_gemm(128, 128, 128), [128, 128, 24], [64, 64, 16], {},
     "K chunk 24"),
    ("threads", lambda: gw.fp16_gemm(128, 128, 128), [128, 128, 32], [64, 64, 16],
     {"threads": 256}, "4 warps = 128 threads"),
    ("accumulators", lambda: gw.fp16_gemm(256, 256, 64), [256, 128, 32], [128, 64, 16], {},
     "at most 128"),
    ("vector loads", lambda: gw.fp16_gemm(256, 256, 64), [128, 128, 16], [32, 32, 16], {},
     "whole multiples"),
    ("fp16 accumulation", lambda: gemm_f16_acc(128, 128, 128), [128, 128, 32], [64, 64, 16], {},
     "float32 accumulation"),
    ("shape name", lambda: gw.fp16_gemm(128, 128, 128), [128, 128, 32], [64, 64, 16],
     {"tensor_core": "wgmma"}, "unknown fragment shape"),
    ("mma with A transposed", lambda: gemm_tn_f32(128, 128, 128), [128, 128, 32], [64, 64, 16],
     {"tensor_core": tc.MMA}, "A stored"),
])
def test_refused(case, func, l1, reg, kw, match):
    f = func()
    fa = analyze(f, backend="cuda")
    tile = make_tile(fa, l1, reg)
    for k, v in kw.items():
        setattr(tile, k, v)
    with pytest.raises(UnsupportedError, match=match):
        tc.apply_tensorcore(f, fa, tile)
    with pytest.raises(UnsupportedError, match=match):
        tc.validate_tile(fa, tile, H100)


def test_not_a_matmul_refused():
    X = te.placeholder((64, 64), "float16", name="X")
    k = te.reduce_axis((0, 64), name="k")
    S = te.compute((64,), lambda i: te.sum(X[i, k].astype("float32"), axis=k), name="S")
    fa = analyze(te.create_prim_func([X, S]), backend="cuda")
    with pytest.raises(UnsupportedError, match="tensor cores"):
        tc.gemm_structure(fa)


def test_validate_tile_device_limits():
    f = gw.fp16_gemm(4096, 4096, 4096)
    fa = analyze(f, backend="cuda")
    ok = make_tile(fa, [128, 128, 32], [64, 64, 16], stages=3, shape=tc.MMA)
    tc.validate_tile(fa, ok, H100)
    tc.validate_tile(fa, ok, hardware.preset("a100"))
    v100 = hardware.preset("v100")
    with pytest.raises(UnsupportedError, match="sm_80"):
        tc.validate_tile(fa, ok, v100)  # mma.sync m16n8k16
    ok.tensor_core = tc.WMMA
    with pytest.raises(UnsupportedError, match="cp.async"):
        tc.validate_tile(fa, ok, v100)
    ok.stages = 1
    tc.validate_tile(fa, ok, v100)  # wmma without a pipeline runs on sm_70
    big = make_tile(fa, [256, 256, 64], [64, 64, 16], stages=4)  # 16 warps, 4 stages
    assert tc.smem_bytes(fa, big) > gpu.smem_limit(H100)
    with pytest.raises(UnsupportedError, match="shared memory"):
        tc.validate_tile(fa, big, H100)
    with pytest.raises(UnsupportedError, match="not a GPU"):
        tc.validate_tile(fa, ok, hardware.preset("x86-avx512"))


def test_smem_bytes_formula():
    fa = analyze(gw.fp16_gemm(4096, 4096, 4096), backend="cuda")
    t = make_tile(fa, [128, 128, 32], [64, 64, 16], stages=2)
    ab = 2 * (128 * (32 + 8) + 32 * (128 + 8)) * 2
    assert tc.smem_bytes(fa, t) == max(ab, 128 * (128 + 4) * 4) == 67584
    t = make_tile(fa, [128, 256, 32], [64, 64, 16], stages=4)
    ab = 4 * (128 * (32 + 8) + 32 * (256 + 8)) * 2
    assert tc.smem_bytes(fa, t) == max(ab, 128 * (256 + 4) * 4)


@pytest.mark.parametrize("shape, stages", [(tc.WMMA, 2), (tc.MMA, 3)])
def test_smem_bytes_matches_lowered_kernel(shape, stages):
    from tvm.s_tir.analysis import calculate_allocated_bytes, verify_gpu_code

    f = gw.fp16_gemm(512, 512, 256)
    fa = analyze(f, backend="cuda")
    tile = make_tile(fa, [128, 128, 32], [64, 64, 16], stages=stages, shape=shape)
    sch = tc.apply_tensorcore(f, fa, tile)
    kern = tc.lower_device_kernel(sch.mod, tile, target("sm_90"))
    used = calculate_allocated_bytes(kern)
    used = dict(used[list(used.keys())[0]])
    assert used.get("shared.dyn") == tc.smem_bytes(fa, tile)
    assert "shared" not in used  # everything in the one dynamic allocation
    assert verify_gpu_code(kern, gpu.verify_constraints(H100))


def test_trace_replays():
    f = gemm_nt_bias_relu(256, 256, 128)
    fa = analyze(f, backend="cuda")
    for shape in (tc.WMMA, tc.MMA):
        sch = tc.apply_tensorcore(f, fa, make_tile(fa, [128, 128, 32], [64, 64, 16], shape=shape))
        fresh = tvm.s_tir.Schedule(f)
        sch.trace.apply_to_schedule(fresh, remove_postproc=False)
        tvm.ir.assert_structural_equal(fresh.mod, sch.mod)


def test_intrinsics_registered_once_with_roller_names():
    from tvm.s_tir import TensorIntrin

    for _ in range(2):
        names = list(tc.wmma_intrinsics(False, True).values())
        names += list(tc.mma_intrinsics(False).values())
    assert all(n.startswith("roller_") for n in names)
    assert all(TensorIntrin.get(n) is not None for n in names)


# -- numerics: the generated CUDA on the host emulator ----------------------------------------
EMU_CASES = {
    # name: (workload, shape, l1, reg, stages, flavour)
    "wmma": ("nn", (256, 256, 128), [128, 128, 32], [64, 64, 16], 2, tc.WMMA),
    "mma": ("nn", (256, 256, 128), [128, 128, 32], [64, 64, 16], 2, tc.MMA),
    "wmma-batch-3stage": ("batch", (2, 64, 128, 128), [1, 64, 64, 32], [1, 32, 32, 16], 3, tc.WMMA),
    "mma-batch-1stage": ("batch", (2, 64, 128, 64), [1, 64, 64, 32], [1, 32, 32, 16], 1, tc.MMA),
    "wmma-nt-bias-relu": ("nt_bias_relu", (128, 128, 128), [64, 128, 32], [32, 64, 16], 2,
                          tc.WMMA),
    "mma-nt-bias-relu-3stage": ("nt_bias_relu", (128, 128, 128), [64, 128, 32], [32, 64, 16], 3,
                                tc.MMA),
    "wmma-tn-f32": ("tn", (128, 128, 64), [64, 64, 32], [32, 32, 16], 2, tc.WMMA),
    "mma-transposed-producer": ("transposed_producer", (128, 128, 64), [64, 64, 32],
                                [32, 32, 16], 2, tc.MMA),
    "wmma-cast-producer": ("cast_producer", (128, 128, 64), [64, 64, 32], [32, 32, 16], 2,
                           tc.WMMA),
}
FAST_EMU = tuple(EMU_CASES)  # ~1-2 s each


def _emu_case(name):
    kind, shape, l1, reg, stages, flavour = EMU_CASES[name]
    if kind == "nn":
        f = gw.fp16_gemm(*shape)
    elif kind == "batch":
        f = gw.fp16_batch_gemm(*shape)
    else:
        f = {"nt_bias_relu": gemm_nt_bias_relu, "tn": gemm_tn_f32,
             "transposed_producer": gemm_transposed_producer,
             "cast_producer": gemm_cast_producer}[kind](*shape)
    return kind, f, l1, reg, stages, flavour


@needs_emulator
@pytest.mark.parametrize("name", [pytest.param(n, marks=[] if n in FAST_EMU else [pytest.mark.slow])
                                  for n in EMU_CASES])
def test_emulated_numerics(name, tmp_path):
    from tvm.s_tir.analysis import verify_gpu_code

    from tvm_roller.analysis import unwrap_func

    kind, f, l1, reg, stages, flavour = _emu_case(name)
    fa = analyze(f, backend="cuda")
    tile = make_tile(fa, l1, reg, stages=stages, shape=flavour)
    sch = tc.apply_tensorcore(f, fa, tile)
    src = tc.build(sch.mod, tile, target("sm_80")).mod.imports[0].inspect_source()
    # a gathering copy (the transposed producer) must not become cp.async
    assert ("cp.async" in src) == (stages >= 2 and kind != "transposed_producer")
    assert verify_gpu_code(tc.lower_device_kernel(sch.mod, tile, target("sm_80")),
                           gpu.verify_constraints(hardware.preset("a100")))
    rng = np.random.default_rng(0)
    params = [p for p in unwrap_func(f).params]
    arrays = {}
    for p in params[:-1]:
        shape = tuple(int(d) for d in p.ty.shape)
        arrays[p.name] = rng.uniform(-1, 1, shape).astype(str(p.dtype))
    out = params[-1]
    out_shape = tuple(int(d) for d in out.ty.shape)
    arrays[out.name] = np.full(out_shape, np.nan, str(out.dtype))
    # grid and block from the tile: blockIdx.x over N, .y over M, .z over the batch
    g = tc.gemm_structure(fa)
    ext = [a.extent for a in fa.axes]
    grid = (ext[g.n] // l1[g.n], ext[g.m] // l1[g.m], int(np.prod([ext[b] for b in g.batch])))
    block = (32, tile.threads // 32, 1)
    got = _emulate(src, grid, block, tc.smem_bytes(fa, tile), arrays, out.name,
                   workdir=str(tmp_path))
    ref = _reference(kind, arrays)
    assert np.all(np.isfinite(got)), "elements never written (NaN)"
    err = np.max(np.abs(got.astype(np.float64) - ref)) / np.max(np.abs(ref))
    tol = 2e-3 if str(out.dtype) == "float16" else 1e-5
    assert err < tol, f"relative max error {err:.3g}"


# -- nvcc on the FP16_GEMMS ---------------------------------------------------------------------
# (M, N, K) -> block tile, warp tile, stages; 128 x 3072 x 768 gets smaller blocks (96 of them)
NVCC_TILES = {
    "HGEMM:4096": ([128, 128, 32], [64, 64, 16], 3),
    "HGEMM:1024": ([128, 128, 32], [64, 64, 16], 2),
    "HGEMM:128x3072x768": ([64, 64, 32], [32, 32, 16], 3),
    "BHGEMM:8x512x512x512": ([1, 128, 128, 32], [1, 64, 64, 16], 2),
}


def nvcc_report(src, arch, workdir):
    """ptxas -v of ``src`` as a cubin, and its PTX: (registers, stack, spill stores, smem, ptx)."""
    cu = os.path.join(workdir, f"k_{arch}.cu")
    with open(cu, "w") as fh:
        fh.write(src)
    r = subprocess.run([NVCC, f"-arch={arch}", "-cubin", "-Xptxas", "-v", "-o", cu + ".cubin", cu],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-3000:]
    log = r.stdout + r.stderr
    p = subprocess.run([NVCC, f"-arch={arch}", "-ptx", "-o", cu + ".ptx", cu], capture_output=True,
                       text=True)
    assert p.returncode == 0, p.stderr[-3000:]
    with open(cu + ".ptx") as fh:
        ptx = fh.read()
    regs = int(re.search(r"Used (\d+) registers", log).group(1))
    stack, spill = map(int, re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores",
                                      log).groups())
    return regs, stack, spill, ptx


@needs_nvcc
@pytest.mark.slow
@pytest.mark.parametrize("flavour", [tc.WMMA, tc.MMA])
@pytest.mark.parametrize("name", list(NVCC_TILES))
def test_nvcc_fp16_gemm(name, flavour, tmp_path):
    from tvm.s_tir.analysis import calculate_allocated_bytes, verify_gpu_code

    f = gw.create(name)
    fa = analyze(f, backend="cuda")
    l1, reg, stages = NVCC_TILES[name]
    tile = make_tile(fa, l1, reg, stages=stages, shape=flavour)
    for arch, preset in (("sm_90", "h100"), ("sm_80", "a100")):
        dev = hardware.preset(preset)
        tc.validate_tile(fa, tile, dev)
        sch = tc.apply_tensorcore(f, fa, tile)
        tgt = target(arch)
        kern = tc.lower_device_kernel(sch.mod, tile, tgt)
        assert verify_gpu_code(kern, gpu.verify_constraints(dev))
        used = calculate_allocated_bytes(kern)
        smem = dict(used[list(used.keys())[0]])["shared.dyn"]
        assert smem == tc.smem_bytes(fa, tile) <= gpu.smem_limit(hardware.preset("h100"))
        src = tc.build(sch.mod, tile, tgt).mod.imports[0].inspect_source()
        regs, stack, spill, ptx = nvcc_report(src, arch, str(tmp_path))
        assert spill == 0 and stack == 0, f"{arch}: {stack} B stack frame, {spill} B spill stores"
        assert regs <= 255
        assert re.search(r"\bwmma\.mma\.sync\b" if flavour == tc.WMMA else r"\bmma\.sync\.aligned"
                         r"\.m16n8k16\b", ptx)
        if flavour == tc.MMA:
            assert "ldmatrix.sync.aligned" in ptx
        assert ("cp.async" in ptx) == (stages >= 2)
        print(f"{name} {flavour} {arch}: {regs} registers, {smem} B smem, {stack} B stack, "
              f"{spill} B spill stores")


@needs_emulator
def test_emulator_catches_broken_kernels(tmp_path):
    """The emulator is not vacuous: a cp.async wait that covers too little, a dropped barrier and
    an ldmatrix without its transpose each give wrong results (or an emulator failure)."""
    M, N, K = 128, 128, 128
    f = gw.fp16_gemm(M, N, K)
    fa = analyze(f, backend="cuda")
    tile = make_tile(fa, [64, 64, 32], [32, 32, 16], stages=2, shape=tc.MMA)
    src = tc.build(tc.apply_tensorcore(f, fa, tile).mod, tile,
                   target("sm_80")).mod.imports[0].inspect_source()
    rng = np.random.default_rng(1)
    arrays = {"A": rng.uniform(-1, 1, (M, K)).astype("float16"),
              "B": rng.uniform(-1, 1, (K, N)).astype("float16")}
    ref = arrays["A"].astype(np.float64) @ arrays["B"].astype(np.float64)
    mutations = {
        "none": lambda s: s,
        "wait_group 1 -> 2": lambda s: s.replace('"cp.async.wait_group 1;"',
                                                 '"cp.async.wait_group 2;"'),
        "no __syncthreads": lambda s: s.replace("__syncthreads();", ""),
        "ldmatrix without .trans": lambda s: s.replace("m8n8.x4.trans.shared", "m8n8.x4.shared"),
    }
    for i, (name, mutate) in enumerate(mutations.items()):
        mutated = mutate(src)
        assert name == "none" or mutated != src, name
        args = dict(arrays, C=np.full((M, N), np.nan, "float16"))
        try:
            got = _emulate(mutated, (N // 64, M // 64, 1), (32, 4, 1), tc.smem_bytes(fa, tile),
                           args, "C", workdir=str(tmp_path / str(i)))
            err = np.max(np.abs(got.astype(np.float64) - ref)) / np.max(np.abs(ref))
            ok = bool(np.isfinite(err) and err < 2e-3)
        except RuntimeError:
            ok = False
        assert ok == (name == "none"), name
