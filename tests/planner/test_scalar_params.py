"""A PrimFunc with a scalar parameter used as a value (a decode step's position feeding its
rotary angles) is roller's like any other, and exact."""
from __future__ import annotations

import numpy as np
import tvm
from tvm import te, tirx

from tvm_roller.planner import Context, ScheduleOptions, schedule_function

from conftest import TARGET, device


def test_scalar_value_parameter_is_scheduled_and_exact():
    a = te.placeholder((1, 1, 7), "float32", name="a")
    s = tirx.Var("s", "int64")
    out = te.compute((1, 1, 14), lambda i, j, k: tirx.Cast("float32", s - 1) * a[i, j, k % 7],
                     name="o")
    func = te.create_prim_func([a, s, out])
    ctx = Context.make(TARGET, device())
    res = schedule_function(func, ctx, "rope_angles", ScheduleOptions(), True)
    assert res.entry.status == "roller", res.entry.reason
    lib = tvm.compile(tvm.IRModule({"main": res.kernel.with_attr("global_symbol", "main")}),
                      target=ctx.target)
    x = np.random.default_rng(3).uniform(-1, 1, (1, 1, 7)).astype("float32")
    got = tvm.runtime.tensor(np.zeros((1, 1, 14), "float32"))
    lib["main"](tvm.runtime.tensor(x), 13, got)
    np.testing.assert_allclose(got.numpy(), np.concatenate([x, x], -1) * 12.0, rtol=1e-6)
