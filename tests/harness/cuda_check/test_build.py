"""The CUDA toolchain (harness.cuda_check.build) on modules scheduled by TVM's dlight rules or by
hand, never by roller: lowering to host + device functions, kernel launches, verification, nvcc.

No GPU is needed; nvcc tests are skipped where nvcc is missing."""
from __future__ import annotations

import json
import os
import re
import shutil

import pytest

tvm = pytest.importorskip("tvm")

from tvm import te  # noqa: E402

from tvm_roller import hardware  # noqa: E402
from tvm_roller.core.errors import UnsupportedError  # noqa: E402
from harness.cuda_check import build as cb  # noqa: E402
from tvm_roller.tools.suite import workloads  # noqa: E402

HAVE_NVCC = bool(os.environ.get("TVM_ROLLER_NVCC") or shutil.which("nvcc")
                 or os.path.isfile("/usr/local/cuda/bin/nvcc"))
needs_nvcc = pytest.mark.skipif(not HAVE_NVCC, reason="nvcc is not installed")


def sm90():
    return tvm.target.Target({"tag": "nvidia/nvidia-h100", "arch": "sm_90"})


def sm80():
    return tvm.target.Target("nvidia/nvidia-a100")


def dlight(func, target):
    from tvm.s_tir import dlight as dl

    with target:
        return dl.ApplyDefaultSchedule(dl.gpu.Matmul(), dl.gpu.GEMV(), dl.gpu.Reduction(),
                                       dl.gpu.GeneralReduction(), dl.gpu.Fallback())(
            tvm.IRModule({"main": func}))


def softmax_four_kernels():
    """SFM:0 with each of its 4 blocks bound on its own: 4 kernels, intermediates in global
    memory (dlight fuses softmax into one kernel, so this is the multi-kernel case)."""
    sch = tvm.s_tir.Schedule(tvm.IRModule({"main": workloads.create("SFM", 0)}))
    for b in sch.get_child_blocks(sch.get_sblock("root")):
        bx, tx = sch.split(sch.get_loops(b)[0], [None, 64])
        sch.bind(bx, "blockIdx.x")
        sch.bind(tx, "threadIdx.x")
    return sch.mod


def gmm_dyn_smem(tile_k: int = 128):
    """GMM:0 with X's tile in dynamic shared memory (16 x tile_k floats per block)."""
    sch = tvm.s_tir.Schedule(tvm.IRModule({"main": workloads.create("GMM", 0)}))
    blk = sch.get_sblock("Z")
    _, i, j, k = sch.get_loops(blk)
    io, ii = sch.split(i, [None, 16])
    jo, ji = sch.split(j, [None, 16])
    sch.reorder(io, jo, ii, ji, k)
    sch.bind(io, "blockIdx.x")
    sch.bind(jo, "blockIdx.y")
    sch.bind(ii, "threadIdx.y")
    sch.bind(ji, "threadIdx.x")
    ko, _ = sch.split(k, [None, tile_k])
    s = sch.cache_read(blk, 0, "shared.dyn")
    sch.compute_at(s, ko)
    _, ty, tx = sch.split(sch.fuse(*sch.get_loops(s)[-2:]), [None, 16, 16])
    sch.bind(ty, "threadIdx.y")
    sch.bind(tx, "threadIdx.x")
    return sch.mod


def wide_vector():
    """A float32 loop vectorized 8 wide: 32-byte vectors, invalid CUDA only nvcc catches."""
    A = te.placeholder((1024, 64), "float32", name="A")
    B = te.compute((1024, 64), lambda i, j: A[i, j] * 2.0, name="B")
    sch = tvm.s_tir.Schedule(te.create_prim_func([A, B]).with_attr("global_symbol", "main"))
    i, j = sch.get_loops(sch.get_sblock("B"))
    _, ji = sch.split(j, [None, 8])
    bx, tx = sch.split(i, [None, 128])
    sch.bind(bx, "blockIdx.x")
    sch.bind(tx, "threadIdx.x")
    sch.vectorize(ji)
    return sch


def signature(source: str, kernel: str):
    """(launch bounds, parameter names) of ``kernel``'s definition in the source."""
    m = re.search(r"__global__ void __launch_bounds__\((\d+)\) " + kernel + r"\(([^)]*)\)\s*\{", source)
    assert m, f"{kernel} not defined in the source"
    return int(m.group(1)), [p.split()[-1] for p in m.group(2).split(",")]


