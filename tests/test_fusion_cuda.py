"""The fused CUDA kernel of GEMM chains (``fusion.lower_cuda``), checked without a GPU.

* numerics: the schedule's CPU replica (thread loops serial, shared/local buffers global;
  ``lower.cuda_replica``) built with LLVM against float64 numpy, for odd, prime, size-1,
  two-batch-axis, MLP-like and attention-like chains, at the planned row block and others;
* the kernel: TVM lowers it, ``verify_gpu_code`` accepts it within the H100/A100 presets and
  nvcc (sm_90, sm_80) compiles it without spills, for BERT-base attention (12 heads, 512
  tokens); the generated CUDA has the warp-shuffle row reductions and float4 tile fetches;
* the decision: fused for that attention, declined for the MLP block (3072 hidden: too few rows
  fit shared memory to amortise re-reading the weights), refused when not even one row fits or
  the dtype is not float32 — each with the reason.

* the generated CUDA itself, run on the host (each CUDA thread an OS thread, ``__syncthreads``
  a barrier, warp shuffles warp-collective), for three shapes: what the replica cannot see
  (a missing barrier, a thread making only its own part of a shared tile) shows there.

No GPU ran these kernels: timing and the hardware itself are unchecked.
"""
from __future__ import annotations

import numpy as np
import pytest
import tvm

import tvm_roller
from tvm_roller import hardware
from tvm_roller.errors import UnsupportedError
from tvm_roller.fusion.chain import detect_chain
from tvm_roller.fusion.lower_cuda import CudaChainPlan, apply_fused_cuda, plan_cuda_chain
from tvm_roller.fusion import split
from tvm_roller.fusion.workloads import conv_chain, gemm_chain
from tvm_roller.hardware import gpu
from tvm_roller.lower.cuda_build import check
from tvm_roller.lower.cuda_replica import cpu_replica

from conftest import (assert_close, chain_inputs, chain_reference, conv_chain_reference,
                      cuda_target, rand, run)

H100 = hardware.preset("h100")
SM90 = cuda_target("sm_90")
TOL = 1e-4






CASES = [  # (batch, m, k, l, n, middle)
    ([3], 37, 13, 41, 11, "relu"),      # odd and prime
    ([2, 3], 7, 5, 3, 2, "softmax"),    # two batch axes, tiny
    ([1], 1, 1, 1, 1, "none"),          # size 1 everywhere
    (None, 24, 16, 96, 32, "gelu"),     # 2-D: an MLP block
    ([4], 64, 32, 128, 48, "softmax"),  # attention-like
    ([2], 16, 64, 64, 64, "none"),      # every tile whole: vector fetches
]


