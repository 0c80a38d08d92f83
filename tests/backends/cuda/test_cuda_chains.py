"""The fused CUDA kernel of GEMM chains (``backends.cuda.chain``), checked without a GPU.

* numerics: the schedule's CPU replica (thread loops serial, shared/local buffers global;
  ``cuda_check.replica``) built with LLVM against float64 numpy, for odd, prime, size-1,
  two-batch-axis, MLP-like and attention-like chains, at the planned row block and others;
* the kernel: TVM lowers it, ``verify_gpu_code`` accepts it within the H100/A100 presets and
  nvcc (sm_90, sm_80) compiles it without spills, for BERT-base attention (12 heads, 512
  tokens); the generated CUDA has the warp-shuffle row reductions and float4 tile fetches;
* the decision: fused for that attention, declined for the MLP block (3072 hidden: too few rows
  fit shared memory to amortise re-reading the weights), refused when not even one row fits or
  the dtype is not float32 — each with the reason.

* the generated CUDA itself, run on the host (each CUDA thread an OS thread, ``__syncthreads``
  a barrier, warp shuffles warp-collective), for three shapes: what the replica cannot see
  (a missing barrier, a thread making only its own part of a shared tile) shows there.

No GPU ran these kernels: timing and the hardware itself are unchecked.
"""
from __future__ import annotations

import numpy as np
import pytest
import tvm

import tvm_roller
from tvm_roller import hardware
from tvm_roller.core.errors import UnsupportedError
from tvm_roller.fusion.chain import detect_chain
from tvm_roller.backends.cuda.chain import CudaChainPlan, apply_fused_cuda, plan_cuda_chain
from tvm_roller.fusion import split
from harness.bench.chains import conv_chain, gemm_chain
from tvm_roller.hardware import gpu
from harness.cuda_check.build import check
from harness.cuda_check.replica import cpu_replica

from conftest import (CHAIN_CASES, assert_close, chain_inputs, chain_reference,
                      conv_chain_reference, cuda_target, rand, run)
from cuda_emulator import emulate, needs_emulator

H100 = hardware.preset("h100")
SM90 = cuda_target("sm_90")
TOL = 1e-4


CASES = CHAIN_CASES + [([2], 16, 64, 64, 64, "none")]  # + every tile whole: vector fetches


