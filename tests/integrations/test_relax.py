"""The drop-in points: the dlight rule and the Relax pipeline (report, fallback, caches, fast math),
checked against PyTorch / numpy float64 on random inputs."""
from __future__ import annotations

import logging
import math
import os
import warnings

import numpy as np
import pytest
import torch
import tvm
from torch import nn
from tvm import relax, te
from tvm.s_tir import dlight as dl

import tvm_roller
import tvm_roller.dlight
import tvm_roller.analysis.visit
import tvm_roller.relax as rr
from conftest import TARGET, assert_close, device, rand, run


# -- dlight rule ----------------------------------------------------------------------------------
def _gemm(m, n, k, name):
    A = te.placeholder((m, k), name="A")
    B = te.placeholder((k, n), name="B")
    r = te.reduce_axis((0, k), "r")
    C = te.compute((m, n), lambda i, j: te.sum(A[i, r] * B[r, j], axis=r), name="C")
    return te.create_prim_func([A, B, C]).with_attr("global_symbol", name)


def _gather(name):
    """A reduction over gathered values: roller declines it (a plain gather it schedules)."""
    A = te.placeholder((16,), name="A")
    idx = te.placeholder((8,), "int32", name="idx")
    k = te.reduce_axis((0, 8), "k")
    G = te.compute((1,), lambda i: te.sum(A[idx[k]], axis=k), name="G")
    return te.create_prim_func([A, idx, G]).with_attr("global_symbol", name)


def test_dlight_rule_schedules_and_declines():
    mod = tvm.IRModule({"gemm": _gemm(37, 53, 29, "gemm"), "gather": _gather("gather")})
    rule = tvm_roller.dlight.Roller(device=device())
    tgt = tvm.target.Target(TARGET)
    with tgt:
        out = dl.ApplyDefaultSchedule(rule, dl.gpu.Fallback())(mod)
    assert out["gemm"].attrs["tirx.is_scheduled"]
    assert not (out["gather"].attrs.get("tirx.is_scheduled") or False)  # left for the next rule
    assert "gather" in rule.declined["gather"]
    lib = tvm.compile(out, tgt)
    a, b = rand((37, 29), seed=1), rand((29, 53), seed=2)
    dev = tvm.cpu()
    c = tvm.runtime.empty((37, 53), "float32", dev)
    lib["gemm"](tvm.runtime.tensor(a), tvm.runtime.tensor(b), c)
    assert_close(c.numpy(), a.astype(np.float64) @ b, 2e-5)


def test_dlight_rule_returns_none_for_unsupported_gpus_and_symbolic_shapes():
    rule = tvm_roller.dlight.Roller()
    n = te.var("n")
    A = te.placeholder((n, 8), name="A")
    B = te.compute((n, 8), lambda i, j: A[i, j] * 2.0, name="B")
    sym = te.create_prim_func([A, B])
    assert rule.apply(sym, tvm.target.Target(TARGET), False) is None
    assert "symbolic" in rule.declined["main"]
    cuda = tvm.target.Target({"kind": "cuda", "arch": "sm_80"})
    assert rule.apply(_gemm(64, 64, 64, "g"), cuda, False) is not None  # the CUDA backend
    sm86 = tvm.target.Target({"kind": "cuda", "arch": "sm_86"})  # no preset: declined, reported
    assert rule.apply(_gemm(64, 64, 64, "g"), sm86, False) is None
    assert "compute capability 8.6" in rule.declined["g"]


# -- Relax pipeline -------------------------------------------------------------------------------
def _import(model, x, keep_params=False):
    from tvm.relax.frontend.torch import from_exported_program

    ep = torch.export.export(model.eval(), (x,))
    return from_exported_program(ep, keep_params_as_input=keep_params, unwrap_unit_return_tuple=True)


def _run_vm(ex, *args):
    vm = relax.VirtualMachine(ex, tvm.cpu())
    out = vm["main"](*[tvm.runtime.tensor(a) for a in args])
    return out.numpy()


class _ConvNet(nn.Module):
    """NCHW convs (odd channels, stride 2), max and average pooling, batch > 1."""

    def __init__(self):
        super().__init__()
        self.c1 = nn.Conv2d(3, 7, 3, padding=1)
        self.c2 = nn.Conv2d(7, 11, 3, stride=2, padding=1)
        self.fc = nn.Linear(11, 5)

    def forward(self, x):
        y = torch.relu(self.c1(x))
        y = nn.functional.max_pool2d(y, 2)
        y = torch.relu(self.c2(y))
        y = nn.functional.adaptive_avg_pool2d(y, 1).flatten(1)
        return self.fc(y)


