"""``check_executable``: nvcc on every kernel of a built CUDA module, against the device limits
(the conftest runs it on every CUDA module a test builds with roller)."""
from __future__ import annotations

import shutil

import pytest
import tvm
from tvm import te

import tvm_roller
from harness.cuda_check import CudaCompileError, check_executable

from conftest import cuda_target

pytestmark = pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc")


def _static_smem_kernel(floats: int):
    """A copy through a static __shared__ tile of ``floats`` floats (one block of 128 threads)."""
    from tvm.script import tirx as T

    @T.prim_func(s_tir=True)
    def main(A: T.Buffer((floats,), "float32"), B: T.Buffer((floats,), "float32")):
        S = T.sblock_alloc_buffer((floats,), scope="shared")
        for tx in T.thread_binding(128, thread="threadIdx.x"):
            for i in range(floats // 128):
                with T.sblock("load"):
                    v = T.axis.spatial(floats, i * 128 + tx)
                    S[v] = A[v]
            for i in range(floats // 128):
                with T.sblock("store"):
                    v = T.axis.spatial(floats, i * 128 + tx)
                    B[v] = S[floats - 1 - v] * T.float32(2)
    return main


def test_kernel_ptxas_rejects_is_an_error():
    tgt = cuda_target("sm_90")
    ok = tvm.compile(tvm.IRModule({"main": _static_smem_kernel(128 * 16)}), target=tgt)
    reports = check_executable(ok, tgt)
    assert reports and all(k.smem_static == 128 * 16 * 4 for r in reports
                           for k in r.kernels.values())
    # 64 KiB of static __shared__: ptxas refuses (0xc000 = 48 KiB max)
    bad = tvm.compile(tvm.IRModule({"main": _static_smem_kernel(128 * 128)}), target=tgt)
    with pytest.raises(CudaCompileError, match="shared"):
        check_executable(bad, tgt)


def test_roller_builds_are_checked():
    """``tvm_roller.build`` for CUDA returns a module whose every kernel nvcc accepts, and the
    conftest checks it too (a prime-sized matmul: padded block tiles, whole warps)."""
    A = te.placeholder((37, 219), name="A")
    B = te.placeholder((219, 53), name="B")
    k = te.reduce_axis((0, 219), "k")
    C = te.compute((37, 53), lambda i, j: te.sum(A[i, k] * B[k, j], axis=k), name="C")
    ex = tvm_roller.build(te.create_prim_func([A, B, C]), cuda_target("sm_90"))
    for rep in check_executable(ex, cuda_target("sm_90")):
        assert all(k.spill_stores == 0 for k in rep.kernels.values())
