"""NVIDIA GPUs: sourced presets and device models from TVM CUDA targets, with no live GPU.

A GPU ``DeviceModel`` uses the same plain dataclass as a CPU one:

  * ``num_units`` is the SM count; ``levels`` are SMEM (per SM), L2 and DRAM (whole device);
  * ``simd_bytes`` is warp_size x 4 B and ``num_vector_registers`` the registers one thread may use;
  * ``peak_gflops`` has ``float32`` and ``float16`` (CUDA cores) and ``float16_tc`` (dense tensor
    cores, fp16 inputs with fp32 accumulation);
  * ``gpu`` (a frozen ``GpuTraits``) holds the limits the policy and the checks read (see
    ``GPU_LIMIT_KEYS``), the compute capability as two ints (``cc_major``, ``cc_minor``), never
    as a string.

Compute capabilities are parsed from ``arch`` ("sm_90a" -> 9.0 with the "a" feature suffix) and
compared as numbers. A target whose capability has no preset is refused with the list of known
ones; ``device=`` gives any model directly (TVM has no H200 tag).
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Dict, Optional, Tuple

from tvm.target import Target

from tvm_roller.core.errors import UnsupportedError
from tvm_roller.hardware.model import DeviceModel, GpuTraits, MemoryLevel
from tvm_roller.hardware.presets import GiB, KiB, MiB, preset, register_preset

# the fields of GpuTraits
GPU_LIMIT_KEYS = (
    "cc_major", "cc_minor", "warp_size", "max_threads_per_block", "max_threads_per_sm",
    "max_blocks_per_sm", "regs_per_sm", "regs_per_block", "max_regs_per_thread",
    "smem_per_block", "smem_per_block_optin", "smem_per_sm", "smem_banks", "bank_bytes",
    "transaction_bytes", "l2_line_bytes", "boost_ghz",
)


@dataclass(frozen=True)
class ComputeCapability:
    """``sm_90a`` -> major 9, minor 0, suffix "a" (arch-specific features, e.g. wgmma)."""

    major: int
    minor: int
    suffix: str = ""

    @classmethod
    def parse(cls, arch: str) -> "ComputeCapability":
        m = re.fullmatch(r"\s*(?:sm_|compute_)?(\d+)(\d)([a-z]?)\s*", str(arch))
        if not m:
            raise UnsupportedError(f"cannot read a compute capability from arch {arch!r} "
                                   "(expected e.g. 'sm_80', 'sm_90a')")
        return cls(int(m.group(1)), int(m.group(2)), m.group(3))

    @property
    def number(self) -> Tuple[int, int]:
        return (self.major, self.minor)

    @property
    def arch(self) -> str:
        return f"sm_{self.major}{self.minor}{self.suffix}"

    def __str__(self) -> str:
        return f"{self.major}.{self.minor}{self.suffix}"


def compute_capability(dev: DeviceModel) -> ComputeCapability:
    return ComputeCapability(dev.gpu.cc_major, dev.gpu.cc_minor)


def _gpu(key: str, name: str, cc: Tuple[int, int], sms: int, boost_ghz: float,
         smem_per_sm_kib: int, smem_optin_bytes: int, l2_bytes: int, l2_gbs: float,
         hbm_bytes: int, hbm_gbs: float, fp32_tf: float, fp16_tf: float, tc_fp16_tf: float,
         max_threads_per_sm: int = 2048, max_blocks_per_sm: int = 32) -> DeviceModel:
    """A GPU preset from its datasheet/whitepaper figures (see each preset's comment).

    Derived, not looked up: shared memory serves 32 banks x 4 B per clock per SM; sustained HBM
    bandwidth is 90 % of the peak (STREAM-like copies on HBM2/3 reach 88-93 %)."""
    smem_gbs = round(32 * 4 * boost_ghz, 3)  # per SM
    return DeviceModel(
        name=name, kind="gpu", num_units=sms, simd_bytes=32 * 4, num_vector_registers=255,
        levels=[
            MemoryLevel("SMEM", smem_per_sm_kib * KiB, 128, smem_gbs),
            MemoryLevel("L2", l2_bytes, 128, l2_gbs, shared=True),
            MemoryLevel("DRAM", hbm_bytes, 32, round(hbm_gbs * 0.9, 3), shared=True),
        ],
        peak_gflops={"float32": fp32_tf * 1e3, "float16": fp16_tf * 1e3,
                     "float16_tc": tc_fp16_tf * 1e3},
        frequency_ghz=boost_ghz, isa=f"sm_{cc[0]}{cc[1]}", source=f"preset:{key}",
        gpu=GpuTraits(
            cc_major=cc[0], cc_minor=cc[1], warp_size=32,
            max_threads_per_block=1024, max_threads_per_sm=max_threads_per_sm,
            max_blocks_per_sm=max_blocks_per_sm, regs_per_sm=65536,
            regs_per_block=65536, max_regs_per_thread=255,
            smem_per_block=48 * KiB,  # static __shared__ limit; more needs dynamic + opt-in
            smem_per_block_optin=smem_optin_bytes, smem_per_sm=smem_per_sm_kib * KiB,
            smem_banks=32, bank_bytes=4, transaction_bytes=32, l2_line_bytes=128,
            boost_ghz=boost_ghz,
        ),
    )


# --------------------------------------------------------------------------------------------
# V100 (SXM2, 32 GB), compute capability 7.0. NVIDIA "Tesla V100 GPU Architecture" whitepaper
# (2017): 80 SMs, 1530 MHz boost, 15.7 TFLOPS FP32, 31.4 FP16, 125 tensor; 6 MB L2; 900 GB/s
# HBM2; up to 96 KB shared memory per SM and per block (CUDA C Programming Guide, table
# "Technical Specifications per Compute Capability"). L2: 2155 GB/s measured by Jia et al.,
# "Dissecting the NVIDIA Volta GPU Architecture via Microbenchmarking" (2018).
# Planning only: CUDA 13's nvcc no longer compiles sm_70.
# --------------------------------------------------------------------------------------------
def _v100() -> DeviceModel:
    return _gpu("v100", "NVIDIA V100 SXM2 32GB", (7, 0), 80, 1.53, 96, 96 * KiB, 6 * MiB, 2155.0,
                32 * GiB, 900.0, 15.7, 31.4, 125.0)


# --------------------------------------------------------------------------------------------
# A100 (SXM4, 80 GB), compute capability 8.0. NVIDIA "A100 Tensor Core GPU Architecture"
# whitepaper (2020) and A100 datasheet: 108 SMs, 1410 MHz boost, 19.5 TFLOPS FP32, 78 FP16,
# 312 FP16 tensor (dense); 40 MB L2; 2039 GB/s HBM2e; 164 KB shared memory per SM, 163 KB per
# block with opt-in (Programming Guide). L2 ~4.9 TB/s: the whitepaper's "2.3x V100" L2 bandwidth.
# --------------------------------------------------------------------------------------------
def _a100() -> DeviceModel:
    return _gpu("a100", "NVIDIA A100 SXM4 80GB", (8, 0), 108, 1.41, 164, 163 * KiB, 40 * MiB,
                4950.0, 80 * GiB, 2039.0, 19.5, 78.0, 312.0)


# --------------------------------------------------------------------------------------------
# H100 (SXM5, 80 GB), compute capability 9.0. NVIDIA "H100 Tensor Core GPU Architecture"
# whitepaper (2022) and H100 datasheet: 132 SMs, 1980 MHz boost, 67 TFLOPS FP32, 133.8 FP16,
# 989.4 FP16 tensor (dense); 50 MB L2; 3.35 TB/s HBM3; 228 KB shared memory per SM, 227 KB per
# block with opt-in (Programming Guide). L2 ~7.3 TB/s: 1.5x A100's, per Chips and Cheese's
# H100 microbenchmarks (2023); an estimate, ``python/gpu_check.py`` measures.
# --------------------------------------------------------------------------------------------
def _h100() -> DeviceModel:
    return _gpu("h100", "NVIDIA H100 SXM5 80GB", (9, 0), 132, 1.98, 228, 227 * KiB, 50 * MiB,
                7300.0, 80 * GiB, 3350.0, 67.0, 133.8, 989.4)


# --------------------------------------------------------------------------------------------
# H200 (SXM, 141 GB), compute capability 9.0: the H100's GH100 die with HBM3e. NVIDIA H200
# Tensor Core GPU datasheet (2024): 67 TFLOPS FP32, 989 FP16 tensor (dense; 1979 with sparsity),
# 141 GB at 4.8 TB/s; SMs, clocks, L2 and shared memory as H100 SXM5.
# --------------------------------------------------------------------------------------------
def _h200() -> DeviceModel:
    return _gpu("h200", "NVIDIA H200 SXM 141GB", (9, 0), 132, 1.98, 228, 227 * KiB, 50 * MiB,
                7300.0, 141 * 10**9, 4800.0, 67.0, 133.8, 989.4)


register_preset("v100", _v100)
register_preset("a100", _a100)
register_preset("h100", _h100)
register_preset("h200", _h200)

# A target's compute capability -> the preset that stands for it when nothing else is given.
PRESET_FOR_CC: Dict[Tuple[int, int], str] = {(7, 0): "v100", (8, 0): "a100", (9, 0): "h100"}
# TVM tags -> presets, where the tag names one of ours
_PRESET_FOR_TAG = {"nvidia/nvidia-v100": "v100", "nvidia/nvidia-a100": "a100",
                   "nvidia/nvidia-h100": "h100"}


def target_cc(target: Target) -> ComputeCapability:
    arch = target.attrs.get("arch")
    if arch is None:
        raise UnsupportedError(f"CUDA target {target} has no 'arch' (e.g. \"sm_90\"); roller plans "
                               "without a live GPU, so the compute capability must be given")
    return ComputeCapability.parse(str(arch))


def from_target(target: Target) -> DeviceModel:
    """DeviceModel of a CUDA target: the preset of its tag or compute capability, with the
    target's own limits (shared memory per block, L2 size) where it states them."""
    cc = target_cc(target)
    tag = str(getattr(target, "tag", "") or "")
    key = _PRESET_FOR_TAG.get(tag) or PRESET_FOR_CC.get(cc.number)
    if key is None:
        known = ", ".join(f"{k[0]}.{k[1]} ({v})" for k, v in sorted(PRESET_FOR_CC.items()))
        raise UnsupportedError(
            f"no GPU preset for compute capability {cc} (arch {cc.arch}); known: {known}. "
            "Pass device=tvm_roller.hardware.preset(...) or register_preset() your GPU")
    dev = preset(key)
    if compute_capability(dev).number != cc.number:
        raise UnsupportedError(f"target arch {cc.arch} does not match preset {key} "
                               f"(compute capability {compute_capability(dev)})")
    l2 = target.attrs.get("l2_cache_size_bytes")
    if l2 is not None and int(l2) > 0 and int(l2) != dev.levels[1].capacity_bytes:
        dev.levels[1].capacity_bytes = int(l2)
    dev.source += f" (target {cc.arch})"
    return dev


def check_target_device(target: Target, dev: DeviceModel) -> Optional[str]:
    """A note when ``dev`` (given with ``device=``) is not what the target compiles for; raises
    when the code could not run on it (target capability above the device's)."""
    if dev.kind != "gpu":
        raise UnsupportedError(f"device {dev.name!r} is a {dev.kind}, the target is CUDA")
    cc, dcc = target_cc(target), compute_capability(dev)
    if cc.number > dcc.number:
        raise UnsupportedError(f"target arch {cc.arch} is newer than device {dev.name} "
                               f"(compute capability {dcc}): its code could not run there")
    if cc.number != dcc.number:
        return f"code for {cc.arch} planned for {dev.name} (compute capability {dcc})"
    return None


def smem_limit(dev: DeviceModel, dynamic: bool = True) -> int:
    """Shared memory one block may use: the opt-in maximum with dynamic shared memory."""
    return dev.gpu.smem_per_block_optin if dynamic else dev.gpu.smem_per_block


def verify_constraints(dev: DeviceModel, dynamic_smem: bool = True) -> Dict[str, int]:
    """Constraints for ``tvm.s_tir.analysis.verify_gpu_code`` from the model's limits."""
    return {
        "max_shared_memory_per_block": smem_limit(dev, dynamic_smem),
        "max_threads_per_block": dev.gpu.max_threads_per_block,
        "max_thread_x": 1024, "max_thread_y": 1024, "max_thread_z": 64,
        "max_vector_bytes": 16,
    }