def check_args_match_source(bundle: cb.KernelBundle) -> None:
    # TVM names a kernel's pointer parameters <buffer>_ptr: our argument order must be theirs
    for launch in bundle.launches:
        bounds, names = signature(bundle.source, launch.name)
        assert launch.threads == bounds
        assert len(names) == len(launch.args)
        for a, n in zip(launch.args, names):
            assert n == f"{a.name}_ptr", (launch.name, n, a)


# -- lowering and launches --------------------------------------------------------------------
def test_lower_splits_host_and_device():
    low = cb.lower(dlight(workloads.create("GMM", 0), sm90()), sm90())
    kernels = cb.device_kernels(low)
    assert list(kernels) == ["main_kernel"]
    assert int(kernels["main_kernel"].attrs["calling_conv"]) == 2
    host = low["main"]
    assert len(host.params) == 3  # buffers still, not the packed API
    assert [tuple(int(d) for d in p.ty.shape) for p in host.params] == \
        [s for s, _ in workloads.arg_specs(workloads.create("GMM", 0))]


def test_launches_gmm_dlight():
    func = workloads.create("GMM", 0)
    b = cb.kernel_launches(dlight(func, sm90()), sm90())
    assert b.arch == "sm_90"
    assert [(tuple(p.shape), p.dtype) for p in b.params] == workloads.arg_specs(func)
    assert b.workspaces == []
    (launch,) = b.launches
    assert launch.name == "main_kernel" and launch.dyn_smem_bytes == 0
    assert [(a.kind, a.index) for a in launch.args] == [("param", 0), ("param", 1), ("param", 2)]
    # dlight's 128^3 matmul: 32x64 output tiles per block, 8x16 threads with 4x4 outputs each
    assert launch.grid == (4, 2, 1) and launch.block == (8, 16, 1)
    check_args_match_source(b)
    assert cb.KernelBundle.from_json(b.to_json()) == b


def test_launches_keep_kernel_argument_order():
    # dlight's conv kernel takes the output first: arguments follow the kernel, not the function
    b = cb.kernel_launches(dlight(workloads.create("C2D", 0), sm90()), sm90())
    (launch,) = b.launches
    assert [a.index for a in launch.args] == [2, 0, 1]
    assert launch.grid == (784, 1, 1) and launch.block == (1024, 1, 1)
    check_args_match_source(b)


def test_launches_multi_kernel_with_workspaces():
    b = cb.kernel_launches(softmax_four_kernels(), sm90())
    assert [l.name for l in b.launches] == ["main_kernel"] + [f"main_kernel_{i}" for i in (1, 2, 3)]
    assert all(l.grid == (4, 1, 1) and l.block == (64, 1, 1) for l in b.launches)
    # TVM reuses the max buffer for the sums: two workspaces for three intermediates
    assert [(w.name, w.dtype, w.count) for w in b.workspaces] == \
        [("T_softmax_maxelem", "float32", 256), ("T_softmax_exp", "float32", 65536)]
    assert b.workspaces[1].nbytes == 65536 * 4
    kinds = [[(a.kind, a.index) for a in l.args] for l in b.launches]
    assert kinds == [
        [("param", 0), ("workspace", 0)],
        [("param", 0), ("workspace", 1), ("workspace", 0)],
        [("workspace", 1), ("workspace", 0)],
        [("workspace", 1), ("workspace", 0), ("param", 1)],
    ]
    check_args_match_source(b)
    again = cb.KernelBundle.from_json(b.to_json())
    assert again == b and again.kernel_names == [l.name for l in b.launches]
    assert json.loads(b.to_json())["format"] == cb.BUNDLE_FORMAT


def test_launches_dynamic_shared_memory():
    b = cb.kernel_launches(gmm_dyn_smem(128), sm90())
    (launch,) = b.launches
    assert launch.dyn_smem_bytes == 16 * 128 * 4
    assert isinstance(launch.dyn_smem_bytes, int)
    assert launch.grid == (8, 8, 1) and launch.block == (16, 16, 1)
    assert "extern __shared__" in b.source


def test_bundle_from_json_rejects_other_formats():
    b = cb.kernel_launches(dlight(workloads.create("GMM", 0), sm90()), sm90())
    d = json.loads(b.to_json())
    d["format"] = 99
    with pytest.raises(ValueError, match="format"):
        cb.KernelBundle.from_json(json.dumps(d))


