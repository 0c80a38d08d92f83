"""Shared settings and helpers for the tvm_roller tests.

* ``TVM_ROLLER_CACHE`` points at a fresh temporary directory for the whole session, so no test
  reads (or writes) this machine's calibration cache; ``TVM_ROLLER_CALIBRATE=0``: nothing is
  calibrated on first use.
* ``TARGET`` / ``device()``: the fixed target and preset device model the op tests plan for, so
  the constructed schedules do not depend on calibration or on the host. A test that asserts a
  planning decision plans for a pinned target and model, never ``host_target()`` (whose model
  reads this machine's /sys: Intel and AMD plan differently); ``AMX_TARGET`` / ``VNNI_TARGET``
  with ``device_for()`` for the tests that run AMX / VNNI code (skipped on hosts without it).
* every CUDA module a test builds with roller is compiled by nvcc (``check_executable``).
* ``rand`` / ``run`` / ``assert_close``: random (never zero) inputs, calling a built module with
  a NaN-filled output (an element the kernel never writes stays NaN and fails the check), and a
  relative max-error comparison against a float64 numpy reference.
"""
from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Sequence

import numpy as np
import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]  # the checkout (tests/ mirrors tvm_roller/)

_CACHE_DIR = tempfile.mkdtemp(prefix="tvm-roller-test-cache-")
os.environ["TVM_ROLLER_CACHE"] = _CACHE_DIR
# the tests plan with presets and estimates: no calibration on first use
os.environ["TVM_ROLLER_CALIBRATE"] = "0"
# one lock file for the whole run: pytest-xdist's workers inherit the main process's (``alone``)
_RUN_LOCK = os.environ.setdefault("TVM_ROLLER_TEST_LOCK", os.path.join(_CACHE_DIR, "alone.lock"))

TARGET = {"kind": "llvm", "mcpu": "skylake-avx512", "num-cores": 2}
# the CUDA targets the GPU tests build for: sm_90 with the H100 tag (whose own arch is sm_90a)
CUDA_TARGETS = {"sm_90": {"tag": "nvidia/nvidia-h100", "arch": "sm_90"},
                "sm_80": "nvidia/nvidia-a100"}


def cuda_target(arch: str):
    import tvm

    return tvm.target.Target(CUDA_TARGETS[arch])

# float32 results are compared with this relative max error; float64 with F64_TOL
F32_TOL = 2e-5
F32_TOL_LONG = 1e-4  # reductions longer than ~256 terms
F64_TOL = 1e-12


def pytest_configure(config):
    # pytest.ini registers them too; registering twice is harmless
    config.addinivalue_line("markers", "slow: long-running (big shapes); deselect with -m 'not slow'")
    config.addinivalue_line("markers", "alone: runs with no other test beside it (it times "
                                       "kernels against a stored or a concurrent measurement)")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """Under pytest-xdist every test holds the run's lock file shared, from its setup to its
    teardown, and a test marked ``alone`` holds it exclusively: nothing runs beside a test that
    times kernels (the other worker's load would move its numbers)."""
    if "PYTEST_XDIST_WORKER" not in os.environ:
        yield
        return
    import fcntl

    with open(_RUN_LOCK, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX if item.get_closest_marker("alone") else fcntl.LOCK_SH)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def pytest_unconfigure(config):
    shutil.rmtree(_CACHE_DIR, ignore_errors=True)


@pytest.fixture(autouse=True)
def _private_roller_cache(monkeypatch):
    """Keep every test on the session's private cache even if a test changed the variable."""
    monkeypatch.setenv("TVM_ROLLER_CACHE", _CACHE_DIR)