@pytest.mark.parametrize("batch,m,k,l,n,middle", CASES)
def test_replica_matches_numpy(batch, m, k, l, n, middle):  # noqa: E741
    func = gemm_chain(batch, m, k, l, n, middle)
    chain = detect_chain(func)
    arrays = chain_inputs(batch, m, k, l, n)
    ref = chain_reference(*arrays, middle)
    out_shape = tuple(batch or ()) + (m, n)
    planned = plan_cuda_chain(chain, H100)
    assert planned.fits and planned.reason
    # the planned row block, the whole of m (up to 64 rows) and one in between
    divisors = [d for d in range(1, min(m, 64) + 1) if m % d == 0]
    for rows in sorted({planned.rows, divisors[-1], divisors[len(divisors) // 2]}):
        cplan = plan_cuda_chain(chain, H100, rows=rows)
        sch = apply_fused_cuda(func, chain, cplan, H100)
        lib = tvm.compile(cpu_replica(sch.mod), target="llvm")
        assert_close(run(lib, arrays, out_shape, "float32"), ref, TOL)


@pytest.mark.parametrize("batch,m,k,l,n,middle", CASES[:4])
def test_roller_cuda_chain_fused_or_one_by_one(batch, m, k, l, n, middle):  # noqa: E741
    """What ``tvm_roller.build`` makes of a chain for CUDA, fused or (declined) its operators
    one by one with roller's CUDA schedules, run as a CPU replica."""
    func = gemm_chain(batch, m, k, l, n, middle)
    p = tvm_roller.plan(func, SM90, device=H100)
    assert p.chain is not None and p.fusion.reason
    sch = tvm_roller.api.apply(p, p.tiles[0])
    lib = tvm.compile(cpu_replica(sch.mod), target="llvm")
    arrays = chain_inputs(batch, m, k, l, n)
    assert_close(run(lib, arrays, tuple(batch or ()) + (m, n), "float32"),
                 chain_reference(*arrays, middle), TOL)
    # and the operators one by one whatever the decision
    one_by_one = split.build_unfused(func, p.chain,
                                     lambda part: tvm_roller.schedule(part, SM90, device=H100))
    lib = tvm.compile(cpu_replica(one_by_one.mod), target="llvm")
    assert_close(run(lib, arrays, tuple(batch or ()) + (m, n), "float32"),
                 chain_reference(*arrays, middle), TOL)


def test_conv_chain_on_cuda_one_by_one():
    """A conv chain (padding before the first operator) is not fused on the GPU: its operators
    are built one by one, and the whole chain compiles with nvcc."""
    func = conv_chain(1, 9, 7, 5, 6, 3)
    p = tvm_roller.plan(func, SM90, device=H100)
    assert not p.fusion.fuse and "before the first matmul" in p.fusion.reason
    sch = tvm_roller.api.apply(p, p.tiles[0])
    assert check(sch.mod, SM90).ok
    x, w1, w2 = rand((1, 9, 7, 5), seed=1), rand((3, 3, 5, 6), seed=2), rand((1, 1, 6, 3), seed=3)
    lib = tvm.compile(cpu_replica(sch.mod), target="llvm")
    assert_close(run(lib, [x, w1, w2], (1, 9, 7, 3), "float32"), conv_chain_reference(x, w1, w2),
                 TOL)


ATTENTION = ([12], 512, 64, 512, 64, "softmax")  # BERT-base: 12 heads, 512 tokens, head 64
MLP = (None, 128, 768, 3072, 768, "gelu")  # BERT-base MLP block, 128 tokens


@pytest.mark.parametrize("arch", ["sm_90", "sm_80"])
def test_attention_fused_kernel_compiles(arch):
    tgt = cuda_target(arch)
    dev = gpu.from_target(tgt)
    func = gemm_chain(*ATTENTION)
    chain = detect_chain(func)
    cplan = plan_cuda_chain(chain, dev)
    assert cplan.fuse, cplan.reason
    assert "fuse:" in cplan.reason and "round trip" in cplan.reason
    assert cplan.row_reduction and cplan.blocks >= dev.num_units
    assert cplan.traffic_fused < cplan.traffic_unfused
    rep = check(apply_fused_cuda(func, chain, cplan, dev).mod, tgt, dev)
    assert rep.ok, rep.problems
    (kern,) = rep.ptxas.kernels.values()
    assert kern.spill_stores == 0 and kern.stack_frame == 0, kern
    (launch,) = rep.bundle.launches
    assert launch.grid == (cplan.blocks, 1, 1)
    assert launch.block == (32, cplan.threads // 32, 1)
    # the planner's estimate bounds the real allocation (TVM reuses dead tiles' space)
    smem = launch.dyn_smem_bytes + kern.smem_static
    assert smem <= cplan.smem_bytes <= gpu.smem_limit(dev)
    # row max and sum by warp shuffles; B and D tiles fetched as float4
    assert "__shfl_down_sync" in rep.source and "float4" in rep.source


def test_attention_softmax_tile_is_shared_by_all_threads():
    """The softmax output is made per l-step of the second matmul as a shared tile of
    rows x l_step: every thread block computes the whole tile once per step (all threads), not
    each thread the part it reads (a replica would not notice that; the GPU would)."""
    func = gemm_chain(*ATTENTION)
    chain = detect_chain(func)
    cplan = plan_cuda_chain(chain, H100)
    sch = apply_fused_cuda(func, chain, cplan, H100)
    blk = sch.get_sblock(chain.between[-1])
    loops = sch.get_loops(blk)
    inner = [sch.get(lp) for lp in loops[loops.index(next(
        lp for lp in loops if "rl" in str(sch.get(lp).loop_var))) + 1:]]
    threads = [lp for lp in inner if lp.thread_binding is not None]
    assert {str(lp.thread_binding.thread_tag) for lp in threads} == {"threadIdx.x",
                                                                      "threadIdx.y"}
    assert np.prod([int(lp.extent) for lp in inner]) == cplan.rows * cplan.l_step


def test_mlp_block_declined_with_reason():
    func = gemm_chain(*MLP)
    chain = detect_chain(func)
    cplan = plan_cuda_chain(chain, H100)
    assert not cplan.fuse
    assert "shared memory" in cplan.reason and "too long" in cplan.reason, cplan.reason
    assert cplan.traffic_fused > cplan.traffic_unfused
    # still buildable (the caller may insist): a small kernel, checked for the device limits
    tgt = cuda_target("sm_90")
    rep = check(apply_fused_cuda(func, chain, cplan, H100).mod, tgt, H100)
    assert rep.ok_for_compute_bound(), rep.problems


def test_refused_when_one_row_does_not_fit():
    func = gemm_chain(None, 4, 8, 65536, 8, "relu")  # one row of the slice: 256 KiB
    chain = detect_chain(func)
    cplan = plan_cuda_chain(chain, H100)
    assert not cplan.fits and not cplan.fuse
    assert "even for one row" in cplan.reason and "too long" in cplan.reason
    with pytest.raises(UnsupportedError, match="cannot be fused"):
        apply_fused_cuda(func, chain, cplan, H100)


def test_refused_float64_and_cpu_device():
    func = gemm_chain([2], 8, 4, 8, 4, "relu", dtype="float64")
    chain = detect_chain(func)
    cplan = plan_cuda_chain(chain, H100)
    assert not cplan.fits and "float32 only" in cplan.reason
    with pytest.raises(UnsupportedError, match="float64"):
        apply_fused_cuda(func, chain, cplan, H100)
    with pytest.raises(UnsupportedError, match="GPU"):
        plan_cuda_chain(chain, hardware.preset("x86-avx512"))


def test_plan_is_plain_data():
    func = gemm_chain(*ATTENTION)
    cplan = plan_cuda_chain(detect_chain(func), H100)
    d = cplan.to_dict()
    assert CudaChainPlan(**d) == cplan
    assert d["intermediate_round_trip"] == 2 * 12 * 512 * 512 * 4
    with pytest.raises(UnsupportedError, match="does not divide"):
        plan_cuda_chain(detect_chain(func), H100, rows=3)


# -- the generated CUDA run on the host: barriers, shuffles and shared tiles as on a GPU ---------
_EMU_PRELUDE = r'''
#include <vector_types.h>
#include <pthread.h>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <thread>
#include <vector>
#define uint unsigned int
#define uchar unsigned char
struct emu_dim3 { unsigned x, y, z; };
static thread_local emu_dim3 threadIdx, blockIdx;
static emu_dim3 blockDim, gridDim;
static pthread_barrier_t emu_block_bar;
static pthread_barrier_t emu_warp_bar[32];
static unsigned emu_lane_word[32][32];
alignas(256) static unsigned char emu_smem[EMU_SMEM + 64];
static inline int emu_tid() { return threadIdx.x + blockDim.x * threadIdx.y; }
// a shuffle: every lane of the warp publishes its word, then reads the source lane's
template <class T> static T emu_shfl(T v, int src) {
  static_assert(sizeof(T) == 4, "32-bit shuffles only");
  int w = emu_tid() / 32, lane = emu_tid() % 32;
  memcpy(&emu_lane_word[w][lane], &v, 4);
  pthread_barrier_wait(&emu_warp_bar[w]);
  T r; memcpy(&r, &emu_lane_word[w][src], 4);
  pthread_barrier_wait(&emu_warp_bar[w]);
  return r;
}
template <class T> static T __shfl_down_sync(unsigned, T v, int offset, int width) {
  int lane = emu_tid() % 32;
  return emu_shfl(v, (lane % width) + offset < width ? lane + offset : lane);
}
template <class T> static T __shfl_sync(unsigned, T v, int src, int width) {
  int lane = emu_tid() % 32;
  return emu_shfl(v, (lane / width) * width + src % width);
}
static inline unsigned __activemask() { return 0xffffffffu; }
static inline float max(float a, float b) { return a > b ? a : b; }
static inline float min(float a, float b) { return a < b ? a : b; }
static inline int max(int a, int b) { return a > b ? a : b; }
static inline int min(int a, int b) { return a < b ? a : b; }
#define __global__
#define __launch_bounds__(x)
#define __align__(x) alignas(x)
#define __syncthreads() pthread_barrier_wait(&emu_block_bar)
'''

_EMU_DRIVER = r'''
static std::vector<std::vector<unsigned char>> emu_args;
static void emu_thread(emu_dim3 b, emu_dim3 t) { blockIdx = b; threadIdx = t; main_kernel(@ARGS@); }
int main(int argc, char** argv) {
  for (int i = 0; i < @NARGS@; ++i) {
    FILE* f = fopen(argv[1 + i], "rb"); fseek(f, 0, SEEK_END); long n = ftell(f); fseek(f, 0, SEEK_SET);
    emu_args.emplace_back(n); if (fread(emu_args.back().data(), 1, n, f) != (size_t)n) return 2; fclose(f);
  }
  gridDim = {@GX@, 1, 1}; blockDim = {@BX@, @BY@, 1};
  int threads = @BX@ * @BY@;
  pthread_barrier_init(&emu_block_bar, nullptr, threads);
  for (int w = 0; w < threads / 32; ++w) pthread_barrier_init(&emu_warp_bar[w], nullptr, 32);
  for (unsigned bx = 0; bx < @GX@; ++bx) {
    memset(emu_smem, 0xff, sizeof(emu_smem));  // NaN: a tile read before it is written shows
    std::vector<std::thread> ts;
    for (unsigned ty = 0; ty < @BY@; ++ty) for (unsigned tx = 0; tx < @BX@; ++tx)
      ts.emplace_back(emu_thread, emu_dim3{bx, 0, 0}, emu_dim3{tx, ty, 0});
    for (auto& t : ts) t.join();
  }
  FILE* f = fopen(argv[1 + @NARGS@], "wb");
  fwrite(emu_args[@OUT@].data(), 1, emu_args[@OUT@].size(), f); fclose(f);
  return 0;
}
'''


def _cuda_include():
    import os
    import shutil

    nvcc = shutil.which("nvcc")
    cands = [os.environ.get("CUDA_HOME", ""), "/usr/local/cuda"]
    if nvcc:
        cands.append(os.path.dirname(os.path.dirname(os.path.realpath(nvcc))))
    return next((os.path.join(c, "include") for c in cands
                 if c and os.path.exists(os.path.join(c, "include", "vector_types.h"))), None)


def _emulate(source, launch, arrays, out_name, workdir):
    """Run ``source`` (TVM's CUDA, one kernel) on the host: each CUDA thread an OS thread,
    ``__syncthreads`` a barrier, shuffles warp-collective; returns ``arrays[out_name]`` after."""
    import re
    import subprocess

    sig = re.search(r'extern "C" __global__ void (?:__launch_bounds__\(\d+\) )?'
                    r'main_kernel\(([^)]*)\)\s*\{', source)
    params = [p.strip() for p in sig.group(1).split(",")]
    names = [re.fullmatch(r"float\* __restrict__ (\w+)_ptr", p).group(1) for p in params]
    body = source[source.index('extern "C"'):]
    body = re.sub(r"extern __shared__ __align__\(\d+\) uchar (\w+)\[\];",
                  r"uchar* \1 = emu_smem;", body)
    # static locals: one copy per (emulated) thread block, shared by its threads
    body = re.sub(r"__shared__ (alignas\(\d+\) )?", r"\1static ", body)
    subst = {"ARGS": ", ".join(f"(float*)emu_args[{i}].data()" for i in range(len(params))),
             "NARGS": len(params), "OUT": names.index(out_name), "GX": launch.grid[0],
             "BX": launch.block[0], "BY": launch.block[1]}
    code = (_EMU_PRELUDE.replace("EMU_SMEM", str(max(16, launch.dyn_smem_bytes))) + body
            + re.sub(r"@(\w+)@", lambda m: str(subst[m.group(1)]), _EMU_DRIVER))
    cpp, exe = workdir / "emu.cpp", workdir / "emu"
    cpp.write_text(code)
    r = subprocess.run(["g++", "-std=c++17", "-O1", "-pthread", "-w", f"-I{_cuda_include()}",
                        str(cpp), "-o", str(exe)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-3000:]
    files = []
    for i, name in enumerate(names):
        files.append(str(workdir / f"arg{i}.bin"))
        np.ascontiguousarray(arrays[name]).tofile(files[-1])
    out = str(workdir / "out.bin")
    r = subprocess.run([str(exe), *files, out], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    return np.fromfile(out, dtype=np.float32).reshape(arrays[out_name].shape)


@pytest.mark.skipif(__import__("shutil").which("g++") is None or _cuda_include() is None,
                    reason="g++ or the CUDA headers not found")
@pytest.mark.parametrize("batch,m,k,l,n,middle,rows", [
    ([2], 64, 32, 128, 48, "softmax", 32),  # 8 warps: shuffles per warp, the S tile per step
    ([3], 37, 13, 41, 11, "relu", 37),      # prime: predicated threads and tiles
    ([2, 3], 7, 5, 3, 2, "softmax", 7),     # one warp, rows serial
])
def test_generated_cuda_emulated(batch, m, k, l, n, middle, rows, tmp_path):  # noqa: E741
    """The CUDA source nvcc compiles, run with real barriers and warp shuffles: catches what the
    replica cannot (a missing barrier, a thread making only its own part of a shared tile)."""
    from tvm_roller.lower.cuda_build import kernel_launches

    func = gemm_chain(batch, m, k, l, n, middle)
    chain = detect_chain(func)
    cplan = plan_cuda_chain(chain, H100, rows=rows)
    bundle = kernel_launches(apply_fused_cuda(func, chain, cplan, H100).mod, cuda_target("sm_90"))
    (launch,) = bundle.launches
    a, b, d = chain_inputs(batch, m, k, l, n)
    e = np.full(tuple(batch or ()) + (m, n), np.nan, dtype=np.float32)
    out = _emulate(bundle.source, launch, {"A": a, "B": b, "D": d, "E": e}, "E", tmp_path)
    assert_close(out, chain_reference(a, b, d, middle), TOL)


def test_relax_attention_fused_for_cuda():
    """The Relax pipeline groups a plain attention (matmul -> softmax -> matmul) for CUDA, the
    model fuses it, and the grouped PrimFunc gets the fused kernel, which nvcc compiles."""
    import torch

    from tvm_roller.compile_model import import_torch
    from tvm_roller.relax import fusion_passes

    class Attention(torch.nn.Module):  # keys and values as weights: one example input
        def __init__(self):
            super().__init__()
            self.k = torch.nn.Parameter(torch.randn(12, 64, 512))
            self.v = torch.nn.Parameter(torch.randn(12, 512, 64))

        def forward(self, q):
            return torch.softmax(q @ self.k, dim=-1) @ self.v

    mod = import_torch(Attention(), torch.randn(12, 512, 64))
    decisions = []
    with SM90:
        grouped = fusion_passes(chains=decisions, device=H100)(mod)
    assert len(decisions) == 1 and decisions[0]["fused"], decisions
    funcs = [f for gv, f in grouped.functions_items()
             if isinstance(f, tvm.tirx.PrimFunc) and "chain" in gv.name_hint]
    assert len(funcs) == 1
    p = tvm_roller.plan(funcs[0].with_attr("global_symbol", "main"), SM90, device=H100)
    assert p.chain is not None and p.fusion.fuse
    sch = tvm_roller.api.apply(p, p.tiles[0])
    with tvm_roller.api.pass_context(p.target):
        report = check(sch.mod, SM90, H100)
    assert report.ok, report.problems
    assert len(report.bundle.launches) == 1  # one fused kernel