def test_target_errors():
    mod = dlight(workloads.create("GMM", 0), sm90())
    with pytest.raises(UnsupportedError, match="not cuda"):
        cb.lower(mod, {"kind": "llvm", "mcpu": "skylake-avx512"})
    with pytest.raises(TypeError, match="IRModule"):
        cb.lower("main", sm90())


# -- verification -----------------------------------------------------------------------------
def test_verify_clean_and_violations():
    dev = hardware.preset("h200")
    assert cb.verify(dlight(workloads.create("GMM", 0), sm90()), sm90(), dev) == []
    assert cb.verify(softmax_four_kernels(), sm90(), dev) == []
    problems = cb.verify(wide_vector(), sm90(), dev)
    assert len(problems) == 1 and "max_vector_bytes=16" in problems[0]
    # 16 x 4096 floats of dynamic shared memory = 256 KiB > 227 KiB (opt-in) on an H200
    big = cb.verify(_big_smem(), sm90(), dev)
    assert any("max_shared_memory_per_block" in p for p in big)
    assert any("bytes of shared memory >" in p for p in big)


def _big_smem():
    A = te.placeholder((64, 4096), "float32", name="A")
    k = te.reduce_axis((0, 4096), name="k")
    B = te.compute((64,), lambda i: te.sum(A[i, k], axis=k), name="B")
    sch = tvm.s_tir.Schedule(te.create_prim_func([A, B]).with_attr("global_symbol", "main"))
    blk = sch.get_sblock("B")
    i, _ = sch.get_loops(blk)
    bx, tx = sch.split(i, [None, 16])
    sch.bind(bx, "blockIdx.x")
    sch.bind(tx, "threadIdx.x")
    s = sch.cache_read(blk, 0, "shared.dyn")
    sch.compute_at(s, bx)
    _, t = sch.split(sch.fuse(*sch.get_loops(s)[-2:]), [None, 16])
    sch.bind(t, "threadIdx.x")
    return sch.mod


# -- nvcc -------------------------------------------------------------------------------------
PTXAS_SM90 = """\
ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function 'main_kernel_1' for 'sm_90'
ptxas info    : Function properties for main_kernel_1
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 30 registers, used 0 barriers
ptxas info    : Compile time = 3.625 ms
ptxas info    : Compiling entry function 'main_kernel' for 'sm_90'
ptxas info    : Function properties for main_kernel
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 64 registers, used 1 barriers, 6912 bytes smem
ptxas info    : Compile time = 16.343 ms
"""
PTXAS_SPILL_SM80 = """\
ptxas info    : 0 bytes gmem
ptxas info    : Function properties for helper
    8 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Compiling entry function 'big' for 'sm_80'
ptxas info    : Function properties for big
    264 bytes stack frame, 248 bytes spill stores, 360 bytes spill loads
ptxas warning : Registers are spilled to local memory in function 'big', 248 bytes spill stores, 360 bytes spill loads
ptxas info    : Used 255 registers, used 1 barriers, 37376 bytes smem, 376 bytes cmem[0]
"""


def test_parse_ptxas_canned_logs():
    k, warns = cb.parse_ptxas(PTXAS_SM90)
    assert set(k) == {"main_kernel", "main_kernel_1"} and warns == []
    main = k["main_kernel"]
    assert (main.registers, main.barriers, main.smem_static) == (64, 1, 6912)
    assert (k["main_kernel_1"].registers, k["main_kernel_1"].smem_static) == (30, 0)
    k, warns = cb.parse_ptxas(PTXAS_SPILL_SM80)
    assert set(k) == {"big"}  # the device function "helper" is not a kernel
    big = k["big"]
    assert (big.registers, big.stack_frame, big.spill_stores, big.spill_loads) == (255, 264, 248, 360)
    assert (big.smem_static, big.cmem) == (37376, 376)
    assert len(warns) == 1 and "spilled" in warns[0]


@needs_nvcc
def test_compile_cubin_sm90_and_cache(monkeypatch):
    b = cb.kernel_launches(dlight(workloads.create("GMM", 0), sm90()), sm90())
    rep = cb.compile_cubin(b.source, b.arch)
    k = rep.kernels["main_kernel"]
    assert rep.arch == "sm_90" and k.registers > 0 and k.smem_static == 6912
    assert k.spill_stores == 0 and k.stack_frame == 0
    assert os.path.isfile(rep.cubin_path)
    # the second call is a cache hit: nvcc must not run
    monkeypatch.setattr(cb, "_run_nvcc", lambda *a, **k: pytest.fail("nvcc ran on a cache hit"))
    again = cb.compile_cubin(b.source, "sm_90")
    assert again.kernels == rep.kernels and again.cubin_path == rep.cubin_path


