"""Any CPU target for the random cases (``--llvm-target``), and whether this host can run it.

A target is an llvm target dict given as JSON (``'{"kind":"llvm","mcpu":"haswell",
"num-cores":2}'``). Cases are built for it whatever the host is; they are run and compared only
where this host can execute the code, which :func:`can_run` decides from LLVM's feature lists:

* the target's architecture (its ``mtriple``, the host's when absent) must be the host's;
* every *instruction-set* feature of the target (LLVM's ``llvm_get_cpu_features``, which counts
  ``mattr``: ``-amx-tile`` removes AMX) must be one of the host's. The host's features are
  LLVM's for ``tvm_roller.hardware.host_target()`` (whose mcpu is checked against
  ``/proc/cpuinfo``: under a hypervisor LLVM's own name for the host, which
  ``Target.from_device("cpu")`` uses, can be an older part's), less the vector and matrix
  extensions ``/proc/cpuinfo`` does not report (a hypervisor may hide them).

LLVM's tuning features (``fast-*``, ``slow-*``, ``false-deps-*``, ...) are no instructions and
are not compared. On x86 only the extensions LLVM's code generation emits by itself are compared
(SSE*, AVX*, AMX, FMA, BMI, ...); system extensions a compiled kernel never uses (Key Locker,
``hreset``, ``clzero``, ``mwaitx``, ...) are not, so an Alder Lake target runs on a Sapphire
Rapids host. AMD's SSE4A is the one x86 extension an Intel host lacks that LLVM can emit
(``extrq`` / ``insertq`` in byte and word shuffles): when it is all the host lacks, the built
code's assembly decides (``asm``).
"""
from __future__ import annotations

import functools
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, FrozenSet, Optional

import tvm
from tvm.target import codegen as _cg

PROC_CPUINFO = Path("/proc/cpuinfo")

# the x86 extensions LLVM's code generation may use without an intrinsic (APX: egpr .. zu)
_X86_EMITTED = re.compile(
    r"^(sse|ssse3|avx|amx-|fma|f16c|xop|tbm|bmi|lzcnt|popcnt|movbe|cmov|cx8|cx16|gfni|"
    r"egpr|ndd|nf|ppx|push2pop2|ccmp|cf|zu)")
# LLVM features that tune code generation and name no instructions (x86 and AArch64)
_TUNING = re.compile(
    r"^(fast-|faster-|slow-|false-deps-|prefer-|tuning-|no-bypass-|lea-|use-|pad-|idiv|"
    r"retpoline|lvi-|harden-|fuse-|enable-|balance-|avoid-|predictable-|disable-|strict-|"
    r"reserve-|call-saved-|outline-|allow-|branch-hint|branchfusion|macrofusion|"
    r"sbb-dep-breaking|vzeroupper|ermsb|fsrm|nopl|ete$|trbe$)")
# vector / matrix extensions /proc/cpuinfo names the same way (once '_', '-', '.' are dropped)
_CPUINFO_CHECKED = re.compile(r"^(avx(?!10)|amx|fma|f16c|sse4a|xop|gfni)")
# extensions a host may lack whose use the built assembly shows: feature -> its mnemonics
_ASM_CHECKED = {"sse4a": re.compile(r"\b(extrq|insertq|movntss|movntsd)\b")}


@dataclass(frozen=True)
class RunVerdict:
    """Whether this host can run code built for a target, and why (not)."""

    ok: bool
    reason: str


def parse(text: str) -> str:
    """The canonical JSON text (sorted keys) of an llvm target given as a JSON object; a
    ValueError says what is wrong with it."""
    try:
        spec = json.loads(text)
    except json.JSONDecodeError as err:
        raise ValueError(f"--llvm-target is not JSON ({err}): {text!r}") from None
    if not isinstance(spec, dict):
        raise ValueError(f"--llvm-target must be a JSON object, got {text!r}")
    if spec.get("kind") != "llvm":
        raise ValueError(f'--llvm-target must have "kind": "llvm", got {text!r}')
    try:
        tvm.target.Target(spec)
    except Exception as err:  # noqa: BLE001  (TVM's own message says what it rejects)
        raise ValueError(f"--llvm-target {text!r} is no TVM target: "
                         f"{str(err).strip().splitlines()[-1]}") from None
    return json.dumps(spec, sort_keys=True)


