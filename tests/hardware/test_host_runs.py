"""Code for a target runs here only when the host has every instruction feature it enables:
route calibration for a newer CPU's target must not die of an illegal instruction."""
from __future__ import annotations

import platform

import pytest
import tvm

from tvm_roller.hardware import host_target
from tvm_roller.hardware.cpu import detect_isa, host_cpu, host_runs

X86 = platform.machine() in ("x86_64", "AMD64")
NEWER = ["sapphirerapids", "graniterapids", "znver5", "tigerlake", "znver4", "icelake-server"]


def test_the_host_runs_its_own_target():
    assert host_runs(host_target())


def test_another_architecture_does_not_run_here():
    other = "aarch64-linux-gnu" if X86 else "x86_64-linux-gnu"
    assert not host_runs(tvm.target.Target({"kind": "llvm", "mtriple": other}))


@pytest.mark.skipif(not X86, reason="x86 CPU names")
def test_a_cpu_with_instructions_the_host_lacks_does_not_run_here():
    have = detect_isa(tvm.target.Target({"kind": "llvm", "mcpu": host_cpu()}))[1]
    for mcpu in NEWER:
        target = tvm.target.Target({"kind": "llvm", "mcpu": mcpu, "num-cores": 2})
        extra = {f for f in detect_isa(target)[1] - have if f.startswith(("avx", "amx"))}
        if extra:
            assert not host_runs(target), f"{mcpu} enables {sorted(extra)}, absent here"
            return
    pytest.skip(f"this host ({host_cpu()}) has every vector feature of {NEWER}")


@pytest.mark.skipif(not X86, reason="x86 CPU names")
def test_tuning_flags_do_not_count_as_instructions():
    # haswell's feature list holds tuning flags (false-deps-*, fast-*) a newer x86 CPU lacks;
    # its instructions are a subset of every AVX-512 host's
    if "avx512f" not in detect_isa(tvm.target.Target({"kind": "llvm", "mcpu": host_cpu()}))[1]:
        pytest.skip("an AVX-512 host")
    assert host_runs(tvm.target.Target({"kind": "llvm", "mcpu": "haswell"}))
