"""LLVM's name for the host CPU, checked against the ISA the host reports.

LLVM names an x86 host by its CPUID family/model. Under a hypervisor the model can be another
part's: a Sapphire Rapids guest seen as model 167 is named "rocketlake", whose LLVM features lack
AMX, AVX512-BF16 and AVX512-FP16, so code built for that name never uses them. When /proc/cpuinfo
lists ISA extensions the named CPU lacks, the CPU of the same architecture whose ISA is the largest
the host has is taken instead, and the reason is kept for the target-completion notes.
"""
from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from pathlib import Path
from typing import FrozenSet, Optional

from tvm.target import Target
from tvm.target import codegen as _cg

PROC_CPUINFO = Path("/proc/cpuinfo")

# The vector and matrix extensions that decide which compute instructions LLVM may emit; system
# extensions (waitpkg, uintr, ...) are left out: hypervisors hide them from guests.
# Names are compared with '_', '-' and '.' removed: cpuinfo's avx512_fp16 is LLVM's avx512fp16.
_ISA_VOCABULARY = frozenset({
    "avx", "avx2", "fma", "f16c", "gfni", "vaes", "vpclmulqdq", "avxvnni", "avxifma",
    "avxvnniint8", "avxneconvert", "avx512f", "avx512dq", "avx512cd", "avx512bw", "avx512vl",
    "avx512ifma", "avx512vbmi", "avx512vbmi2", "avx512vnni", "avx512bitalg", "avx512vpopcntdq",
    "avx512bf16", "avx512fp16", "amx_tile", "amx_int8", "amx_bf16", "amx_fp16", "amx_complex",
})


def _norm(name: str) -> str:
    return re.sub(r"[_\-.]", "", name.lower())


_VOCAB = frozenset(_norm(f) for f in _ISA_VOCABULARY)


@dataclass(frozen=True)
class HostCpuName:
    """The name to build for, LLVM's own name, and why they differ (None when they do not)."""
    name: str
    llvm_name: str
    reason: Optional[str] = None


def _cpuinfo_isa(text: Optional[str]) -> Optional[FrozenSet[str]]:
    """The ISA extensions of the first 'flags' line of /proc/cpuinfo (x86 only), else None."""
    m = re.search(r"^flags\s*:\s*(.*)$", text or "", re.M)
    if not m:
        return None
    return frozenset(_norm(f) for f in m.group(1).split()) & _VOCAB


def _llvm_isa(mcpu: str, triple: str) -> FrozenSet[str]:
    feats = _cg.llvm_get_cpu_features(Target({"kind": "llvm", "mcpu": mcpu, "mtriple": triple}))
    return frozenset(_norm(str(f)) for f in feats) & _VOCAB


def _best_named_cpu(host_isa: FrozenSet[str], triple: str, llvm_name: str) -> Optional[str]:
    """The LLVM CPU whose ISA is the largest subset of the host's; LLVM's own name on a tie."""
    best, best_size = None, -1
    for cpu in _cg.llvm_get_cpu_archlist(Target({"kind": "llvm", "mtriple": triple})):
        cpu = str(cpu)
        isa = _llvm_isa(cpu, triple)
        if not isa <= host_isa:
            continue
        if len(isa) > best_size or (len(isa) == best_size and cpu == llvm_name):
            best, best_size = cpu, len(isa)
    return best


def resolve_host_cpu(llvm_name: str, triple: str, cpuinfo: Optional[str]) -> HostCpuName:
    """Check ``llvm_name`` against the ISA in ``cpuinfo`` text (see the module docstring)."""
    host_isa = _cpuinfo_isa(cpuinfo)
    if host_isa is None or not triple.startswith(("x86_64", "i686", "i386")):
        return HostCpuName(llvm_name, llvm_name)
    named = _llvm_isa(llvm_name, triple)
    missing = host_isa - named
    if not missing:
        return HostCpuName(llvm_name, llvm_name)
    best = _best_named_cpu(host_isa, triple, llvm_name)
    if best is None or best == llvm_name or len(_llvm_isa(best, triple)) <= len(named & host_isa):
        return HostCpuName(llvm_name, llvm_name)
    gained = sorted(_llvm_isa(best, triple) - named)
    return HostCpuName(best, llvm_name,
                       f"LLVM names this host {llvm_name!r} (its CPUID model, which a hypervisor "
                       f"may set), but /proc/cpuinfo reports {', '.join(gained)} that "
                       f"{llvm_name!r} lacks: built as {best!r}")


@functools.lru_cache(maxsize=1)
def host_cpu_name() -> HostCpuName:
    """This machine's CPU name for LLVM, checked once per process."""
    try:
        text: Optional[str] = PROC_CPUINFO.read_text()
    except OSError:  # not Linux: LLVM's name stands
        text = None
    return resolve_host_cpu(str(_cg.llvm_get_system_cpu()), str(_cg.llvm_get_system_triple()),
                            text)