@pytest.mark.parametrize("params_as_inputs", [False, True])
def test_pipeline_mlp_odd_sizes(params_as_inputs):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(37, 53), nn.GELU(), nn.Linear(53, 7))
    x = torch.randn(3, 37)
    mod = _import(model, x, params_as_inputs)
    params = []
    if params_as_inputs:
        from tvm.relax.frontend import detach_params

        mod, p = detach_params(mod)
        params = [t.numpy() for t in p["main"]]
    report = []
    pipeline = rr.get_pipeline(TARGET, report, device(), cache=False)
    ex = tvm.compile(mod, target=tvm.target.Target(TARGET), relax_pipeline=pipeline)
    out = _run_vm(ex, x.numpy(), *params)
    with torch.no_grad():
        ref = model(x).double().numpy()
    assert np.abs(out - ref).max() <= 1e-4
    assert report and all(e["status"] == "roller" for e in report), report
    tiled = [e for e in report if e["kind"] == "tiled"]
    assert tiled and all(e["rtile"]["reg"] and e["predicted_s"] > 0 for e in tiled)


@pytest.mark.parametrize("batch", [1, 5])
def test_constant_weights_are_packed_while_compiling(batch):
    """A weight whose last extent fills whole register panels is packed at compile time: the
    kernel reads the folded, packed constant (``_prepacked``), with no packing left to run;
    weights passed as inputs are not."""
    torch.manual_seed(1)  # (one linear: two would be a matmul chain, packed per task)
    model = nn.Sequential(nn.Linear(37, 96), nn.GELU())
    x = torch.randn(batch, 37)
    with torch.no_grad():
        ref = model(x).double().numpy()
    for as_inputs in (False, True):
        mod = _import(model, x, as_inputs)
        params = []
        if as_inputs:
            from tvm.relax.frontend import detach_params

            mod, p = detach_params(mod)
            params = [t.numpy() for t in p["main"]]
        report = []
        ex = rr.compile(mod, TARGET, report, device(), cache=False)
        assert np.abs(_run_vm(ex, x.numpy(), *params) - ref).max() <= 1e-4
        packed = [e for e in report if e.get("prepacked")]
        assert bool(packed) != as_inputs, report
        assert all(e["name"].endswith("_prepacked") for e in packed)
        if not as_inputs:  # what runs: the packed kernels, no packing
            from tvm_roller.tools.kernel_timing import kernel_calls

            ran = kernel_calls(relax.VirtualMachine(ex, tvm.cpu()),
                               tvm.runtime.tensor(x.numpy()), 1)
            assert {e["name"] for e in packed} <= set(ran)
            assert not any("weight_prepack" in k for k in ran), ran