def target(text: str) -> tvm.target.Target:
    """The TVM target of a case's ``llvm_target`` text; the host's when empty."""
    if not text:
        from tvm_roller.hardware import host_target

        return host_target()
    return tvm.target.Target(json.loads(text))


def _spec(tgt: tvm.target.Target) -> Dict[str, Any]:
    return {str(k): v for k, v in tgt.export().items()}


def arch_of(tgt: tvm.target.Target) -> str:
    """The target's architecture (its mtriple's first part; the host's when it has none)."""
    triple = str(_spec(tgt).get("mtriple") or _cg.llvm_get_system_triple())
    arch = triple.split("-", 1)[0].lower()
    return {"arm64": "aarch64", "amd64": "x86_64"}.get(arch, arch)


def _norm(name: str) -> str:
    return re.sub(r"[_\-.]", "", name.lower())


def isa_features(tgt: tvm.target.Target) -> FrozenSet[str]:
    """The target's LLVM features that name instructions (see the module docstring)."""
    feats = {str(f) for f in _cg.llvm_get_cpu_features(tgt)}
    if arch_of(tgt) in ("x86_64", "i386", "i686"):
        return frozenset(f for f in feats if _X86_EMITTED.match(f))
    return frozenset(f for f in feats if not _TUNING.match(f))


def _cpuinfo_flags() -> Optional[FrozenSet[str]]:
    try:
        text = PROC_CPUINFO.read_text()
    except OSError:
        return None
    m = re.search(r"^(?:flags|Features)\s*:\s*(.*)$", text, re.M)
    return frozenset(_norm(f) for f in m.group(1).split()) if m else None


@functools.lru_cache(maxsize=1)
def host_features() -> FrozenSet[str]:
    """This host's instruction-set features (see the module docstring)."""
    from tvm_roller.hardware import host_target

    host = host_target()
    feats = isa_features(host)
    flags = _cpuinfo_flags()
    if flags is None or arch_of(host) != "x86_64":
        return feats
    return frozenset(f for f in feats
                     if not _CPUINFO_CHECKED.match(_norm(f)) or _norm(f) in flags)


@functools.lru_cache(maxsize=1)
def host_arch() -> str:
    from tvm_roller.hardware import host_target

    return arch_of(host_target())


def can_run(tgt: tvm.target.Target, asm: Optional[str] = None) -> RunVerdict:
    """Whether this host can run code built for ``tgt``. When the host lacks only extensions
    whose instructions the assembly shows (SSE4A), ``asm`` (the built module's assembly)
    decides; without it such a target is not run."""
    arch = arch_of(tgt)
    if arch != host_arch():
        return RunVerdict(False, f"{arch} code; this host is {host_arch()}")
    missing = sorted(isa_features(tgt) - host_features())
    if not missing:
        return RunVerdict(True, "the host has every instruction-set feature of the target")
    lacks = f"this host lacks {', '.join(missing)}"
    if set(missing) <= set(_ASM_CHECKED):
        if asm is None:
            return RunVerdict(False, f"{lacks} (the assembly was not checked)")
        used = [f for f in missing if _ASM_CHECKED[f].search(asm)]
        if used:
            return RunVerdict(False, f"{lacks}, and the code uses {', '.join(used)}")
        return RunVerdict(True, f"{lacks}, but the code uses none of its instructions")
    return RunVerdict(False, lacks)


def needs_asm(tgt: tvm.target.Target) -> bool:
    """True when :func:`can_run` of ``tgt`` depends on the built code's assembly."""
    if arch_of(tgt) != host_arch():
        return False
    missing = isa_features(tgt) - host_features()
    return bool(missing) and missing <= set(_ASM_CHECKED)
