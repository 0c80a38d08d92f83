"""Transposed convolutions built by roller as one sub-convolution per output parity class
(``analysis.parity``, planned part by part by ``api``): strides 2 and 3, kernels 1 to 5,
paddings 0 to 2, sizes 1, odd and prime, batch 2, 1-D and 2-D, NHWC (te_workload) and NCHW (topi,
Relax), float32 and float64, against float64 numpy references; the scheduled kernels keep no
parity guard in any reduction; explain, the schedule cache, dlight, the Relax pipeline and a
CUDA-target build take the parts too."""
from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch
import tvm
from torch import nn
from tvm import relax, te, topi
from tvm.s_tir.meta_schedule.testing import te_workload as W

import tvm_roller
import tvm_roller.dlight
import tvm_roller.relax as rr
from tvm_roller import planner
from tvm_roller.cache.schedules import ScheduleCache
from tvm_roller.hardware import normalize_target
from tvm_roller.planner import Context, plan_and_lower
from conftest import (parity_guards, F64_TOL, TARGET, assert_close, conv2d_transpose_nhwc, cuda_target, device,
                      rand, run)

F32_RTOL = 1e-5


def conv_transpose_ncx(x, w, stride, padding, output_padding=0):
    """Channels-first transposed convolution of any rank: x[N, CI, *S], w[CI, CO, *K]."""
    size, ks = x.shape[2:], w.shape[2:]
    full = np.zeros((x.shape[0], w.shape[1]) + tuple((s - 1) * stride + k + output_padding
                                                      for s, k in zip(size, ks)))
    for off in itertools.product(*[range(k) for k in ks]):
        sl = tuple(slice(o, o + stride * (s - 1) + 1, stride) for o, s in zip(off, size))
        full[(slice(None), slice(None)) + sl] += np.einsum("nc...,cd->nd...", x,
                                                           w[(slice(None), slice(None)) + off])
    out = [(s - 1) * stride - 2 * padding + k + output_padding for s, k in zip(size, ks)]
    return full[(slice(None), slice(None)) + tuple(slice(padding, padding + o) for o in out)]


def _check(func, arrays, expect, dtype="float32", target=TARGET):
    p = tvm_roller.plan(func, target, device=device())
    assert p.parts and p.decomposed.decomposition.kind == "parity"
    sch = planner.apply(p, p.tiles[0])
    assert not parity_guards(sch.mod["main"])
    lib = tvm_roller.build(func, target, device=device())
    shape = [int(s) for s in func.params[-1].shape]
    out = run(lib, arrays, shape, dtype)
    if dtype == "float64":
        assert_close(out, expect, F64_TOL)
    else:
        np.testing.assert_allclose(out, expect, rtol=F32_RTOL, atol=F32_RTOL * np.abs(expect).max())
    return p


# (n, h, w, ci, co, kernel, stride, padding)
NHWC_CASES = {
    "k4_s2_p1": (1, 8, 8, 16, 32, 4, 2, 1),
    "k3_s2_p1_odd": (1, 7, 9, 5, 7, 3, 2, 1),
    "k3_s3_p0_prime": (1, 7, 13, 8, 6, 3, 3, 0),
    "k5_s3_p2_batch2": (2, 5, 7, 6, 9, 5, 3, 2),
    "k4_s3_p2": (1, 6, 6, 8, 16, 4, 3, 2),
    "k5_s2_p2_size1": (1, 1, 1, 16, 16, 5, 2, 2),
    "k4_s2_p1_size1": (1, 1, 1, 8, 8, 4, 2, 1),
    "k2_s3_p0_no_taps_for_some": (1, 4, 5, 4, 4, 2, 3, 0),  # kernel < stride: zero classes
    "k1_s2_p0": (1, 5, 5, 8, 8, 1, 2, 0),
    "co3_small_channels": (1, 16, 16, 32, 3, 4, 2, 1),
}


@pytest.mark.parametrize("case", sorted(NHWC_CASES))
def test_te_nhwc(case):
    n, h, w_, ci, co, k, s, pad = args = NHWC_CASES[case]
    func = te.create_prim_func(list(W.conv2d_transpose_nhwc(*args)))
    x, w = rand((n, h, w_, ci), seed=1), rand((k, k, ci, co), seed=2)
    _check(func, [x, w], conv2d_transpose_nhwc(x.astype(np.float64), w.astype(np.float64), s,
                                               pad))


