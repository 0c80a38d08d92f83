"""harness.cuda_check.gpu_check and its parts (gpu_*; behind python/gpu_check.py)
without a GPU: the CuPy launcher against a fake CuPy (kernel names, grids, blocks, dynamic
shared memory, argument order, loading fallbacks), the PyTorch ops against the suite's float64
references on the CPU (and the GEMM chains' against numpy's), the results tables, and the
``build`` half on a few workloads and two small GEMM chains, one fused and one not (size,
contents, and that the ``run`` half reads it without TVM, also through the python/gpu_check.py
command line)."""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from harness.cuda_check import (gpu_bundles, gpu_check, gpu_launch, gpu_manifest,
                                gpu_measure, gpu_reference, gpu_report, gpu_timing)

from conftest import REPO_ROOT as ROOT  # noqa: E402
SCRIPT = ROOT / "python" / "gpu_check.py"  # the command line (run as a program only)
HAVE_NVCC = bool(os.environ.get("TVM_ROLLER_NVCC") or shutil.which("nvcc")
                 or os.path.isfile("/usr/local/cuda/bin/nvcc"))


@pytest.fixture(autouse=True)
def _fresh_loader_state():
    gpu_launch._LOAD_PREF.clear()  # which loading route worked is remembered per process
    yield
    gpu_launch._LOAD_PREF.clear()


# -- a fake CuPy ------------------------------------------------------------------------------
FAKE_CUPY = r'''
import re
import numpy as np


class FakeFunction:
    def __init__(self, module, name):
        self.module, self.name = module, name

    def __call__(self, grid, block, args, shared_mem=0, stream=None):
        self.module.cp.calls.append({"name": self.name, "grid": grid, "block": block,
                                     "args": args, "shared_mem": shared_mem,
                                     "opt_in": getattr(self, "max_dynamic_shared_size_bytes", None)})


class FakeModule:
    def __init__(self, cp, code=None, options=(), path=None):
        self.cp, self.code, self.options, self.path = cp, code, tuple(options), path
        cp.modules.append(self)

    def get_function(self, name):
        # real CuPy compiles here and fails for a bad source or a missing kernel
        if self.code is not None:
            if self.cp.reject(self.options):
                raise RuntimeError("NVRTC_ERROR_INVALID_OPTION (5)")
            pattern = r"__global__\s+void\s+(__launch_bounds__\(\d+\)\s+)?" + re.escape(name) + r"\("
            if not re.search(pattern, self.code):
                raise RuntimeError(f"CUDA_ERROR_NOT_FOUND: {name}")
        elif self.cp.reject_cubin:
            raise RuntimeError("CUDA_ERROR_INVALID_IMAGE")
        fn = FakeFunction(self, name)
        self.cp.functions.append(fn)
        return fn


class FakeCupy:
    uint8, float32 = np.uint8, np.float32
    __version__ = "fake"

    def __init__(self, reject=lambda options: False, reject_cubin=False):
        self.reject, self.reject_cubin = reject, reject_cubin
        self.modules, self.functions, self.calls = [], [], []

    def RawModule(self, code=None, *, options=(), path=None):
        return FakeModule(self, code, options, path)

    def empty(self, shape, dtype):
        return np.empty(shape, dtype)

    def asarray(self, x):
        return x
'''
_ns: dict = {}
exec(FAKE_CUPY, _ns)  # noqa: S102  (also shipped verbatim into the no-TVM subprocess below)
FakeCupy = _ns["FakeCupy"]


class Buf:
    """Stands for a device array; identity is what the argument checks compare."""

    def __init__(self, name):
        self.name = name

    def __repr__(self):
        return f"Buf({self.name})"


# -- bundles made by cuda_build ---------------------------------------------------------------
@pytest.fixture(scope="module")
def softmax_bundle():
    """SFM:0 with each block its own kernel: 4 launches, two workspaces (see test_cuda_build)."""
    tvm = pytest.importorskip("tvm")
    from harness.cuda_check import build as cb
    from tvm_roller.tools.suite import workloads

    sch = tvm.s_tir.Schedule(tvm.IRModule({"main": workloads.create("SFM", 0)}))
    for b in sch.get_child_blocks(sch.get_sblock("root")):
        bx, tx = sch.split(sch.get_loops(b)[0], [None, 64])
        sch.bind(bx, "blockIdx.x")
        sch.bind(tx, "threadIdx.x")
    target = tvm.target.Target({"tag": "nvidia/nvidia-h100", "arch": "sm_90"})
    return json.loads(cb.kernel_launches(sch.mod, target).to_json())


