"""Every suite workload and the fp16 GEMMs, built by roller for sm_90 and sm_80 with no GPU:

* the schedule passes TVM's GPU verification within the preset's limits (threads, shared memory,
  16-byte vectors);
* the generated CUDA compiles with this machine's ``nvcc -arch=sm_XX -cubin -Xptxas -v``, and
  GEMM/convolution kernels spill nothing and have no stack frame;
* fp16 GEMMs use tensor cores (mma/wmma instructions in the PTX);
* construction (analysis + policy + micro-model) takes a median of at most 0.5 s per workload.
"""
from __future__ import annotations

import statistics
import time

import pytest

import tvm_roller
from tvm_roller import hardware
from harness.cuda_check import build as cuda_build
from tvm_roller.tools.suite import gpu_workloads
from tvm_roller.tools.suite import workloads as W

from conftest import CUDA_TARGETS, cuda_target

TARGETS = {arch: cuda_target(arch) for arch in CUDA_TARGETS}
PRESET = {"sm_90": "h100", "sm_80": "a100"}
CASES = [f"{c}:{i}" for c, i in W.list_workloads()] + sorted(gpu_workloads.FP16_GEMMS)
# classes whose main kernel is a GEMM or a convolution: no spills, no stack frame
COMPUTE_BOUND = ("C1D", "C2D", "C3D", "GMM", "GRP", "DIL", "DEP", "T2D", "CAP", "CBR", "TBG",
                 "HGEMM")


def _func(case: str):
    if case.startswith("HGEMM"):
        return gpu_workloads.create(case)
    cls, idx = case.split(":")
    return W.create(cls, int(idx))


@pytest.mark.parametrize("arch", sorted(TARGETS))
@pytest.mark.parametrize("case", CASES)
def test_builds_and_compiles(case, arch):
    tgt = TARGETS[arch]
    dev = hardware.preset(PRESET[arch])
    p = tvm_roller.plan(_func(case), tgt, device=dev)
    tile = p.tiles[0]
    sch = tvm_roller.planner.apply(p, tile)
    with tvm_roller.planner.Context.make(tgt).pass_context():
        rep = cuda_build.check(sch.mod, tgt, dev)
    assert rep.ok, rep.problems
    if case.split(":")[0] in COMPUTE_BOUND and tile.kind == "tiled":
        assert rep.ok_for_compute_bound(), {k: (r.spill_stores, r.stack_frame)
                                            for k, r in rep.ptxas.kernels.items()}
    if case.startswith("HGEMM"):
        assert tile.tensor_core and rep.tensor_core
    smem = max(r.smem_static for r in rep.ptxas.kernels.values())
    assert smem <= hardware.gpu.smem_limit(dev)


@pytest.mark.alone  # wall-clock planning time
def test_construction_time():
    tgt = TARGETS["sm_90"]
    times = []
    for case in CASES:
        f = _func(case)
        t0 = time.perf_counter()
        tvm_roller.plan(f, tgt)
        times.append(time.perf_counter() - t0)
    assert statistics.median(times) <= 0.5, times