class _CumsumLinear(nn.Module):
    """A linear beside a cumulative sum (a hand-written loop nest TVM's split rejects)."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(29, 64)

    def forward(self, x):
        return self.fc(x) + torch.cumsum(x, dim=-1).sum(-1, keepdim=True)


@pytest.mark.parametrize("split_fails", [False, True])
def test_packing_beside_other_kernels_and_when_its_split_fails(split_fails, monkeypatch):
    if split_fails:  # the packing stays in the kernel, reported; the model still matches
        def broken():
            @tvm.transform.module_pass(opt_level=0, name="Broken")
            def _raise(mod, _ctx):
                raise tvm.error.InternalError("split refused")
            return _raise
        monkeypatch.setattr(relax.transform, "SplitLayoutRewritePreproc", broken)
    torch.manual_seed(3)
    model, x = _CumsumLinear(), torch.randn(7, 29)
    report = []
    ex = rr.compile(_import(model, x), TARGET, report, device(), cache=False)
    with torch.no_grad():
        ref = model(x).double().numpy()
    assert np.abs(_run_vm(ex, x.numpy()) - ref).max() <= 1e-4 * np.abs(ref).max()
    gemm = [e for e in report if e["kind"] == "tiled"]
    assert gemm and all(e["prepacked"] != split_fails for e in gemm), report
    if split_fails:
        assert all("packing left in the kernel" in e["reason"] for e in gemm)


def test_pipeline_convnet_batch_pooling():
    torch.manual_seed(1)
    model = _ConvNet()
    x = torch.randn(2, 3, 17, 17)
    report = []
    ex = rr.compile(_import(model, x), TARGET, report, device=device(), cache=False)
    out = _run_vm(ex, x.numpy())
    with torch.no_grad():
        ref = model(x).double().numpy()
    assert np.abs(out - ref).max() <= 1e-4
    by_name = {e["name"]: e for e in report}
    assert all(e["status"] == "roller" for e in report), [e for e in report if e["status"] != "roller"]
    assert any("conv2d" in n for n in by_name) and any("pool" in n for n in by_name)


def test_pipeline_symbolic_shape_is_bucketed():
    """A model exported with a dynamic batch: every PrimFunc roller takes gets one kernel per
    bucket of the batch (its report entry lists them), none is left to TVM's default, and
    the one build matches PyTorch at any batch."""
    torch.manual_seed(2)
    model = nn.Sequential(nn.Linear(16, 8), nn.ReLU())
    x = torch.randn(4, 16)
    from tvm.relax.frontend.torch import from_exported_program

    batch = torch.export.Dim("batch", min=1, max=64)
    ep = torch.export.export(model.eval(), (x,), dynamic_shapes={"input": {0: batch}})
    mod = from_exported_program(ep, keep_params_as_input=False, unwrap_unit_return_tuple=True)
    report = []
    ex = tvm.compile(mod, target=tvm.target.Target(TARGET),
                     relax_pipeline=rr.get_pipeline(TARGET, report, device(), cache=False))
    assert report and not [e for e in report if e["status"] == "fallback"]
    assert all(e["buckets"] for e in report)
    assert all(">=" in e["buckets"][-1]["values"] or len(e["buckets"]) == 1 for e in report)
    for n in (1, 5, 64, 100):
        xn = torch.randn(n, 16)
        with torch.no_grad():
            ref = model(xn).double().numpy()
        assert np.abs(_run_vm(ex, xn.numpy()) - ref).max() <= 1e-5


# -- caches ---------------------------------------------------------------------------------------
def test_module_cache_hit_then_corruption(tmp_path, monkeypatch):
    monkeypatch.setenv("TVM_ROLLER_CACHE", str(tmp_path))
    torch.manual_seed(3)
    model = nn.Sequential(nn.Linear(24, 40), nn.ReLU(), nn.Linear(40, 9))
    x = torch.randn(5, 24)
    mod = _import(model, x)
    with torch.no_grad():
        ref = model(x).double().numpy()
    r1, r2 = [], []
    ex1 = rr.compile(mod, TARGET, r1, device=device())
    ex2 = rr.compile(mod, TARGET, r2, device=device())
    assert not any(e["cached"] for e in r1) and all(e["cached"] for e in r2)
    for ex in (ex1, ex2):
        assert np.abs(_run_vm(ex, x.numpy()) - ref).max() <= 1e-5

    libs = list((tmp_path / "modules").glob("*.so"))
    assert len(libs) == 1
    # a truncated library. Written as a new file renamed over the old one: this process has the
    # old one mapped (ex2), and truncating a mapped file in place would crash it with SIGBUS
    bad = libs[0].with_name("truncated.tmp-lib")
    bad.write_bytes(libs[0].read_bytes()[:1000])
    os.replace(bad, libs[0])
    from tvm_roller.cache.schedules import CacheWarning

    with pytest.warns(CacheWarning, match="checksum"):
        ex3 = rr.compile(mod, TARGET, [], device=device())
    assert np.abs(_run_vm(ex3, x.numpy()) - ref).max() <= 1e-5
    meta = list((tmp_path / "modules").glob("*.json"))[0]
    meta.write_text("{not json")
    with pytest.warns(CacheWarning):
        ex4 = rr.compile(mod, TARGET, [], device=device())
    assert np.abs(_run_vm(ex4, x.numpy()) - ref).max() <= 1e-5


def _compile_in_child(cache_dir, seed):
    import os

    os.environ["TVM_ROLLER_CACHE"] = cache_dir
    import numpy as np
    import torch
    from torch import nn

    import tvm_roller.relax as rr
    from tvm_roller import hardware

    torch.manual_seed(3)
    model = nn.Sequential(nn.Linear(24, 40), nn.ReLU(), nn.Linear(40, 9))
    x = torch.randn(5, 24)
    ex = rr.compile(_import(model, x), TARGET, [], device=hardware.preset("x86-avx512"))
    with torch.no_grad():
        ref = model(x).double().numpy()
    return float(np.abs(_run_vm(ex, x.numpy()) - ref).max())


def test_two_concurrent_compiles_share_the_caches(tmp_path):
    import multiprocessing as mp

    ctx = mp.get_context("spawn")
    with ctx.Pool(2) as pool:
        errs = pool.starmap(_compile_in_child, [(str(tmp_path), 0), (str(tmp_path), 1)])
    assert max(errs) <= 1e-5
    assert not list(tmp_path.rglob("*.tmp")) and not list(tmp_path.rglob(".*.so"))
    # a third compile is served from the cache both wrote
    assert _compile_in_child(str(tmp_path), 2) <= 1e-5


# -- fast math ------------------------------------------------------------------------------------
def test_rational_erf_accuracy():
    from tvm_roller.integrations.relax.passes.fast_math import erf_expr

    X = te.placeholder((4001,), "float32", name="X")
    Y = te.compute((4001,), lambda i: erf_expr(X[i]), name="Y")
    lib = tvm_roller.build(te.create_prim_func([X, Y]), TARGET, device=device())
    x = np.linspace(-6, 6, 4001).astype("float32")
    got = run(lib, [x], (4001,), "float32")
    ref = np.array([math.erf(float(v)) for v in x])
    assert np.abs(got - ref).max() < 1e-6


class _NegativeIndices(nn.Module):
    """Negative constant indices, which TVM's importer turns into out-of-bounds takes."""

    def forward(self, x):
        return x[:, -1] * 2.0 + x[:, :, -2].sum(1, keepdim=True) + torch.select(x, 1, -3) + \
            x[:, -4:, 1].sum(1, keepdim=True)