@pytest.mark.parametrize("batch,m,k,l,n,middle", CASES)
def test_replica_matches_numpy(batch, m, k, l, n, middle):  # noqa: E741
    func = gemm_chain(batch, m, k, l, n, middle)
    chain = detect_chain(func)
    arrays = chain_inputs(batch, m, k, l, n)
    ref = chain_reference(*arrays, middle)
    out_shape = tuple(batch or ()) + (m, n)
    planned = plan_cuda_chain(chain, H100)
    assert planned.fits and planned.reason
    # the planned row block, the whole of m (up to 64 rows) and one in between
    divisors = [d for d in range(1, min(m, 64) + 1) if m % d == 0]
    for rows in sorted({planned.rows, divisors[-1], divisors[len(divisors) // 2]}):
        cplan = plan_cuda_chain(chain, H100, rows=rows)
        sch = apply_fused_cuda(func, chain, cplan, H100)
        lib = tvm.compile(cpu_replica(sch.mod), target="llvm")
        assert_close(run(lib, arrays, out_shape, "float32"), ref, TOL)


@pytest.mark.parametrize("batch,m,k,l,n,middle", CASES[:4])
def test_roller_cuda_chain_fused_or_one_by_one(batch, m, k, l, n, middle):  # noqa: E741
    """What ``tvm_roller.build`` makes of a chain for CUDA, fused or (declined) its operators
    one by one with roller's CUDA schedules, run as a CPU replica."""
    func = gemm_chain(batch, m, k, l, n, middle)
    p = tvm_roller.plan(func, SM90, device=H100)
    assert p.chain is not None and p.fusion.reason
    sch = tvm_roller.planner.apply(p, p.tiles[0])
    lib = tvm.compile(cpu_replica(sch.mod), target="llvm")
    arrays = chain_inputs(batch, m, k, l, n)
    assert_close(run(lib, arrays, tuple(batch or ()) + (m, n), "float32"),
                 chain_reference(*arrays, middle), TOL)
    # and the operators one by one whatever the decision
    one_by_one = split.build_unfused(func, p.chain,
                                     lambda part: tvm_roller.schedule(part, SM90, device=H100))
    lib = tvm.compile(cpu_replica(one_by_one.mod), target="llvm")
    assert_close(run(lib, arrays, tuple(batch or ()) + (m, n), "float32"),
                 chain_reference(*arrays, middle), TOL)


def test_conv_chain_on_cuda_one_by_one():
    """A conv chain (padding before the first operator) is not fused on the GPU: its operators
    are built one by one, and the whole chain compiles with nvcc."""
    func = conv_chain(1, 9, 7, 5, 6, 3)
    p = tvm_roller.plan(func, SM90, device=H100)
    assert not p.fusion.fuse and "before the first matmul" in p.fusion.reason
    sch = tvm_roller.planner.apply(p, p.tiles[0])
    assert check(sch.mod, SM90).ok
    x, w1, w2 = rand((1, 9, 7, 5), seed=1), rand((3, 3, 5, 6), seed=2), rand((1, 1, 6, 3), seed=3)
    lib = tvm.compile(cpu_replica(sch.mod), target="llvm")
    assert_close(run(lib, [x, w1, w2], (1, 9, 7, 3), "float32"), conv_chain_reference(x, w1, w2),
                 TOL)


ATTENTION = ([12], 512, 64, 512, 64, "softmax")  # BERT-base: 12 heads, 512 tokens, head 64
MLP = (None, 128, 768, 3072, 768, "gelu")  # BERT-base MLP block, 128 tokens


@pytest.mark.parametrize("arch", ["sm_90", "sm_80"])
def test_attention_fused_kernel_compiles(arch):
    tgt = cuda_target(arch)
    dev = gpu.from_target(tgt)
    func = gemm_chain(*ATTENTION)
    chain = detect_chain(func)
    cplan = plan_cuda_chain(chain, dev)
    assert cplan.fuse, cplan.reason
    assert "fuse:" in cplan.reason and "round trip" in cplan.reason
    assert cplan.row_reduction and cplan.blocks >= dev.num_units
    assert cplan.traffic_fused < cplan.traffic_unfused
    rep = check(apply_fused_cuda(func, chain, cplan, dev).mod, tgt, dev)
    assert rep.ok, rep.problems
    (kern,) = rep.ptxas.kernels.values()
    assert kern.spill_stores == 0 and kern.stack_frame == 0, kern
    (launch,) = rep.bundle.launches
    assert launch.grid == (cplan.blocks, 1, 1)
    assert launch.block == (32, cplan.threads // 32, 1)
    # the planner's estimate bounds the real allocation (TVM reuses dead tiles' space)
    smem = launch.dyn_smem_bytes + kern.smem_static
    assert smem <= cplan.smem_bytes <= gpu.smem_limit(dev)
    # row max and sum by warp shuffles; B and D tiles fetched as float4
    assert "__shfl_down_sync" in rep.source and "float4" in rep.source


def test_attention_softmax_tile_is_shared_by_all_threads():
    """The softmax output is made per l-step of the second matmul as a shared tile of
    rows x l_step: every thread block computes the whole tile once per step (all threads), not
    each thread the part it reads (a replica would not notice that; the GPU would)."""
    func = gemm_chain(*ATTENTION)
    chain = detect_chain(func)
    cplan = plan_cuda_chain(chain, H100)
    sch = apply_fused_cuda(func, chain, cplan, H100)
    blk = sch.get_sblock(chain.between[-1])
    loops = sch.get_loops(blk)
    inner = [sch.get(lp) for lp in loops[loops.index(next(
        lp for lp in loops if "rl" in str(sch.get(lp).loop_var))) + 1:]]
    threads = [lp for lp in inner if lp.thread_binding is not None]
    assert {str(lp.thread_binding.thread_tag) for lp in threads} == {"threadIdx.x",
                                                                      "threadIdx.y"}
    assert np.prod([int(lp.extent) for lp in inner]) == cplan.rows * cplan.l_step


def test_mlp_block_declined_with_reason():
    func = gemm_chain(*MLP)
    chain = detect_chain(func)
    cplan = plan_cuda_chain(chain, H100)
    assert not cplan.fuse
    assert "shared memory" in cplan.reason and "too long" in cplan.reason, cplan.reason
    assert cplan.traffic_fused > cplan.traffic_unfused
    # still buildable (the caller may insist): a small kernel, checked for the device limits
    tgt = cuda_target("sm_90")
    rep = check(apply_fused_cuda(func, chain, cplan, H100).mod, tgt, H100)
    assert rep.ok_for_compute_bound(), rep.problems


def test_refused_when_one_row_does_not_fit():
    func = gemm_chain(None, 4, 8, 65536, 8, "relu")  # one row of the slice: 256 KiB
    chain = detect_chain(func)
    cplan = plan_cuda_chain(chain, H100)
    assert not cplan.fits and not cplan.fuse
    assert "even for one row" in cplan.reason and "too long" in cplan.reason
    with pytest.raises(UnsupportedError, match="cannot be fused"):
        apply_fused_cuda(func, chain, cplan, H100)


def test_refused_float64_and_cpu_device():
    func = gemm_chain([2], 8, 4, 8, 4, "relu", dtype="float64")
    chain = detect_chain(func)
    cplan = plan_cuda_chain(chain, H100)
    assert not cplan.fits and "float32 only" in cplan.reason
    with pytest.raises(UnsupportedError, match="float64"):
        apply_fused_cuda(func, chain, cplan, H100)
    with pytest.raises(UnsupportedError, match="GPU"):
        plan_cuda_chain(chain, hardware.preset("x86-avx512"))


def test_plan_is_plain_data():
    func = gemm_chain(*ATTENTION)
    cplan = plan_cuda_chain(detect_chain(func), H100)
    d = cplan.to_dict()
    assert CudaChainPlan(**d) == cplan
    assert d["intermediate_round_trip"] == 2 * 12 * 512 * 512 * 4
    with pytest.raises(UnsupportedError, match="does not divide"):
        plan_cuda_chain(detect_chain(func), H100, rows=3)


@needs_emulator
@pytest.mark.parametrize("batch,m,k,l,n,middle,rows", [
    ([2], 64, 32, 128, 48, "softmax", 32),  # 8 warps: shuffles per warp, the S tile per step
    ([3], 37, 13, 41, 11, "relu", 37),      # prime: predicated threads and tiles
    ([2, 3], 7, 5, 3, 2, "softmax", 7),     # one warp, rows serial
])
def test_generated_cuda_emulated(batch, m, k, l, n, middle, rows, tmp_path):  # noqa: E741
    """The CUDA source nvcc compiles, run with real barriers and warp shuffles: catches what the
    replica cannot (a missing barrier, a thread making only its own part of a shared tile)."""
    from harness.cuda_check.build import kernel_launches

    func = gemm_chain(batch, m, k, l, n, middle)
    chain = detect_chain(func)
    cplan = plan_cuda_chain(chain, H100, rows=rows)
    bundle = kernel_launches(apply_fused_cuda(func, chain, cplan, H100).mod, cuda_target("sm_90"))
    (launch,) = bundle.launches
    a, b, d = chain_inputs(batch, m, k, l, n)
    e = np.full(tuple(batch or ()) + (m, n), np.nan, dtype=np.float32)
    out = emulate(bundle.source, launch.grid, launch.block, launch.dyn_smem_bytes,
                  {"A": a, "B": b, "D": d, "E": e}, "E", str(tmp_path))
    assert_close(out, chain_reference(a, b, d, middle), TOL)


def test_relax_attention_fused_for_cuda():
    """The Relax pipeline groups a plain attention (matmul -> softmax -> matmul) for CUDA, the
    model fuses it, and the grouped PrimFunc gets the fused kernel, which nvcc compiles."""
    import torch

    from tvm_roller.integrations.pytorch import import_torch
    from tvm_roller.relax import fusion_passes

    class Attention(torch.nn.Module):  # keys and values as weights: one example input
        def __init__(self):
            super().__init__()
            self.k = torch.nn.Parameter(torch.randn(12, 64, 512))
            self.v = torch.nn.Parameter(torch.randn(12, 512, 64))

        def forward(self, q):
            return torch.softmax(q @ self.k, dim=-1) @ self.v

    mod = import_torch(Attention(), torch.randn(12, 512, 64))
    decisions = []
    with SM90:
        grouped = fusion_passes(chains=decisions, device=H100)(mod)
    assert len(decisions) == 1 and decisions[0]["fused"], decisions
    funcs = [f for gv, f in grouped.functions_items()
             if isinstance(f, tvm.tirx.PrimFunc) and "chain" in gv.name_hint]
    assert len(funcs) == 1
    p = tvm_roller.plan(funcs[0].with_attr("global_symbol", "main"), SM90, device=H100)
    assert p.chain is not None and p.fusion.fuse
    sch = tvm_roller.planner.apply(p, p.tiles[0])
    with tvm_roller.planner.Context.make(p.target).pass_context():
        report = check(sch.mod, SM90, H100)
    assert report.ok, report.problems
    assert len(report.bundle.launches) == 1  # one fused kernel
