"""Numerics of roller's CUDA schedules without a GPU: each schedule's CPU replica (the same loop
nest and index arithmetic, thread loops run one after another; ``cuda_check.replica``) is built
with LLVM, run on random data and compared with a float64 reference.

Shapes are small, odd, prime or size-1 so the replicas run in moments; every class of the suite
is covered, plus pooling, broadcasting elementwise and GEMV shapes.
"""
from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import te
from tvm.s_tir.meta_schedule.testing import te_workload as tw

import tvm_roller
from harness.cuda_check.replica import cpu_replica

from conftest import assert_close, cuda_target, rand, run

SM90 = cuda_target("sm_90")
SM80 = cuda_target("sm_80")
TOL = 2e-5


def _replica_output(func, arrays, target=SM90, topk=1):
    """Outputs of roller's top-k CUDA schedules of ``func``, run as CPU replicas."""
    p = tvm_roller.plan(func, target, topk)
    outs = []
    for tile in p.tiles:
        sch = tvm_roller.planner.apply(p, tile)
        lib = tvm.compile(cpu_replica(sch.mod), target="llvm")
        shape = [int(s) for s in func.params[-1].shape]
        outs.append(run(lib, arrays, shape, str(func.params[-1].dtype)))
    return outs, p


def _f64_reference(make, args, arrays):
    """TVM's own unscheduled build of the same workload in float64: an exact reference."""
    tensors = make(*args, in_dtype="float64", out_dtype="float64")
    lib = tvm.compile(te.create_prim_func(list(tensors)), target="llvm")
    out = tensors[-1]
    return run(lib, [a.astype(str(t.dtype)) for a, t in zip(arrays, tensors)], out.shape,
               "float64")


def _check_workload(make, args, topk=2, target=SM90):
    tensors = make(*args)
    func = te.create_prim_func(list(tensors))
    arrays = [rand([int(s) for s in t.shape], "float32", i) for i, t in enumerate(tensors[:-1])]
    ref = _f64_reference(make, args, arrays)
    outs, p = _replica_output(func, arrays, target, topk)
    for out, tile in zip(outs, p.tiles):
        assert_close(out, ref, TOL if tile.kind != "tiled" else 1e-4)
    return p


@pytest.mark.parametrize("n,m,k", [(13, 17, 19), (1, 256, 64), (128, 1, 64), (1, 1, 97),
                                   (64, 64, 64), (96, 40, 33)])
def test_gemm_shapes(n, m, k):
    _check_workload(tw.matmul, (n, m, k))


def test_gemm_big_register_tiles():
    """Candidates with the largest register tiles (8x8 per thread), not just the top-ranked."""
    import math

    from tvm_roller.backends.cuda import policy as policy_gpu

    tensors = tw.matmul(128, 192, 64)
    func = te.create_prim_func(list(tensors))
    arrays = [rand([int(s) for s in t.shape], "float32", i) for i, t in enumerate(tensors[:-1])]
    ref = _f64_reference(tw.matmul, (128, 192, 64), arrays)
    p = tvm_roller.plan(func, SM90)
    cands = sorted(policy_gpu.construct_simt(p.analysis, p.device),
                   key=lambda t: -math.prod(t.reg))[:3]
    assert math.prod(cands[0].reg) == 64
    for tile in cands:
        lib = tvm.compile(cpu_replica(tvm_roller.planner.apply(p, tile).mod), target="llvm")
        assert_close(run(lib, arrays, (128, 192), "float32"), ref, 1e-4)


def test_batch_gemm_odd():
    _check_workload(tw.batch_matmul_nkkm, (3, 5, 7, 11))
    _check_workload(tw.batch_matmul_nkkm, (2, 64, 32, 48), target=SM80)


@pytest.mark.parametrize("args", [
    (1, 9, 9, 5, 7, 3, 1, 1),          # odd everything, padding 1
    (2, 15, 15, 8, 16, 3, 2, 1),       # stride 2
    (1, 13, 13, 4, 8, 3, 1, 2, 2),     # dilation 2
    (1, 8, 8, 16, 16, 3, 1, 1, 1, 4),  # 4 groups
    (1, 7, 7, 32, 64, 1, 1, 0),        # 1x1
])
def test_conv2d(args):
    _check_workload(tw.conv2d_nhwc, args)


def test_conv1d_conv3d_depthwise():
    _check_workload(tw.conv1d_nlc, (1, 17, 6, 10, 3, 1, 1))
    _check_workload(tw.conv3d_ndhwc, (1, 4, 7, 7, 3, 8, 3, 1, 1))
    _check_workload(tw.depthwise_conv2d_nhwc, (1, 11, 11, 6, 3, 1, 1))
    _check_workload(tw.depthwise_conv2d_nhwc, (1, 14, 14, 32, 3, 2, 1))


def test_transposed_capsule_tbg():
    _check_workload(tw.conv2d_transpose_nhwc, (1, 5, 5, 8, 6, 4, 2, 1))
    _check_workload(tw.conv2d_capsule_nhwijc, (1, 6, 6, 8, 8, 3, 1, 1, 4))
    _check_workload(tw.transpose_batch_matmul, (1, 9, 3, 16))


def test_conv_bn_relu_epilogue():
    # (data, kernel, bias, bn_offset, bn_scale, out): the epilogue is folded into the write-back
    p = _check_workload(tw.conv2d_nhwc_bn_relu, (1, 9, 9, 8, 12, 3, 1, 1))
    assert p.tiles[0].kind == "tiled"


