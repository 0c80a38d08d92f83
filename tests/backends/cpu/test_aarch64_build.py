"""fp32 GEMMs cross-compiled for AArch64 (NEON, dot product, i8mm) on any host: roller plans
them with its own rule for the ``arm-neon`` preset's device model (ISA "neon": 16-byte vectors,
32 registers), ``tvm_roller.build`` compiles them without a fallback, and the object file is an
AArch64 ELF whose assembly multiplies-and-adds with NEON vector ``fmla``. Nothing is run."""
from __future__ import annotations

import re
import warnings

import pytest

import tvm_roller
from tvm_roller import FallbackWarning
from tvm_roller.backends.cpu.rules import RULES
from tvm_roller.tools.suite import workloads

from conftest import matmul_func

AARCH64 = {"kind": "llvm", "mtriple": "aarch64-linux-gnu", "mattr": ["+neon", "+dotprod", "+i8mm"]}
EM_AARCH64 = 183  # ELF e_machine of AArch64
ROLLER_RULES = {rule.name for rule in RULES}

GEMMS = {
    "suite GMM:0 (1 x 128 x 128 x 128)": lambda: workloads.create("GMM", 0),
    "matmul 256 x 256 x 256": lambda: matmul_func(256, 256, 256),
}


def elf_machine(path) -> int:
    """e_machine of a 64-bit little-endian ELF file (asserting it is one)."""
    with open(path, "rb") as f:
        head = f.read(20)
    assert head[:4] == b"\x7fELF", head[:4]
    assert head[4] == 2 and head[5] == 1, "not a 64-bit little-endian ELF"
    return int.from_bytes(head[18:20], "little")


@pytest.mark.parametrize("name", list(GEMMS))
def test_aarch64_gemm_object_file(name, tmp_path):
    func = GEMMS[name]()
    plan = tvm_roller.plan(func, AARCH64)
    assert plan.rule.name in ROLLER_RULES, plan.rule.name  # scheduled by a roller rule ...
    assert plan.device.isa == "neon" and plan.device.simd_bytes == 16
    with warnings.catch_warnings():
        warnings.simplefilter("error", FallbackWarning)  # ... and never left to TVM's default
        ex = tvm_roller.build(func, AARCH64, fallback=False)
    mod = ex.mod
    obj = tmp_path / "gemm.o"
    mod.write_to_file(str(obj))
    assert elf_machine(obj) == EM_AARCH64
    asm = mod.inspect_source("asm")
    assert re.search(r"\bfmla\s+v\d+\.4s", asm), "no NEON fmla in the assembly"