@needs_nvcc
def test_compile_cubin_sm80_multi_kernel():
    b = cb.kernel_launches(softmax_four_kernels(), sm80())
    assert b.arch == "sm_80"
    rep = cb.compile_cubin(b.source, b.arch)
    assert set(rep.kernels) == set(b.kernel_names)
    assert all(k.registers > 0 for k in rep.kernels.values())


@needs_nvcc
def test_bad_source_gives_typed_error():
    with pytest.raises(cb.CudaCompileError, match="undefined") as exc:
        cb.compile_cubin('extern "C" __global__ void k(float* a) { a[0] = nothing_here; }', "sm_90")
    assert isinstance(exc.value, UnsupportedError) and exc.value.returncode != 0
    assert "nothing_here" in exc.value.log
    # TVM accepts 8-wide float vectors; nvcc does not
    src = cb.kernel_launches(wide_vector(), sm90()).source
    with pytest.raises(cb.CudaCompileError, match="too many arguments"):
        cb.compile_cubin(src, "sm_90")


WMMA_SOURCE = r"""
#include <mma.h>
using namespace nvcuda;
extern "C" __global__ void tc(const half* a, const half* b, float* c) {
  wmma::fragment<wmma::matrix_a, 16, 16, 16, half, wmma::row_major> fa;
  wmma::fragment<wmma::matrix_b, 16, 16, 16, half, wmma::row_major> fb;
  wmma::fragment<wmma::accumulator, 16, 16, 16, float> fc;
  wmma::fill_fragment(fc, 0.0f);
  wmma::load_matrix_sync(fa, a, 16);
  wmma::load_matrix_sync(fb, b, 16);
  wmma::mma_sync(fc, fa, fb, fc);
  wmma::store_matrix_sync(c, fc, 16, wmma::mem_row_major);
}
"""


@needs_nvcc
def test_ptx_tensor_core():
    assert cb.ptx_tensor_core(WMMA_SOURCE, "sm_90") is True
    b = cb.kernel_launches(dlight(workloads.create("GMM", 0), sm90()), sm90())
    assert cb.ptx_tensor_core(b.source, "sm_90") is False


@needs_nvcc
def test_check_report():
    dev = hardware.preset("h200")
    rep = cb.check(softmax_four_kernels(), sm90(), dev)
    assert rep.ok and rep.problems == [] and rep.ok_for_compute_bound()
    assert rep.tensor_core is False and len(rep.bundle.launches) == 4
    assert set(rep.ptxas.kernels) == set(rep.bundle.kernel_names)
    assert cb.CheckReport.from_json(rep.to_json()) == rep
    bad = cb.check(wide_vector(), sm90(), dev)
    assert not bad.ok and not bad.ok_for_compute_bound() and bad.ptxas is None
    assert any("max_vector_bytes" in p for p in bad.problems)
    assert any("nvcc" in p and "too many arguments" in p for p in bad.problems)


def test_ok_for_compute_bound_flags_spills():
    ptxas = cb.PtxasReport("sm_80", "x", cb.parse_ptxas(PTXAS_SPILL_SM80)[0])
    rep = cb.CheckReport("sm_80", "", [], ptxas, False)
    assert rep.ok and not rep.ok_for_compute_bound()


@pytest.mark.slow
@needs_nvcc
def test_fp16_gemm_dlight_tensor_cores_and_big_dynamic_smem():
    # dlight's tensor-core matmul rule (the tensor intrinsics take ~35 s of CPU to register)
    n = 1024
    A = te.placeholder((n, n), "float16", name="A")
    B = te.placeholder((n, n), "float16", name="B")
    k = te.reduce_axis((0, n), name="k")
    acc = te.compute((n, n), lambda i, j: te.sum(
        A[i, k].astype("float32") * B[k, j].astype("float32"), axis=k), name="matmul")
    C = te.compute((n, n), lambda i, j: acc[i, j].astype("float16"), name="C")
    mod = dlight(te.create_prim_func([A, B, C]).with_attr("global_symbol", "main"), sm90())
    rep = cb.check(mod, sm90(), hardware.preset("h200"))
    assert rep.ok and rep.tensor_core
    (launch,) = rep.bundle.launches
    assert launch.dyn_smem_bytes > 48 * 1024
    assert [p.dtype for p in rep.bundle.params] == ["float16"] * 3
