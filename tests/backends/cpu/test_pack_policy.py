"""Panel operands copied per task where their rows alias in L1 and enough rows reuse the copy
(``backends.cpu.pack_policy``): the decision, and the packed kernel against float64."""
from __future__ import annotations

import dataclasses

import numpy as np
import tvm
from tvm import te

from tvm_roller.hardware import DeviceModel
from tvm_roller.planner import build, plan

from conftest import TARGET, device_for


def _core_48k() -> DeviceModel:
    """The pinned model the decision is planned for (not the host's: a 32 KiB L1 — Zen 4, the
    AVX-512 preset — plans other tiles): 2 AVX-512 cores with a Sapphire Rapids core's 48 KiB
    L1 and 2 MiB L2, the caches the policy's numbers were measured on."""
    base = device_for(TARGET)
    levels = list(base.levels)
    levels[0] = dataclasses.replace(levels[0], capacity_bytes=48 << 10)
    levels[1] = dataclasses.replace(levels[1], capacity_bytes=2 << 20)
    return dataclasses.replace(base, name="avx512 x2, 48 KiB L1", levels=levels)


def _gemm(m: int, k: int, n: int):
    a = te.placeholder((m, k), name="A")
    b = te.placeholder((k, n), name="B")
    r = te.reduce_axis((0, k), name="k")
    c = te.compute((m, n), lambda i, j: te.sum(a[i, r] * b[r, j], axis=r), name="C")
    return te.create_prim_func([a, b, c])


def test_aliasing_rows_with_many_rows_reusing_them_are_packed():
    # B's rows 32 KiB apart: every row of an L1 chunk in the same sets; 1,087 rows reuse it
    dev = _core_48k()
    tile = plan(_gemm(1087, 2048, 8192), TARGET, device=dev).tiles[0]
    assert tile.pack == ["B"] and any("copied per task" in n for n in tile.notes)
    # the same rows reused by few rows: the copy would cost more than it saves
    assert plan(_gemm(64, 2048, 8192), TARGET, device=dev).tiles[0].pack == []
    # rows 4,100 bytes apart spread over the sets: nothing to fix
    assert plan(_gemm(1087, 256, 1025), TARGET, device=dev).tiles[0].pack == []


def test_packed_kernel_matches_float64():
    m, k, n = 1031, 67, 4096  # prime rows and reduction; B rows 16 KiB apart
    func, dev = _gemm(m, k, n), _core_48k()
    tile = plan(func, TARGET, device=dev).tiles[0]
    rng = np.random.default_rng(0)
    a = rng.standard_normal((m, k)).astype("float32")
    b = rng.standard_normal((k, n)).astype("float32")
    out = tvm.runtime.tensor(np.full((m, n), np.nan, "float32"))
    build(func, TARGET, device=dev)(tvm.runtime.tensor(a), tvm.runtime.tensor(b), out)
    ref = a.astype("f8") @ b.astype("f8")
    np.testing.assert_allclose(out.numpy(), ref, rtol=1e-4, atol=1e-4)
    assert tile.pack == ["B"], tile.notes  # the case this test is for
