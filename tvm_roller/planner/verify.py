"""The wrong-result guard: roller's kernel of a function run once on random inputs against TVM's
default build of the same function (opt-in: ``verify=True``), so a silently wrong kernel
becomes an error entry and a fallback instead of a wrong model.

Inputs are random and never zero for floats (a zero hides a kernel that reads the wrong place);
integer inputs are zero (they may index another tensor: any other value could read out of
bounds in both builds). Outputs start as NaN, so an element a kernel never writes shows. Only
functions with static shapes, for a target this machine runs, whose default build would run
within the budget (TVM's unscheduled loops run at about 0.5 GFLOP/s) are checked; the others
are reported as skipped, with the reason.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import List, Optional, Set

import numpy as np
import tvm
from tvm import tirx

from tvm_roller.analysis.visit import post_order_visit
from tvm_roller.planner.context import Context
from tvm_roller.planner.roofline import bound_of, param_bytes

#: the unscheduled default build's rate, to estimate how long checking a function takes
_DEFAULT_GFLOPS = 0.5
#: largest relative difference (to the output's largest magnitude) of float outputs
TOLERANCE = 1e-4


@dataclass(frozen=True)
class Verdict:
    """``ok`` False: the outputs differ (``detail`` says how); ``checked`` False: skipped."""

    ok: bool
    checked: bool
    detail: str


def verify(func: tirx.PrimFunc, kernel_build, ctx: Context, budget_s: float = 2.0,
           seed: int = 0) -> Verdict:
    """``kernel_build`` (roller's build of ``func``) against TVM's default build of ``func``."""
    why = _why_not(func, ctx, budget_s)
    if why:
        return Verdict(True, False, f"skipped: {why}")
    prim = func if func.attrs is not None and "global_symbol" in func.attrs else \
        func.with_attr("global_symbol", "main")
    reference = tvm.compile(ctx.backend.default_schedule(tvm.IRModule({"main": prim}),
                                                         ctx.target), target=ctx.target)
    outputs = _output_params(func)
    rng = np.random.default_rng(seed)
    arrays = [_array(p, i in outputs, rng) for i, p in enumerate(func.params)]
    got = _run(kernel_build, arrays)
    want = _run(reference, arrays)
    worst = 0.0
    for i in sorted(outputs):
        ok, diff = _close(got[i], want[i])
        if not ok:
            return Verdict(False, True, f"output {func.params[i].name} differs from TVM's "
                                        f"default build ({diff})")
        worst = max(worst, diff if isinstance(diff, float) else 0.0)
    return Verdict(True, True, f"matches TVM's default build (max rel. err {worst:.1e})")


def _why_not(func: tirx.PrimFunc, ctx: Context, budget_s: float) -> str:
    if ctx.backend.runner_device != "cpu":
        return f"a {ctx.target.kind.name} kernel does not run on this machine"
    if param_bytes(func) is None:
        return "symbolic shapes"
    b = bound_of(func, ctx)
    estimate = (b.flops if b else 0.0) / (_DEFAULT_GFLOPS * 1e9)
    if estimate > budget_s:
        return f"TVM's default build would take about {estimate:.0f} s (budget {budget_s:g} s)"
    return ""


def _output_params(func: tirx.PrimFunc) -> Set[int]:
    """Indices of the parameters the function writes."""
    written: List[object] = []
    post_order_visit(func.body, lambda n: written.append(n.buffer.id_)
                     if isinstance(n, tirx.BufferStore) else None)
    return {i for i, p in enumerate(func.params) if p.id_ in set(written)}


def _array(param, is_output: bool, rng) -> Optional[np.ndarray]:
    shape = getattr(getattr(param, "ty", None), "shape", None)
    if shape is None:
        return None  # a scalar: not a buffer
    dims = [int(d) for d in shape]
    dtype = str(param.dtype)
    if is_output:
        return np.full(dims, np.nan, dtype) if "float" in dtype else np.zeros(dims, dtype)
    if "float" in dtype:
        x = rng.uniform(-1.0, 1.0, size=dims)
        x[x == 0] = 0.5
        return x.astype(dtype)
    if dtype == "bool":
        return rng.integers(0, 2, size=dims).astype(bool)
    return np.zeros(dims, dtype)


def _run(executable, arrays) -> list:
    dev = tvm.cpu()
    args = [tvm.runtime.tensor(a.copy(), dev) for a in arrays]
    executable["main"](*args)
    return [a.numpy() for a in args]


def _close(got: np.ndarray, want: np.ndarray):
    if got.dtype.kind != "f":
        same = np.array_equal(got, want)
        return same, 0.0 if same else f"{int((got != want).sum())} elements differ"
    nan_got, nan_want = np.isnan(got), np.isnan(want)
    if not np.array_equal(nan_got, nan_want):
        return False, f"{int((nan_got != nan_want).sum())} elements NaN in one build only"
    scale = float(np.abs(want[~nan_want]).max()) if (~nan_want).any() else 0.0
    diff = float(np.abs(got[~nan_got] - want[~nan_want]).max()) if (~nan_want).any() else 0.0
    rel = diff / scale if scale > 0 else diff
    if not math.isfinite(rel) or rel > TOLERANCE:
        return False, f"max rel. err {rel:.2e}"
    return True, rel
