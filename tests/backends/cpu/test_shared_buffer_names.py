"""Functions holding distinct buffers of one name (TOPI's log-softmax: its exp-sum and its
output are both ``compute``). TVM 0.27's ``loop_partition`` matches buffers by name, so the
partition of the output row gave the exp-sum the output's region ("Buffer rank and region
dimension mismatch"): the CPU lowering renames the function's own buffers first
(``backends.buffer_names``) and, where it may not rewrite the function (a trace that must
replay on it), splits rather than partitions (``loops.partition_hazard``). Compared with float64
references at 1, prime and odd sizes."""
from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import s_tir, te, topi

import tvm_roller
from conftest import F32_TOL, F64_TOL, TARGET, assert_close, device, rand, run
from tvm_roller.backends.buffer_names import shared_names, unique_buffer_names
from tvm_roller.backends.cpu.loops import partition_hazard, vectorize_inner


def _log_softmax(a: np.ndarray, axis: int = -1) -> np.ndarray:
    s = a - a.max(axis, keepdims=True)
    return s - np.log(np.exp(s).sum(axis, keepdims=True))


def _topi_log_softmax(shape, dtype: str, axis: int = -1):
    x = te.placeholder(shape, dtype, name="x")
    return x, topi.nn.log_softmax(x, axis=axis % len(shape))


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("shape", [(5, 17, 334), (93, 343), (1, 13), (7, 1), (3, 5, 7),
                                   (2, 1, 97), (31, 16)])
def test_topi_log_softmax(shape, dtype):
    x, y = _topi_log_softmax(shape, dtype)
    lib = tvm_roller.build(te.create_prim_func([x, y]), TARGET, device=device())
    a = rand(shape, dtype, seed=1)
    out = run(lib, [a], shape, dtype)
    tol = F64_TOL if dtype == "float64" else F32_TOL
    assert_close(out, _log_softmax(a.astype(np.float64)), tol)


@pytest.mark.parametrize("shape", [(5, 17, 334), (93, 343)])
def test_topi_log_softmax_sapphire_rapids(shape):
    """The harness's host target on Intel (AMX, AVX-512 FP16): the same lowering. It builds on
    every host; it runs where the host has Sapphire Rapids' ISA."""
    from tvm_roller.hardware import host_target
    from tvm_roller.hardware.cpu import detect_isa

    x, y = _topi_log_softmax(shape, "float32")
    target = {"kind": "llvm", "mcpu": "sapphirerapids", "num-cores": 2}
    lib = tvm_roller.build(te.create_prim_func([x, y]), target, device=device())
    if not {"amx-tile", "avx512fp16"} <= detect_isa(host_target())[1]:
        pytest.skip("built; this CPU cannot run Sapphire Rapids code")
    a = rand(shape, seed=2)
    assert_close(run(lib, [a], shape, "float32"), _log_softmax(a.astype(np.float64)), F32_TOL)


@pytest.mark.parametrize("shape,axis", [((37, 11), 0), ((3, 19, 5), 1)])
def test_topi_log_softmax_inner_axis(shape, axis):
    x, y = _topi_log_softmax(shape, "float64", axis)
    lib = tvm_roller.build(te.create_prim_func([x, y]), TARGET, device=device())
    a = rand(shape, "float64", seed=3)
    assert_close(run(lib, [a], shape, "float64"), _log_softmax(a, axis), F64_TOL)


def test_unique_names_rename_the_functions_own_buffers():
    x, y = _topi_log_softmax((4, 21), "float32")
    func = te.create_prim_func([x, y])
    assert shared_names(func) == ["compute"]
    renamed = unique_buffer_names(func)
    assert shared_names(renamed) == []
    # the parameters keep their names (the signature); the exp-sum becomes compute_1
    assert [p.name for p in renamed.params] == [p.name for p in func.params]
    assert sorted(b.name for b in renamed.body.block.alloc_buffers) == \
        ["T_softmax_maxelem", "compute_1"]
    assert unique_buffer_names(renamed).same_as(renamed)


def test_partition_declined_where_names_are_shared():
    """On the function as given, the output row is split (whole vectors and a predicated last
    one) instead of partitioned; the module builds and computes the log-softmax."""
    shape = (6, 21)
    x, y = _topi_log_softmax(shape, "float32")
    sch = s_tir.Schedule(te.create_prim_func([x, y]))
    out = sch.get_sblock("compute_1")
    row, col = sch.get_loops(out)
    for name in ("compute", "T_softmax_maxelem"):
        sch.compute_at(sch.get_sblock(name), row)
    assert "compute" in partition_hazard(sch, col)
    vectorize_inner(sch, col, 16, partition=True)
    lib = tvm.compile(sch.mod, target="llvm")
    a = rand(shape, seed=4)
    assert_close(run(lib["main"], [a], shape, "float32"), _log_softmax(a.astype(np.float64)),
                 F32_TOL)


def test_traceable_schedule_replays_on_the_function():
    """A MetaSchedule record's trace replays on the function as given (shared names and all)."""
    from tvm_roller.planner.context import Context
    from tvm_roller.planner.scheduling import schedule_candidates

    x, y = _topi_log_softmax((93, 343), "float32")
    func = te.create_prim_func([x, y])
    ctx = Context.for_target(tvm.target.Target(TARGET), (), device(), None)
    found = schedule_candidates(func, ctx, topk=1)
    assert found.error is None and found.schedules, (found.failed, found.error)
