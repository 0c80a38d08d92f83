"""A host emulator of TVM's generated CUDA, for tests that have no GPU.

``emulate`` rewrites TVM's CUDA source into host C++: every CUDA thread is an OS thread,
``__syncthreads`` a barrier, warp shuffles warp-collective; ``ldmatrix`` / ``mma.sync.m16n8k16``
are warp-collective functions with the PTX ISA's fragment layouts, ``nvcuda::wmma`` works on
whole 16x16 tiles (with its alignment and ``ldm`` rules checked), and cp.async copies are
deferred to the ``cp.async.wait_group`` that must cover them, so a missing wait or barrier shows
up as wrong data. Shared memory starts as NaN-like garbage, so a tile read before it is written
shows too. It never stands for timing or for the hardware itself.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile

import numpy as np
import pytest

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
needs_emulator = pytest.mark.skipif(GXX is None or CUDA_INCLUDE is None,
                                    reason="g++ or the CUDA headers (cuda_fp16.h) not found")


# -- the emulator -------------------------------------------------------------
_PRELUDE = r'''
#include <cuda_fp16.h>
#include <cmath>
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
// a shuffle: every lane of the warp publishes its word, then reads the source lane's
static unsigned emu_lane_word[32][32];
template <class T> static T emu_shfl(T v, int src) {
  static_assert(sizeof(T) == 4, "32-bit shuffles only");
  memcpy(&emu_lane_word[emu_warp()][emu_lane()], &v, 4);
  emu_syncwarp();
  T r; memcpy(&r, &emu_lane_word[emu_warp()][src], 4);
  emu_syncwarp();
  return r;
}
template <class T> static T __shfl_down_sync(unsigned, T v, int offset, int width) {
  int lane = emu_lane();
  return emu_shfl(v, (lane % width) + offset < width ? lane + offset : lane);
}
template <class T> static T __shfl_sync(unsigned, T v, int src, int width) {
  return emu_shfl(v, (emu_lane() / width) * width + src % width);
}
static inline unsigned __activemask() { return 0xffffffffu; }
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
    # static locals: one copy per (emulated) thread block, shared by its threads; an alignment
    # specifier must come first
    body = re.sub(r"__shared__ ((?:alignas|__align__)\(\d+\) )?", r"\1static ", body)
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


def emulate(src, grid, block, smem_bytes, args, out_name, workdir=None):
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