@pytest.fixture(autouse=True)
def _nvcc_checks_cuda_builds(monkeypatch):
    """Every CUDA module ``tvm_roller.build`` or ``tvm_roller.relax.compile`` returns in a test
    goes through nvcc + ``ptxas -v`` (when nvcc is on the machine): a kernel ptxas rejects, or
    one over the device's thread or static shared-memory limits, fails the test that built it."""
    if shutil.which("nvcc") is None and not os.environ.get("TVM_ROLLER_NVCC"):
        return
    import tvm

    import tvm_roller
    from tvm_roller import relax
    from tvm_roller.backends.registry import backend_for, has_backend

    def checked(build):
        def wrapper(mod, target, *args, **kwargs):
            ex = build(mod, target, *args, **kwargs)
            tgt = tvm.target.Target(target)
            if has_backend(tgt) and backend_for(tgt).name == "cuda":
                from harness.cuda_check import check_executable, nvcc_supports
                from tvm_roller.hardware.gpu import target_cc

                # TVM's default arch (sm_50) is one CUDA 13's nvcc no longer compiles for
                if nvcc_supports(target_cc(tgt).arch):
                    check_executable(ex, target, kwargs.get("device"))
            return ex
        return wrapper

    monkeypatch.setattr(tvm_roller, "build", checked(tvm_roller.build))
    monkeypatch.setattr(relax, "compile", checked(relax.compile))


def device():
    """The preset device model every op test plans for (independent of calibration)."""
    from tvm_roller import hardware

    return hardware.preset("x86-avx512")


# the targets of the tests that run AMX / AVX-512 VNNI code (skipped on a host without it): the
# first CPU with each, so the code runs on every host that has the instructions (Intel's later
# Xeons, AMD Zen 4 for VNNI), and the plan is the same on all of them
AMX_TARGET = {"kind": "llvm", "mcpu": "sapphirerapids", "num-cores": 2}
VNNI_TARGET = {"kind": "llvm", "mcpu": "cascadelake", "num-cores": 2}
# the first CPU with AVX512-BF16 (and VNNI): Zen 4 and later, Cooper Lake and later Xeons run its code
BF16_DOT_TARGET = {"kind": "llvm", "mcpu": "cooperlake", "num-cores": 2}
# AVX2 only (a laptop): runs on every x86-64 host with AVX2
HASWELL_TARGET = {"kind": "llvm", "mcpu": "haswell", "num-cores": 2}


def device_for(target):
    """The device model of ``target`` estimated from its ISA's preset (its matrix and
    dot-product units from the target's features): never this host's /sys or calibration."""
    import tvm

    from tvm_roller.hardware.cpu import from_target

    return from_target(tvm.target.Target(target), use_cache=False, host_caches=False)


def rand(shape: Sequence[int], dtype: str = "float32", seed: int = 0) -> np.ndarray:
    """Uniform(-1, 1) data without exact zeros (a zero would hide reading padding for data)."""
    rng = np.random.default_rng(seed)
    x = rng.uniform(-1.0, 1.0, size=tuple(int(s) for s in shape))
    x[x == 0] = 0.5
    return x.astype(dtype)


def rand_inputs(tensors, seed: int = 0):
    """Random arrays for every te placeholder among ``tensors[:-1]`` (the last is the output)."""
    return [rand([int(s) for s in t.shape], str(t.dtype), seed + i)
            for i, t in enumerate(tensors[:-1])]


def run(lib, arrays, out_shape, out_dtype) -> np.ndarray:
    """Call ``lib`` on ``arrays`` plus a NaN-filled output (integers: the dtype's minimum), so an
    element the kernel never writes shows up; return the output."""
    import tvm

    dev = tvm.cpu(0)
    shape = tuple(int(s) for s in out_shape)
    if np.issubdtype(np.dtype(out_dtype), np.integer):
        fill = np.full(shape, np.iinfo(out_dtype).min, dtype=out_dtype)
    else:
        fill = np.full(shape, np.nan, dtype=out_dtype)
    out = tvm.runtime.tensor(fill, dev)
    # np.require keeps 0-d arrays 0-d (ascontiguousarray makes them 1-d)
    lib(*[tvm.runtime.tensor(np.require(a, requirements="C"), dev) for a in arrays], out)
    return out.numpy()


