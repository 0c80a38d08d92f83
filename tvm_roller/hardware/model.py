"""Plain-data description of a device: what the policy and the micro-model read.

Nothing here talks to a live device. A model is built from a preset, from a TVM target plus the
host's /sys (``hardware.cpu.from_target``), or loaded from a calibration cache; it prints and
round-trips through JSON.
"""
from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, field
from typing import Dict, List, Optional

from ..errors import UnsupportedError

DTYPE_BYTES = {"float16": 2, "bfloat16": 2, "float32": 4, "float64": 8, "bool": 1, "int8": 1,
               "uint8": 1, "int16": 2, "int32": 4, "int64": 8}


def dtype_bytes(dtype: str) -> int:
    """Bytes of one element of a TVM dtype string, vector types included ("float32x4": 16)."""
    dtype = str(dtype)
    if dtype in DTYPE_BYTES:
        return DTYPE_BYTES[dtype]
    m = re.fullmatch(r"[a-z]+?(\d+)(?:x(\d+))?", dtype)
    if not m:
        raise UnsupportedError(f"unknown dtype {dtype!r}")
    return max(1, int(m.group(1)) // 8) * int(m.group(2) or 1)


@dataclass
class MemoryLevel:
    """One level of the memory hierarchy, fastest first (L1, L2, L3, DRAM on a CPU)."""

    name: str
    capacity_bytes: int  # per unit when ``shared`` is False, whole device otherwise
    line_bytes: int  # cache line / memory transaction length
    bandwidth_gbs: float  # sustained read bandwidth, per unit when not shared, total when shared
    shared: bool = False  # shared by all parallel units (L3, DRAM)


@dataclass
class DeviceModel:
    """A device as the ROLLER policy sees it."""

    name: str
    kind: str  # "cpu" or "gpu"
    num_units: int  # cores (CPU) or SMs (GPU)
    simd_bytes: int  # vector register width in bytes (CPU); warp_size * 4 on a GPU
    num_vector_registers: int  # architectural vector registers per core (32 for AVX-512/NEON)
    levels: List[MemoryLevel]  # fastest first; the last one is DRAM
    peak_gflops: Dict[str, float]  # whole-device peak per dtype
    frequency_ghz: float = 0.0
    isa: str = ""  # "avx512", "avx2", "neon", "sm_90", ...
    source: str = "preset"  # where the numbers came from: preset / sysfs / calibrated:<file>
    extra: Dict[str, float] = field(default_factory=dict)

    # -- derived ---------------------------------------------------------------------------
    def simd_lanes(self, dtype: str) -> int:
        return max(1, self.simd_bytes // DTYPE_BYTES.get(dtype, 4))

    def level(self, name: str) -> MemoryLevel:
        for lvl in self.levels:
            if lvl.name == name:
                return lvl
        raise KeyError(f"{self.name} has no memory level {name!r}")

    @property
    def dram(self) -> MemoryLevel:
        return self.levels[-1]

    def peak_per_unit(self, dtype: str) -> float:
        gf = self.peak_gflops.get(dtype, self.peak_gflops.get("float32", 1.0))
        return gf / max(1, self.num_units)

    # -- serialisation ---------------------------------------------------------------------
    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> "DeviceModel":
        d = json.loads(text)
        d["levels"] = [MemoryLevel(**lv) for lv in d["levels"]]
        return cls(**d)

    def with_units(self, num_units: Optional[int]) -> "DeviceModel":
        """Same device restricted to ``num_units`` cores (peak and shared bandwidths scaled)."""
        if not num_units or num_units == self.num_units:
            return self
        scale = num_units / self.num_units
        levels = [
            MemoryLevel(l.name, l.capacity_bytes, l.line_bytes,
                        l.bandwidth_gbs * (min(1.0, scale) if l.shared else 1.0), l.shared)
            for l in self.levels
        ]
        return DeviceModel(self.name, self.kind, num_units, self.simd_bytes,
                           self.num_vector_registers, levels,
                           {k: v * scale for k, v in self.peak_gflops.items()},
                           self.frequency_ghz, self.isa, self.source, dict(self.extra))