@pytest.mark.parametrize("co,vector", [(3, "v_w"), (32, "v_co")])
def test_few_output_channels_vectorize_the_width(co, vector):
    """Fewer output channels than vector lanes (16 here): the classes accumulate with the width
    innermost and read a copy of the padded input with the width innermost."""
    func = te.create_prim_func(list(W.conv2d_transpose_nhwc(1, 16, 16, 32, co, 4, 2, 1)))
    p = tvm_roller.plan(func, TARGET, device=device())
    classes = [part for part, label in zip(p.parts, p.decomposed.decomposition.labels)
               if label != "prologue"]
    assert classes and all(part.analysis.kind == "tiled" for part in classes)
    assert {part.analysis.axes[part.analysis.vector_axis].name for part in classes} == {vector}
    notes = " ".join(p.decomposed.decomposition.notes)
    assert ("w innermost" in notes) == (vector == "v_w")


@pytest.mark.parametrize("args", [(1, 5, 5, 8, 6, 3, 2, 1), (2, 7, 7, 4, 5, 4, 3, 1)])
def test_te_nhwc_float64(args):
    n, h, w_, ci, co, k, s, pad = args
    func = te.create_prim_func(list(W.conv2d_transpose_nhwc(*args, in_dtype="float64",
                                                            out_dtype="float64")))
    x, w = rand((n, h, w_, ci), "float64", 1), rand((k, k, ci, co), "float64", 2)
    _check(func, [x, w], conv2d_transpose_nhwc(x, w, s, pad), "float64")


@pytest.mark.parametrize("n,ci,h,co,k,s,p", [(1, 8, 6, 4, 4, 2, 1), (2, 5, 7, 3, 3, 3, 0)])
def test_topi_nchw(n, ci, h, co, k, s, p):
    X, Wt = te.placeholder((n, ci, h, h), name="X"), te.placeholder((ci, co, k, k), name="W")
    func = te.create_prim_func([X, Wt, topi.nn.conv2d_transpose_nchw(X, Wt, (s, s), (p, p),
                                                                    "float32", (0, 0))])
    x, w = rand((n, ci, h, h), seed=1), rand((ci, co, k, k), seed=2)
    _check(func, [x, w], conv_transpose_ncx(x.astype(np.float64), w.astype(np.float64), s, p))


@pytest.mark.parametrize("n,ci,length,co,k,s,p", [(1, 8, 13, 6, 4, 2, 1), (2, 3, 7, 5, 5, 3, 2)])
def test_conv1d_transpose_topi(n, ci, length, co, k, s, p):
    X, Wt = te.placeholder((n, ci, length), name="X"), te.placeholder((ci, co, k), name="W")
    func = te.create_prim_func([X, Wt, topi.nn.conv1d_transpose_ncw(X, Wt, s, p, "float32", 0)])
    x, w = rand((n, ci, length), seed=1), rand((ci, co, k), seed=2)
    _check(func, [x, w], conv_transpose_ncx(x.astype(np.float64), w.astype(np.float64), s, p))


def test_without_the_decomposition_the_guard_stays(monkeypatch):
    from tvm_roller.backends.registry import backend_for

    func = te.create_prim_func(list(W.conv2d_transpose_nhwc(1, 4, 4, 8, 8, 4, 2, 1)))
    monkeypatch.setattr(backend_for(normalize_target(TARGET)), "decomposes", False)
    p = tvm_roller.plan(func, TARGET, device=device())
    assert not p.parts and parity_guards(planner.apply(p, p.tiles[0]).mod["main"])


def test_explain_says_why_and_shows_each_part():
    func = te.create_prim_func(list(W.conv2d_transpose_nhwc(1, 8, 8, 16, 32, 4, 2, 1)))
    text = tvm_roller.explain(func, TARGET, device=device())
    assert "decomposed by output parity" in text
    assert "75% of its multiply-adds" in text
    for label in ("prologue", "h%2=0 w%2=0", "h%2=1 w%2=1"):
        assert f": {label}" in text
    assert text.count("main block:") == 6  # the whole function and its 5 parts