def rel_err(out: np.ndarray, ref: np.ndarray) -> float:
    out = np.asarray(out, dtype=np.float64)
    ref = np.asarray(ref, dtype=np.float64)
    assert out.shape == ref.shape, f"shape {out.shape} != reference {ref.shape}"
    if not np.all(np.isfinite(out)):
        return float("inf")
    scale = float(np.max(np.abs(ref))) or 1.0
    return float(np.max(np.abs(out - ref))) / scale


def assert_close(out, ref, tol: float) -> None:
    err = rel_err(out, ref)
    assert err <= tol, f"relative max error {err:.3g} > {tol:.1g}"


def build_and_check(tensors, ref, *, tol=None, arrays=None, dev=None, seed=0):
    """Build ``te.create_prim_func(tensors)`` with roller, run it on random inputs and compare with
    ``ref(*float64 inputs)``. Returns the module."""
    import tvm_roller
    from tvm import te

    tensors = list(tensors)
    func = te.create_prim_func(tensors)
    arrays = rand_inputs(tensors, seed) if arrays is None else arrays
    lib = tvm_roller.build(func, TARGET, device=dev if dev is not None else device())
    out_t = tensors[-1]
    out = run(lib, arrays, out_t.shape, str(out_t.dtype))
    expect = ref(*[a.astype(np.float64) for a in arrays])
    if tol is None:
        tol = F64_TOL if str(out_t.dtype) == "float64" else F32_TOL
    assert_close(out, expect, tol)
    return lib