def test_launcher_multi_kernel(softmax_bundle):
    cp = FakeCupy()
    launcher = gpu_launch.Launcher(softmax_bundle, cp)
    (mod,) = cp.modules
    assert mod.code == softmax_bundle["source"] and mod.options[0] == "-arch=sm_90"
    assert launcher.how == "nvrtc -arch=sm_90"
    names = [l["name"] for l in softmax_bundle["launches"]]
    assert list(launcher.functions) == names
    # workspaces are raw bytes of the recorded sizes
    assert [w.nbytes for w in launcher.workspaces] == [256 * 4, 65536 * 4]
    A, out = Buf("A"), Buf("out")
    launcher([A, out])
    assert [c["name"] for c in cp.calls] == names
    assert all(c["grid"] == (4, 1, 1) and c["block"] == (64, 1, 1) and c["shared_mem"] == 0
               for c in cp.calls)
    ws0, ws1 = launcher.workspaces
    expect = [(A, ws0), (A, ws1, ws0), (ws1, ws0), (ws1, ws0, out)]
    for call, args in zip(cp.calls, expect):
        assert len(call["args"]) == len(args) and all(a is b for a, b in zip(call["args"], args))
    assert all(c["opt_in"] is None for c in cp.calls)  # nothing above 48 KB
    with pytest.raises(ValueError, match="1 arguments for 2"):
        launcher.prepare([A])


def _hand_bundle(dyn: int) -> dict:
    src = ('extern "C" __global__ void __launch_bounds__(128) k_big(float* X_ptr, int n) {}\n'
           'extern "C" __global__ void k_small(float* X_ptr, float* Y_ptr) {}\n')
    return {
        "format": 1, "arch": "sm_90", "source": src,
        "params": [{"name": "X", "shape": [8], "dtype": "float32", "kind": "buffer"},
                   {"name": "n", "shape": [], "dtype": "int32", "kind": "scalar"}],
        "workspaces": [{"name": "Y", "dtype": "float16", "count": 3}],
        "launches": [
            {"name": "k_big", "grid": [2, 3, 1], "block": [128, 1, 1], "dyn_smem_bytes": dyn,
             "args": [{"kind": "param", "index": 0, "dtype": "float32", "value": None, "name": "X"},
                      {"kind": "param", "index": 1, "dtype": "int32", "value": None, "name": "n"}]},
            {"name": "k_small", "grid": [1, 1, 1], "block": [32, 2, 1], "dyn_smem_bytes": 1024,
             "args": [{"kind": "param", "index": 0, "dtype": "float32", "value": None, "name": "X"},
                      {"kind": "workspace", "index": 0, "dtype": "float16", "value": None,
                       "name": "Y"}]},
            {"name": "k_big", "grid": [1, 1, 1], "block": [128, 1, 1], "dyn_smem_bytes": 0,
             "args": [{"kind": "param", "index": 0, "dtype": "float32", "value": None, "name": "X"},
                      {"kind": "scalar", "index": -1, "dtype": "int32", "value": 7, "name": "n"}]},
        ],
    }


def test_launcher_dynamic_smem_opt_in_and_scalars():
    cp = FakeCupy()
    launcher = gpu_launch.Launcher(_hand_bundle(73728), cp)
    assert launcher.functions["k_big"].max_dynamic_shared_size_bytes == 73728  # > 48 KB: opt in
    assert not hasattr(launcher.functions["k_small"], "max_dynamic_shared_size_bytes")
    assert launcher.workspaces[0].nbytes == 6  # 3 float16
    X = Buf("X")
    launcher([X, 5])
    big, small, again = cp.calls
    assert (big["grid"], big["block"], big["shared_mem"]) == ((2, 3, 1), (128, 1, 1), 73728)
    assert big["args"][0] is X and big["args"][1] == 5 and big["args"][1].dtype == np.int32
    assert (small["block"], small["shared_mem"]) == ((32, 2, 1), 1024)
    assert small["args"][1] is launcher.workspaces[0]
    assert again["args"][1] == 7 and again["args"][1].dtype == np.int32
    cp = FakeCupy()
    gpu_launch.Launcher(_hand_bundle(8192), cp)
    assert not hasattr(cp.functions[0], "max_dynamic_shared_size_bytes")


def test_loader_fallbacks(tmp_path):
    bundle = _hand_bundle(0)
    # an NVRTC that rejects a second -arch: CuPy's own arch option only
    cp = FakeCupy(reject=lambda opts: any(o.startswith("-arch") for o in opts))
    launcher = gpu_launch.Launcher(bundle, cp)
    assert launcher.how == "nvrtc" and not any(o.startswith("-arch") for o in cp.modules[-1].options)
    # remembered: the next module tries that route first
    cp2 = FakeCupy(reject=lambda opts: any(o.startswith("-arch") for o in opts))
    gpu_launch.Launcher(bundle, cp2)
    assert len(cp2.modules) == 1
    # no usable NVRTC at all: the cubin nvcc built
    gpu_launch._LOAD_PREF.clear()
    cubin = tmp_path / "k.cubin"
    cubin.write_bytes(b"\x7fELF")
    cp3 = FakeCupy(reject=lambda opts: True)
    launcher = gpu_launch.Launcher(bundle, cp3, cubin_path=str(cubin))
    assert launcher.how == "cubin" and cp3.modules[-1].path == str(cubin)
    gpu_launch._LOAD_PREF.clear()
    with pytest.raises(RuntimeError, match="NVRTC_ERROR_INVALID_OPTION.*CUDA_ERROR_INVALID_IMAGE"):
        gpu_launch.Launcher(bundle, FakeCupy(reject=lambda o: True, reject_cubin=True),
                            cubin_path=str(cubin))
    # a kernel missing from the source is a load error, not a silent skip
    gpu_launch._LOAD_PREF.clear()
    bad = dict(bundle, launches=[dict(bundle["launches"][0], name="nope")])
    with pytest.raises(RuntimeError, match="nope"):
        gpu_launch.Launcher(bad, FakeCupy())


