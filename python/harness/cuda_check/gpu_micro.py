"""The device constants measured on the GPU (``gpu_check``'s run half), next to the device
preset's: DRAM, L2 and shared-memory bandwidth, the FP32 FMA peak and the FP16 tensor-core peak,
each with its own small kernel (CuPy) or PyTorch op.

Nothing here may import TVM or the rest of tvm_roller: the GPU machine has neither.
"""
from __future__ import annotations

import statistics
import time
from typing import Any, Callable, Dict, List, Optional

import numpy as np

from harness.cuda_check.gpu_launch import load_module
from harness.cuda_check.gpu_manifest import ARCH

_SMEM_KERNEL = r"""
extern "C" __global__ void smem_bw(float* out, int iters) {
  __shared__ float4 buf[1024];
  for (int i = threadIdx.x; i < 1024; i += blockDim.x) buf[i] = make_float4(i, i + 1, i + 2, i + 3);
  __syncthreads();
  float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
  int idx = threadIdx.x;
  for (int it = 0; it < iters; ++it) {
    // consecutive lanes read consecutive 16-byte words: conflict-free, 512 B per warp
    float4 v = buf[idx];
    acc.x += v.x; acc.y += v.y; acc.z += v.z; acc.w += v.w;
    idx = (idx + 32 + (it & 1)) & 1023;
  }
  out[blockIdx.x * blockDim.x + threadIdx.x] = acc.x + acc.y + acc.z + acc.w;
}
"""
_L2_KERNEL = r"""
extern "C" __global__ void l2_read(const float4* __restrict__ src, float* out, int n4, int reps) {
  float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
  int stride = gridDim.x * blockDim.x;
  for (int r = 0; r < reps; ++r) {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n4; i += stride) {
      float4 v = __ldcg(src + i);  // cached in L2 only: L1 hits must not count
      acc.x += v.x; acc.y += v.y; acc.z += v.z; acc.w += v.w;
    }
  }
  out[blockIdx.x * blockDim.x + threadIdx.x] = acc.x + acc.y + acc.z + acc.w;
}
"""
_FMA_KERNEL = r"""
extern "C" __global__ void fma_peak(float* out, int iters, float a, float b) {
  float x0 = threadIdx.x, x1 = x0 + 1, x2 = x0 + 2, x3 = x0 + 3;
  float x4 = x0 + 4, x5 = x0 + 5, x6 = x0 + 6, x7 = x0 + 7;
  for (int i = 0; i < iters; ++i) {
#pragma unroll
    for (int u = 0; u < 16; ++u) {  // 8 independent chains hide the FMA latency
      x0 = fmaf(x0, a, b); x1 = fmaf(x1, a, b); x2 = fmaf(x2, a, b); x3 = fmaf(x3, a, b);
      x4 = fmaf(x4, a, b); x5 = fmaf(x5, a, b); x6 = fmaf(x6, a, b); x7 = fmaf(x7, a, b);
    }
  }
  out[blockIdx.x * blockDim.x + threadIdx.x] = x0 + x1 + x2 + x3 + x4 + x5 + x6 + x7;
}
"""


def micro_benchmarks(cp: Any, preset: Dict[str, Any], budget_s: float = 30.0) -> List[Dict[str, Any]]:
    """Measured device constants next to the preset's (ratio = measured / preset)."""
    import torch

    props = torch.cuda.get_device_properties(0)
    sms = props.multi_processor_count
    levels = {lv["name"]: lv for lv in preset["levels"]}
    rows: List[Dict[str, Any]] = []
    t_end = time.perf_counter() + budget_s

    def add(name: str, unit: str, measured: float, model: Optional[float], how: str) -> None:
        rows.append({"name": name, "unit": unit, "measured": measured, "preset": model,
                     "ratio": (measured / model) if model else None, "how": how})

    def best_of(fn: Callable[[], None], reps: int) -> float:
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        fn()
        torch.cuda.synchronize()
        ts = []
        for _ in range(reps):
            e0.record()
            fn()
            e1.record()
            e1.synchronize()
            ts.append(e0.elapsed_time(e1) / 1e3)
            if time.perf_counter() > t_end:
                break
        return statistics.median(ts)

    steps = [
        ("DRAM bandwidth", "GB/s", "DRAM", "copy of 1 GiB (read + write)"),
        ("L2 bandwidth", "GB/s", "L2", "16 MiB read 64 times with ld.cg (L2 resident)"),
        ("SMEM bandwidth per SM", "GB/s", "SMEM", "conflict-free 16-byte shared loads"),
        ("FP32 peak", "GFLOP/s", "float32", "8 independent FMA chains per thread"),
        ("FP16 tensor-core peak", "GFLOP/s", "float16_tc", "torch fp16 matmul 8192^3"),
    ]
    for name, unit, key, how in steps:
        try:
            if key == "DRAM":
                n = 2**28  # float32 elements = 1 GiB
                src, dst = torch.empty(n, device="cuda"), torch.empty(n, device="cuda")
                src.fill_(1.0)
                t = best_of(lambda: dst.copy_(src), 10)
                add(name, unit, 2 * n * 4 / t / 1e9, levels["DRAM"]["bandwidth_gbs"], how)
                del src, dst
            elif key == "L2":
                mod, _ = load_module(cp, _L2_KERNEL, ARCH, "l2_read")
                fn = mod.get_function("l2_read")
                n4, reps = 2**20, 64  # 16 MiB, a third of the L2, read 64 times
                src = cp.ones((n4 * 4,), dtype=cp.float32)
                blocks, threads = sms * 4, 512
                out = cp.empty((blocks * threads,), dtype=cp.float32)
                args = (src, out, np.int32(n4), np.int32(reps))
                t = best_of(lambda: fn((blocks,), (threads,), args), 10)
                add(name, unit, n4 * 16 * reps / t / 1e9, levels["L2"]["bandwidth_gbs"], how)
            elif key == "SMEM":
                mod, _ = load_module(cp, _SMEM_KERNEL, ARCH, "smem_bw")
                fn = mod.get_function("smem_bw")
                blocks, threads, iters = sms * 4, 512, 8192
                out = cp.empty((blocks * threads,), dtype=cp.float32)
                t = best_of(lambda: fn((blocks,), (threads,), (out, np.int32(iters))), 10)
                total = blocks * threads * iters * 16 / t / 1e9
                add(name, unit, total / sms, levels["SMEM"]["bandwidth_gbs"],
                    how + f" (device total {total:.0f} GB/s)")
            elif key == "float32":
                mod, _ = load_module(cp, _FMA_KERNEL, ARCH, "fma_peak")
                fn = mod.get_function("fma_peak")
                blocks, threads, iters = sms * 8, 256, 2048
                out = cp.empty((blocks * threads,), dtype=cp.float32)
                args = (out, np.int32(iters), np.float32(0.999), np.float32(0.001))
                t = best_of(lambda: fn((blocks,), (threads,), args), 10)
                flops = 2 * 8 * 16 * iters * blocks * threads
                add(name, unit, flops / t / 1e9, preset["peak_gflops"]["float32"], how)
            else:
                n = 8192
                a = torch.randn(n, n, device="cuda", dtype=torch.float16)
                b = torch.randn(n, n, device="cuda", dtype=torch.float16)
                t = best_of(lambda: torch.matmul(a, b), 10)
                add(name, unit, 2 * n**3 / t / 1e9, preset["peak_gflops"].get("float16_tc"), how)
                del a, b
        except Exception as err:  # noqa: BLE001
            rows.append({"name": name, "unit": unit, "error": f"{type(err).__name__}: {err}"[:300]})
        torch.cuda.empty_cache()
    return rows