# -- float64 numpy references --------------------------------------------------------------------
def conv_nlc(x, w, stride=1, padding=0, dilation=1, groups=1):
    """Channels-last convolution of any rank: x[N, *S, CI], w[*K, CI/g, CO] -> y[N, *O, CO]."""
    import itertools

    nd = x.ndim - 2
    ks = w.shape[:nd]
    cpg, co = w.shape[nd], w.shape[nd + 1]
    cog = co // groups
    xp = np.pad(x, [(0, 0)] + [(padding, padding)] * nd + [(0, 0)])
    outs = [(xp.shape[1 + d] - dilation * (ks[d] - 1) - 1) // stride + 1 for d in range(nd)]
    y = np.zeros((x.shape[0], *outs, groups, cog))
    for off in itertools.product(*[range(k) for k in ks]):
        sl = tuple(slice(o * dilation, o * dilation + stride * (n - 1) + 1, stride)
                   for o, n in zip(off, outs))
        patch = xp[(slice(None),) + sl + (slice(None),)]  # [N, *O, CI]
        patch = patch.reshape(*patch.shape[:-1], groups, cpg)
        wk = w[off].reshape(cpg, groups, cog)  # [cpg, CO] with co = g * cog + j
        y += np.einsum("...gc,cgj->...gj", patch, wk)
    return y.reshape(x.shape[0], *outs, co)


def conv2d_transpose_nhwc(x, w, stride, padding):
    """x[N,H,W,CI], w[KH,KW,CI,CO]: y[n, ih*s - p + kh, iw*s - p + kw, co] += x * w."""
    n, h, wd, _ = x.shape
    kh, kw, _, co = w.shape
    full = np.zeros((n, (h - 1) * stride + kh, (wd - 1) * stride + kw, co))
    for a in range(kh):
        for b in range(kw):
            full[:, a:a + stride * (h - 1) + 1:stride, b:b + stride * (wd - 1) + 1:stride, :] += \
                np.einsum("nhwc,cd->nhwd", x, w[a, b])
    oh, ow = (h - 1) * stride - 2 * padding + kh, (wd - 1) * stride - 2 * padding + kw
    return full[:, padding:padding + oh, padding:padding + ow, :]


def softmax(x, axis=-1):
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


# -- GEMM chains (fusion): shapes and float64 references -------------------------------------
CHAIN_CASES = [  # (batch, m, k, l, n, middle)
    ([3], 37, 13, 41, 11, "relu"),      # odd and prime
    ([2, 3], 7, 5, 3, 2, "softmax"),    # two batch axes, tiny
    ([1], 1, 1, 1, 1, "none"),          # size 1 everywhere
    (None, 24, 16, 96, 32, "gelu"),     # 2-D: an MLP block
    ([4], 64, 32, 128, 48, "softmax"),  # attention-like
]


def chain_inputs(batch, m, k, l, n):  # noqa: E741
    bs = tuple(batch or ())
    return [rand(bs + (m, k), seed=1), rand(bs + (k, l), seed=2), rand(bs + (l, n), seed=3)]


def chain_reference(a, b, d, middle):
    """f(a . b) . d in float64, f one of none, relu, gelu (tanh form), softmax over the rows."""
    c = np.matmul(a.astype(np.float64), b.astype(np.float64))
    if middle == "relu":
        c = np.maximum(c, 0.0)
    elif middle == "gelu":
        c = 0.5 * c * (1.0 + np.tanh(0.7978845608 * (c + 0.044715 * c ** 3)))
    elif middle == "softmax":
        c = softmax(c)
    return np.matmul(c, d.astype(np.float64))


def conv_chain_reference(x, w1, w2):
    """NHWC 3x3 conv (padding 1) -> ReLU -> 1x1 conv in float64."""
    n, h, w, _ = x.shape
    xp = np.pad(x.astype(np.float64), ((0, 0), (1, 1), (1, 1), (0, 0)))
    y = np.zeros((n, h, w, w1.shape[-1]))
    for dh in range(3):
        for dw in range(3):
            y += xp[:, dh:dh + h, dw:dw + w, :] @ w1[dh, dw].astype(np.float64)
    return np.maximum(y, 0.0) @ w2[0, 0].astype(np.float64)


def parity_guards(func) -> list:
    """Selects (if_then_else) in the reduction blocks of ``func`` whose condition takes a
    remainder: a parity guard left in a multiply-add."""
    from tvm import s_tir, tirx

    from tvm_roller.analysis.visit import post_order_visit

    found = []

    def guarded(e):
        mods = []
        post_order_visit(e, lambda n: mods.append(n) if isinstance(n, tirx.FloorMod) else None)
        return bool(mods)

    def in_reduction(e):
        if isinstance(e, tirx.Select) and guarded(e.condition):
            found.append(e)
        elif str(getattr(getattr(e, "op", None), "name", "")).endswith("if_then_else") and \
                guarded(e.args[0]):
            found.append(e)

    def visit(node):
        if isinstance(node, s_tir.SBlock) and any(int(iv.iter_type) == 2 for iv in node.iter_vars):
            post_order_visit(node.body, in_reduction)

    post_order_visit(func.body, visit)
    return found


def matmul_func(m: int, n: int, k: int):
    """The PrimFunc of C[m, n] = A[m, k] @ B[k, n] (float32, TE)."""
    from tvm import te

    A = te.placeholder((m, k), name="A")
    B = te.placeholder((k, n), name="B")
    r = te.reduce_axis((0, k), "r")
    C = te.compute((m, n), lambda i, j: te.sum(A[i, r] * B[r, j], axis=r), name="C")
    return te.create_prim_func([A, B, C])


def gather_sum_func():
    """A sum over gathered elements (A[idx[k]]): a function roller declines (a gather)."""
    from tvm import te

    A = te.placeholder((16,), "float32", name="A")
    idx = te.placeholder((8,), "int32", name="idx")
    k = te.reduce_axis((0, 8), "k")
    return te.create_prim_func([A, idx, te.compute((1,), lambda i: te.sum(A[idx[k]], axis=k),
                                                   name="S")])