def test_nvrtc_options_define_infinity_only_when_used():
    cp = FakeCupy()
    src = 'extern "C" __global__ void k(float* x) { x[0] = INFINITY; }'
    gpu_launch.load_module(cp, src, "sm_90", "k")
    assert "-DINFINITY=__int_as_float(0x7f800000)" in cp.modules[-1].options
    gpu_launch.load_module(cp, src.replace("INFINITY", "1.0f"), "sm_90", "k")
    assert not any("INFINITY" in o for o in cp.modules[-1].options)


# -- PyTorch ops vs the suite's references --------------------------------------------------------
# one small shape per class (float64 on 2 CPU cores)
SMALL = ["C1D:0", "C2D:1", "GMM:0", "GRP:0", "DIL:1", "DEP:2", "T2D:3", "CAP:2", "NRM:0", "SFM:0",
         "CBR:2", "TBG:2"]


@pytest.mark.parametrize("name", SMALL + [pytest.param("C3D:1", marks=pytest.mark.slow)])
def test_torch_ops_match_references(name):
    torch = pytest.importorskip("torch")
    from tvm_roller.tools.suite import references, workloads

    cls, idx = name.split(":")
    idx = int(idx)
    func = workloads.create(cls, idx)
    inputs = workloads.random_inputs(func)
    ref = references.reference(cls, idx, inputs)
    fn, back = gpu_reference.torch_op(cls, references.named_params(cls, idx),
                          [torch.from_numpy(x).to(torch.float64) for x in inputs])
    out = back(fn())
    assert tuple(out.shape) == workloads.output_spec(func)[0]
    assert gpu_reference.rel_error(out, torch.from_numpy(np.asarray(ref))) < 1e-12


@pytest.mark.parametrize("batch", [None, [2], [2, 3]])
@pytest.mark.parametrize("middle", ["none", "relu", "gelu", "softmax"])
def test_torch_op_chain_matches_numpy(batch, middle):
    """The CHAIN reference (float64) against conftest's numpy one; the float32 peer (PyTorch's
    own tanh GELU) within the chains' tolerance."""
    torch = pytest.importorskip("torch")
    from conftest import chain_inputs, chain_reference

    m, k, l, n = 7, 5, 9, 4  # noqa: E741
    a, b, d = chain_inputs(batch, m, k, l, n)
    ref = torch.from_numpy(chain_reference(a, b, d, middle))
    params = {"batch": batch, "m": m, "k": k, "l": l, "n": n, "middle": middle}
    fn, back = gpu_reference.torch_op("CHAIN", params,
                                      [torch.from_numpy(x).double() for x in (a, b, d)])
    out = back(fn())
    assert tuple(out.shape) == tuple(batch or ()) + (m, n) and out.dtype == torch.float64
    assert gpu_reference.rel_error(out, ref) < 1e-12
    fn32, back32 = gpu_reference.torch_op("CHAIN", params, [torch.from_numpy(x) for x in (a, b, d)])
    out32 = back32(fn32())
    assert (out32.dtype == torch.float32
            and gpu_reference.rel_error(out32, ref) < gpu_bundles.CHAIN_TOL)
    with pytest.raises(ValueError, match="middle"):
        gpu_reference.torch_op("CHAIN", dict(params, middle="tanh"),
                               [torch.from_numpy(x) for x in (a, b, d)])


def test_torch_op_hgemm():
    torch = pytest.importorskip("torch")
    gen = torch.Generator().manual_seed(0)
    a = gpu_reference.random_tensor((64, 32), "float16", gen, device="cpu")
    b = gpu_reference.random_tensor((32, 48), "float16", gen, device="cpu")
    fn, back = gpu_reference.torch_op("HGEMM", {"m": 64, "n": 48, "k": 32},
                                      [a.double(), b.double()])
    ref = torch.from_numpy(a.double().numpy() @ b.double().numpy())
    assert gpu_reference.rel_error(back(fn()), ref) < 1e-12
    assert gpu_reference.rel_error((a.double() @ b.double()).half(), ref) < gpu_bundles.FP16_TOL


