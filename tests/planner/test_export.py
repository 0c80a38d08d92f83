"""A roller-built module survives export_library / load_module and computes the same result."""
from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import te
from tvm.s_tir.meta_schedule.testing import te_workload as W

import tvm_roller

from conftest import F32_TOL, TARGET, assert_close, conv_nlc, device, rand_inputs, run, softmax

_CASES = {
    "matmul": (lambda: W.matmul(37, 64, 29), lambda a, b: a @ b),
    "conv2d": (lambda: W.conv2d_nhwc(1, 9, 9, 8, 16, 3, 2, 1), lambda x, w: conv_nlc(x, w, 2, 1)),
    "softmax": (lambda: W.softmax_mn(12, 80), lambda a: softmax(a, axis=1)),
}


@pytest.mark.parametrize("name", sorted(_CASES))
def test_export_and_reload(name, tmp_path):
    make, ref = _CASES[name]
    tensors = list(make())
    lib = tvm_roller.build(te.create_prim_func(tensors), TARGET, device=device())
    arrays = rand_inputs(tensors)
    out_shape = tensors[-1].shape
    before = run(lib, arrays, out_shape, "float32")

    path = tmp_path / f"{name}.so"
    lib.export_library(str(path))
    assert path.is_file() and path.stat().st_size > 0
    loaded = tvm.runtime.load_module(str(path))
    after = run(loaded["main"], arrays, out_shape, "float32")

    np.testing.assert_array_equal(after, before)  # the very same machine code
    assert_close(after, ref(*[a.astype(np.float64) for a in arrays]), F32_TOL)


def test_export_fallback_build(tmp_path):
    """A FallbackWarning build (a division by a scalar parameter) exports and reloads too, and
    so does a function with a symbolic extent (its bucket kernels and their dispatch)."""
    A = te.placeholder((16,), "float32", name="A")
    d = te.var("d", "int32")
    D = te.compute((16,), lambda i: A[te.floordiv(i, d)], name="D")
    with pytest.warns(tvm_roller.FallbackWarning, match="non-constant division"):
        lib = tvm_roller.build(te.create_prim_func([A, d, D]), TARGET, fallback=True,
                               device=device())
    path = tmp_path / "fallback.so"
    lib.export_library(str(path))
    loaded = tvm.runtime.load_module(str(path))
    a = rand_inputs([A, None])[0]
    out = tvm.runtime.tensor(np.full(16, np.nan, "float32"))
    loaded["main"](tvm.runtime.tensor(a), 3, out)
    assert_close(out.numpy(), a[np.arange(16) // 3], 0.0)

    n = te.var("n")
    X = te.placeholder((n, 16), "float32", name="X")
    Y = te.compute((n, 16), lambda i, j: X[i, j] * 3.0 + 1.0, name="Y")
    lib = tvm_roller.build(te.create_prim_func([X, Y]), TARGET, device=device(),
                           bounds={"n": (1, 64)})
    path = tmp_path / "dynamic.so"
    lib.export_library(str(path))
    loaded = tvm.runtime.load_module(str(path))
    for rows in (1, 5, 70):
        x = rand_inputs([te.placeholder((rows, 16), "float32"), None], seed=rows)[0]
        assert_close(run(loaded["main"], [x], (rows, 16), "float32"),
                     x.astype(np.float64) * 3 + 1, 1e-7)