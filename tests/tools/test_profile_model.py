"""``tvm-roller profile-model``'s rows: each kernel measured against its bound, flagged with why."""
from __future__ import annotations

import pytest
import tvm
from tvm import relax

import tvm_roller.relax as rr
from tvm_roller.tools.kernel_timing import fork_join_s
from tvm_roller.tools.profile_model import KernelRow, _flag, format_profile, profile

from conftest import TARGET

_FACTS = {"parallel_regions": 1, "parallel_extent": 8, "vector_lanes": 16, "strided": {},
          "gathers": []}


def _row(measured, bound, facts=None, **kw):
    return KernelRow("k", measured, kw.pop("share", 0.5), 1, kw.pop("status", "roller"), "tiled",
                     bound_s=bound, bound_by="L2", predicted_s=kw.pop("pred", 2 * bound),
                     facts=dict(_FACTS, **(facts or {})), **kw)


def test_flag_says_why():
    assert _flag(_row(100e-6, 20e-6), 2e-6) == ""  # 5x: not flagged
    assert _flag(_row(40e-6, 1e-6, share=0.001), 2e-6) == ""  # does not matter
    small = _flag(_row(100e-6, 1e-6), 2e-6)
    assert small.startswith("100x its L2 bound") and "small" in small
    strided = _flag(_row(1e-3, 50e-6, {"strided": {"A": 65}}), 2e-6)
    assert "strided" in strided and "65" in strided and "small" not in strided
    serial = _flag(_row(1e-3, 50e-6, {"parallel_regions": 0, "vector_lanes": 0}), 2e-6)
    assert "serial" in serial and "scalar" in serial
    assert "unexplained" in _flag(_row(1e-3, 50e-6), 2e-6)
    # a GELU's erf expansion: its arithmetic, not its bytes, takes the time
    gelu = _flag(_row(1e-3, 50e-6, {"arith_ops": 40e6, "arith_s": 400e-6}), 2e-6)
    assert "arithmetic" in gelu and "unexplained" not in gelu
    fb = _flag(_row(1e-3, 50e-6, status="fallback", fallback="decline", reason="gather"), 2e-6)
    assert "left to TVM's default" in fb and "gather" in fb


@pytest.mark.alone  # it times the kernels and the thread pool's fork-join
def test_profile_of_a_small_model_matches_its_report():
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((67, 129), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            t = bb.emit(relax.op.permute_dims(x))
            y = bb.emit_output(relax.op.nn.softmax(relax.op.matmul(t, x), axis=-1))
        bb.emit_func_output(y)
    report: list = []
    ex = rr.compile(bb.get(), TARGET, report)
    vm = relax.VirtualMachine(ex, tvm.cpu())
    arg = tvm.runtime.tensor(__import__("numpy").random.default_rng(1).standard_normal(
        (67, 129)).astype("float32"))
    fj = fork_join_s(tvm.target.Target(TARGET), 2)
    assert 0 < fj < 1e-3
    rows = profile(vm, arg, report, calls=3, fork_join_s=fj)
    kernels = [r for r in rows if r.status]
    assert {r.name for r in kernels} <= {e["name"] for e in report} and kernels
    assert all(r.measured_s > 0 and r.bound_s and r.over_bound > 0.5 for r in kernels)
    text = format_profile(rows)
    assert "all kernels" in text and kernels[0].name[:40] in text