def test_schedule_cache_serves_every_part(tmp_path):
    func = te.create_prim_func(list(W.conv2d_transpose_nhwc(1, 6, 6, 8, 8, 4, 2, 1)))
    cache = ScheduleCache(tmp_path)
    first = plan_and_lower(func, Context.make(TARGET, device(), cache))
    assert not first.from_cache and cache.stats()["writes"] == len(first.plan.parts) == 5
    again = plan_and_lower(func, Context.make(TARGET, device(), cache))
    assert again.from_cache and all(p.from_cache for p in again.plan.parts)
    assert cache.stats()["hits"] == 5
    x, w = rand((1, 6, 6, 8), seed=1), rand((4, 4, 8, 8), seed=2)
    with planner.Context.make(again.plan.target).pass_context():
        lib = tvm.compile(again.schedule.mod, target=again.plan.target)
    assert_close(run(lib, [x, w], (1, 12, 12, 8), "float32"),
                 conv2d_transpose_nhwc(x.astype(np.float64), w.astype(np.float64), 2, 1), 1e-5)


def test_dlight_rule_and_metaschedule_traces():
    func = te.create_prim_func(list(W.conv2d_transpose_nhwc(1, 4, 4, 8, 8, 4, 2, 1)))
    sch = tvm_roller.dlight.Roller(device()).apply(func, tvm.target.Target(TARGET), False)
    assert sch is not None and not parity_guards(sch.mod["main"])
    p = tvm_roller.plan(func, TARGET, device=device())
    with pytest.raises(tvm_roller.UnsupportedError, match="parts"):
        planner.apply(p, p.tiles[0], traceable=True)  # a MetaSchedule record needs one trace


def test_relax_pipeline_conv_transpose_with_epilogue():
    """A PyTorch ConvTranspose2d + ReLU and a stride-3 one with output padding, imported and
    built by roller's Relax pipeline (conv + bias + relu fused by FuseTIR)."""
    from tvm.relax.frontend.torch import from_exported_program

    torch.manual_seed(0)
    model = nn.Sequential(nn.ConvTranspose2d(3, 5, 4, stride=2, padding=1), nn.ReLU(),
                          nn.ConvTranspose2d(5, 4, 3, stride=3, output_padding=1)).eval()
    x = torch.randn(2, 3, 7, 7)
    mod = from_exported_program(torch.export.export(model, (x,)),
                                unwrap_unit_return_tuple=True)
    report = []
    ex = rr.compile(mod, TARGET, report, device=device(), cache=False)
    vm = relax.VirtualMachine(ex, tvm.cpu())
    out = vm["main"](tvm.runtime.tensor(x.numpy())).numpy()
    with torch.no_grad():
        ref = model(x).double().numpy()
    assert np.abs(out - ref).max() <= 1e-4 * np.abs(ref).max()
    transposed = [e for e in report if "conv2d_transpose" in e["name"]]
    assert len(transposed) == 2 and all(e["status"] == "roller" for e in transposed), report


def test_cuda_target_builds_the_parts():
    """The CUDA backend takes the parts as well: one kernel per part, compiled by nvcc (the
    conftest checks every CUDA build) and numerically checked through its CPU replica."""
    from harness.cuda_check.replica import cpu_replica

    args = (1, 5, 7, 8, 6, 4, 2, 1)
    func = te.create_prim_func(list(W.conv2d_transpose_nhwc(*args)))
    tgt = cuda_target("sm_90")
    tvm_roller.build(func, tgt)
    p = tvm_roller.plan(func, tgt)
    assert p.parts
    sch = planner.apply(p, p.tiles[0])
    assert not parity_guards(sch.mod["main"])
    lib = tvm.compile(cpu_replica(sch.mod), target="llvm")
    x, w = rand((1, 5, 7, 8), seed=1), rand((4, 4, 8, 6), seed=2)
    out = run(lib, [x, w], (1, 10, 14, 6), "float32")
    assert_close(out, conv2d_transpose_nhwc(x.astype(np.float64), w.astype(np.float64), 2, 1),
                 1e-5)
