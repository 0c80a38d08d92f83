"""The AVX2-only target (``mcpu=haswell``, which runs on every x86 host and stands for laptops):
every suite class built for it holds no zmm register (no AVX-512 instruction leaks in through a
micro-kernel, a packing copy or an epilogue), and matches float64 here."""
from __future__ import annotations

import re

import numpy as np
import pytest
import tvm

import tvm_roller
from tvm_roller.hardware import host_target
from tvm_roller.tools.suite.references import compare, reference, tolerance
from tvm_roller.tools.suite.workloads import arg_specs, create

HASWELL = {"kind": "llvm", "mcpu": "haswell", "num-cores": 2}
CLASSES = ["C1D", "C2D", "C3D", "GMM", "GRP", "DIL", "DEP", "T2D", "CAP", "NRM", "SFM", "CBR", "TBG"]


def _x86_host() -> bool:
    return str(host_target().attrs.get("mtriple") or "x86_64").startswith("x86")


@pytest.mark.skipif(not _x86_host(), reason="an x86 host runs the haswell code")
@pytest.mark.parametrize("cls", CLASSES)
def test_suite_class_has_no_zmm_and_runs(cls):
    func = create(cls, 0)
    lib = tvm_roller.build(func, HASWELL)
    asm = lib.mod.inspect_source("asm")
    assert not re.search(r"%zmm\d+", asm), f"{cls}:0 built for haswell uses zmm registers"
    assert re.search(r"%ymm\d+", asm), f"{cls}:0 built for haswell is not vectorised"
    rng = np.random.default_rng(len(cls))
    specs = arg_specs(func)
    inputs = [rng.standard_normal(s).astype(d) for s, d in specs[:-1]]
    out = tvm.runtime.tensor(np.full(specs[-1][0], np.nan, specs[-1][1]))
    lib(*[tvm.runtime.tensor(a) for a in inputs], out)
    ok, err = compare(out.numpy(), reference(cls, 0, inputs), tolerance(cls, 0))
    assert ok, f"{cls}:0 built for haswell: max relative error {err:.2e} against float64"