def test_rel_error_and_random_tensor():
    torch = pytest.importorskip("torch")
    ref = torch.tensor([[1.0, -2.0], [0.5, 4.0]], dtype=torch.float64)
    assert gpu_reference.rel_error(ref.float(), ref) == 0.0
    assert gpu_reference.rel_error(ref + 0.04, ref) == pytest.approx(0.01)
    assert gpu_reference.rel_error(torch.full((2, 2), float("nan")), ref) == float("inf")
    assert gpu_reference.rel_error(ref[0], ref) == float("inf")
    x = gpu_reference.random_tensor((64, 64), "float16", torch.Generator().manual_seed(1),
                                    device="cpu")
    assert x.dtype == torch.float16 and bool((x != 0).all()) and float(x.abs().max()) <= 1.0


def test_n_copies():
    l2 = 50 * 2**20
    assert gpu_timing.n_copies(100 * 2**20, l2) == 2  # 3x the L2 in two copies
    assert gpu_timing.n_copies(2**10, l2) == 32  # capped
    assert gpu_timing.n_copies(2**31, l2) == 1  # a copy bigger than the memory cap: just one


def test_table_and_geomeans():
    rows = [
        {"name": "A:0", "roller": {"status": "ok", "us": 10.0}, "dlight": {"status": "ok", "us": 20.0},
         "torch": {"status": "ok", "us": 5.0}},
        {"name": "B:0", "roller": {"status": "ok", "us": 10.0}, "dlight": {"status": "ok", "us": 80.0},
         "torch": {"status": "ok", "us": 20.0}},
        {"name": "C:0", "roller": {"status": "wrong", "rel_err": 0.5, "us": 1.0},
         "dlight": {"status": "ok", "us": 80.0}, "torch": {"status": "ok", "us": 20.0}},
        {"name": "D:0", "roller": {"status": "declined", "reason": "x"},
         "dlight": {"status": "skipped"}, "torch": {"status": "skipped"}},
    ]
    micro = [{"name": "DRAM bandwidth", "unit": "GB/s", "measured": 4000.0, "preset": 4320.0,
              "ratio": 4000 / 4320, "how": "copy"}, {"name": "L2", "unit": "GB/s", "error": "boom"}]
    text, md, summary = gpu_report.table(rows, micro)
    assert summary["geomean_vs_dlight"] == pytest.approx(4.0)  # sqrt(2 * 8); C:0 is wrong
    assert summary["geomean_vs_torch"] == pytest.approx(1.0)  # sqrt(0.5 * 2)
    assert summary["roller_wrong"] == ["C:0"] and summary["roller_ok"] == 2
    assert "ERR 5.0e-01" in text and "declined" in text and "0.93" in text and "boom" in text
    assert md.startswith("| workload |") and md.count("\n| ") >= 6
    assert "chains" not in summary and "GEMM chains" not in text


def _chain_row(name, fuse, roller, unfused, torch_us, **extra):
    ok = lambda us: {"status": "ok", "us": us}
    return {"name": name, "kind": "chain", "impls": ["roller", "unfused"],
            "fusion": {"fuse": fuse, "reason": "r"}, "roller": dict(ok(roller), **extra),
            "unfused": ok(unfused), "torch": ok(torch_us)}


def test_chain_table():
    suite = {"name": "A:0", "roller": {"status": "ok", "us": 10.0},
             "dlight": {"status": "ok", "us": 20.0}, "torch": {"status": "ok", "us": 5.0}}
    rows = [suite,
            _chain_row("CHAIN:a", True, 10.0, 40.0, 20.0),
            _chain_row("CHAIN:b", True, 10.0, 10.0, 5.0),
            _chain_row("CHAIN:c", False, 10.0, 11.0, 40.0,
                       built_under="tvm default PassContext (no cp.async)"),
            {"name": "CHAIN:d", "kind": "chain", "impls": ["roller", "unfused"],
             "roller": {"status": "skipped"}, "unfused": {"status": "skipped"},
             "torch": {"status": "skipped"}}]
    text, md, summary = gpu_report.table(rows, [])
    # the suite's part is what it was without the chains
    assert {k: v for k, v in summary.items() if k != "chains"} == gpu_report.table([suite], [])[2]
    assert text.startswith(gpu_report.table([suite], [])[0])
    ch = summary["chains"]
    assert ch["chains"] == 4 and ch["fused"] == ["CHAIN:a", "CHAIN:b"]
    assert ch["geomean_fused_vs_unfused"] == pytest.approx(2.0)  # sqrt(4 * 1); c was not fused
    assert ch["n_fused_vs_unfused"] == 2
    assert ch["geomean_x_torch"] == pytest.approx((2 * 0.5 * 4) ** (1 / 3))
    assert ch["roller_ok"] == 3 and ch["unfused_ok"] == 3 and ch["roller_wrong"] == []
    assert ch["built_under_default_context"] == ["CHAIN:c/roller"]
    lines = text.splitlines()
    head = next(l for l in lines if l.startswith("chain "))
    assert re.split(r"\s{2,}", head.strip()) == [
        "chain", "model", "roller", "unfused", "torch", "roller us", "unfused us", "torch us",
        "fused vs unfused", "x torch"]
    row_a = next(l for l in lines if l.startswith("CHAIN:a"))
    assert row_a.split()[1:] == ["fused", "ok", "ok", "ok", "10.0", "40.0", "20.0", "4.00x",
                                 "2.00x"]
    row_c = next(l for l in lines if l.startswith("CHAIN:c"))
    assert row_c.split()[1:3] == ["unfused", "ok*"]
    assert any(l.startswith("* built under") for l in lines)
    assert "| chain | model |" in md and md.startswith("| workload |")
    # chains alone: their table only
    text, md, summary = gpu_report.table(rows[1:], [])
    assert md.startswith("| chain | model |") and "workload" not in text
    assert summary["workloads"] == 0 and summary["chains"]["chains"] == 4