@pytest.mark.parametrize("dynamic", [False, True])
def test_negative_indices_read_from_the_end(dynamic):
    from tvm_roller.integrations.pytorch import import_torch

    model = _NegativeIndices().eval()
    x = torch.from_numpy(rand((3, 7, 5), seed=11))
    dims = {1: torch.export.Dim("seq", min=5, max=64)} if dynamic else None
    mod = import_torch(model, x, dims)
    ex = rr.compile(mod, TARGET, cache=False)
    vm = relax.VirtualMachine(ex, tvm.cpu())
    for n in ((7, 13) if dynamic else (7,)):
        xn = torch.from_numpy(rand((3, n, 5), seed=n))
        out = vm["main"](tvm.runtime.tensor(xn.numpy())).numpy()
        with torch.no_grad():
            ref = model(xn.double()).numpy()
        assert_close(out, ref, 1e-5)


class _ComposedGelus(nn.Module):
    """GELUs composed: inlining each into the next multiplies the expression (erf's
    polynomial uses its argument about ten times); this once took minutes to compile."""

    def forward(self, x):
        f = torch.nn.functional
        return f.gelu(f.gelu(f.gelu(x, approximate="tanh")), approximate="tanh") + 0.5


def test_composed_elementwise_functions_compile_in_bounded_time():
    import time

    from tvm_roller.integrations.pytorch import import_torch

    model = _ComposedGelus().eval()
    x = torch.from_numpy(rand((32, 8, 34), seed=5))
    t0 = time.perf_counter()
    ex = rr.compile(import_torch(model, x), TARGET, cache=False)
    assert time.perf_counter() - t0 < 60
    out = relax.VirtualMachine(ex, tvm.cpu())["main"](tvm.runtime.tensor(x.numpy())).numpy()
    with torch.no_grad():
        ref = model(x.double()).numpy()
    assert_close(out, ref, 1e-5)


def test_a_kernel_too_big_to_compile_is_declined():
    """An expression whose tree is far larger than its graph (each step uses the last twice)
    is declined before it is compiled, with the reason."""
    from tvm_roller.planner import Context, schedule_function

    X = te.placeholder((64,), "float32", name="X")

    def grow(v):  # 3^11 nodes as a tree
        for _ in range(11):
            v = v * v + v
        return v

    func = te.create_prim_func([X, te.compute((64,), lambda i: grow(X[i]), name="Y")])
    res = schedule_function(func, Context.make(TARGET, device()), check=False)
    assert res.kernel is None and res.entry.fallback == "decline"
    assert "nodes" in res.entry.reason


def test_wrong_kernel_is_caught_by_the_guard_and_falls_back(monkeypatch):
    """With ``verify=True`` a kernel whose build computes something else (here: writes
    nothing) is an error entry, and the function gets TVM's default build: the model stays
    right."""
    from tvm_roller.integrations.pytorch import import_torch
    from tvm_roller.planner import scheduling

    real = scheduling._build
    builds = []

    def broken(kernel, ctx):  # the first kernel with a reduction writes nothing
        builds.append(kernel)
        if len(builds) == 1 and any(True for _ in _reductions_of(kernel)):
            kernel = kernel.with_body(tvm.tirx.Evaluate(tvm.tirx.const(0, "int32")))
        return real(kernel, ctx)

    monkeypatch.setattr(scheduling, "_build", broken)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(24, 40), nn.ReLU(), nn.Linear(40, 8)).eval()
    x = torch.from_numpy(rand((5, 24), seed=3))
    report: list = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ex = rr.compile(import_torch(model, x), TARGET, report, device(), cache=False,
                        verify=True)
    wrong = [e for e in report if e["fallback"] == "error"]
    assert wrong and all("WrongResultError" in e["reason"] for e in wrong)
    assert any(e["verified"].startswith("matches") for e in report)
    out = relax.VirtualMachine(ex, tvm.cpu())["main"](tvm.runtime.tensor(x.numpy())).numpy()
    with torch.no_grad():
        ref = model.double()(x.double()).numpy()
    assert_close(out, ref, 1e-5)


