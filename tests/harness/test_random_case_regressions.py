"""Every random case that once failed (on HEAD before issue 14 or while fixing it), re-run
through the harness's own checks: each must now come out ok. The CUDA ones also pass nvcc and
the device-limit checks (``check_cuda.launch_limits``) and their CPU replica's numerics."""
from __future__ import annotations

import shutil

import pytest

from harness.random_cases import check_cpu, check_cuda
from harness.random_cases.case import OK, Case

# (family, dtype, params, what went wrong)
CUDA_CASES = [
    ("gemv", "float32", {"K": 333, "N": 1182, "form": "dense"}, "static smem > 48 KB"),
    ("reduce", "float32", {"axes": "0", "keepdims": 0, "op": "mean", "post": "scale",
                           "shape": "7"}, "scalar reduction: IndexError"),
    ("reduce", "float32", {"axes": "0", "keepdims": 0, "op": "sum", "post": "scale",
                           "shape": "1024"}, "scalar reduction"),
    ("conv1d", "float32", {"CI": 1, "CO": 56, "N": 2, "S": "26", "dilation": 1, "groups": 1,
                           "kernel": "6", "layout": "NLC", "pad": 2, "stride": 3},
     "partial warps"),
    ("conv2d_nhwc", "float32", {"CI": 1, "CO": 49, "N": 4, "S": "25x29", "dilation": 2,
                                "groups": 1, "kernel": "2x2", "layout": "NHWC", "pad": 2,
                                "stride": 2}, "partial warps"),
    ("softmax", "float64", {"shape": "8x1x376"}, "replica: float64 limit literal"),
    ("matmul_bias_act", "float16", {"K": 56, "M": 379, "N": 375, "acc": "float32",
                                    "act": "sigmoid", "trans_b": 1}, "partial warps"),
    ("gemm_chain", "float32", {"K": 79, "L": 208, "M": 5, "N": 248, "batch": 0,
                               "middle": "relu"}, "partial warps"),
    ("matmul", "float16", {"K": 1, "M": 19, "N": 397, "acc": "float32", "trans_b": 1},
     "partial warps"),
    ("pool", "float64", {"C": 37, "H": 15, "N": 2, "W": 32, "kernel": "2x2", "kind": "avg",
                         "layout": "NHWC", "pad": 0, "stride": 1}, "partial warps"),
    ("reduce", "float32", {"axes": "0", "keepdims": 0, "op": "sum", "post": "scale",
                           "shape": "37x10"}, "declined: a tiny output of partial warps"),
    ("matmul", "float32", {"K": 256, "M": 4, "N": 1, "trans_b": 0}, "declined"),
    ("copy_transpose", "float16", {"perm": "2,0,1", "shape": "1x104x31"},
     "nvcc: a gathered half8 vector"),
    ("elementwise", "float16", {"shape": "16x84x8", "bshape": "16x84x1", "op": "sigmoid_mul"},
     "nvcc: a broadcast half8 vector"),
    ("conv3d", "float32", {"CI": 16, "CO": 3, "N": 2, "S": "8x9x8", "dilation": 1, "groups": 1,
                           "kernel": "1x1x1", "layout": "NDHWC", "pad": 0, "stride": 2},
     "static smem: a strided window's staged box"),
    ("variance", "float64", {"axes": "0", "keepdims": 0, "shape": "32x2x32"},
     "declined: a reduction feeding a reduction"),
    ("variance", "float32", {"axes": "2", "keepdims": 0, "shape": "48x4x4"},
     "declined: rows with a kept unit axis"),
    ("variance", "float32", {"axes": "0,1,2,3", "keepdims": 1, "shape": "48x13x32x32"},
     "error: a split reduction before another"),
    ("arg_reduce", "float32", {"shape": "7x4x130", "axis": 2, "op": "argmin", "keepdims": 0},
     "declined: an int32 index"),
]
CPU_CASES = [
    ("reduce", "float32", {"axes": "0", "keepdims": 0, "op": "sum", "post": "scale",
                           "shape": "648"}, "rfactor InternalError"),
    ("reduce", "float64", {"axes": "0", "keepdims": 0, "op": "max", "post": "relu",
                           "shape": "1024"}, "rfactor InternalError"),
    ("variance", "float32", {"axes": "1", "keepdims": 0, "shape": "64x129x33"},
     "vectorize of a leftover reduction"),
    ("variance", "float64", {"axes": "1", "keepdims": 1, "shape": "8x16"},
     "reorder: the partial sums' lane loop over an init and an update"),
    ("arg_reduce", "float64", {"shape": "3x17x9", "axis": 1, "op": "argmax", "keepdims": 1},
     "declined: an int32 index"),
    # (a Relax model: its fused softmax chain's vectorize refused under a task loop fused from
    # two batch axes, a ScheduleError; the chain then built as its operators one by one)
    ("attention", "float64", {"B": 3, "D": 16, "H": 3, "KVH": 1, "SK": 32, "SQ": 32,
                              "const": "4.0", "form": "torch", "kv": "repeat",
                              "mask": "head_bias", "mask_batch": 3, "scale": "divide"},
     "chain ScheduleError: vectorize under a task over two batch axes"),
]


CASES = [("cpu", *c) for c in CPU_CASES] + [("cuda", *c) for c in CUDA_CASES]
_CHECKS = {"cpu": check_cpu.check, "cuda": check_cuda.check}


@pytest.mark.parametrize("i", range(len(CASES)), ids=[f"{c[0]}-{c[1]}-{c[4]}" for c in CASES])
def test_once_failing_case_is_ok(i):
    target, family, dtype, params, _ = CASES[i]
    if target == "cuda" and shutil.which("nvcc") is None:
        pytest.skip("needs nvcc")
    r = _CHECKS[target](Case(0, i, family, dtype, target, dict(params)))
    assert r.outcome == OK, (r.outcome, r.stage, r.message)
    for launch in r.facts.get("launches", []):  # CUDA: whole warps, or one small block
        threads = launch["block"][0] * launch["block"][1] * launch["block"][2]
        assert threads % 32 == 0 or threads < 32, launch
