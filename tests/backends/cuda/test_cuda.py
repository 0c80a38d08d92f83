"""The CUDA backend without a GPU: device models from targets, construction, the drop-in points.

Compiling every suite workload with nvcc is tests/harness/cuda_check/test_suite_kernels.py; the
kernels run only on the lent device (python/gpu_check.py).
"""
from __future__ import annotations

import dataclasses
import tempfile

import pytest
import tvm
from tvm import te

from tvm_roller.backends.cuda import policy
from tvm_roller.planner import Context
import tvm_roller
from tvm_roller import hardware
from tvm_roller.core.errors import FallbackWarning, UnsupportedError
from tvm_roller.hardware import gpu
from tvm_roller.tools.suite import workloads as W

from conftest import cuda_target


def device_model(target):
    """The device model of a target, as the planner's context makes it."""
    return Context.make(target).device


SM90 = cuda_target("sm_90")
SM80 = cuda_target("sm_80")


# -- device models -------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["v100", "a100", "h100", "h200"])
def test_gpu_presets_complete(name):
    d = hardware.preset(name)
    assert d.kind == "gpu" and d.num_units >= 80
    assert d.cpu is None and isinstance(d.gpu, hardware.GpuTraits)
    assert gpu.GPU_LIMIT_KEYS == tuple(f.name for f in dataclasses.fields(d.gpu))
    assert d.peak_gflops["float16_tc"] > d.peak_gflops["float32"] > 0
    assert [l.name for l in d.levels] == ["SMEM", "L2", "DRAM"]
    assert gpu.smem_limit(d) > gpu.smem_limit(d, dynamic=False) == 48 * 1024
    assert hardware.DeviceModel.from_json(d.to_json()) == d


def test_compute_capability_is_numeric():
    cc = gpu.ComputeCapability.parse("sm_90a")
    assert (cc.major, cc.minor, cc.suffix) == (9, 0, "a") and cc.arch == "sm_90a"
    assert gpu.ComputeCapability.parse("sm_100a").number == (10, 0)
    # "sm_100" < "sm_90" as strings; as numbers it is newer
    assert gpu.ComputeCapability.parse("sm_100").number > gpu.ComputeCapability.parse("sm_90").number
    with pytest.raises(UnsupportedError, match="compute capability"):
        gpu.ComputeCapability.parse("hopper")


def test_device_from_targets():
    h = device_model(tvm.target.Target("nvidia/nvidia-h100"))  # the tag says sm_90a
    assert h.name.startswith("NVIDIA H100") and h.gpu.cc_major == 9
    assert device_model(SM90).gpu.cc_major == 9
    a = device_model(SM80)
    assert a.name.startswith("NVIDIA A100") and a.num_units == 108
    assert device_model({"kind": "cuda", "arch": "sm_90"}).num_units == 132
    with pytest.raises(UnsupportedError, match="compute capability 8.6"):
        device_model({"kind": "cuda", "arch": "sm_86"})
    with pytest.raises(UnsupportedError, match="compute capability"):
        device_model("nvidia/geforce-rtx-3080")


def test_device_argument_checked_against_target():
    f = W.create("GMM", 0)
    h200 = hardware.preset("h200")
    p = tvm_roller.plan(f, SM90, device=h200)
    assert p.device.name.startswith("NVIDIA H200") and p.tiles[0].backend == "cuda"
    p = tvm_roller.plan(f, SM80, device=h200)  # sm_80 code runs on a 9.0 device
    assert any("sm_80" in n for n in p.target_notes)
    with pytest.raises(UnsupportedError, match="newer"):
        tvm_roller.plan(f, {"kind": "cuda", "arch": "sm_90"}, device=hardware.preset("a100"))
    with pytest.raises(UnsupportedError, match="cpu"):
        tvm_roller.plan(f, SM90, device=hardware.preset("x86-avx512"))
    with pytest.raises(UnsupportedError, match="gpu"):
        tvm_roller.plan(f, {"kind": "llvm", "mcpu": "skylake-avx512"}, device=h200)


# -- construction --------------------------------------------------------------------------------
def test_gpu_tiles_respect_limits():
    dev = hardware.preset("h100")
    for cls, idx in W.list_workloads("GMM,C2D,DEP,T2D,CBR,SFM,NRM,CAP"):
        p = tvm_roller.plan(W.create(cls, idx), SM90, topk=3, device=dev)
        for t in p.tiles:
            assert t.backend == "cuda"
            if t.kind != "tiled":
                continue
            # whole warps (prime axes such as 7x7 are padded); SIMT tiles are static shared
            assert t.threads % 32 == 0, (cls, idx, t.threads)
            smem_cap = gpu.smem_limit(dev, dynamic=bool(t.tensor_core))
            assert t.threads <= 1024 and t.smem_bytes <= smem_cap
            for i, a in enumerate(p.analysis.axes):
                # a block tile may pad its axis (a predicated tail), never past a power of two
                assert t.l1[i] % t.reg[i] == 0, (cls, idx, t.l1, t.reg)
                assert a.kind == "R" or t.l1[i] <= policy.tile_limit(a.extent)
            assert t.predicted_s > 0 and t.bound


def test_small_and_irregular_shapes():
    """GEMV (M=1), prime sizes and size-1 axes get valid tiles and build."""
    for m, n, k in [(1, 4096, 1024), (13, 17, 19), (1, 1, 97), (127, 1, 64)]:
        A = te.placeholder((m, k), name="A")
        B = te.placeholder((k, n), name="B")
        r = te.reduce_axis((0, k), name="r")
        C = te.compute((m, n), lambda i, j: te.sum(A[i, r] * B[r, j], axis=r), name="C")
        f = te.create_prim_func([A, B, C])
        p = tvm_roller.plan(f, SM90)
        t = p.tiles[0]
        assert t.num_tasks >= 1
        with tvm_roller.planner.Context.make(SM90).pass_context():
            tvm.compile(tvm_roller.planner.apply(p, t).mod, target=SM90)