# -- build ------------------------------------------------------------------------------------
BUILD_OPS = "GMM:0,SFM:0,NRM:0,CHAIN"
# small GEMM chains in place of gpu_bundles.CHAINS (seconds, not minutes): the model fuses the
# first (a row block of the softmax attention fits and saves traffic), not the second
TEST_CHAINS = {"CHAIN:tiny": ([16], 128, 16, 64, 16, "softmax"),
               "CHAIN:mlp-tiny": (None, 16, 32, 64, 32, "gelu")}


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    pytest.importorskip("tvm")
    out = tmp_path_factory.mktemp("gpu_bundles")
    lines = []
    manifest = gpu_bundles.build(out, BUILD_OPS, nvcc=HAVE_NVCC, log=lines.append,
                                 chains=TEST_CHAINS)
    return out, manifest, lines


def _check_bundles(out, w):
    """Each built implementation of manifest entry ``w``: bundle and record agree, the cubin is
    an ELF, and the launcher replays every launch (workspaces included) with a fake CuPy."""
    for impl in w["impls"]:
        rec = w[impl]
        if "bundle" not in rec:
            continue
        bundle = json.loads(gpu_manifest.read_gz(out / rec["bundle"]))
        assert [list(p["shape"]) for p in bundle["params"]] == [a[0] for a in w["args"]]
        assert rec["launches"] == [[l["name"], l["grid"], l["block"], l["dyn_smem_bytes"]]
                                   for l in bundle["launches"]]
        if HAVE_NVCC:
            assert gpu_manifest.read_gz(out / rec["cubin"])[:4] == b"\x7fELF"
            assert set(rec["kernels"]) == {l["name"] for l in bundle["launches"]}
        cp = FakeCupy()
        launcher = gpu_launch.Launcher(bundle, cp)
        params = [Buf(p["name"]) for p in bundle["params"]]
        launcher(params)
        assert len(cp.calls) == len(bundle["launches"])
        ws = [a for c in cp.calls for a in c["args"] if isinstance(a, np.ndarray)]
        assert len({id(a) for a in ws}) == len(bundle["workspaces"])
        assert all(any(a is p for p in params) or any(a is x for x in launcher.workspaces)
                   for c in cp.calls for a in c["args"] if not np.isscalar(a))


def test_build_writes_small_complete_bundles(built):
    out, manifest, lines = built
    assert [w["name"] for w in manifest["workloads"]] == ["GMM:0", "SFM:0", "NRM:0",
                                                          *TEST_CHAINS]
    size = sum(p.stat().st_size for p in out.iterdir())
    assert size < 1 * 2**20 and size < gpu_bundles.MAX_DIR_BYTES
    assert json.loads((out / gpu_manifest.MANIFEST).read_text()) == manifest
    assert manifest["arch"] == "sm_90" and manifest["device"]["name"].startswith("NVIDIA H200")
    for w in manifest["workloads"]:
        assert w["args"][-1][1] == "float32" and w["tol"] > 0 and w["flops"] > 0
        if w["kind"] == "chain":
            continue  # test_build_chains
        assert w["impls"] == ["roller", "dlight"] and "fusion" not in w
        assert set(w["params"]) >= ({"b", "n", "m", "k"} if w["cls"] == "GMM" else set())
        assert "bundle" in w["dlight"], w["dlight"]  # dlight schedules all three
        # roller's scheduler is another engineer's work in progress: any outcome is recorded
        assert sum(k in w["roller"] for k in ("bundle", "declined", "error")) == 1
        _check_bundles(out, w)
    assert any("GMM:0" in l for l in lines) and "MiB" in lines[-1]


