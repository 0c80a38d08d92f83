"""The CUDA backend: device models from presets chosen by the target (never a live GPU)."""
from __future__ import annotations

import types

import tvm

from tvm_roller.backends.base import Backend
from tvm_roller.backends.cuda.rules import RULES
from tvm_roller.backends.cuda.rules.chain import CudaChainRule
from tvm_roller.hardware import gpu
from tvm_roller.hardware.model import DeviceModel


class CudaBackend(Backend):
    name = "cuda"
    tiled_dtypes = ("float16", "float32", "float64")
    conv_layouts: dict = {}  # unmeasured on a GPU: the model's layouts are kept
    # TVM's lowering turns the pipelines roller annotates into cp.async copies only when asked
    pass_config = {"tirx.use_async_copy": True}
    traceable_chains = False  # an unfused chain is its operators as separate kernels
    runner_device = "cuda"
    tuning_kind = "cuda"
    # (both seen with nvcc on a replayed GEMM: TVM 0.27's thread sync refuses a kernel under
    # the dispatch's condition, and the padded tiles are scratch of a symbolic size)
    no_dynamic_kernels = ("TVM inserts no __syncthreads under the bucket dispatch's condition "
                          "and allocates no symbolic-size scratch on the device")

    def __init__(self) -> None:
        super().__init__(tuple(rule() for rule in RULES), CudaChainRule())

    def device_model(self, target: tvm.target.Target) -> DeviceModel:
        return gpu.from_target(target)

    def check_device(self, target: tvm.target.Target, dev: DeviceModel) -> list:
        note = gpu.check_target_device(target, dev)
        return [note] if note else []

    def describe_device(self, dev: DeviceModel) -> str:
        g = dev.gpu
        return (f"device: {dev.name} ({dev.source}), {dev.num_units} SMs, compute capability "
                f"{g.cc_major}.{g.cc_minor}, {g.smem_per_block_optin} B shared memory per "
                f"block (opt-in), {dev.dram.bandwidth_gbs:g} GB/s DRAM")

    def relax_stages(self) -> types.ModuleType:
        from tvm.relax.backend.cuda import pipeline

        return pipeline

    def fallback_passes(self, target: tvm.target.Target) -> list:
        # unscheduled kernels do not build for a GPU: dlight's default rules, which skip what
        # roller marked scheduled
        from tvm.s_tir import dlight as dl

        return [dl.ApplyDefaultSchedule(dl.gpu.Matmul(), dl.gpu.GEMV(), dl.gpu.Reduction(),
                                        dl.gpu.GeneralReduction(), dl.gpu.Fallback())]
