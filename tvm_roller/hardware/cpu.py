"""CPU targets: complete a TVM target from the host, and turn an llvm target into a DeviceModel.

Numbers come from, in order of preference:
  1. a calibration cache entry for (host CPU, target mcpu, num-cores)  -> source "calibrated:<file>";
     (``hardware.calibrate.device_model`` measures a host target on first use);
  2. the host's /sys cache description and /proc/cpuinfo frequency when the target's mcpu is the
     host CPU, with bandwidths/peak estimated from the preset of the same ISA -> "estimated:sysfs...";
  3. the preset of the same ISA, rescaled to the target's core count      -> "estimated:preset ...".
"""
from __future__ import annotations

import os
import re
from dataclasses import replace
from pathlib import Path
from typing import Any, Dict, List, Optional, Set, Tuple

from tvm.target import Target
from tvm.target import codegen as _cg

from tvm_roller.core.errors import UnsupportedError
from tvm_roller.core.ffi import plain
from tvm_roller.hardware import calibration_store as _cache
from tvm_roller.hardware.host_name import host_cpu_name
from tvm_roller.hardware.model import DeviceModel, MemoryLevel
from tvm_roller.hardware.presets import PRESET_FOR_ISA, cpu_peak_gflops, preset


# Paths are module attributes so tests (and odd hosts) can point them elsewhere.
SYS_CPU = Path("/sys/devices/system/cpu")
PROC_CPUINFO = Path("/proc/cpuinfo")

# Fallback when LLVM cannot be asked for the features of an mcpu (unknown name, backend missing).
_MCPU_ISA: Dict[str, str] = {
    **{c: "avx512" for c in (
        "skylake-avx512", "cascadelake", "cooperlake", "cannonlake", "icelake-client",
        "icelake-server", "tigerlake", "rocketlake", "sapphirerapids", "emeraldrapids",
        "graniterapids", "graniterapids-d", "diamondrapids", "znver4", "znver5", "x86-64-v4")},
    **{c: "avx2" for c in (
        "haswell", "broadwell", "skylake", "kabylake", "coffeelake", "cometlake", "alderlake",
        "raptorlake", "meteorlake", "arrowlake", "lunarlake", "gracemont", "znver1", "znver2",
        "znver3", "x86-64-v3", "bdver4")},
    **{c: "sse" for c in ("generic", "x86-64", "x86-64-v2", "nehalem", "westmere",
                          "sandybridge", "ivybridge", "core2", "btver2")},
}
_ARM_CPU_PREFIXES = ("neoverse", "cortex-a", "cortex-x", "apple-", "a64fx", "ampere", "carmel",
                     "thunderx", "kryo", "exynos", "falkor", "saphira", "tsv110", "oryon")

# Vector FMAs per cycle (at the ISA's full width) where a CPU differs from its ISA preset's 2.
_FMA_UNITS: Dict[Tuple[str, str], int] = {
    ("znver4", "avx512"): 1,  # Zen 4 runs a zmm FMA on both of its 256-bit pipes (double-pumped)
    ("icelake-client", "avx512"): 1, ("tigerlake", "avx512"): 1,  # client parts: one 512-bit
    ("rocketlake", "avx512"): 1, ("cannonlake", "avx512"): 1,     # FMA port (port 0+1 fused)
    ("znver1", "avx2"): 1,  # Zen 1: 2 x 128-bit FMA pipes = one ymm FMA per cycle
    ("cortex-a53", "neon"): 1, ("cortex-a55", "neon"): 1,  # little in-order cores
}
_REGS = {"avx512": 32, "avx2": 16, "sse": 16, "neon": 32}
_SIMD = {"avx512": 64, "avx2": 32, "sse": 16, "neon": 16}


# ---------------------------------------------------------------------------------------------
# host facts
# ---------------------------------------------------------------------------------------------
def host_cpu() -> str:
    """The host CPU's name for LLVM (e.g. "znver4", "emeraldrapids"): LLVM's own name unless
    the host reports ISA extensions that name lacks (see ``hardware.host_name``)."""
    return host_cpu_name().name


def host_triple() -> str:
    return str(_cg.llvm_get_system_triple())


def arch_of(triple: str) -> str:
    """The architecture of an LLVM triple, with aliases folded (arm64 -> aarch64)."""
    a = triple.split("-", 1)[0].lower()
    return {"arm64": "aarch64", "amd64": "x86_64"}.get(a, a)