def test_build_chains(built):
    """A chain's entry: its impls (roller: the fused kernel when the model fuses, else the
    operators one by one; unfused: roller's kernels for the operators, several launches and
    workspaces), the model's decision and reason, and what run() needs for the reference."""
    out, manifest, lines = built
    chains = {w["name"]: w for w in manifest["workloads"] if w["kind"] == "chain"}
    assert list(chains) == list(TEST_CHAINS)
    for name, w in chains.items():
        batch, m, k, l, n, middle = TEST_CHAINS[name]
        assert w["cls"] == "CHAIN" and w["impls"] == ["roller", "unfused"]
        assert w["params"] == {"batch": batch, "m": m, "k": k, "l": l, "n": n, "middle": middle}
        bs = list(batch or [])
        assert w["args"] == [[bs + [m, k], "float32"], [bs + [k, l], "float32"],
                             [bs + [l, n], "float32"], [bs + [m, n], "float32"]]
        assert w["tol"] == gpu_bundles.CHAIN_TOL and not w["memory_bound"]
        assert w["flops"] >= 2 * int(np.prod(bs or [1])) * m * l * (k + n)
        assert w["fusion"]["reason"] and w["fusion"]["plan"]["rows"] >= 1
        for impl in w["impls"]:
            assert "bundle" in w[impl], w[impl]
        _check_bundles(out, w)
        unfused = json.loads(gpu_manifest.read_gz(out / w["unfused"]["bundle"]))
        n_ops = 3 if middle == "softmax" else 2  # matmul (+ epilogue), row-wise stages, matmul
        assert len(unfused["launches"]) >= n_ops and unfused["workspaces"]
        assert {ws["count"] for ws in unfused["workspaces"]} == {int(np.prod(bs or [1])) * m * l}
    tiny, mlp = chains["CHAIN:tiny"], chains["CHAIN:mlp-tiny"]
    assert tiny["fusion"]["fuse"] and "fuse" in tiny["fusion"]["reason"]
    fused = json.loads(gpu_manifest.read_gz(out / tiny["roller"]["bundle"]))
    assert len(fused["launches"]) == 1 and not fused["workspaces"]  # one kernel, no round trip
    assert not mlp["fusion"]["fuse"] and "do not fuse" in mlp["fusion"]["reason"]
    assert mlp["roller"]["launches"] == mlp["unfused"]["launches"]  # declined: the same kernels
    assert any(l.startswith("CHAIN:tiny") and "fused" in l for l in lines)
    assert any(l.startswith("CHAIN:mlp-tiny") and "not fused" in l for l in lines)


def test_build_again_replaces_old_bundles(built, tmp_path):
    pytest.importorskip("tvm")
    (tmp_path / "OLD_0.dlight.json.gz").write_bytes(b"x")
    (tmp_path / "notes.txt").write_text("mine")
    gpu_bundles.build(tmp_path, "SFM:0", nvcc=False, log=lambda s: None)
    names = {p.name for p in tmp_path.iterdir()}
    assert "OLD_0.dlight.json.gz" not in names and "notes.txt" in names


def test_workload_selection():
    pytest.importorskip("tvm")
    specs = gpu_bundles._workload_specs(None)
    assert len(specs) == 52 + 3 + len(gpu_bundles.CHAINS)
    assert specs[52:] == ([(n, "hgemm", None) for n in gpu_bundles.HGEMMS]
                          + [(n, "chain", None) for n in gpu_bundles.CHAINS])
    assert [s[0] for s in gpu_bundles._workload_specs("CHAIN")] == list(gpu_bundles.CHAINS)
    assert gpu_bundles._workload_specs("chain:MLP,GMM:1") == [("GMM:1", "suite", ("GMM", 1)),
                                                              ("CHAIN:mlp", "chain", None)]
    assert gpu_bundles._workload_specs("CHAIN:a", {"CHAIN:a": None}) == [("CHAIN:a", "chain", None)]
    with pytest.raises(SystemExit, match="CHAIN:NOPE"):
        gpu_bundles._workload_specs("CHAIN:nope")
    assert gpu_bundles._workload_specs("GMM:1,HGEMM:1024") == [("GMM:1", "suite", ("GMM", 1)),
                                                               ("HGEMM:1024", "hgemm", None)]
    assert [s[0] for s in gpu_bundles._workload_specs("HGEMM")] == list(gpu_bundles.HGEMMS)
    with pytest.raises(SystemExit, match="HGEMM:7"):
        gpu_bundles._workload_specs("HGEMM:7")
    wls = [{"name": n} for n in ("GMM:0", "GMM:1", "SFM:0", "HGEMM:1024", *gpu_bundles.CHAINS)]
    assert [w["name"] for w in gpu_manifest.select(wls, "gmm,HGEMM:1024")] == ["GMM:0", "GMM:1",
                                                                                "HGEMM:1024"]
    assert [w["name"] for w in gpu_manifest.select(wls, "CHAIN")] == list(gpu_bundles.CHAINS)
    assert [w["name"] for w in gpu_manifest.select(wls, "chain:attn128")] == ["CHAIN:attn128"]
    assert gpu_manifest.impls_of({"name": "old manifest"}) == ["roller", "dlight"]


