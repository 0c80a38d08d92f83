"""Named device presets: reference machines with documented, sourced numbers.

A preset is what the policy uses when nothing better is known (no /sys, a cross target, no
calibration). ``cpu.from_target`` also starts from the preset of the target's ISA and rescales it
to the target's core count and frequency.

Conventions (same as ``MemoryLevel``):
  * private levels (L1, L2) give capacity and sustained read bandwidth **per core**;
  * shared levels (L3, DRAM) give capacity and bandwidth for **the whole chip**;
  * ``peak_gflops[dtype] = cores * GHz * fma_units * 2 * lanes(dtype)`` (2 flops per FMA lane).

Bandwidths are written as ``bytes/cycle * GHz * efficiency`` so each number can be traced: the
bytes/cycle figure is the vendor/microarchitecture figure, the efficiency is the fraction a plain
vectorised read (sum) kernel typically sustains. They are estimates; ``calibrate()`` measures.

GPU presets are meant to go into the same registry (``register_preset``); none are defined yet.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Callable, Dict, List, Tuple

from tvm_roller.core.errors import UnsupportedError
from tvm_roller.hardware.model import CpuTraits, DeviceModel, MemoryLevel

KiB = 1024
MiB = 1024 * KiB
GiB = 1024 * MiB

# name -> factory; factories return a fresh (mutable) model each call.
_PRESETS: Dict[str, Callable[[], DeviceModel]] = {}

# Which preset describes an ISA family; ``cpu.from_target`` scales it to the real target.
PRESET_FOR_ISA: Dict[str, str] = {"avx512": "x86-avx512", "avx2": "x86-avx2", "neon": "arm-neon"}


def register_preset(name: str, factory: Callable[[], DeviceModel]) -> None:
    """Add (or replace) a preset. GPU presets are expected to be registered the same way."""
    _PRESETS[name] = factory


def list_presets() -> List[str]:
    return sorted(_PRESETS)


def preset(name: str) -> DeviceModel:
    """A fresh ``DeviceModel`` for a named preset; unknown names raise ``UnsupportedError``."""
    try:
        factory = _PRESETS[name]
    except KeyError:
        raise UnsupportedError(
            f"unknown device preset {name!r}; known presets: {', '.join(list_presets())}"
        ) from None
    return factory()


def cpu_peak_gflops(cores: int, ghz: float, fma_units: float, simd_bytes: int,
                    dtypes: List[str]) -> Dict[str, float]:
    """cores * GHz * fma_units * 2 * lanes, for each dtype (lanes = simd_bytes / dtype size)."""
    sizes = {"float16": 2, "float32": 4, "float64": 8}
    return {dt: round(cores * ghz * fma_units * 2 * (simd_bytes // sizes[dt]), 3) for dt in dtypes}


@dataclass(frozen=True)
class _CpuFigures:
    """A reference CPU's sourced figures (see each preset's comment). Levels L1 and L2 are
    (capacity, bytes/cycle per core, efficiency); L3 the same per core, summed over the cores;
    DRAM (capacity, sustained GB/s for the chip)."""

    name: str
    isa: str
    cores: int
    ghz: float
    fma: int
    simd: int
    vregs: int
    l1: Tuple[int, float, float]
    l2: Tuple[int, float, float]
    l3: Tuple[int, float, float]
    dram: Tuple[int, float]
    dtypes: Tuple[str, ...]
    dram_gbs_single_core: float
    units: Tuple[str, ...] = ()  # dot-product / matrix features (``CpuTraits.matrix_units``)


def _bw(bytes_per_cycle: float, ghz: float, efficiency: float, cores: int = 1) -> float:
    return round(bytes_per_cycle * ghz * efficiency * cores, 3)


def _cpu(key: str) -> DeviceModel:
    """The CPU preset ``key`` from its figures."""
    f = _CPU_FIGURES[key]
    (c1, b1, e1), (c2, b2, e2), (c3, b3, e3) = f.l1, f.l2, f.l3
    levels = [MemoryLevel("L1", c1, 64, _bw(b1, f.ghz, e1)),
              MemoryLevel("L2", c2, 64, _bw(b2, f.ghz, e2)),
              MemoryLevel("L3", c3, 64, _bw(b3, f.ghz, e3, f.cores), shared=True),
              MemoryLevel("DRAM", f.dram[0], 64, round(f.dram[1], 3), shared=True)]
    return DeviceModel(
        name=f.name, kind="cpu", num_units=f.cores, simd_bytes=f.simd,
        num_vector_registers=f.vregs, levels=levels,
        peak_gflops=cpu_peak_gflops(f.cores, f.ghz, f.fma, f.simd, list(f.dtypes)),
        frequency_ghz=f.ghz, isa=f.isa, source=f"preset:{key}",
        cpu=CpuTraits(fma_units=float(f.fma), dram_gbs_single_core=f.dram_gbs_single_core,
                      matrix_units=f.units),
    )


_CPU_FIGURES: Dict[str, _CpuFigures] = {
    # x86-avx2: AMD Ryzen 7 3700X (Zen 2), a typical 8-core desktop.
    #   AMD product page: 8 cores, base 3.6 GHz (boost 4.4), L2 4 MB total (512 KiB/core),
    #   L3 32 MB (2 CCX x 16 MiB), dual-channel DDR4-3200.
    #   Zen 2 core (AMD Hot Chips 31; WikiChip "Zen 2"; Agner Fog microarchitecture guide):
    #   L1d 32 KiB 8-way, 64 B lines; 2 x 256-bit FMA pipes; 2 x 32 B loads/cycle from L1d;
    #   L2 -> L1 32 B/cycle; L3 -> L2 32 B/cycle per core; 16 ymm registers (AVX2).
    #   DRAM: 2 channels x 8 B x 3200 MT/s = 51.2 GB/s peak; ~80 % sustained (STREAM-like).
    #   One core alone reaches ~20 GB/s (bounded by outstanding L1/L2 misses, Little's law).
    #   Sustained L3 is well below the 32 B/cycle/core fabric peak under all-core load (0.5).
    #   AVX2 has no fp16 arithmetic (F16C converts only), so no float16 peak.
    "x86-avx2": _CpuFigures(
        "x86-avx2 (AMD Ryzen 7 3700X / Zen 2, 8 cores)", "avx2", 8, 3.6, 2, 32, 16,
        (32 * KiB, 64, 0.9), (512 * KiB, 32, 0.8), (32 * MiB, 32, 0.5), (32 * GiB, 51.2 * 0.8),
        ("float32", "float64"), 20.0),
    # x86-avx512: Intel Xeon Gold 6248 (Cascade Lake-SP), a typical server socket.
    #   Intel ARK: 20 cores, base 2.5 GHz, 27.5 MB L3 (1.375 MiB/core, non-inclusive, mesh),
    #   6 channels DDR4-2933. Core (Intel 64 and IA-32 Optimization Reference Manual,
    #   Skylake-SP): L1d 32 KiB, 64 B lines, 2 x 64 B loads/cycle; L2 1 MiB/core, 64 B/cycle
    #   peak to L1; 2 AVX-512 FMA units (ports 0+1 fused and port 5) on Gold 6xxx / Platinum;
    #   32 zmm registers. Heavy AVX-512 code runs below the nominal base clock (AVX-512
    #   frequency licence), so the peak here is an upper bound. DRAM: 6 x 8 B x 2933 MT/s =
    #   140.8 GB/s peak, ~75 % sustained (STREAM on one socket ~100-110 GB/s). One Skylake-SP
    #   core reaches only ~12 GB/s of DRAM. L3 on the mesh sustains ~12 B/cycle per core under
    #   all-core load. Cascade Lake has no AVX512-FP16 (that starts with Sapphire Rapids);
    #   it has AVX512-BW and AVX512-VNNI (vpdpbusd), no AVX512-BF16.
    "x86-avx512": _CpuFigures(
        "x86-avx512 (Intel Xeon Gold 6248 / Cascade Lake-SP, 20 cores)", "avx512", 20, 2.5, 2,
        64, 32, (32 * KiB, 128, 0.9), (1 * MiB, 64, 0.6), (int(27.5 * MiB), 12, 1.0),
        (192 * GiB, 140.8 * 0.75), ("float32", "float64"), 12.0, ("avx512vnni", "avx512bw")),
    # arm-neon: AWS Graviton2 (Arm Neoverse N1), 64 cores.
    #   AWS: 64 cores at 2.5 GHz, 8 x DDR4-3200; Arm Neoverse N1 TRM / Software Optimization
    #   Guide: L1d 64 KiB, L2 1 MiB private per core, 64 B lines; 32 MiB shared system-level
    #   cache (CMN-600); 2 x 128-bit ASIMD/FP pipes, both FMA-capable; 2 x 16 B loads/cycle;
    #   32 v-registers; Armv8.2 FP16 arithmetic (8 fp16 lanes per 128-bit FMA); the
    #   dot-product extension (sdot / udot), no i8mm.
    #   DRAM: 8 x 8 B x 3200 MT/s = 204.8 GB/s peak, ~75 % sustained (STREAM ~150 GB/s);
    #   one N1 core reaches ~18 GB/s. The L2 -> L1 path is bounded by the 32 B/cycle load
    #   ports; the SLC over the mesh sustains ~6 B/cycle per core under all-core load.
    "arm-neon": _CpuFigures(
        "arm-neon (AWS Graviton2 / Neoverse N1, 64 cores)", "neon", 64, 2.5, 2, 16, 32,
        (64 * KiB, 32, 0.9), (1 * MiB, 32, 0.7), (32 * MiB, 6, 1.0), (256 * GiB, 204.8 * 0.75),
        ("float32", "float64", "float16"), 18.0, ("dotprod",)),
}

for _key in _CPU_FIGURES:
    register_preset(_key, functools.partial(_cpu, _key))