def _reductions_of(func):
    found = []
    tvm_roller.analysis.visit.post_order_visit(
        func.body, lambda n: found.append(n) if isinstance(n, tvm.s_tir.SBlock) and any(
            int(iv.iter_type) == 2 for iv in n.iter_vars) else None)
    return found


def test_top_k_measured_keeps_the_fastest_and_caches_it(tmp_path, monkeypatch):
    """``measure_topk``: each matmul's best predicted candidates are timed here, the fastest
    kept (its report says how it was chosen) and stored, so a second compile reads it back."""
    from tvm_roller.integrations.pytorch import import_torch

    monkeypatch.setenv("TVM_ROLLER_CACHE", str(tmp_path))
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(96, 160), nn.ReLU(), nn.Linear(160, 48)).eval()
    x = torch.from_numpy(rand((37, 96), seed=4))
    mod = import_torch(model, x)
    first: list = []
    ex = rr.compile(mod, TARGET, first, device(), measure_topk=3, fuse_chains=False)
    measured = [e for e in first if e["measured"]]
    assert measured and all(e["measured"].startswith("measured 3 candidates")
                            for e in measured if e["kind"] == "tiled")
    out = relax.VirtualMachine(ex, tvm.cpu())["main"](tvm.runtime.tensor(x.numpy())).numpy()
    with torch.no_grad():
        ref = model.double()(x.double()).numpy()
    assert_close(out, ref, 1e-5)
    # the pipeline alone (relax.compile would load the whole module from its cache)
    from tvm_roller.cache import ScheduleCache
    from tvm_roller.integrations.relax import get_pipeline

    again: list = []
    with tvm.transform.PassContext(opt_level=3):
        tvm.compile(mod, target=tvm_roller.hardware.normalize_target(TARGET),
                    relax_pipeline=get_pipeline(TARGET, again, device(), cache=ScheduleCache(),
                                                measure_topk=3, fuse_chains=False))
    assert [e["measured"] for e in again if e["measured"]] and \
        all(e["measured"] == "measured before" for e in again if e["measured"])


def test_kernel_tvm_cannot_compile_falls_back_alone(monkeypatch, caplog):
    """``compile`` builds the model once without building each kernel alone; when that build
    fails, it builds again with each kernel checked: the one TVM cannot compile is an error
    entry with TVM's default build, and the model is right."""
    from tvm_roller.integrations.pytorch import import_torch
    from tvm_roller.planner import scheduling

    real = scheduling._kernel
    broken_names = []

    def broken(name, func, ctx, options):  # the first matmul calls a GPU intrinsic
        kernel, entry = real(name, func, ctx, options)
        if not broken_names and _reductions_of(kernel):
            broken_names.append(name)
        if name in broken_names:  # in both builds
            # the CPU code generator has no warp intrinsics
            call = tvm.tirx.call_intrin("uint32", "tirx.tvm_warp_activemask")
            kernel = kernel.with_body(tvm.tirx.SeqStmt([tvm.tirx.Evaluate(call),
                                                        kernel.body]))
        return kernel, entry

    monkeypatch.setattr(scheduling, "_kernel", broken)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(24, 40), nn.ReLU(), nn.Linear(40, 7)).eval()
    x = torch.from_numpy(rand((5, 24), seed=3))
    report: list = []
    with caplog.at_level(logging.WARNING), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ex = rr.compile(import_torch(model, x), TARGET, report, device(), cache=False)
    assert any("building again with each kernel checked alone" in r.message
               for r in caplog.records)
    errors = [e for e in report if e["fallback"] == "error"]
    assert [e["name"] for e in errors] == broken_names
    assert sum(e["status"] == "roller" for e in report) >= 1
    out = relax.VirtualMachine(ex, tvm.cpu())["main"](tvm.runtime.tensor(x.numpy())).numpy()
    with torch.no_grad():
        ref = model.double()(x.double()).numpy()
    assert_close(out, ref, 1e-5)