def test_run_half_needs_no_tvm(built):
    """The GPU machine has no TVM: with tvm and tvm_roller made unimportable, the run half reads
    the manifest, loads every bundle with a (fake) CuPy and evaluates the torch ops."""
    out, _, _ = built
    code = FAKE_CUPY + f'''
import json, sys
sys.modules["tvm"] = None
sys.modules["tvm_roller"] = None  # the harness's run half needs no part of roller either
from pathlib import Path
from harness.cuda_check import gpu_check  # the entry python/gpu_check.py runs
from harness.cuda_check import gpu_launch, gpu_manifest, gpu_reference
import torch
d = {str(out)!r}
m = gpu_manifest.load_manifest(Path(d))
n = 0
for w in gpu_manifest.select(m["workloads"], "GMM,SFM:0,CHAIN"):
    gen = torch.Generator().manual_seed(0)
    ins = [gpu_reference.random_tensor(s, dt, gen, device="cpu") for s, dt in w["args"][:-1]]
    fn, back = gpu_reference.torch_op(w["cls"], w["params"], [x.double() for x in ins])
    assert list(back(fn()).shape) == w["args"][-1][0]
    for impl in gpu_manifest.impls_of(w):
        if "bundle" in w[impl]:
            b = json.loads(gpu_manifest.read_gz(Path(d) / w[impl]["bundle"]))
            cp = FakeCupy()
            gpu_launch.Launcher(b, cp)([object() for _ in b["params"]])
            n += len(cp.calls)
assert "tvm" not in [k for k, v in sys.modules.items() if v is not None]
assert not [k for k, v in sys.modules.items() if k.startswith("tvm_roller") and v is not None], \
    "tvm_roller modules imported"
assert "harness.cuda_check.build" not in sys.modules
print("launches", n)
'''
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         cwd=ROOT / "python")  # the harness's folder, as for python/gpu_check.py
    assert res.returncode == 0, res.stderr[-3000:]
    assert re.search(r"launches [1-9]", res.stdout)


def test_command_line_runs_without_tvm(tmp_path):
    """``python python/gpu_check.py run`` as on the GPU machine: with an unimportable tvm (and a
    stand-in cupy) it reaches the manifest; ``--help`` needs no TVM either."""
    pytest.importorskip("torch")
    mods = tmp_path / "mods"
    (mods / "tvm").mkdir(parents=True)
    (mods / "tvm" / "__init__.py").write_text('raise ImportError("no TVM on the GPU machine")\n')
    (mods / "cupy.py").write_text('__version__ = "fake"\n')
    bundles = tmp_path / "bundles"
    bundles.mkdir()
    (bundles / gpu_manifest.MANIFEST).write_text(json.dumps({"format": gpu_manifest.FORMAT + 1}))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(mods)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]))
    cli = lambda *args: subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True,
                                       text=True, timeout=120, env=env, cwd=tmp_path)
    res = cli("run", str(bundles), "--no-micro")
    assert res.returncode == 1, res.stderr[-3000:]
    assert (f"is format {gpu_manifest.FORMAT + 1}, expected {gpu_manifest.FORMAT}"
            in res.stderr), res.stderr[-3000:]
    res = cli("--help")
    assert res.returncode == 0 and "{build,run}" in res.stdout, res.stderr[-3000:]
    assert gpu_check.__doc__.splitlines()[0][:40] in " ".join(res.stdout.split())


def test_load_all_compiles_every_bundle_ahead(built):
    out, manifest, _ = built
    cp = FakeCupy()
    loaded = gpu_measure.load_all(manifest["workloads"], out, cp, workers=3)
    expect = {(w["name"], i) for w in manifest["workloads"] for i in w["impls"]
              if "bundle" in w[i]}
    assert {("CHAIN:tiny", "roller"), ("CHAIN:tiny", "unfused")} <= expect
    assert set(loaded) == expect
    for (name, impl), res in loaded.items():
        bundle, cubin_path, (mod, how), secs = res
        assert mod.code == bundle["source"] and how.startswith("nvrtc") and secs >= 0
        assert (cubin_path is not None) == HAVE_NVCC
        gpu_launch.Launcher(bundle, cp, module=(mod, how))  # no second compile
    assert len(cp.modules) == len(expect)
    # a load that fails is recorded, not raised (check_workload retries it on demand)
    gpu_launch._LOAD_PREF.clear()
    bad = gpu_measure.load_all(manifest["workloads"], out,
                               FakeCupy(reject=lambda o: True, reject_cubin=True))
    assert set(bad) == expect and all(isinstance(v, RuntimeError) for v in bad.values())