def _numpy_check(tensors, ref, topk=1):
    func = te.create_prim_func(list(tensors))
    arrays = [rand([int(s) for s in t.shape], "float32", i) for i, t in enumerate(tensors[:-1])]
    outs, p = _replica_output(func, arrays, topk=topk)
    expect = ref(*[a.astype(np.float64) for a in arrays])
    for out in outs:
        assert_close(out, expect, TOL)
    return p


@pytest.mark.parametrize("m,n", [(7, 33), (1, 1000), (64, 1), (3, 4096)])
def test_softmax(m, n):
    def ref(x):
        e = np.exp(x - x.max(axis=1, keepdims=True))
        return e / e.sum(axis=1, keepdims=True)

    _numpy_check(tw.softmax_mn(m, n), ref)


@pytest.mark.parametrize("b,m,n", [(2, 31, 33), (1, 256, 512), (1, 1, 7)])
def test_norm(b, m, n):
    p = _numpy_check(tw.norm_bmn(b, m, n), lambda a: np.sqrt((a * a).sum(axis=(1, 2))))
    if m * n >= 64 * 1024:  # long rows: split over blocks (rfactor), still exact
        assert p.tiles[0].acc_level == "split"


def test_max_pool_and_broadcast_elementwise():
    x = te.placeholder((2, 9, 9, 5), name="x")
    rh = te.reduce_axis((0, 3), name="rh")
    rw = te.reduce_axis((0, 3), name="rw")
    pool = te.compute((2, 4, 4, 5), lambda n, h, w, c: te.max(x[n, h * 2 + rh, w * 2 + rw, c],
                                                              axis=[rh, rw]), name="pool")

    def pool_ref(a):
        out = np.full((2, 4, 4, 5), -np.inf)
        for i in range(3):
            for j in range(3):
                out = np.maximum(out, a[:, i:i + 8:2, j:j + 8:2, :])
        return out

    _numpy_check([x, pool], pool_ref, topk=2)
    x1 = te.placeholder((3, 7, 7, 1), name="x1")  # one channel: no contiguous axis to tile
    pool1 = te.compute((3, 3, 3, 1), lambda n, h, w, c: te.max(
        x1[n, h * 2 + rh, w * 2 + rw, c], axis=[rh, rw]), name="pool1")
    p = _numpy_check([x1, pool1], lambda a: np.max(np.stack(
        [a[:, i:i + 5:2, j:j + 5:2, :] for i in range(3) for j in range(3)]), axis=0))
    assert p.tiles[0].acc_level == "thread"  # a 3x3 window: one output per thread

    a = te.placeholder((37, 64), name="a")
    b = te.placeholder((64,), name="b")
    c = te.compute((37, 64), lambda i, j: te.max(a[i, j] + b[j], 0.0), name="c")
    _numpy_check([a, b, c], lambda a, b: np.maximum(a + b, 0.0))
    t = te.compute((64, 37), lambda i, j: a[j, i] * 2.0, name="t")
    _numpy_check([a, t], lambda a: a.T * 2.0)


@pytest.mark.parametrize("name,shape", [
    ("bert_layer", (1, 37, 768)), ("resnet_cnn", (1, 3, 23, 29)),  # odd sizes: every function
    pytest.param("bert_layer", None, marks=pytest.mark.slow),  # the models' own input sizes
    pytest.param("resnet_cnn", None, marks=pytest.mark.slow)])
def test_relax_model_functions(name, shape):
    """Every PrimFunc roller schedules in the BERT layer and the CNN, for sm_90, replicated."""
    import torch

    from tvm_roller.integrations.pytorch import import_torch
    from harness.examples import models
    from tvm_roller.relax import fusion_passes

    x = torch.randn(*(shape or models.INPUT_SHAPES[name]))
    mod = import_torch(getattr(models, name)(), x)
    with SM90:
        fused = fusion_passes(gemm_chains=False)(mod)  # what the CUDA pipeline runs
    n_checked = 0
    for gv, func in fused.functions_items():
        if not isinstance(func, tvm.tirx.PrimFunc):
            continue
        func = func.with_attr("global_symbol", "main")
        try:
            p = tvm_roller.plan(func, SM90)
        except tvm_roller.UnsupportedError:
            continue  # what roller declines: dlight's
        ins = []
        for i, param in enumerate(func.params[:-1]):
            dims = [int(s) for s in param.shape]
            dt = str(param.dtype)
            ins.append(rand(dims, "float32", i).astype(dt) if "float" in dt
                       else np.random.default_rng(i).integers(0, 2, dims).astype(dt))
        out_shape = [int(s) for s in func.params[-1].shape]
        out_dt = str(func.params[-1].dtype)
        ref = run(tvm.compile(tvm.IRModule({"main": func}), target="llvm"), ins, out_shape,
                  out_dt)
        lib = tvm.compile(cpu_replica(tvm_roller.planner.apply(p, p.tiles[0]).mod), target="llvm")
        assert_close(run(lib, ins, out_shape, out_dt), ref, 1e-4)
        n_checked += 1
    assert n_checked >= 12, (name, n_checked)  # batch norms fold into the convolutions


def test_fp16_gemm_odd_shape_on_cuda_cores():
    """An fp16 GEMM tensor cores cannot take (13x17x19): CUDA cores, fp32 accumulation."""
    from tvm_roller.tools.suite import gpu_workloads

    func = gpu_workloads.fp16_gemm(13, 17, 19)
    a = rand((13, 19), "float32", 1).astype("float16")
    b = rand((19, 17), "float32", 2).astype("float16")
    outs, p = _replica_output(func, [a, b])
    assert not p.tiles[0].tensor_core
    ref = a.astype(np.float64) @ b.astype(np.float64)
    assert_close(outs[0].astype(np.float64), ref, 2e-3)  # one fp16 rounding of the output