def test_row_reduction_split_over_blocks():
    """One long row (a norm) is split over many blocks, not left to one SM."""
    t = tvm_roller.plan(W.create("NRM", 3), SM90).tiles[0]
    assert t.acc_level == "split" and t.num_tasks >= 132
    t = tvm_roller.plan(W.create("SFM", 2), SM90).tiles[0]
    assert t.acc_level != "split" and t.num_tasks == 1024


def test_explain_gpu():
    text = tvm_roller.explain(W.create("GMM", 3), SM90, device=hardware.preset("h200"))
    assert "132 SMs" in text and "compute capability 9.0" in text
    assert "shared-memory (block) tile" in text and "threads per block" in text


# -- bad input -----------------------------------------------------------------------------------
def test_cuda_bad_inputs():
    n = te.var("n")
    A = te.placeholder((n, 64), name="A")
    B = te.compute((n, 64), lambda i, j: A[i, j] * 2.0, name="B")
    with pytest.raises(UnsupportedError, match="symbolic"):
        tvm_roller.schedule(te.create_prim_func([A, B]), SM90)
    A = te.placeholder((64, 64), name="A", dtype="int8")
    r = te.reduce_axis((0, 64), name="r")
    C = te.compute((64, 64), lambda i, j: te.sum(A[i, r] * A[r, j], axis=r), name="C")
    with pytest.raises(UnsupportedError, match="float16 or float32"):
        tvm_roller.schedule(te.create_prim_func([A, C]), SM90)
    with pytest.raises(UnsupportedError, match="rocm"):
        tvm_roller.schedule(W.create("GMM", 0), {"kind": "rocm"})
    from harness.bench.chains import gemm_chain

    # a float64 chain is not fused (the fused kernel takes float32), and says so
    p = tvm_roller.plan(gemm_chain([2], 64, 32, 64, 32, "softmax", dtype="float64"), SM90)
    assert not p.fusion.fuse and "float32 only" in p.fusion.reason


def test_build_fallback_to_dlight_on_cuda():
    data = te.placeholder((100,), name="data")
    idx = te.placeholder((16,), name="idx", dtype="int32")
    k = te.reduce_axis((0, 16), "k")
    out = te.compute((1,), lambda i: te.sum(data[idx[k]], axis=k), name="gathered_sum")
    f = te.create_prim_func([data, idx, out])
    with pytest.raises(UnsupportedError, match="gather"):
        tvm_roller.build(f, SM90)
    with pytest.warns(FallbackWarning, match="gather"):
        ex = tvm_roller.build(f, SM90, fallback=True)
    assert "__global__" in ex.mod.imports[0].inspect_source()


# -- drop-in points ------------------------------------------------------------------------------
def test_dlight_rule_cuda():
    from tvm.s_tir import dlight as dl

    mod = tvm.IRModule({"sfm": W.create("SFM", 0).with_attr("global_symbol", "sfm"),
                        "gmm": W.create("GMM", 0).with_attr("global_symbol", "gmm")})
    rule = tvm_roller.dlight.Roller()
    with SM90:
        out = dl.ApplyDefaultSchedule(rule, dl.gpu.Fallback())(mod)
    assert not rule.declined
    src = tvm.compile(out, target=SM90).mod.imports[0].inspect_source()
    assert "sfm_kernel" in src and "gmm_kernel" in src


def test_meta_schedule_records_cuda():
    from tvm.s_tir import meta_schedule as ms

    from tvm_roller import meta_schedule as rms

    f = W.create("GMM", 1)
    with tempfile.TemporaryDirectory() as d:
        db = rms.tune(f, SM90, d, topk=2)
        assert len(db.get_all_tuning_records()) == 2
        sch = ms.tir_integration.compile_tir(db, f, SM90)
        assert sch is not None
        src = tvm.compile(sch.mod, target=SM90).mod.imports[0].inspect_source()
        assert "__shared__" in src and "threadIdx.x" in src


def test_no_feasible_tile_is_a_decline_then_the_fallback():
    """A device on which no candidate fits (here: 256 B of shared memory, 64 registers per
    block) is a decline naming the limit, never a built kernel (what ``fallback=True`` and the
    Relax path hand to dlight)."""
    h100 = hardware.preset("h100")
    tiny = dataclasses.replace(h100, gpu=dataclasses.replace(
        h100.gpu, smem_per_block=256, smem_per_block_optin=256, regs_per_block=64))
    A = te.placeholder((197, 131), name="A")
    B = te.placeholder((131, 89), name="B")
    k = te.reduce_axis((0, 131), "k")
    C = te.compute((197, 89), lambda i, j: te.sum(A[i, k] * B[k, j], axis=k), name="C")
    f = te.create_prim_func([A, B, C])
    with pytest.raises(UnsupportedError, match="fits"):
        tvm_roller.plan(f, SM90, device=tiny)
    with pytest.raises(UnsupportedError, match="fits"):
        tvm_roller.build(f, SM90, device=tiny)
    # on the real device the same shape gets whole warps, within the static limit
    t = tvm_roller.plan(f, SM90, device=h100).tiles[0]
    assert t.threads % 32 == 0 and t.smem_bytes <= h100.gpu.smem_per_block