def test_run_replayed_on_cpu(built, tmp_path, monkeypatch):
    """run() end to end with CPU tensors, a fake CuPy whose kernels do nothing and host-clock
    CUDA events: every step but the kernels themselves (which therefore leave NaN: ERR)."""
    import contextlib
    import time as _time
    import types

    torch = pytest.importorskip("torch")
    out, _, _ = built

    class Event:
        def __init__(self, enable_timing=False):
            self.t = None

        def record(self):
            self.t = _time.perf_counter()

        def synchronize(self):
            pass

        def elapsed_time(self, other):
            return (other.t - self.t) * 1e3

    cuda = types.SimpleNamespace(
        Event=Event, synchronize=lambda: None, _sleep=lambda cycles: None, empty_cache=lambda: None,
        Stream=lambda: types.SimpleNamespace(cuda_stream=0), stream=lambda s: contextlib.nullcontext(),
        get_device_properties=lambda i: types.SimpleNamespace(
            name="fake H200", multi_processor_count=132, total_memory=141 * 2**30, major=9, minor=0,
            L2_cache_size=50 * 2**20))
    for k, v in vars(cuda).items():
        monkeypatch.setattr(torch.cuda, k, v, raising=False)
    cp = FakeCupy()
    cp.cuda = types.SimpleNamespace(ExternalStream=lambda ptr: contextlib.nullcontext())
    cp.get_default_memory_pool = lambda: types.SimpleNamespace(free_all_blocks=lambda: None)
    monkeypatch.setitem(sys.modules, "cupy", cp)
    monkeypatch.setattr(gpu_reference, "DEVICE", "cpu")
    lines = []
    res = gpu_check.run(out, ops=None, budget_s=120, micro=False, per_impl_s=0.002,
                        out_dir=str(tmp_path), log=lines.append)
    rows = {r["name"]: r for r in res["rows"]}
    assert set(rows) == {"GMM:0", "SFM:0", "NRM:0", *TEST_CHAINS}
    for r in rows.values():
        assert r["torch"]["status"] == "ok" and r["torch"]["us"] > 0, r["torch"]
        assert r["copies"] >= 2
        for impl in r["impls"]:
            if impl == "roller" and r["kind"] != "chain":
                continue  # roller's suite outcome is recorded, whatever it is
            # nothing ran: the outputs stay NaN
            assert r[impl]["status"] == "wrong" and r[impl]["rel_err"] == float("inf"), r[impl]
            assert r[impl]["loaded_by"].startswith("nvrtc") and r[impl]["us"] > 0
    assert rows["CHAIN:tiny"]["impls"] == ["roller", "unfused"] and "dlight" not in rows["CHAIN:tiny"]
    assert rows["CHAIN:tiny"]["fusion"]["fuse"] and not rows["CHAIN:mlp-tiny"]["fusion"]["fuse"]
    launched = {c["name"] for c in cp.calls}
    assert "main_kernel" in launched
    assert res["summary"]["workloads"] == 3 and res["summary"]["geomean_vs_dlight"] is None
    chains = res["summary"]["chains"]
    assert chains["chains"] == 2 and chains["fused"] == ["CHAIN:tiny"]
    assert chains["geomean_fused_vs_unfused"] is None and chains["roller_wrong"] == list(TEST_CHAINS)
    saved = json.loads((tmp_path / "gpu_check.json").read_text())
    assert saved["summary"]["workloads"] == 3 and saved["device"]["name"] == "fake H200"
    assert saved["summary"]["chains"]["chains"] == 2
    md = (tmp_path / "gpu_check.md").read_text()
    assert md.startswith("| workload |") and "| chain | model |" in md
    assert any(l.startswith("compiled ") for l in lines)
    assert any("CHAIN:tiny" in l and "unfused=" in l for l in lines)
    # out of budget: the rest are reported as skipped, not run
    res = gpu_check.run(out, ops=None, budget_s=1, micro=False, per_impl_s=0.002,
                        out_dir=str(tmp_path), log=lambda s: None)
    assert all(r[i]["status"] == "skipped" for r in res["rows"] for i in r["impls"] + ["torch"])
    assert {r["name"] for r in res["rows"] if "unfused" in r} == set(TEST_CHAINS)


@pytest.mark.slow
def test_build_the_real_chains(tmp_path):
    """``build --ops CHAIN`` with gpu_bundles.CHAINS: every chain's two implementations build and
    compile; the model fuses the 512-token attention and nothing else. Where roller's cp.async
    PassContext fails to lower a stitched chain, the bundle was built under TVM's default one
    and says so."""
    pytest.importorskip("tvm")
    lines = []
    manifest = gpu_bundles.build(tmp_path, "CHAIN", nvcc=HAVE_NVCC, log=lines.append)
    ws = {w["name"]: w for w in manifest["workloads"]}
    assert list(ws) == list(gpu_bundles.CHAINS)
    assert {n for n, w in ws.items() if w["fusion"]["fuse"]} == {"CHAIN:attn512"}
    for w in ws.values():
        for impl in w["impls"]:
            rec = w[impl]
            assert "bundle" in rec, (w["name"], impl, rec)
            assert ("built_under" in rec) == ("roller_context_error" in rec)
        _check_bundles(tmp_path, w)
    fused = json.loads(gpu_manifest.read_gz(tmp_path / ws["CHAIN:attn512"]["roller"]["bundle"]))
    assert (len(fused["launches"]) == 1
            and fused["launches"][0]["dyn_smem_bytes"] > gpu_launch.STATIC_SMEM_LIMIT)
    assert sum(p.stat().st_size for p in tmp_path.iterdir()) < 1 * 2**20
