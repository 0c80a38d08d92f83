"""Plain-data description of a device: what the policy and the micro-model read.

Nothing here talks to a live device. A model is built from a preset, from a TVM target plus the
host's /sys (``hardware.cpu.from_target``), or loaded from a calibration cache; it prints and
round-trips through JSON.
"""
from __future__ import annotations

import json
import re
import typing
from dataclasses import asdict, dataclass
from typing import Any, Dict, List, Mapping, Optional, Tuple

from tvm_roller.core.errors import UnsupportedError

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


@dataclass(frozen=True, kw_only=True)
class CpuTraits:
    """CPU constants beyond the common fields (``DeviceModel.cpu``). Defaults are what the
    readers assume when a model does not state a value."""

    core: str = ""  # the LLVM CPU name the model is of ("" when unknown): per-core traits
    fma_units: float = 2.0  # vector FMAs issued per cycle per core (in peak_gflops)
    # DRAM bandwidth one core alone reaches (GB/s); None: the DRAM bandwidth / num_units
    dram_gbs_single_core: Optional[float] = None
    fma_chains: float = 8.0  # independent FMAs in flight that hide the FMA latency
    fma_per_cycle: float = 1.0  # FMAs per cycle the micro-kernel efficiency model assumes
    loads_per_cycle: float = 2.0  # vector loads per cycle from L1
    page_bytes: int = 4096  # the span a hardware prefetcher follows one stream within
    # written by calibrate() (None on presets and estimated models)
    estimated_peak_float32: Optional[float] = None  # the estimate the measurement replaced
    calibration_seconds: Optional[float] = None
    calibration_threads: Optional[int] = None
    calibration_quick: Optional[bool] = None
    calibration_foreign_cpu_share: Optional[float] = None  # -1.0: unknown (no /proc/stat)
    peak_tile_rows: Optional[int] = None  # register tile of the peak-FLOPS kernel
    peak_tile_cols: Optional[int] = None
    # one core's GFLOP/s of the register micro-kernel per tile "<rows>x<vectors>" (float32,
    # operands in L1), measured by calibrate(); None: the micro-model's analytical efficiency
    tile_gflops: Optional[Dict[str, float]] = None
    # the target's matrix and dot-product instructions by LLVM feature name ("amx-bf16",
    # "amx-int8", "avx512bf16", "avx512vnni", "avxvnni", "avx512bw", "dotprod", "i8mm"):
    # which micro-kernel routes it has
    matrix_units: Tuple[str, ...] = ()
    # one core's rate of each micro-kernel route per block, "<route>:<rows>x<cols>"
    # (GFLOP/s or GOP/s, operands in L1), measured by the CPU backend's route calibration;
    # None: the routes' presets
    route_gops: Optional[Dict[str, float]] = None


@dataclass(frozen=True, kw_only=True)
class GpuTraits:
    """GPU limits beyond the common fields (``DeviceModel.gpu``); the compute capability is two
    ints. Fields without a default have no fallback in any reader."""

    cc_major: int
    cc_minor: int
    warp_size: int = 32
    max_threads_per_block: int = 1024
    max_threads_per_sm: int
    max_blocks_per_sm: int
    regs_per_sm: int
    regs_per_block: int
    max_regs_per_thread: int
    smem_per_block: int  # static __shared__ limit
    smem_per_block_optin: int  # with dynamic shared memory and the opt-in attribute
    smem_per_sm: int
    smem_banks: int = 32
    bank_bytes: int = 4
    transaction_bytes: int = 32
    l2_line_bytes: int
    boost_ghz: float


def _traits_from_dict(cls, values: Any, legacy: bool = False):
    """``cls`` (CpuTraits / GpuTraits) from a JSON dict, numbers cast to the field types (old
    ``extra`` dicts held every value as a float). ``legacy``: keys that are not fields (from an
    old ``extra`` dict) are ignored; otherwise they are an error."""
    if not isinstance(values, Mapping):
        raise TypeError(f"{cls.__name__}: expected a JSON object, got {values!r}")
    hints = typing.get_type_hints(cls)
    unknown = sorted(set(values) - set(hints))
    if unknown and not legacy:
        raise TypeError(f"{cls.__name__} has no field(s) {', '.join(unknown)}")
    kw = {}
    for k, v in values.items():
        if k in hints:
            # Optional[int] -> int
            base = next((a for a in typing.get_args(hints[k]) if a is not type(None)), hints[k])
            kw[k] = base(v) if v is not None and base in (int, float, bool) else v
            if typing.get_origin(hints[k]) is tuple and v is not None:
                kw[k] = tuple(v)  # (JSON has lists only)
    return cls(**kw)


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
    cpu: Optional[CpuTraits] = None  # set on a CPU model (all defaults when not given)
    gpu: Optional[GpuTraits] = None  # set on a GPU model (required)

    def __post_init__(self) -> None:
        if self.kind == "cpu" and self.cpu is None:
            self.cpu = CpuTraits()  # a CPU model that states nothing gets the readers' defaults
        has = (self.cpu is not None, self.gpu is not None)
        if has != (self.kind == "cpu", self.kind == "gpu"):
            raise ValueError(f"device model {self.name!r} of kind {self.kind!r}: a CPU model has "
                             "cpu traits and no gpu traits, a GPU model gpu=GpuTraits(...) and "
                             "no cpu traits")

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
        traits = {"cpu": CpuTraits, "gpu": GpuTraits}
        # JSON written before the traits (calibration caches, datasets) has one flat ``extra``
        # dict: its keys go to the traits of the model's kind, unknown keys are dropped
        extra = d.pop("extra", None)
        for key, tcls in traits.items():
            if d.get(key) is not None:
                d[key] = _traits_from_dict(tcls, d[key])
            elif extra is not None and d.get("kind") == key:
                d[key] = _traits_from_dict(tcls, extra, legacy=True)
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
                           self.frequency_ghz, self.isa, self.source, self.cpu, self.gpu)