def _read(path: Path) -> Optional[str]:
    try:
        return path.read_text().strip()
    except (OSError, UnicodeDecodeError):
        return None


def _parse_cpulist(text: Optional[str]) -> Set[int]:
    """'0-3,8' -> {0,1,2,3,8}; empty set on None/garbage."""
    cpus: Set[int] = set()
    for part in (text or "").split(","):
        part = part.strip()
        if not part:
            continue
        lo, _, hi = part.partition("-")
        if not lo.isdigit() or (hi and not hi.isdigit()):
            return set()
        cpus.update(range(int(lo), int(hi or lo) + 1))
    return cpus


def _allowed_cpus() -> Set[int]:
    try:
        return set(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return set(range(os.cpu_count() or 1))


def host_physical_cores() -> int:
    """Physical cores this process may run on (SMT siblings counted once)."""
    allowed = _allowed_cpus()
    cores: Set[Tuple[str, str]] = set()
    for c in allowed:
        topo = SYS_CPU / f"cpu{c}" / "topology"
        pkg, core = _read(topo / "physical_package_id"), _read(topo / "core_id")
        if pkg is None or core is None:
            break
        cores.add((pkg, core))
    else:
        if cores:
            return len(cores)
    try:
        import psutil  # optional: only for hosts without /sys topology

        phys, logical = psutil.cpu_count(logical=False), psutil.cpu_count(logical=True)
        if phys and logical:
            return max(1, len(allowed) * phys // logical)
    except ImportError:
        pass  # psutil is optional; the logical count below is the documented fallback
    return max(1, len(allowed))


def host_frequency_ghz() -> Optional[float]:
    """Nominal host clock: cpufreq base_frequency, else /proc/cpuinfo 'cpu MHz', else cpufreq max."""
    base = _read(SYS_CPU / "cpu0" / "cpufreq" / "base_frequency")  # kHz, intel_pstate only
    if base and base.isdigit():
        return int(base) / 1e6
    text = _read(PROC_CPUINFO)
    if text:
        mhz = [float(m) for m in re.findall(r"^cpu MHz\s*:\s*([0-9.]+)", text, re.M)]
        if mhz and max(mhz) > 0:
            return max(mhz) / 1e3
    mx = _read(SYS_CPU / "cpu0" / "cpufreq" / "cpuinfo_max_freq")
    if mx and mx.isdigit():
        return int(mx) / 1e6
    return None


def _parse_size(text: Optional[str]) -> Optional[int]:
    m = re.fullmatch(r"\s*(\d+)\s*([KMG]?)B?\s*", text or "", re.I)
    if not m:
        return None
    return int(m.group(1)) * {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}[m.group(2).upper()]


def host_cache_levels() -> Optional[List[MemoryLevel]]:
    """Data/unified cache levels of cpu0 from /sys (bandwidth 0 = unknown), None if unavailable.

    A level is shared when cpus outside cpu0's SMT siblings share it; a shared level's capacity
    is multiplied by the number of its instances among the cpus this process may use (e.g. two
    CCX-local L3s)."""
    base = SYS_CPU / "cpu0" / "cache"
    if not base.is_dir():
        return None
    siblings = _parse_cpulist(_read(SYS_CPU / "cpu0" / "topology" / "thread_siblings_list")) or {0}
    allowed = _allowed_cpus()
    levels: Dict[int, MemoryLevel] = {}
    for idx in sorted(base.glob("index*")):
        ctype, lvl = _read(idx / "type"), _read(idx / "level")
        size = _parse_size(_read(idx / "size"))
        line = _read(idx / "coherency_line_size")
        if ctype == "Instruction" or not (lvl and lvl.isdigit()) or not size:
            continue
        sharers = _parse_cpulist(_read(idx / "shared_cpu_list")) or {0}
        shared = not sharers <= siblings
        if shared:
            instances = {_read(SYS_CPU / f"cpu{c}" / "cache" / idx.name / "shared_cpu_list")
                         for c in allowed}
            size *= max(1, len(instances - {None}))
        line_b = int(line) if line and line.isdigit() else 64
        levels[int(lvl)] = MemoryLevel(f"L{lvl}", size, line_b, 0.0, shared)
    return [levels[k] for k in sorted(levels)] or None


def _host_dram_bytes() -> Optional[int]:
    try:
        return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):  # sysconf names are platform dependent
        return None


# ---------------------------------------------------------------------------------------------
# ISA detection
# ---------------------------------------------------------------------------------------------
def _llvm_features(tgt: Target, mcpu: str, triple: str) -> Optional[Set[str]]:
    """LLVM's feature set for the target, or None when LLVM cannot answer for this mcpu."""
    try:
        if not _cg.llvm_is_valid_cpu(mcpu, triple):
            return None  # LLVM would silently fall back to generic; the table knows better
        return {str(f) for f in _cg.llvm_get_cpu_features(tgt)}
    except (RuntimeError, ValueError, TypeError, AttributeError):
        # no LLVM backend for this triple, or an LLVM without the query: use the mcpu table
        return None


def _isa_from_features(feats: Set[str], arch: str) -> str:
    if arch == "aarch64" or "neon" in feats:
        return "neon"
    if "avx512f" in feats:
        return "avx512"
    if "avx2" in feats and "fma" in feats:
        return "avx2"
    return "sse"


def _isa_from_table(mcpu: str, mattr: List[str], arch: str) -> str:
    if arch in ("aarch64", "arm") or mcpu.startswith(_ARM_CPU_PREFIXES):
        return "neon"
    isa = _MCPU_ISA.get(mcpu, "sse")
    plus = {a[1:] for a in mattr if a.startswith("+")}
    minus = {a[1:] for a in mattr if a.startswith("-")}
    if "avx512f" in plus:
        isa = "avx512"
    elif isa == "sse" and {"avx2", "fma"} <= plus:
        isa = "avx2"
    if isa == "avx512" and "avx512f" in minus:
        isa = "avx2"
    if isa == "avx2" and minus & {"avx2", "fma", "avx"}:
        isa = "sse"
    return isa


#: LLVM features naming a low-precision product a micro-kernel route may be built from
MATRIX_FEATURES = ("amx-bf16", "amx-int8", "avx512bf16", "avx512vnni", "avxvnni", "avx512bw",
                   "dotprod", "i8mm")


def matrix_units(feats: Set[str]) -> Tuple[str, ...]:
    """The low-precision products among an LLVM feature set (empty when LLVM cannot say)."""
    return tuple(f for f in MATRIX_FEATURES if f in feats)


def detect_isa(tgt: Target) -> Tuple[str, Set[str]]:
    """(ISA family, LLVM features or empty set) of an llvm target."""
    spec = plain(tgt.export())
    mcpu = str(spec.get("mcpu") or "generic")
    triple = str(spec.get("mtriple") or host_triple())
    feats = _llvm_features(tgt, mcpu, triple)
    if feats is not None:
        return _isa_from_features(feats, arch_of(triple)), feats
    return _isa_from_table(mcpu, target_mattr(spec), arch_of(triple)), set()


#: LLVM feature names of instructions code generation may emit on its own (tuning flags such
#: as ``false-deps-*`` or ``fast-*`` are not instructions)
_INSTRUCTION_FEATURES = re.compile(r"^(avx|amx|sse|ssse|fma|f16c|bmi|gfni|vaes|vpclmulqdq|popcnt|"
                                   r"lzcnt|movbe|adx|sha|aes|pclmul|dotprod|i8mm|sve|bf16|"
                                   r"fullfp16|fp16|neon|crypto)")


def host_runs(target: Target) -> bool:
    """Whether code built for ``target`` runs on this machine: the same architecture and no
    instruction feature the host lacks (when LLVM cannot list them: the host's own mcpu)."""
    spec = plain(target.export())
    if arch_of(str(spec.get("mtriple") or host_triple())) != arch_of(host_triple()):
        return False
    _, wanted = detect_isa(target)
    _, have = detect_isa(Target({"kind": "llvm", "mcpu": host_cpu()}))
    if not wanted or not have:
        return spec.get("mcpu") in (None, "", host_cpu())
    return not {f for f in wanted - have if _INSTRUCTION_FEATURES.match(f)}


def target_mattr(spec: Dict[str, Any]) -> List[str]:
    """The mattr list of an exported target spec (a dict), [] when absent."""
    return [str(a) for a in spec.get("mattr") or []]


def _base_preset(isa: str) -> DeviceModel:
    if isa in PRESET_FOR_ISA:
        return preset(PRESET_FOR_ISA[isa])
    # SSE-only x86 (mcpu generic): the AVX2 desktop with 16-byte vectors and no FMA; one mul and
    # one add pipe per cycle count as one "FMA unit" (2 flops per lane per cycle).
    m = preset("x86-avx2")
    m.simd_bytes, m.isa, m.source = 16, "sse", "preset:x86-avx2 (as sse)"
    m.cpu = replace(m.cpu, fma_units=1.0)
    return m


# ---------------------------------------------------------------------------------------------
# DeviceModel from a target
# ---------------------------------------------------------------------------------------------
def is_host_target(target: Target) -> bool:
    """True when code for this llvm target is built for this machine's CPU (same mcpu & arch)."""
    spec = plain(target.export())
    triple = str(spec.get("mtriple") or host_triple())
    return arch_of(triple) == arch_of(host_triple()) and spec.get("mcpu") == host_cpu()


def from_target(tgt: Target, use_cache: bool = True, *,
                host_caches: Optional[bool] = None) -> DeviceModel:
    """DeviceModel of an llvm target (see the module docstring for where numbers come from).

    ``use_cache=False`` ignores calibration files; ``host_caches`` forces (True) or forbids (False)
    reading this machine's /sys and clock instead of deciding by "mcpu is the host CPU"."""
    kind = tgt.kind.name
    if kind != "llvm":
        raise UnsupportedError(f"from_target handles llvm (CPU) targets; no device model for "
                               f"kind {kind!r} yet")
    spec = plain(tgt.export())
    mcpu = str(spec.get("mcpu") or "generic")
    isa, feats = detect_isa(tgt)
    base = _base_preset(isa)
    cores = int(spec.get("num-cores") or base.num_units)
    host = is_host_target(tgt) if host_caches is None else host_caches

    if use_cache:
        key = _cache.calibration_key(host_cpu(), mcpu, cores, target_mattr(spec))
        cached = _cache.load_calibration(key)
        if cached is not None:  # (a calibration file from before the field: the target's)
            return replace(cached, cpu=replace(cached.cpu, core=mcpu,
                                               matrix_units=matrix_units(feats)))

    fma_units = float(_FMA_UNITS.get((mcpu, isa), base.cpu.fma_units))
    freq = (host_frequency_ghz() if host else None) or base.frequency_ghz
    simd = _SIMD[isa]
    sys_levels = host_cache_levels() if host else None

    ratio_f = freq / base.frequency_ghz

    def scaled(name: str, shared: bool) -> float:
        # Per-core bytes/cycle of a cache level is a microarchitecture trait: scale by clock, and by
        # the core count for shared levels (aggregate). DRAM: a per-core ceiling capped by the socket.
        if name == "DRAM":
            single = base.cpu.dram_gbs_single_core
            if single is None:
                single = base.dram.bandwidth_gbs / base.num_units
            return round(min(base.dram.bandwidth_gbs, single * cores), 3)
        ref = next((l for l in base.levels if l.name == name),
                   base.levels[-2] if shared else base.levels[0])
        per_core = ref.bandwidth_gbs / base.num_units if ref.shared else ref.bandwidth_gbs
        return round(per_core * ratio_f * (cores if shared else 1), 3)

    if sys_levels:
        levels = [MemoryLevel(l.name, l.capacity_bytes, l.line_bytes, scaled(l.name, l.shared),
                              l.shared) for l in sys_levels]
        levels.append(MemoryLevel("DRAM", _host_dram_bytes() or base.dram.capacity_bytes,
                                  base.dram.line_bytes, scaled("DRAM", True), True))
        where = "sysfs caches, bandwidth/peak scaled from preset " + PRESET_FOR_ISA.get(isa, "x86-avx2")
    else:
        levels = [MemoryLevel(l.name, l.capacity_bytes, l.line_bytes, scaled(l.name, l.shared),
                              l.shared) for l in base.levels]
        where = f"{base.source} scaled to {cores} cores at {freq:g} GHz"

    dtypes = ["float32", "float64"]
    if "avx512fp16" in feats or "fullfp16" in feats or (not feats and "float16" in base.peak_gflops):
        dtypes.append("float16")
    return DeviceModel(
        name=f"{mcpu} x{cores}" + (" (host)" if host else ""),
        kind="cpu",
        num_units=cores,
        simd_bytes=simd,
        num_vector_registers=_REGS[isa],
        levels=levels,
        peak_gflops=cpu_peak_gflops(cores, freq, fma_units, simd, dtypes),
        frequency_ghz=round(freq, 4),
        isa=isa,
        source=f"estimated: {where}",
        cpu=replace(base.cpu, core=mcpu, fma_units=fma_units, matrix_units=matrix_units(feats)),
    )
